"""/api/docs in headless Chromium: Swagger UI renders every operation of the schema, under the
server's strict CSP, with nothing fetched from anywhere but this server."""
from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import expect

from tests.browser.conftest import page_problems

pytestmark = pytest.mark.browser


def test_interactive_docs_render_every_operation(page, server):
    schema = httpx.get(f"{server.url}/api/v1/openapi.json").json()
    operations = [(method.upper(), path) for path, item in schema["paths"].items() for method in item
                  if method in ("get", "post", "put", "patch", "delete")]
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    page.goto(f"{server.url}/api/docs")

    blocks = page.locator(".opblock")
    expect(blocks).to_have_count(len(operations))
    create_run = page.locator(".opblock-post", has=page.locator("[data-path='/api/v1/runs']"))
    expect(create_run).to_have_count(1)
    expect(create_run).to_contain_text("Create a run")
    create_run.locator(".opblock-summary").click()  # expands: its request body schema renders
    expect(create_run.locator(".opblock-body")).to_contain_text("name")
    expect(page.locator(".info .title")).to_contain_text(schema["info"]["title"])

    assert page_problems(page) == {"csp": [], "errors": []}
    assert requested and all(u.startswith(server.url) for u in requested), \
        [u for u in requested if not u.startswith(server.url)]


def test_authorize_and_try_it_out_answer_200_in_token_mode(page, token_server):
    """Issue 29.4: the schema had no security scheme, so Swagger UI had no Authorize button and
    "Try it out" answered 401 on a server that requires tokens."""
    server, tokens = token_server
    page.goto(f"{server.url}/api/docs")
    list_runs = page.locator(".opblock-get", has=page.locator("[data-path='/api/v1/runs']"))
    health = page.locator(".opblock-get", has=page.locator("[data-path='/healthz']"))
    expect(list_runs.locator(".authorization__btn")).to_have_count(1)  # needs a token: says so
    expect(health.locator(".authorization__btn")).to_have_count(0)  # public: does not

    page.locator(".auth-wrapper button.authorize").click()
    dialog = page.locator(".modal-ux")
    dialog.locator("input[type=text], input[type=password]").fill(tokens["read"])
    dialog.locator("button.authorize").click()
    dialog.locator("button.btn-done").click()

    list_runs.locator(".opblock-summary").click()
    list_runs.locator("button.try-out__btn").click()
    list_runs.locator("button.execute").click()
    status = list_runs.locator(".live-responses-table .response .response-col_status")
    expect(status).to_have_text("200")
    expect(list_runs.locator(".live-responses-table .response .response-col_description")).to_contain_text("token-run")
    assert page_problems(page) == {"csp": [], "errors": []}
