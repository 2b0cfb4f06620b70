"""Compare runs (issue 16.2) in Chromium: runs of two projects overlaid on one metric, aligned by
step or by wall time since each run started, with each run's parity verdict; the URL is the view."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import page_problems, pump_until
from tests.browser.seed import Seeder, chatml_fingerprint, spread_arrivals
from tests.fixtures.chat_templates import TRL_CUSTOM_TEMPLATE, TRL_DEFAULT_TEMPLATE

pytestmark = pytest.mark.browser

TRACES = """() => { const p = document.querySelector('[data-compare=plot]');
  return p && p.data ? p.data.map((t) => ({name: t.name, x: Array.from(t.x), y: Array.from(t.y)})) : null; }"""


def _seed(s: Seeder, name: str, project: str, trainer_fp: dict, rollout_fp: dict, first: int, batches: int) -> dict:
    """A run whose `loss` covers steps [first, first + 100 * batches), posted in `batches` batches."""
    run = s.run(name, project=project)
    for side, worker, fp in (("trainer", "trainer-rank0", trainer_fp), ("rollout", "vllm-0", rollout_fp)):
        comp = s.component(run["id"], side, worker)
        s.fingerprint(run["id"], comp["id"], fp)
    for b in range(batches):
        steps = list(range(first + 100 * b, first + 100 * (b + 1)))
        s.metrics(run["id"], steps, {"loss": [1.0 / (1 + 0.01 * (x - first)) for x in steps],
                                     "reward/mean": [0.001 * x for x in steps]})
    return run


@pytest.fixture(scope="module")
def runs(server, tmp_path_factory):
    work = tmp_path_factory.mktemp("compare-tokenizers")
    custom = chatml_fingerprint(work, TRL_CUSTOM_TEMPLATE, "custom")
    default = chatml_fingerprint(work, TRL_DEFAULT_TEMPLATE, "default")
    s = Seeder(server.url)
    healthy = _seed(s, "baseline-healthy", "cmp-grpo-qwen", custom, custom, first=0, batches=5)
    drifted = _seed(s, "tonight-trl-bug", "cmp-grpo-llama", custom, default, first=200, batches=4)
    spread_arrivals(server.db_url, healthy["id"], 60)
    spread_arrivals(server.db_url, drifted["id"], 30)
    return {"healthy": healthy, "drifted": drifted, "fingerprints": {"custom": custom, "default": default}}


def _traces(page, count: int) -> list:
    page.wait_for_function(f"() => {{ const t = ({TRACES})(); return t && t.length === {count}; }}")
    return page.evaluate(TRACES)


def test_compare_two_runs_from_the_runs_list(page, server, runs, screenshots):
    healthy, drifted = runs["healthy"], runs["drifted"]
    page.goto(f"{server.url}/#/runs")
    button = page.locator("button[data-action=compare]")
    expect(button).to_be_disabled()
    page.locator(f"tr[data-run-id='{healthy['id']}'] input[data-pick]").check()
    expect(button).to_be_disabled()  # one run is not a comparison
    page.locator(f"tr[data-run-id='{drifted['id']}'] input[data-pick]").check()
    expect(button).to_be_enabled()
    button.click()
    page.wait_for_url(re.compile(rf"#/compare\?runs={healthy['id']},{drifted['id']}&metric=loss$"))

    def check_view() -> None:
        traces = {t["name"]: t for t in _traces(page, 2)}
        assert set(traces) == {"baseline-healthy", "tonight-trl-bug"}
        # aligned by step: each trace spans its own run's steps on one shared step axis
        assert traces["baseline-healthy"]["x"][0] == 0 and traces["baseline-healthy"]["x"][-1] <= 499
        assert traces["tonight-trl-bug"]["x"][0] == 200 and traces["tonight-trl-bug"]["x"][-1] <= 599
        assert traces["tonight-trl-bug"]["x"][-1] >= 500
        assert traces["baseline-healthy"]["y"][0] == pytest.approx(1.0)
        expect(page.locator("[data-compare=plot]")).to_have_attribute("data-x", "step")
        head = page.locator(".compare-table thead th[data-compare-run]")
        expect(head).to_have_text(["baseline-healthy", "tonight-trl-bug"])
        verdicts = page.locator(".compare-table [data-verdict]")
        expect(verdicts.nth(0)).to_have_attribute("data-verdict", "same")
        expect(verdicts.nth(1)).to_have_attribute("data-verdict", "error")
        expect(verdicts.nth(1)).to_contain_text("1 of 1 rollout worker(s) differ")

    check_view()
    page.locator("[data-compare=plot]").scroll_into_view_if_needed()
    page.screenshot(path=str(screenshots / "compare-two-runs.png"), full_page=True)
    page.reload()  # the URL alone brings back the same view
    check_view()
    assert page_problems(page) == {"csp": [], "errors": []}


def test_the_url_keeps_metric_axis_and_runs_picked_on_the_page(page, server, runs):
    healthy, drifted = runs["healthy"], runs["drifted"]
    page.goto(f"{server.url}/#/compare?runs={healthy['id']}")
    _traces(page, 1)
    page.locator(f".chip[data-compare-run='{healthy['id']}'] button").click()  # none left: a message
    expect(page.locator(".compare-plot .plot-placeholder")).to_contain_text("Add two runs")
    assert page.evaluate("location.hash") == "#/compare"
    page.locator("select[data-picker=add]").select_option(str(healthy["id"]))  # a fresh chart again
    assert [t["name"] for t in _traces(page, 1)] == ["baseline-healthy"]
    page.locator("select[data-picker=add]").select_option(str(drifted["id"]))
    assert {t["name"] for t in _traces(page, 2)} == {"baseline-healthy", "tonight-trl-bug"}
    page.locator("select[data-picker=metric]").select_option("reward/mean")
    page.wait_for_function("() => document.querySelector('[data-compare=plot]').dataset.metric === 'reward/mean'")
    page.locator("input[name=compare-x][value=time]").check()
    page.wait_for_function("() => document.querySelector('[data-compare=plot]').dataset.x === 'time'")
    expected = f"#/compare?runs={healthy['id']},{drifted['id']}&metric=reward%2Fmean&x=time"
    assert page.evaluate("location.hash") == expected
    page.goto(f"{server.url}/#/runs")
    page.goto(f"{server.url}/{expected}")
    traces = {t["name"]: t for t in _traces(page, 2)}
    expect(page.locator("select[data-picker=metric]")).to_have_value("reward/mean")
    expect(page.locator("input[name=compare-x][value=time]")).to_be_checked()
    # wall time since each run started: the healthy run's batches arrived every 60 s (5 of them),
    # the drifted run's every 30 s (4 of them)
    assert traces["baseline-healthy"]["x"][-1] == pytest.approx(300, abs=1)
    assert traces["tonight-trl-bug"]["x"][-1] == pytest.approx(120, abs=1)
    for t in traces.values():
        assert t["x"] == sorted(t["x"]) and t["x"][0] >= 0


def test_a_deleted_or_unknown_run_in_the_url_is_named_not_fatal(page, server, runs):
    page.goto(f"{server.url}/#/compare?runs={runs['healthy']['id']},999999")
    expect(page.locator(".chip[data-compare-run='999999']")).to_contain_text("not found")
    assert [t["name"] for t in _traces(page, 1)] == ["baseline-healthy"]


def test_run_names_are_text_in_the_legend_and_hover(page, server, runs):
    name = '<b>bold</b> <a href="https://example.com">x</a> 100% %{y} &amp;'
    s = Seeder(server.url)
    odd = s.run(name, project="cmp-markup")
    s.metrics(odd["id"], [0, 1, 2], {"loss": [3.0, 2.0, 1.0]})
    page.goto(f"{server.url}/#/compare?runs={runs['healthy']['id']},{odd['id']}")
    _traces(page, 2)
    legend = page.locator("[data-compare=plot] .legendtext")
    expect(legend).to_have_count(2)
    assert name in legend.all_text_contents()
    assert page.locator("[data-compare=plot] .legend a, [data-compare=plot] .legend b").count() == 0
    expect(page.locator(".compare-table thead th[data-compare-run]").nth(1)).to_have_text(name)
    assert page_problems(page)["errors"] == []


def test_a_page_whose_module_loads_late_does_not_replace_the_later_one(page, server, runs):
    """The router: leave for the runs list and, before runs.js has arrived, go on to a comparison.
    When runs.js arrives, the stale runs view must not stay drawn over the comparison."""
    held = []
    page.route("**/static/runs.js", lambda route: held.append(route))
    page.goto(f"{server.url}/#/compare?runs={runs['healthy']['id']}")
    _traces(page, 1)
    page.evaluate("location.hash = '#/runs'")
    page.wait_for_function("() => document.querySelector('h1') === null")  # 'Loading…': waiting for runs.js
    # The route handler runs when Playwright next dispatches events, which may be after the page
    # already shows 'Loading…': pump events until it has the request (bounded).
    pump_until(page, lambda: held, timeout_s=30, what="the request for runs.js")
    assert len(held) == 1
    page.evaluate(f"location.hash = '#/compare?runs={runs['drifted']['id']}'")
    assert [t["name"] for t in _traces(page, 1)] == ["tonight-trl-bug"]
    with page.expect_request(lambda r: r.url.endswith("/api/v1/runs")):  # the stale runs view ran
        held[0].continue_()
    expect(page.locator("h1")).to_have_text("Compare runs")
    assert [t["name"] for t in _traces(page, 1)] == ["tonight-trl-bug"]
    expect(page.locator(".runs-table")).to_have_count(0)


def test_a_live_run_extends_and_its_verdict_follows_a_worker_that_joins(page, server, runs):
    s = Seeder(server.url)
    fps = runs["fingerprints"]
    live = _seed(s, "live-run", "cmp-live", fps["custom"], fps["custom"], first=0, batches=1)
    page.goto(f"{server.url}/#/compare?runs={runs['healthy']['id']},{live['id']}")
    assert max(_traces(page, 2)[1]["x"]) == 99
    verdict = page.locator(".compare-table [data-verdict]").nth(1)
    expect(verdict).to_have_attribute("data-verdict", "same")
    s.metrics(live["id"], list(range(100, 200)), {"loss": [0.5] * 100})
    joined = s.component(live["id"], "rollout", "vllm-autoscaled")  # the TRL bug: the default processor
    s.fingerprint(live["id"], joined["id"], fps["default"])
    page.wait_for_function(f"() => Math.max(...({TRACES})()[1].x) === 199", timeout=90_000)
    expect(verdict).to_have_attribute("data-verdict", "error", timeout=90_000)
    expect(verdict).to_contain_text("1 of 2 rollout worker(s) differ")


def test_url_parsing_wall_time_mapping_and_verdicts(page, server):
    """compare.js's pure helpers, in the page: what a hand-edited URL becomes, step -> seconds, verdicts."""
    page.goto(f"{server.url}/#/runs")
    got = page.evaluate("""async () => {
      const m = await import('/static/compare.js');
      const times = {steps: [10, 20, 40], seconds: [1, 3, 4]};
      const group = (verdict, n, comps) => ({verdict, components: Array(n).fill({}), diff: {components: comps}});
      return {
        parsed: m.parseCompare('runs=3,x,3,-1,7,2.5&metric=a%2Fb&x=bogus'),
        hash: m.compareHash({runs: [3, 7], metric: 'a/b', x: 'time'}),
        roundTrip: m.parseCompare(m.compareHash({runs: [3, 7], metric: 'a/b', x: 'time'}).split('?')[1]),
        seconds: [5, 10, 15, 30, 40, 99].map((s) => m.secondsAt(times, s)),
        none: m.secondsAt({steps: [], seconds: []}, 5),
        unknown: [m.runVerdict(null).verdict, m.runVerdict({trainer: null, groups: []}).verdict],
        mixed: m.runVerdict({trainer: {}, groups: [group('same', 3, []),
          group('warning', 1, [{name: 'sampling_defaults', severity: 'warning'}]),
          group('error', 2, [{name: 'vocab', severity: 'error'}, {name: 'runtime', severity: 'info'}])]}),
        same: m.runVerdict({trainer: {}, groups: [group('same', 4, [])]}),
        choices: m.metricChoices([[{key: 'loss'}, {key: 'b'}], [{key: 'loss'}, {key: 'a'}]]),
      };
    }""")
    assert got["parsed"] == {"runs": [3, 7], "metric": "a/b", "x": "step"}
    assert got["hash"] == "#/compare?runs=3,7&metric=a%2Fb&x=time"
    assert got["roundTrip"] == {"runs": [3, 7], "metric": "a/b", "x": "time"}
    assert got["seconds"] == [1, 1, 2, 3.5, 4, 4] and got["none"] is None
    assert got["unknown"] == ["unknown", "unknown"]
    assert got["mixed"] == {"verdict": "error", "text": "3 of 6 rollout worker(s) differ: vocab"}
    assert got["same"] == {"verdict": "same", "text": "all 4 rollout worker(s) match the trainer"}
    assert got["choices"] == [["loss"], ["a", "b"]]


def test_runs_compared_before_they_log_pick_up_their_first_metric(page, server):
    """Two runs that have just started: the page opens with no metric, and the first metric they
    log (a key with markup in it: text on the axis) is offered and drawn once they log it."""
    s = Seeder(server.url)
    key = "<i>kl</i> %{y}"
    fresh = [s.run(f"just-started-{i}", project="cmp-fresh") for i in range(2)]
    page.goto(f"{server.url}/#/compare?runs={fresh[0]['id']},{fresh[1]['id']}")
    expect(page.locator(".plot-placeholder")).to_have_text("These runs have no metric yet.")
    for run in fresh:
        s.metrics(run["id"], [0, 1, 2], {key: [0.3, 0.2, 0.1]})
    traces = page.wait_for_function(f"() => {{ const t = ({TRACES})(); return t && t.length === 2 ? t : null; }}",
                                    timeout=60_000).json_value()  # re-read every 10 s while live
    assert [t["y"] for t in traces] == [[0.3, 0.2, 0.1]] * 2
    expect(page.locator("#compare-metric")).to_have_value(key)
    expect(page.locator("[data-compare=plot] .ytitle")).to_have_text(key)
    assert page.locator("[data-compare=plot] .ytitle i").count() == 0
    assert page_problems(page)["errors"] == []
