"""The workers view with 512 registered processes in a real browser (issue 16): it renders (only the rows
in view are in the DOM), sorts, filters by text, state, side, fingerprint group and lag, flags and
surfaces the lagging worker, links a differing group to its diff, and draws one metric per worker with
the bad replica first. Speed is bench/dashboard.py's to measure, not this test's."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import page_problems
from tests.browser.seed import Seeder, silence_component
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
    # Only the rows in view are drawn, and the differing worker is sorted into view only once
    # detection has raised its alert: filter to it, so that its row is drawn whatever the order.
    section.locator("input[data-filter=text]").fill(DIFFERENT)
    button = section.locator(f"tr[data-worker='{DIFFERENT}'] [data-action=group-diff]")
    expect(button).to_be_visible()
    page.route("**/api/v1/runs/*/parity", lambda route: route.fulfill(
        status=500, content_type="application/json",
        body='{"error": {"code": "internal", "message": "the parity view failed"}}'))
    button.click()
    expect(section.locator(".workers-summary")).to_contain_text("could not be loaded")
    expect(page.locator("dialog.modal")).to_have_count(0)


LOADED = 30_000  # ms: what the page hears of through its stream or draws after a load, on a busy CI machine

# Every drawn cell of the workers table whose content is wider than the cell (cut off by an ellipsis).
CUT_CELLS = """el => [...el.querySelectorAll('tr.worker-row td')].filter((td) => td.scrollWidth > td.clientWidth + 1)
  .map((td) => `${td.closest('tr').dataset.worker}: ${td.textContent}`)"""


def test_no_cell_of_the_workers_table_is_cut_short(server, seeded, page):
    """Issue 29.7: the side ("train…"), worker ids and hosts were cut by fixed column widths."""
    page.goto(f"{server.url}/#/runs/{seeded.run_id}")
    section = page.locator("#workers")
    page.locator("[data-action=show-workers]").click()
    scroll = section.locator(".workers-scroll")
    expect(scroll).to_have_attribute("data-shown", "512")
    section.locator("input[data-filter=text]").fill("trainer")  # its row is drawn wherever it sorts
    expect(section.locator("tr[data-worker='trainer-0'] td").nth(2)).to_have_text("trainer", timeout=LOADED)
    section.locator("input[data-filter=text]").fill("")
    expect(scroll).to_have_attribute("data-shown", "512")
    assert section.locator(".workers-table").evaluate(CUT_CELLS) == []
    # the usual names fit the section: no sideways scrolling at 1400 px
    assert scroll.evaluate("el => el.scrollWidth <= el.clientWidth"), "the table is wider than its section"

    s = Seeder(server.url)
    run = s.run("long-worker-names", project="workers-long")
    long_worker, long_host = "vllm-rollout-worker-with-a-long-name-07", "ip-10-0-3-17.us-west-2.compute.internal"
    comp = s.component(run["id"], "rollout", long_worker, host=long_host)
    s.post(f"/runs/{run['id']}/components/{comp['id']}/heartbeat", {"policy_version": 12345, "samples_per_s": 1234.5})
    page.goto(f"{server.url}/#/runs/{run['id']}")
    row = page.locator(f"#workers tr[data-worker='{long_worker}']")
    expect(row.locator("td").nth(3)).to_have_text(long_host, timeout=LOADED)
    assert page.locator("#workers .workers-table").evaluate(CUT_CELLS) == []  # wider than the section: it scrolls


def test_a_worker_killed_after_its_run_finished_is_ended_in_the_header_the_list_and_the_workers_view(server, page):
    """Issue 29.7: the orchestrator SIGTERMs a finished run's rollout worker (no close()). The header
    said "1 live", the runs list "1 stale"; every view now says `ended`, on the open page too."""
    s = Seeder(server.url)
    run = s.run("sigterm-after-finish", project="workers-ended")
    trainer = s.component(run["id"], "trainer", "trainer-rank0")
    rollout = s.component(run["id"], "rollout", "vllm-0")
    page.goto(f"{server.url}/#/runs/{run['id']}")
    processes = page.locator(".run-facts .processes")
    expect(processes).to_have_text("processes: 2 live · 0 closed · 0 lost", timeout=LOADED)

    s.post(f"/runs/{run['id']}/components/{trainer['id']}/close", {"reason": "training done"})
    silence_component(server.db_url, rollout["id"], seconds=3600)  # killed an hour ago: no beat since
    expect(processes).to_have_text("processes: 0 live · 1 closed · 0 lost · 1 ended", timeout=LOADED)  # no reload
    page.locator("[data-action=show-workers]").click()
    row = page.locator("#workers tr[data-worker='vllm-0']")
    expect(row).to_have_attribute("data-state", "ended", timeout=LOADED)
    expect(row.locator(".badge", has_text="ended")).to_be_visible()
    expect(row.locator("td.attention .dot")).to_have_count(0)  # nothing to look into
    expect(row.locator("td.stale")).to_have_count(0)
    expect(page.locator("#workers .workers-summary")).to_contain_text("2 processes: 0 live · 1 closed · 0 lost · 1 ended")

    page.goto(f"{server.url}/#/runs")
    cell = page.locator(f"tr[data-run-id='{run['id']}'] td").nth(5)  # the rollout column
    expect(cell).to_contain_text("1 ended", timeout=LOADED)
    assert "stale" not in cell.inner_text() and "♥" not in cell.inner_text()
    assert page_problems(page) == {"csp": [], "errors": []}
