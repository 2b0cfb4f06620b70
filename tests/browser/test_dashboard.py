"""The dashboard in a real browser against a real server (issue 6, "Done when")."""
from __future__ import annotations

import re
import threading

import httpx
import pytest
from playwright.sync_api import expect

from tests.browser.conftest import ROOT, drawn_chart, new_page, page_problems
from tests.support.live import wait_for
from tests.browser.seed import Seeder, processor_fingerprints, seed_big_run, seed_clean_run, seed_mismatch_run

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def seeded(server, tmp_path_factory):
    s = Seeder(server.url)
    fps = processor_fingerprints(tmp_path_factory.mktemp("tokenizers"))
    clean = seed_clean_run(s, "grpo-llama8b-code", fps[0])
    run = s.run("grpo-qwen7b-math")
    # Alert only (no auto-pause): the test presses pause itself.
    httpx.put(f"{server.url}/api/v1/runs/{run['id']}/settings", json={"on_mismatch": "alert"}).raise_for_status()
    run = seed_mismatch_run(s, "grpo-qwen7b-math", fps)
    # The built-in align/prompt_rerender_mismatch_frac rule pauses on the seeded metrics: start running.
    control = httpx.get(f"{server.url}/api/v1/runs/{run['id']}/control").json()
    if control["state"] != "running":
        s.post(f"/runs/{run['id']}/control", {"action": "resume", "reason": "test setup", "actor": "test"})
    return {"mismatch": run, "clean": clean, "seeder": s}


class TrainingLoop:
    """A training loop in a thread that calls the real hook, `ParityMonitor.wait_if_paused()`, every step."""

    def __init__(self, url: str, run_id: int, spool_dir):
        from trainer_hooks.monitor import ParityMonitor

        self.monitor = ParityMonitor(run_id, side="trainer", url=url, worker_id="trainer-rank0",
                                     spool_dir=spool_dir, heartbeat_interval_s=1.0, poll_timeout_s=5.0)
        self.steps = 0
        self.held = 0  # times wait_if_paused() held the loop for its whole timeout (still paused)
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set() and not self.monitor.should_stop:
            released = self.monitor.wait_if_paused(timeout=0.3)
            with self._changed:
                if released:
                    self.steps += 1
                else:
                    self.held += 1
                self._changed.notify_all()
            self._stop.wait(0.02)  # the step's "work"

    def progressing(self, steps: int = 3, timeout: float = 10.0) -> bool:
        """True once the loop ran `steps` more steps."""
        with self._changed:
            before = self.steps
            return self._changed.wait_for(lambda: self.steps >= before + steps, timeout)

    def held_back(self, times: int = 2, timeout: float = 10.0) -> bool:
        """True once wait_if_paused() held the loop `times` more times in a row with no step run."""
        with self._changed:
            steps, held = self.steps, self.held
            self._changed.wait_for(lambda: self.steps != steps or self.held >= held + times, timeout)
            return self.steps == steps and self.held >= held + times

    def close(self) -> None:
        self._stop.set()
        self.monitor.close(timeout=2)
        self.thread.join(5)


def test_mismatch_is_visible_explained_and_one_click_from_pausing(page, server, seeded, screenshots, tmp_path):
    run = seeded["mismatch"]
    page.goto(f"{server.url}/#/runs")
    row = page.locator(f"tr[data-run-name='{run['name']}']")
    row.wait_for()
    # expect() retries until the page has rendered it; a bare inner_text() would race the renders.
    expect(row.locator(".alerts-cell")).to_contain_text("error")
    expect(row).to_contain_text("32 workers")
    expect(row).to_contain_text("ago")
    page.screenshot(path=str(screenshots / "runs-list.png"), full_page=True)

    row.locator("a.run-link").click()
    page.wait_for_url(re.compile(rf"#/runs/{run['id']}$"))
    banner = page.locator("[data-banner=mismatch]")
    banner.wait_for()
    expect(banner).to_contain_text("Processor mismatch")
    expect(banner).to_contain_text("chat_template")
    expect(page.locator(".group-head", has_text="31 workers — same as trainer")).to_have_count(1)
    cell = page.locator("tr[data-component=chat_template] td[data-state=differs]")
    expect(cell).to_contain_text("differs")
    expect(cell).to_have_attribute("data-severity", "error")
    expect(page.locator("tr[data-component=chat_template] td[data-state=same]")).to_have_count(1)  # the 31 good workers
    page.locator(".alert-item[data-kind=processor_mismatch]").wait_for()
    page.screenshot(path=str(screenshots / "run-mismatch.png"), full_page=False)

    cell.locator("button").click()
    diff = page.locator("dialog[open] details[data-component=chat_template][open]")
    diff.wait_for()
    rollout_side = diff.locator("td.add").all_inner_texts()
    assert any("<script>window.__pwned = 'script';</script><img src=x onerror=" in t for t in rollout_side), rollout_side
    expect(diff.locator("td.add mark")).not_to_have_count(0)  # the changed part is highlighted
    # Special tokens, eos ids and vocab size are explained too.
    dialog = page.locator("dialog[open]")
    assert dialog.locator("details[data-component=generation_eos]").count() == 1
    dialog.locator("details[data-component=generation_eos] summary").click()
    eos = dialog.locator("details[data-component=generation_eos] table").inner_text()
    assert "[2,3]" in eos.replace(" ", "") and "[2]" in eos.replace(" ", "")
    page.screenshot(path=str(screenshots / "mismatch-diff.png"), full_page=False)
    # Nothing from the template ran or became an element.
    assert page.evaluate("window.__pwned") is None
    assert page.evaluate("document.querySelectorAll('img[src=x], dialog script').length") == 0
    page.keyboard.press("Escape")

    loop = TrainingLoop(server.url, run["id"], tmp_path / "spool")
    try:
        wait_for(lambda: loop.monitor.state == "running", what="the hook to see 'running'")
        assert loop.progressing()
        page.locator(".controls button[data-action=pause]").click()
        page.locator("dialog[open] textarea").fill("chat template mismatch on vllm-default-tok")
        page.locator("dialog[open] button[type=submit]").click()
        page.locator(".controls .state[data-state=paused]").wait_for()
        meta = page.locator(".control-meta").inner_text()
        assert "by " in meta and "chat template mismatch on vllm-default-tok" in meta
        assert page.locator(".controls button[data-action=pause]").is_disabled()
        wait_for(lambda: loop.monitor.state == "paused", timeout_s=10, what="the hook to see 'paused'")
        assert loop.held_back(), "the hook kept training while paused"
        page.screenshot(path=str(screenshots / "run-paused.png"), full_page=False)

        page.locator(".controls button[data-action=resume]").click()
        page.locator("dialog[open] textarea").fill("fixed the worker's processor")
        page.locator("dialog[open] button[type=submit]").click()
        page.locator(".controls .state[data-state=running]").wait_for()
        wait_for(lambda: loop.monitor.state == "running", timeout_s=10, what="the hook to see 'running' again")
        assert loop.progressing()
    finally:
        loop.close()
    assert page_problems(page) == {"csp": [], "errors": []}


def test_alert_acknowledge_and_resolve(page, server, seeded):
    s: Seeder = seeded["seeder"]
    run = s.run("ack-resolve")
    httpx.put(f"{server.url}/api/v1/runs/{run['id']}/settings", json={"on_mismatch": "alert"}).raise_for_status()
    s.post(f"/runs/{run['id']}/rules", {"key": "loss", "aggregate": "last", "window": 1, "comparison": ">",
                                       "threshold": 5.0, "consecutive": 1, "severity": "warning", "action": "alert"})
    s.metrics(run["id"], list(range(10)), {"loss": [1.0] * 9 + [9.0]})
    page.goto(f"{server.url}/#/runs/{run['id']}")
    item = page.locator(".alert-item[data-kind=metric_threshold]")
    item.wait_for()
    item.locator("button[data-action=acknowledge]").click()
    page.locator(".alert-item.status-acknowledged").wait_for()
    page.locator(".alert-item button[data-action=resolve]").click()
    page.locator(".alerts", has_text="No open alerts").wait_for()
    page.locator(".alerts input[type=checkbox]").check()
    resolved = page.locator(".alert-item.status-resolved")
    for _ in range(5):  # bounded: a live re-render can replace the item between locating and clicking it
        resolved.locator(".history summary").click()
        if resolved.locator(".history").evaluate("d => d.open"):
            break
    events = resolved.locator(".events")
    events.locator("li", has_text="resolved").wait_for()
    assert "acknowledged" in events.inner_text()
    # A new alert re-renders the list live; the history the user opened stays open.
    s.metrics(run["id"], [10], {"loss": [9.5]})
    page.locator(".alert-item.status-firing[data-kind=metric_threshold]").wait_for()
    assert resolved.locator(".history").evaluate("d => d.open"), "the opened history closed on a live update"
    events.locator("li", has_text="resolved").wait_for()


def test_charts_render_200k_points_downsampled_zoom_and_live(page, server, screenshots):
    s = Seeder(server.url)
    run = seed_big_run(s, "long-run-200k", 200_000)
    s.post(f"/runs/{run['id']}/rules", {"key": "loss", "aggregate": "last", "window": 1, "comparison": ">",
                                       "threshold": 1.25, "consecutive": 1, "severity": "warning", "action": "alert"})
    page.goto(f"{server.url}/#/runs/{run['id']}")
    chart = drawn_chart(page, "loss")
    info = chart.evaluate("""f => { const gd = f.querySelector('.js-plotly-plot');
        const last = gd.data.find(t => t.name === 'last');
        return {n: last.x.length, width: gd.querySelector('.main-svg').clientWidth, buckets: +f.dataset.buckets,
                total: +f.dataset.total, width_steps: +f.dataset.bucketWidth,
                shapes: (gd.layout.shapes || []).map(s => s.y0)}; }""")
    assert info["total"] == 200_000
    assert info["n"] == info["buckets"]
    assert 100 <= info["n"] <= info["width"], info  # downsampled by the server to the chart's width
    assert 1.25 in info["shapes"]  # the rule threshold is drawn
    page.screenshot(path=str(screenshots / "charts-200k.png"), full_page=False)

    chart.evaluate("f => Plotly.relayout(f.querySelector('.js-plotly-plot'), {'xaxis.range': [1000, 3000]})")
    page.locator("figure.chart[data-key=loss][data-zoomed=true]").wait_for()
    zoomed = chart.evaluate("f => { const t = f.querySelector('.js-plotly-plot').data.find(t => t.name === 'last'); "
                            "return {w: +f.dataset.bucketWidth, lo: Math.min(...t.x), hi: Math.max(...t.x)}; }")
    assert zoomed["w"] < info["width_steps"], (zoomed, info)  # finer buckets fetched
    assert 1000 <= zoomed["lo"] and zoomed["hi"] <= 3000

    chart.evaluate("f => Plotly.relayout(f.querySelector('.js-plotly-plot'), {'xaxis.autorange': true})")
    page.locator("figure.chart[data-key=loss][data-zoomed=false]").wait_for()
    s.metrics(run["id"], list(range(200_000, 201_000)), {"loss": [0.5] * 1000})
    page.locator("figure.chart[data-key=loss][data-total='201000']").wait_for(timeout=15_000)  # appended live
    assert page_problems(page) == {"csp": [], "errors": []}


def test_csp_header_and_no_inline_script(server):
    res = httpx.get(f"{server.url}/")
    csp = res.headers["content-security-policy"]
    script_src = re.search(r"script-src ([^;]+)", csp).group(1)
    assert "'self'" in script_src and "unsafe-inline" not in script_src and "unsafe-eval" not in script_src
    html = res.text
    for tag in re.findall(r"<script\b[^>]*>", html):
        assert "src=" in tag, f"inline script: {tag}"
    assert not re.search(r"\son[a-z]+\s*=", html), "inline event handler in index.html"
    for js in (ROOT / "frontend" / "static").glob("*.js"):
        code = js.read_text()
        for banned in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert banned not in code, f"{js.name} uses {banned}"


def test_backend_down_shows_a_clear_error_then_recovers(page, server, seeded):
    page.route("**/api/v1/**", lambda route: route.abort())
    page.goto(f"{server.url}/#/runs")
    err = page.locator(".error-state[data-status='0']")
    err.wait_for()
    assert "Backend unreachable" in err.inner_text()
    page.unroute("**/api/v1/**")
    err.locator("button", has_text="Retry").click()
    page.locator("tr[data-run-name]").first.wait_for()


def test_phone_width_has_no_horizontal_scroll(browser, server, seeded, screenshots):
    pg = new_page(browser, 390, 844)
    try:
        pg.goto(f"{server.url}/#/runs")
        pg.locator("tr[data-run-name]").first.wait_for()
        assert pg.evaluate("document.documentElement.scrollWidth") <= 390
        pg.screenshot(path=str(screenshots / "runs-list-phone.png"), full_page=True)
        pg.goto(f"{server.url}/#/runs/{seeded['mismatch']['id']}")
        pg.locator("[data-banner=mismatch]").wait_for()
        pg.locator("figure.chart").first.scroll_into_view_if_needed()  # charts draw lazily, when visible
        pg.locator("figure.chart[data-buckets]").first.wait_for()
        pg.evaluate("() => window.scrollTo(0, 0)")
        assert pg.evaluate("document.documentElement.scrollWidth") <= 390
        pg.screenshot(path=str(screenshots / "run-mismatch-phone.png"), full_page=False)
    finally:
        pg.context.close()


def test_sign_in_with_token_and_read_only_controls(page, token_server):
    srv, tokens = token_server
    page.goto(f"{srv.url}/#/runs")
    page.locator(".error-state[data-status='401']").wait_for()
    page.goto(f"{srv.url}/#/signin")
    page.fill("#token", "not-a-token")
    page.click("form.signin button[type=submit]")
    page.locator("form.signin .form-error", has_text="unknown or revoked").wait_for()
    page.fill("#token", tokens["read"])
    page.click("form.signin button[type=submit]")
    page.locator("tr[data-run-name=token-run] a").click()
    page.locator(".controls .state").wait_for()
    assert page.locator(".controls button[data-action=pause]").is_disabled()
    assert "admin scope" in page.locator(".controls").inner_text()
    assert page.evaluate("sessionStorage.getItem('paritywatch.token')") == tokens["read"]
    assert "viewer" in page.locator("#identity").inner_text()
