"""Charts on the run page in a real Chromium: a single point is drawn, step axes have whole-step
ticks, alert markers leave the tick labels readable, the common training keys come first, the
reader's pins lead, and the chart of a firing alert comes right after them (issue 17.8, 29.7)."""
from __future__ import annotations

import uuid

import httpx
import pytest

from tests.browser.conftest import drawn_chart
from tests.browser.seed import Seeder
from tests.support.live import wait_for

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def runs(server):
    s = Seeder(server.url)
    tag = uuid.uuid4().hex[:6]
    single = s.run(f"single-point-{tag}", project="charts")
    s.metrics(single["id"], [7], {"loss": [0.5]})
    few = s.run(f"few-steps-{tag}", project="charts")
    s.metrics(few["id"], [0, 1, 2, 3], {"aa/other": [1, 2, 3, 4], "zz/custom": [4, 3, 2, 1],
                                        "reward": [0.1, 0.2, 0.3, 0.4], "loss": [2, 1.5, 1.2, 1.1]})
    alerting = s.run(f"alert-at-step-{tag}", project="charts")
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
    drawn_chart(page, key)
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


LOADED = 30_000  # ms: what the page hears of through its stream or draws after a load, on a busy CI machine


def test_the_chart_of_a_firing_alert_comes_first_and_pins_still_lead(page, server):
    """15 align/* charts: the alerting one sat at the end of its group. It now leads the metrics,
    after the reader's pins; when its alert resolves it goes back to its group."""
    s = Seeder(server.url)
    run = s.run(f"align-alert-first-{uuid.uuid4().hex[:6]}", project="charts")
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


def test_a_series_the_server_was_too_busy_for_is_fetched_again_by_itself(page, server, runs):
    """A 503 (database busy) or a dropped connection on a chart's first fetch used to leave "Could not
    load this series" on the page for good: nothing fetched it again. Now the chart says so and retries."""
    refused = []

    def busy_twice(route):
        if "key=loss" in route.request.url and len(refused) < 2:
            refused.append(route.request.url)
            route.fulfill(status=503, content_type="application/json",
                          body='{"error": {"code": "database_busy", "message": "The database is busy."}}')
        else:
            route.continue_()

    page.route("**/api/v1/runs/*/series*", busy_twice)
    page.goto(f"{server.url}/#/runs/{runs['few']}")
    fig = page.locator("figure.chart[data-key='loss']")
    fig.locator(".chart-error[data-failures='1']", has_text="Trying again").wait_for()
    fig.and_(page.locator("figure.chart[data-buckets]")).wait_for()
    assert len(refused) == 2
    assert fig.locator(".chart-error").count() == 0
    assert fig.get_attribute("data-total") == "4"
