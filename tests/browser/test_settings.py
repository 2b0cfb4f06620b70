"""The Webhooks page and the per-run rules form, driven in the browser end to end: what a user
adds there must really sign and deliver, and really pause a run."""
from __future__ import annotations

import time

import httpx
import pytest
from playwright.sync_api import expect

from paritywatch.backend.webhooks.signing import verify
from tests.browser.conftest import Server, page_problems, pump_until
from tests.support.live import WebhookReceiver

pytestmark = pytest.mark.browser

XSS = '<img src=x onerror="window.__pwned=1">'


@pytest.fixture(scope="module")
def webhook_server(tmp_path_factory):
    """Its own server: loopback webhook targets allowed (the test receiver listens on 127.0.0.1)."""
    srv = Server(tmp_path_factory.mktemp("settings"), env={
        "PARITYWATCH_ALLOW_LOOPBACK_WEBHOOKS": "1", "PARITYWATCH_WEBHOOK_POLL_INTERVAL_S": "0.05"})
    yield srv
    srv.stop()


def test_a_webhook_added_in_the_page_receives_a_signed_test_event(page, webhook_server):
    with WebhookReceiver() as receiver:
        page.goto(f"{webhook_server.url}/#/settings")
        form = page.locator("form", has_text="Add a webhook")
        form.locator("input[name=url]").fill(receiver.url)
        form.locator("input[name=project]").fill(XSS)
        form.locator("input[value='alert.firing']").check()
        form.locator("button[type=submit]").click()

        secret = page.locator(".secret .secret-value")
        expect(secret).not_to_be_empty()
        secret_text = secret.inner_text()
        card = page.locator("article.webhook", has_text=receiver.url)
        expect(card).to_contain_text("events: alert.firing")
        expect(card).to_contain_text(f"project: {XSS}")  # user text shown as text
        assert page.evaluate("window.__pwned") is None
        assert page.evaluate("document.querySelectorAll('img[src=x]').length") == 0

        card.get_by_role("button", name="Send test").click()
        expect(card).to_contain_text("test event queued")
        got = receiver.wait_accepted(1, timeout_s=20)[0]
        verify(secret_text, got.headers, got.body, now=time.time())  # raises on a bad signature
        expect(card.locator(".delivery-log tr[data-status=delivered]")).to_have_count(1, timeout=20_000)

        card.get_by_role("button", name="Disable").click()
        expect(page.locator("article.webhook", has_text=receiver.url)).to_contain_text("disabled")
        delete = page.locator("article.webhook", has_text=receiver.url).get_by_role("button", name="Delete")
        delete.click()
        expect(delete).to_have_text("Click again to delete")  # one click never deletes
        delete.click()
        expect(page.locator("article.webhook", has_text=receiver.url)).to_have_count(0)
        assert httpx.get(f"{webhook_server.url}/api/v1/webhooks").json()["webhooks"] == []
    assert page_problems(page) == {"csp": [], "errors": []}


def test_a_rule_added_in_the_run_page_pauses_the_run_on_its_metric(page, webhook_server):
    api = f"{webhook_server.url}/api/v1"
    run = httpx.post(f"{api}/runs", json={"name": "rules-form", "project": "forms"}).json()
    page.goto(f"{webhook_server.url}/#/runs/{run['id']}")
    page.locator("details.add-rule summary").click()
    form = page.locator("details.add-rule form")
    form.locator("input[name=key]").fill("reward/collapse")
    form.locator("select[name=comparison]").select_option("<")
    form.locator("input[name=threshold]").fill("0.05")
    form.locator("input[name=consecutive]").fill("2")
    form.locator("select[name=severity]").select_option("error")
    form.locator("select[name=action]").select_option("pause")
    form.locator("button[type=submit]").click()

    row = page.locator(".rules-table tr", has_text="reward/collapse")
    expect(row).to_contain_text("last over 1 step(s) < 0.05 × 2")
    expect(row).to_contain_text("this run")
    rules = httpx.get(f"{api}/runs/{run['id']}/rules").json()["rules"]
    mine = [r for r in rules if r["key"] == "reward/collapse"]
    assert len(mine) == 1 and mine[0]["action"] == "pause" and mine[0]["consecutive"] == 2

    def post(seq: int, value: float) -> None:
        r = httpx.post(f"{api}/runs/{run['id']}/metrics",
                       json={"client_id": "form-test", "seq": seq, "steps": [seq], "series": {"reward/collapse": [value]}})
        assert r.status_code == 200, r.text

    post(0, 0.01)  # one breach: consecutive=2 is not met yet
    assert httpx.get(f"{api}/runs/{run['id']}/control").json()["state"] == "running"
    post(1, 0.02)
    expect(page.locator(".controls .state[data-state=paused]")).to_have_count(1, timeout=20_000)
    expect(page.locator(".alert-item[data-kind=metric_threshold]")).to_contain_text("reward/collapse", timeout=20_000)

    # The box is busy while the server does not have the change yet (the PATCH is held here),
    # then shows what the server holds.
    def enabled_on_server() -> list[bool]:
        return [r["enabled"] for r in httpx.get(f"{api}/runs/{run['id']}/rules").json()["rules"]
                if r["key"] == "reward/collapse"]

    held = []
    page.route("**/api/v1/rules/*", lambda route: held.append(route) if route.request.method == "PATCH" else route.continue_())
    row.get_by_role("checkbox").uncheck()
    toggle = page.locator(".rules-table tr", has_text="reward/collapse").get_by_role("checkbox")
    expect(toggle).to_be_disabled()
    pump_until(page, lambda: held, what="the dashboard's PATCH of the rule")
    assert enabled_on_server() == [True]
    held[0].continue_()
    expect(toggle).to_be_enabled()
    expect(toggle).not_to_be_checked()
    page.unroute("**/api/v1/rules/*")
    assert enabled_on_server() == [False]
    page.locator(".rules-table tr", has_text="reward/collapse").get_by_role("button", name="delete").click()
    expect(page.locator(".rules-table tr", has_text="reward/collapse")).to_have_count(0)
    assert page_problems(page) == {"csp": [], "errors": []}
