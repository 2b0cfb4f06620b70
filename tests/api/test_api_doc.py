"""docs/api.md against the API's OpenAPI schema (issue 17.7): every endpoint, query parameter and
body field documented, nothing documented that the API does not have. The failure lists exactly
what to add or remove (see tests/support/apidoc.py for the doc's conventions)."""
from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.routing import APIRoute

from paritywatch.backend.main import create_app
from paritywatch.backend.settings import Settings
from tests.support import apidoc

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    return create_app(Settings(database_url=f"sqlite:///{tmp_path_factory.mktemp('doc') / 'never-opened.db'}"))


def routes_outside_the_schema(app) -> set[tuple[str, str]]:
    """Routes the doc may mention that OpenAPI leaves out (GET /metrics, the Prometheus text)."""
    out = set()
    for route in app.routes:
        if isinstance(route, APIRoute) and not route.include_in_schema and "{rest:path}" not in route.path:
            path = route.path[len(apidoc.PREFIX):] if route.path.startswith(apidoc.PREFIX + "/") else route.path
            out |= {(m, path) for m in route.methods if m != "HEAD"}
    return out


def test_api_doc_matches_the_openapi_schema(app):
    problems = apidoc.check(DOC.read_text(), app.openapi(), routes_outside_the_schema(app))
    assert not problems, ("docs/api.md is out of step with the API. Change docs/api.md:\n  - "
                          + "\n  - ".join(problems)
                          + "\n(How entries are written: docs/api.md, \"Keeping this reference true\".)")


OPENAPI = {
    "paths": {
        "/api/v1/things": {"get": {"parameters": [{"name": "limit", "in": "query"}],
                                   "responses": {"200": {"content": {"application/json": {"schema": {
                                       "$ref": "#/components/schemas/ThingList"}}}}}},
                           "post": {"requestBody": {"content": {"application/json": {"schema": {
                                       "$ref": "#/components/schemas/ThingIn"}}}},
                                    "responses": {"200": {"content": {"application/json": {"schema": {
                                        "$ref": "#/components/schemas/ThingOut"}}}}}}},
    },
    "components": {"schemas": {
        "ThingIn": {"type": "object", "properties": {"name": {"type": "string"}}},
        "ThingOut": {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"},
                                                      "owner": {"$ref": "#/components/schemas/Owner"}}},
        "Owner": {"type": "object", "properties": {"login": {"type": "string"}}},
        "ThingList": {"type": "object", "properties": {"things": {"type": "array", "items": {
            "$ref": "#/components/schemas/ThingOut"}}, "next_cursor": {"type": "string"}}},
    }},
}
GOOD = """
`Thing`: `{"id": int, "name": str, "owner": {"login"}}`

- `GET /things?limit=` → `{"things": [Thing], "next_cursor": str|null}`
- `POST /things` `{"name": str}` → `Thing`. Prose may say anything, e.g. that `GET /things` pages.
"""


def test_the_checker_accepts_a_doc_in_step():
    assert apidoc.check(GOOD, OPENAPI, set()) == []


@pytest.mark.parametrize("change,expected", [
    (("- `POST /things` `{\"name\": str}` → `Thing`. Prose may say anything, e.g. that `GET /things` pages.\n", ""),
     "`POST /things` is not documented: add an entry"),
    (("?limit=", ""), "query parameter `limit` is not documented"),
    (("?limit=", "?limit=&sort="), "documents query parameter `sort`"),
    (('"name": str, "owner"', '"owner"'), 'field "name" (str) is not documented'),
    (('{"id": int,', '{"id": int, "colour": str,'), 'documents field "colour", which the API does not have'),
    (('"owner": {"login"}', '"owner": str'), 'field "owner" is an object (Owner)'),
    (('{"login"}', '{"login", "email"}'), 'documents field "email"'),
    (("that `GET /things` pages", "that `GET /things/{id}` exists"), "`GET /things/{id}` is documented but"),
    (("`Thing`: `{", "`Gadget`: `{\"x\"}`\n`Thing`: `{"), "shape `Gadget` is not what any endpoint"),
    (('`{"name": str}` →', "→"), "request body (ThingIn) is not documented"),
    (("`Thing`: `{", "`Thing`: `{\"id\"}`\n`Thing`: `{"), "shape `Thing` is defined again"),
])
def test_the_checker_says_what_to_change(change, expected):
    """Each drift the checker must catch, with the message a helper adding an endpoint will read."""
    old, new = change
    assert old in GOOD
    problems = apidoc.check(GOOD.replace(old, new, 1), OPENAPI, set())
    assert any(expected in p for p in problems), problems
