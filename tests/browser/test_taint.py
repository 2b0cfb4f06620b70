"""What a run trained on, in the dashboard (issue 25.4): a run resumed after a real mismatch and then
finished has every alert resolved ("Firing alerts: none"), and still shows the steps it trained
while the mismatch was open, in the runs list, on its page (banner and shaded charts) and in compare."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.api.test_fingerprints import fake_fp
from tests.browser.conftest import drawn_chart, page_problems
from tests.browser.seed import Seeder

pytestmark = pytest.mark.browser
SUMMARY = "steps 212–251: chat_template differs on 1 of 3 rollout workers"


def resumed_after_a_mismatch(seeder: Seeder, name: str) -> dict:
    """A trainer and 3 rollout workers; the third joins with another chat template at step 211, the
    run pauses, someone resumes it unfixed, the worker is fixed at step 251, the run finishes."""
    good, bad = fake_fp("{{ messages }}"), fake_fp("{{ messages | tojson }}")
    run = seeder.run(name, project="taint")
    trainer = seeder.component(run["id"], "trainer", "trainer-0")
    workers = [seeder.component(run["id"], "rollout", f"rollout-{i}") for i in range(3)]
    for c in (trainer, *workers[:2]):
        seeder.fingerprint(run["id"], c["id"], good)
    seeder.metrics(run["id"], list(range(0, 212)), {"loss": [1.0] * 212})
    seeder.fingerprint(run["id"], workers[2]["id"], bad)
    seeder.post(f"/runs/{run['id']}/control", {"action": "resume", "reason": "looks harmless"})
    seeder.metrics(run["id"], list(range(212, 252)), {"loss": [2.0] * 40})
    seeder.fingerprint(run["id"], workers[2]["id"], good)
    seeder.metrics(run["id"], list(range(252, 301)), {"loss": [1.0] * 49})
    for c in (trainer, *workers):
        seeder.post(f"/runs/{run['id']}/components/{c['id']}/close", {"reason": "done"})
    return run


def test_a_resumed_and_finished_run_shows_its_tainted_steps_in_the_list_and_on_its_page(page, server, screenshots):
    seeder = Seeder(server.url)
    run = resumed_after_a_mismatch(seeder, "resumed-after-mismatch")
    clean = seeder.run("clean-run", project="taint")

    page.goto(f"{server.url}/#/runs")
    row = page.locator(f"table.runs-table tbody tr[data-run-id='{run['id']}']")
    expect(row).to_have_attribute("data-tainted", "1")
    expect(row.locator(".state")).to_have_text("finished")
    expect(row.locator(".alerts-cell")).to_have_text("none")  # every alert resolved...
    expect(row.locator(".taint-cell .taint-range")).to_have_text(SUMMARY)  # ...and the record stays
    expect(page.locator(f"tr[data-run-id='{clean['id']}'] .taint-cell")).to_have_text("none")
    page.screenshot(path=str(screenshots / "runs-tainted.png"))

    row.locator("a.run-link").click()
    banner = page.locator("[data-banner=taint]")
    expect(banner).to_contain_text("Trained on 40 tainted steps")
    expect(banner).to_contain_text("a checkpoint from step 212 on was trained on them")
    expect(banner.locator(".taint-range")).to_have_text([SUMMARY])
    expect(page.locator("[data-banner=mismatch]")).to_have_count(0)  # nothing is wrong now
    page.screenshot(path=str(screenshots / "run-tainted.png"))
    chart = drawn_chart(page, "loss")
    shaded = chart.evaluate("""f => (f.querySelector('.js-plotly-plot').layout.shapes || [])
        .filter(s => s.type === 'rect').map(s => [s.x0, s.x1])""")
    assert shaded == [[211.5, 251.5]]

    page.goto(f"{server.url}/#/compare?runs={run['id']},{clean['id']}&metric=loss")
    row = page.locator(".compare-table tbody tr", has_text="tainted steps")
    expect(row.locator("td").nth(0)).to_have_text(SUMMARY)
    expect(row.locator("td").nth(1)).to_have_text("none")
    assert page_problems(page) == {"csp": [], "errors": []}
