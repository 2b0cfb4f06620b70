"""Issue 13 done-when: the route x scope table in the docs is generated from the app, and the
table the security tests exercise (every route x every scope) is the one the app declares."""
from __future__ import annotations

from paritywatch.backend import access_table
from paritywatch.backend.api.deps import route_access_table
from paritywatch.backend.main import create_app
from paritywatch.backend.settings import Settings
from tests.security.test_scopes_secrets_and_headers import ACCESS


def _app(sqlite_db):
    return create_app(Settings(database_url=sqlite_db, run_background_workers=False), upgrade_schema=False)


def test_the_docs_table_is_the_apps(sqlite_db):
    doc = access_table.DOC.read_text()
    expected = access_table.replace_in(doc, access_table.markdown(_app(sqlite_db)))
    assert doc == expected, "docs/api.md is stale: run `python -m paritywatch.backend.access_table --write`"


def test_the_exercised_table_is_the_declared_one(sqlite_db):
    declared = {}
    for entry in route_access_table(_app(sqlite_db)):
        path = access_table.documented_path(entry.path)
        if entry.method == "HEAD" or path in access_table.HIDDEN:
            continue
        declared[(entry.method, path)] = "|".join(entry.access.scopes) if entry.access.scopes else "public"
    assert declared == ACCESS
