"""The workers view with 512 registered processes in a real browser (issue 16): it renders (only the rows
in view are in the DOM), sorts, filters by text, state, side, fingerprint group and lag, flags and
surfaces the lagging worker, links a differing group to its diff, and draws one metric per worker with
the bad replica first. Speed is bench/dashboard.py's to measure, not this test's."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import page_problems
from tests.browser.workers_seed import CLOSED, DIFFERENT, LAGGING, TRAINER_VERSION, seed_workers_run

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def seeded(server):
    return seed_workers_run(server.url, "workers-512")


def test_512_processes_render_filter_and_show_the_lagging_worker(server, seeded, page):
    page.goto(f"{server.url}/#/runs/{seeded.run_id}")
    section = page.locator("#workers")
    page.locator("[data-action=show-workers]").click()  # below the charts, one click from the run's header
    expect(section.locator("h2")).to_be_in_viewport()
    scroll = section.locator(".workers-scroll")
    rows = section.locator("tr.worker-row")
    expect(scroll).to_have_attribute("data-shown", "512")
    expect(section.locator(".workers-summary")).to_contain_text("512 processes: 511 live · 1 closed · 0 lost")
    expect(section.locator(".workers-summary")).to_contain_text(f"trainer at version {TRAINER_VERSION}")
    expect(section.locator(".lagging-count")).to_have_text("1 lagging")
    assert rows.count() < 60  # virtual: only the rows in view (and a few around) are drawn

    # needs-attention order (the default): the differing worker's alert, then the lagging worker
    expect(rows.nth(0)).to_have_attribute("data-worker", DIFFERENT)
    expect(rows.nth(1)).to_have_attribute("data-worker", LAGGING)
    lagging = section.locator(f"tr[data-worker='{LAGGING}']")
    expect(lagging).to_have_attribute("data-lagging", "true")
    expect(lagging).to_have_class("worker-row row-lagging")
    expect(lagging.locator("td[data-lag]")).to_contain_text("9 behind")

    # sorting by a column, both ways
    section.locator("th[data-sort=lag]").click()
    expect(rows.first).to_have_attribute("data-worker", LAGGING)
    expect(section.locator("th[data-sort=lag]")).to_have_attribute("aria-sort", "descending")
    section.locator("th[data-sort=worker]").click()
    expect(rows.first).to_have_attribute("data-worker", "rollout-000")
    section.locator("th[data-sort=worker]").click()
    expect(rows.first).to_have_attribute("data-worker", "trainer-0")

    # filters, alone and together
    text = section.locator("input[data-filter=text]")
    text.fill("rollout-31")
    expect(scroll).to_have_attribute("data-shown", "10")
    text.fill("gpu-node-05")  # hosts match too
    expect(scroll).to_have_attribute("data-shown", "8")
    expect(section.locator(f"tr[data-worker='{LAGGING}']")).to_be_visible()
    text.fill("")
    section.locator("select[data-filter=state]").select_option("closed")
    expect(scroll).to_have_attribute("data-shown", "1")
    expect(rows.first).to_have_attribute("data-worker", CLOSED)
    section.locator("select[data-filter=state]").select_option("")
    section.locator("select[data-filter=side]").select_option("trainer")
    expect(scroll).to_have_attribute("data-shown", "1")
    section.locator("select[data-filter=side]").select_option("")
    section.locator("input[data-filter=lagging]").check()
    expect(scroll).to_have_attribute("data-shown", "1")
    expect(rows.first).to_have_attribute("data-worker", LAGGING)
    section.locator("input[data-filter=lagging]").uncheck()
    section.locator("select[data-filter=group]").select_option("B")
    expect(scroll).to_have_attribute("data-shown", "1")
    expect(rows.first).to_have_attribute("data-worker", DIFFERENT)
    text.fill("no-such-worker")
    expect(section.locator("td.empty")).to_have_text("No process matches these filters.")
    text.fill("")

    # the differing group links to its diff against the trainer
    rows.first.locator("[data-action=group-diff]").click()
    expect(page.locator("dialog.modal")).to_contain_text("Fingerprint B vs the trainer")
    page.locator("dialog.modal .icon-button").click()
    section.locator("select[data-filter=group]").select_option("")
    expect(scroll).to_have_attribute("data-shown", "512")

    # scrolling draws the rows that come into view (still sorted by worker, descending)
    expect(rows.first).to_have_attribute("data-worker", "trainer-0")
    scroll.evaluate("el => { el.scrollTop = el.scrollHeight; }")
    expect(section.locator("tr[data-worker='rollout-000']")).to_be_visible()
    expect(section.locator("tr[data-worker='trainer-0']")).to_have_count(0)

    # one metric per worker: the bad replica first, over the aggregate
    series = section.locator(".worker-series")
    series.scroll_into_view_if_needed()
    expect(series).to_have_attribute("data-workers", re.compile(rf"^{re.escape(DIFFERENT)}(,|$)"))
    expect(series.locator(".worker-plot .main-svg").first).to_be_attached()
    assert page_problems(page) == {"csp": [], "errors": []}



def test_worker_ids_and_metric_keys_are_text_in_the_per_worker_chart(server, page):
    """Worker ids and metric keys come from the processes: Plotly must show markup in them as
    text (no link or styling a worker id could plant in every viewer's legend)."""
    from tests.browser.seed import Seeder

    s = Seeder(server.url)
    run = s.run("markup-workers", project="workers-markup")
    key = "<i>rollout</i>/kl"
    names = ['<a href="https://example.com">rollout-0</a>', "<b>rollout-1</b> %{y}"]
    for i, name in enumerate(names):
        comp = s.component(run["id"], "rollout", name)
        s.post(f"/runs/{run['id']}/metrics", {"client_id": f"markup-{i}", "seq": 1, "component_id": comp["id"],
                                              "steps": [0, 1, 2], "series": {key: [0.1 * i, 0.2, 0.3]}})
    page.goto(f"{server.url}/#/runs/{run['id']}")
    page.locator("[data-action=show-workers]").click()
    series = page.locator("#workers .worker-series")
    series.scroll_into_view_if_needed()
    legend = series.locator(".worker-plot .legendtext")
    expect(legend).to_have_count(3)  # the mean of all, then each worker
    texts = legend.all_text_contents()
    assert all(any(t.startswith(n + " (score") for t in texts) for n in names), texts
    assert series.locator(".worker-plot .legend a, .worker-plot .legend b, .worker-plot .ytitle i").count() == 0
    expect(series.locator(".worker-plot .ytitle")).to_have_text(key)
    assert page_problems(page)["errors"] == []


def test_a_diff_that_cannot_be_loaded_says_so(server, seeded, page):
    page.goto(f"{server.url}/#/runs/{seeded.run_id}")
    section = page.locator("#workers")
    page.locator("[data-action=show-workers]").click()
    expect(section.locator(".workers-scroll")).to_have_attribute("data-shown", "512")
    page.route("**/api/v1/runs/*/parity", lambda route: route.fulfill(
        status=500, content_type="application/json",
        body='{"error": {"code": "internal", "message": "the parity view failed"}}'))
    section.locator(f"tr[data-worker='{DIFFERENT}'] [data-action=group-diff]").click()
    expect(section.locator(".workers-summary")).to_contain_text("could not be loaded")
    expect(page.locator("dialog.modal")).to_have_count(0)
