"""The run page's controls show the newest control state whatever order answers arrive in."""
from __future__ import annotations

import json

import httpx
import pytest
from playwright.sync_api import expect

from tests.browser.conftest import page_problems, pump_until

pytestmark = pytest.mark.browser


def test_a_reload_answered_after_a_pause_does_not_undo_it(page, server):
    """A reload of the run sent before the pause and answered after it (seen in CI: the controls
    showed "paused", then the older "running" control with its old reason) must not put the page
    back to the older state."""
    api = httpx.Client(base_url=f"{server.url}/api/v1", timeout=10)
    run_id = api.post("/runs", json={"name": "late-reload", "project": "controls"}).json()["id"]
    page.goto(f"{server.url}/#/runs/{run_id}")
    state = page.locator(".controls .state")
    expect(state).to_have_attribute("data-state", "running")
    expect(page.locator("[data-live=live]")).to_have_count(1)

    stale, later = [], []  # the first reload, answered by the server now (running) but held; every later one

    def hold_reloads(route) -> None:
        if route.request.method != "GET":
            route.continue_()
        elif not stale:
            stale.append((route, route.fetch()))
        else:
            later.append(route)

    page.route(f"**/api/v1/runs/{run_id}", hold_reloads)
    # A new process changes the run's components: its live event makes the page reload the run.
    # (One that lands before the page read its first event reloads nothing: register another.)
    for worker in range(5):
        api.post(f"/runs/{run_id}/components", json={"side": "rollout", "worker_id": f"w{worker}"}).raise_for_status()
        try:
            pump_until(page, lambda: stale, timeout_s=3, what="the page's reload of the run")
            break
        except AssertionError:
            continue
    assert stale, "the page never reloaded the run after its processes changed"

    page.locator(".controls button[data-action=pause]").click()
    page.locator("dialog[open] textarea").fill("paused after the reload was sent")
    page.locator("dialog[open] button[type=submit]").click()
    expect(state).to_have_attribute("data-state", "paused")

    route, response = stale[0]
    body = response.json()
    assert body["control"]["state"] == "running"  # what the server said before the pause
    body["ended_at"] = "2026-01-01T00:00:00Z"  # a mark: shows once the page has read this answer
    route.fulfill(response=response, body=json.dumps(body))
    expect(page.locator(".ended")).not_to_have_text("")
    # Read at once, not retried: the page drew the controls with the mark, in the same call.
    assert state.get_attribute("data-state") == "paused"
    assert "paused after the reload was sent" in page.locator(".control-meta").inner_text()
    for held in later:
        held.continue_()
    assert page_problems(page) == {"csp": [], "errors": []}
