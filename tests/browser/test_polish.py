"""Dashboard polish seen by a newcomer (issue 17, point 8; issue 29, point 7): what a chart, the metric
list, the sign-in states, the live marker, dialogs on Back and the webhook form look like in a real
Chromium."""
from __future__ import annotations

import uuid

import httpx
import pytest
from playwright.sync_api import expect

from tests.browser.seed import Seeder
from tests.support.live import wait_for

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def runs(server):
    s = Seeder(server.url)
    tag = uuid.uuid4().hex[:6]
    single = s.run(f"single-point-{tag}", project="polish")
    s.metrics(single["id"], [7], {"loss": [0.5]})
    few = s.run(f"few-steps-{tag}", project="polish")
    s.metrics(few["id"], [0, 1, 2, 3], {"aa/other": [1, 2, 3, 4], "zz/custom": [4, 3, 2, 1],
                                        "reward": [0.1, 0.2, 0.3, 0.4], "loss": [2, 1.5, 1.2, 1.1]})
    alerting = s.run(f"alert-at-step-{tag}", project="polish")
    # The built-in rule (any prompt re-render mismatch is an error) fires on step 20's batch.
    s.metrics(alerting["id"], list(range(20)), {"align/prompt_rerender_mismatch_frac": [0.0] * 20})
    s.metrics(alerting["id"], [20], {"align/prompt_rerender_mismatch_frac": [0.5]})
    alert = wait_for(lambda: next(iter(httpx.get(f"{server.url}/api/v1/runs/{alerting['id']}/alerts").json()["alerts"]), None),
                     timeout_s=30)
    assert alert["step"] == 20
    return {"single": single["id"], "few": few["id"], "alerting": alerting["id"]}


def open_run(page, server, run_id: int) -> None:
    page.goto(f"{server.url}/#/runs/{run_id}")
    page.locator("figure.chart .js-plotly-plot").first.wait_for()


def chart(page, key: str):
    loc = page.locator(f"figure.chart[data-key='{key}']")
    loc.locator(".xtick").first.wait_for()
    return loc


def tick_labels(fig) -> list[str]:
    return [t.strip().replace(",", "") for t in fig.locator(".xtick text").evaluate_all("els => els.map((e) => e.textContent)")]


def test_a_single_point_series_is_drawn_as_a_marker(page, server, runs):
    open_run(page, server, runs["single"])
    points = chart(page, "loss").locator(".scatterlayer .point")
    points.first.wait_for(state="attached")
    assert points.count() == 1
    box = points.first.bounding_box()
    assert box and box["width"] > 2 and box["height"] > 2


def test_step_axes_have_whole_step_ticks(page, server, runs):
    for run_id, keys in ((runs["few"], ("loss", "reward", "aa/other", "zz/custom")), (runs["single"], ("loss",))):
        open_run(page, server, run_id)
        for key in keys:
            labels = tick_labels(chart(page, key))
            assert len(labels) >= 2, (key, labels)
            assert all(label.lstrip("-").isdigit() for label in labels), (run_id, key, labels)
            assert len(set(labels)) == len(labels), labels  # no rounding into repeats either


def test_alert_markers_do_not_cover_tick_labels(page, server, runs):
    open_run(page, server, runs["alerting"])
    fig = chart(page, "align/prompt_rerender_mismatch_frac")
    marker = fig.locator(".annotation", has_text="▼").or_(fig.locator(".annotation", has_text="▲"))
    marker.first.wait_for()
    box = marker.first.bounding_box()
    ticks = [fig.locator(".xtick text").nth(i).bounding_box() for i in range(fig.locator(".xtick text").count())]
    assert "20" in tick_labels(fig)  # the marker's step has a label of its own
    overlaps = [t for t in ticks if t and not (box["x"] + box["width"] <= t["x"] or t["x"] + t["width"] <= box["x"]
                                                or box["y"] + box["height"] <= t["y"] or t["y"] + t["height"] <= box["y"])]
    assert overlaps == []


def chart_order(page) -> list[str]:
    return page.eval_on_selector_all("figure.chart", "els => els.map((e) => e.dataset.key)")


def test_common_training_keys_first_and_pinned_metrics_on_top(page, server, runs):
    open_run(page, server, runs["few"])
    wait_for(lambda: len(chart_order(page)) == 4)
    assert chart_order(page)[:2] == ["loss", "reward"]  # before any prefix group, not in a collapsed "(no prefix)"
    page.get_by_role("button", name="Pin zz/custom").click()
    wait_for(lambda: chart_order(page)[0] == "zz/custom")
    assert page.locator("details.chart-group[data-group=pinned]").get_attribute("open") is not None
    page.reload()  # kept in this browser
    page.locator("figure.chart").first.wait_for()
    wait_for(lambda: chart_order(page)[:3] == ["zz/custom", "loss", "reward"])
    assert page.get_by_role("button", name="Unpin zz/custom").get_attribute("aria-pressed") == "true"
    page.get_by_role("button", name="Unpin zz/custom").click()
    wait_for(lambda: chart_order(page)[:2] == ["loss", "reward"])


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


# ------------------------------------------------------------------ issue 29.7: round 3 of a newcomer's view

LOADED = 30_000  # ms: what the page hears of through its stream or draws after a load, on a busy CI machine

def _mismatch_run(server, name: str) -> dict:
    """A running run whose one rollout worker loads another chat template: a red banner with "Show diff"."""
    from trainer_hooks.fingerprint.core import assemble

    s = Seeder(server.url)
    run = s.run(name, project="polish")
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
    run = s.run(f"live-then-finished-{uuid.uuid4().hex[:6]}", project="polish")
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


def test_the_chart_of_a_firing_alert_comes_first_and_pins_still_lead(page, server):
    """15 align/* charts: the alerting one sat at the end of its group. It now leads the metrics,
    after the reader's pins; when its alert resolves it goes back to its group."""
    s = Seeder(server.url)
    run = s.run(f"align-alert-first-{uuid.uuid4().hex[:6]}", project="polish")
    firing = "align/zz_logprob_abs_diff_max"
    keys = [f"align/metric_{i:02d}" for i in range(14)] + [firing]
    s.metrics(run["id"], list(range(20)), {**{k: [0.0] * 20 for k in keys}, "loss": [1.0] * 20})
    s.post(f"/runs/{run['id']}/rules", {"key": firing, "comparison": ">", "threshold": 0.5, "severity": "error"})
    s.metrics(run["id"], [20], {firing: [3.0]})
    alert = wait_for(lambda: next(iter(httpx.get(f"{server.url}/api/v1/runs/{run['id']}/alerts",
                                                 params={"status": "firing"}).json()["alerts"]), None), timeout_s=30)
    open_run(page, server, run["id"])
    wait_for(lambda: chart_order(page)[:2] == [firing, "loss"], timeout_s=LOADED / 1000)
    assert page.locator("details.chart-group").first.get_attribute("data-group") == "alerting"
    assert page.locator(f"figure.chart[data-key='{firing}']").evaluate("el => el.classList.contains('alerting')")
    page.get_by_role("button", name="Pin align/metric_03").click()  # a pin still leads
    wait_for(lambda: chart_order(page)[:3] == ["align/metric_03", firing, "loss"], timeout_s=LOADED / 1000)
    page.get_by_role("button", name="Unpin align/metric_03").click()
    httpx.post(f"{server.url}/api/v1/alerts/{alert['id']}/resolve", json={"note": "looked at it"}).raise_for_status()
    wait_for(lambda: chart_order(page)[-1] == firing, timeout_s=LOADED / 1000)  # back in the align group, at its end
    assert page.locator("details.chart-group[data-group=alerting]").count() == 0


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
