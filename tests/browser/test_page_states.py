"""What the dashboard says in the states a newcomer meets, in a real Chromium: signed out, signed in
without the scope a page needs, Back from an open dialog, "live" only beside a run that can still
log, and an "Add a webhook" form that gives each field its room (issue 17.8, 29.7)."""
from __future__ import annotations

import uuid

import pytest
from playwright.sync_api import expect

from tests.browser.seed import Seeder

pytestmark = pytest.mark.browser

LOADED = 30_000  # ms: what the page hears of through its stream or draws after a load, on a busy CI machine


def test_signed_out_runs_page_asks_to_sign_in_instead_of_empty_filters(page, token_server):
    srv, _ = token_server
    page.goto(f"{srv.url}/#/runs")
    page.locator(".error-state[data-status='401']").wait_for()
    assert page.locator("#view a[href='#/signin']").count() == 1
    assert page.locator("#view select").count() == 0  # no empty project selector
    assert page.locator("#view input[type=search]").count() == 0


def test_webhooks_page_says_the_missing_scope_once(page, token_server):
    srv, tokens = token_server
    page.goto(f"{srv.url}/#/signin")
    page.fill("#token", tokens["read"])
    page.click("form.signin button[type=submit]")
    page.wait_for_url("**/#/runs")
    page.goto(f"{srv.url}/#/settings")
    error = page.locator("#view .error-state[data-status='403']")
    error.wait_for()
    text = error.inner_text()
    assert "admin scope" in text
    assert text.lower().count("scope") == 1, text


def _mismatch_run(server, name: str) -> dict:
    """A running run whose one rollout worker loads another chat template: a red banner with "Show diff"."""
    from trainer_hooks.fingerprint.core import assemble

    s = Seeder(server.url)
    run = s.run(name, project="page-states")
    for side, worker, template in (("trainer", "t0", "{{ messages }}"), ("rollout", "r0", "{{ messages | tojson }}")):
        comp = s.component(run["id"], side, worker)
        s.fingerprint(run["id"], comp["id"], assemble("tokenizer", {"chat_template": template}, {}))
    return run


def test_browser_back_closes_the_diff_dialog(page, server):
    run = _mismatch_run(server, f"back-closes-{uuid.uuid4().hex[:6]}")
    page.goto(f"{server.url}/#/runs")
    page.locator(f"a.run-link[href='#/runs/{run['id']}']").click()
    page.locator("[data-banner=mismatch]").get_by_role("button", name="Show diff").click(timeout=LOADED)
    expect(page.locator("dialog[open]")).to_have_count(1)
    page.go_back()
    expect(page.locator("h1")).to_have_text("Runs")
    expect(page.locator("dialog")).to_have_count(0)  # not left open over the runs list
    page.go_forward()  # and it does not come back with the page
    page.locator("[data-banner=mismatch]").wait_for(timeout=LOADED)
    expect(page.locator("dialog")).to_have_count(0)


def test_live_is_said_only_beside_a_run_that_can_still_log(page, server):
    s = Seeder(server.url)
    run = s.run(f"live-then-finished-{uuid.uuid4().hex[:6]}", project="page-states")
    trainer = s.component(run["id"], "trainer", "t0")
    page.goto(f"{server.url}/#/runs/{run['id']}")
    marker = page.locator(".run-title .live")
    expect(marker).to_have_text("● live", timeout=LOADED)
    s.post(f"/runs/{run['id']}/components/{trainer['id']}/close", {"reason": "done"})  # finished while watched
    expect(page.locator(".run-facts .ended")).to_contain_text("ended", timeout=LOADED)
    expect(marker).to_be_hidden()
    page.reload()
    page.locator(".run-facts .ended").wait_for()
    expect(marker).to_have_attribute("data-live", "ended", timeout=LOADED)  # connected, and quiet about it
    expect(marker).to_be_hidden()
    s.component(run["id"], "trainer", "t0")  # the job resumes: live again
    expect(marker).to_have_text("● live", timeout=LOADED)


def test_the_add_webhook_form_gives_each_field_its_room(browser, server):
    from tests.browser.conftest import new_page

    wide = new_page(browser, 1400, 900)
    try:
        wide.goto(f"{server.url}/#/settings")
        form = wide.locator("form", has_text="Add a webhook")
        url = form.locator("input[name=url]")
        url.wait_for()
        # the URL field shows its whole placeholder (it was cut at a quarter of the form)
        assert url.evaluate("""el => { const c = document.createElement('canvas').getContext('2d');
          c.font = getComputedStyle(el).font; return c.measureText(el.placeholder).width + 24 <= el.clientWidth; }""")
        assert url.bounding_box()["width"] >= 0.4 * form.bounding_box()["width"]
        tops = lambda loc: {round(b["y"]) for b in (x.bounding_box() for x in loc.all())}  # noqa: E731
        assert len(tops(form.locator("input[name=events]"))) == 1  # every event on one line
        assert len(tops(form.locator("input[name=group_by]"))) == 1
        intervals = form.locator("input[name$=_s]")
        assert len(tops(intervals)) == 1  # the three intervals side by side, under "Group by"
        group_by_y = form.locator("input[name=group_by]").first.bounding_box()["y"]
        assert min(b["y"] for b in (x.bounding_box() for x in intervals.all())) > group_by_y
        assert form.bounding_box()["height"] < 420, "the form spreads over the page"
    finally:
        wide.context.close()
    narrow = new_page(browser, 420, 900)
    try:
        narrow.goto(f"{server.url}/#/settings")
        narrow.locator("form input[name=url]").wait_for()
        assert narrow.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    finally:
        narrow.context.close()
