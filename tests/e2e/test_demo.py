"""`paritywatch demo`: the story (healthy steps, then a worker with the wrong processor joins, the
alignment metrics jump, the alerts fire, the run pauses) as a user runs it from an empty folder,
the same run on the dashboard, a quiet --healthy run, and a stop that leaves no process behind."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from paritywatch.demo.run import STOP_TIMEOUT_S
from tests.browser.conftest import browser, new_page  # noqa: F401 - the browser fixture, for the run page test
from tests.support.live import ROOT, ProcessServer, free_port, wait_for

PARITYWATCH = str(Path(sys.executable).with_name("paritywatch"))
TODAYS_KEYS = {"run", "run_id", "run_state", "alerts", "dashboard"}
JUMPING_KEY = "align/prompt_rerender_mismatch_frac"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("demo-model") / "model"


@pytest.fixture(scope="module")
def story(tmp_path_factory, model_dir):
    """`paritywatch demo` in an empty folder, with the backend it starts itself. The wrong worker
    joins at step 100 (the earliest the story allows), not after 75% of --duration: the test waits
    for the story's steps, however fast this machine trains them; --duration only bounds it."""
    folder = tmp_path_factory.mktemp("demo-story")
    cmd = [PARITYWATCH, "demo", "--bad-worker-at", "100", "--duration", "400", "--port", str(free_port()),
           "--model-dir", str(model_dir)]
    out = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return folder, json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.fixture(scope="module")
def story_server(story):
    """The story's database served again, to read it back (the demo stopped its own backend)."""
    folder, _, _ = story
    with ProcessServer(f"sqlite:///{folder / 'paritywatch.db'}") as srv:
        yield srv


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_story_pauses_after_a_hundred_healthy_steps(story):
    folder, summary, stderr = story
    assert TODAYS_KEYS | {"last_step"} <= set(summary)
    assert summary["run_state"] == "paused"
    joined = summary["bad_worker_joined_at_step"]
    assert joined >= 100, summary
    assert summary["last_step"] >= joined
    mismatch = [a for a in summary["alerts"] if a["kind"] == "processor_mismatch"]
    assert mismatch and mismatch[0]["severity"] == "error" and "chat_template" in mismatch[0]["components"]
    assert mismatch[0]["step"] >= joined  # the marker lands where the worker joined, not at step 0
    # the console says what to click
    assert f"Open {summary['dashboard']}" in stderr and "Show diff" in stderr and JUMPING_KEY in stderr
    assert "Loading weights" not in stderr and "it/s]" not in stderr  # no library's progress bars among its lines
    assert (folder / "paritywatch.db").exists()  # from an empty folder: the default database


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_story_is_in_the_data(story, story_server):
    _, summary, _ = story
    api = f"{story_server.url}/api/v1/runs/{summary['run_id']}"
    keys = {k["key"]: k["count"] for k in httpx.get(f"{api}/metrics").json()["keys"]}
    assert keys["loss"] >= 100 and keys["reward"] >= 100  # real curves, not a point
    series = httpx.get(f"{api}/series", params={"key": JUMPING_KEY, "points": 4000}).json()["buckets"]
    first_bad = next(step for step, high in zip(series["step"], series["max"]) if high > 0)
    assert first_bad == summary["first_misaligned_step"]
    assert summary["bad_worker_joined_at_step"] <= first_bad <= summary["last_step"]
    assert all(high == 0 for step, high in zip(series["step"], series["max"]) if step < first_bad)
    parity = httpx.get(f"{api}/parity").json()
    assert sorted(g["verdict"] for g in parity["groups"]) == ["error", "same"]  # the two first workers, the new one


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(900)
def test_the_run_page_shows_the_change_where_the_worker_joined(story, story_server, browser):  # noqa: F811
    _, summary, _ = story
    page = new_page(browser)
    try:
        page.goto(f"{story_server.url}/#/runs/{summary['run_id']}")
        page.locator("[data-banner=mismatch]").wait_for()
        fig = page.locator(f"figure.chart[data-key='{JUMPING_KEY}']")
        fig.scroll_into_view_if_needed()  # charts are drawn when scrolled into view
        fig.locator(".annotation").first.wait_for()
        trace = fig.locator(".js-plotly-plot").evaluate(
            "el => { const t = el.data[el.data.length - 1]; return {x: Array.from(t.x), y: Array.from(t.y)}; }")
        jump = next(x for x, y in zip(trace["x"], trace["y"]) if y > 0)
        assert jump == summary["first_misaligned_step"]
        assert all(y == 0 for x, y in zip(trace["x"], trace["y"]) if x < jump) and len(trace["x"]) >= 100
        markers = fig.locator(".js-plotly-plot").evaluate("el => el.layout.annotations.filter((a) => a.xref === 'x').map((a) => a.x)")
        assert markers and all(summary["bad_worker_joined_at_step"] <= x <= summary["last_step"] for x in markers)
        loss = page.locator("figure.chart[data-key='loss'] .js-plotly-plot")
        loss.scroll_into_view_if_needed()
        loss.wait_for()
        assert loss.evaluate("el => el.data[el.data.length - 1].x.length") >= 100
    finally:
        page.context.close()


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    db = tmp_path_factory.mktemp("demo") / "demo.db"
    with ProcessServer(f"sqlite:///{db}") as srv:
        yield srv


@pytest.mark.slow
def test_healthy_run_raises_nothing_and_finishes(backend, model_dir):
    # 40 steps, however long this machine takes for them (the run ends when the trainer does).
    cmd = [sys.executable, "-m", "paritywatch.backend.cli", "demo", "--healthy", "--url", backend.url, "--steps", "40",
           "--duration", "300", "--model-dir", str(model_dir)]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["alerts"] == [] and summary["run_state"] == "finished"
    assert summary["bad_worker_joined_at_step"] is None
    keys = {k["key"] for k in httpx.get(f"{backend.url}/api/v1/runs/{summary['run_id']}/metrics").json()["keys"]}
    assert {JUMPING_KEY, "align/kl_k3", "loss", "reward", "grad_norm"} <= keys
    values = httpx.get(f"{backend.url}/api/v1/runs/{summary['run_id']}/series", params={"key": JUMPING_KEY}).json()["buckets"]["max"]
    assert values and max(values) == 0.0


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    def running(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:  # ended between the two calls
            return False

    return [p for p in procs if running(p)]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_stopped_demo_leaves_no_process_behind(tmp_path, model_dir, sig):
    """The backend, the trainer, every worker (the held-back one too) and multiprocessing's helper."""
    stderr = tmp_path / "demo.err"
    # As from a terminal: SIGINT at its default. A suite started in the background by a shell without
    # job control inherits SIGINT ignored, and Python then never turns it into KeyboardInterrupt.
    demo = subprocess.Popen([PARITYWATCH, "demo", "--port", str(free_port()), "--model-dir", str(model_dir)],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=stderr.open("wb"),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    children: list[psutil.Process] = []
    try:
        # backend + trainer + 2 workers + the held-back one + multiprocessing's resource tracker
        children = wait_for(lambda: (lambda c: c if len(c) >= 6 else None)(descendants(demo.pid)), timeout_s=240, interval_s=0.2)
        demo.send_signal(sig)
        sent = time.monotonic()
        try:
            code = demo.wait(timeout=120)
        except subprocess.TimeoutExpired:  # a demo that does not stop: say where it is stuck
            size = stderr.stat().st_size
            demo.send_signal(signal.SIGUSR1)  # faulthandler: every thread's stack to stderr
            wait_for(lambda: stderr.stat().st_size > size, timeout_s=10)
            pytest.fail(f"the demo did not stop within 120 s; its stderr ends:\n{stderr.read_text()[-6000:]}")
        assert code == {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: 130}[sig]
        # The processes were still importing torch: they are terminated at once, not waited for
        # (before: every stop waited out the 20 s goodbye).
        assert time.monotonic() - sent < STOP_TIMEOUT_S
        wait_for(lambda: not alive(children), timeout_s=30, interval_s=0.2)
    finally:  # whatever happened, end what this test started (by pid, never by name)
        for p in alive(children + descendants(demo.pid)):
            with contextlib.suppress(psutil.NoSuchProcess):  # it may end between the two calls
                p.kill()
        if demo.poll() is None:
            demo.kill()
            demo.wait()


def test_a_backend_that_requires_a_token_is_explained_not_a_traceback(tmp_path):
    """A user who once created a token for `make serve` runs the demo against that backend without
    PARITYWATCH_TOKEN: the demo says what to do, before it builds or starts anything."""
    db = f"sqlite:///{tmp_path / 'tokens.db'}"
    made = subprocess.run([PARITYWATCH, "token", "create", "--scope", "admin", "--name", "me", "--db", db],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    env = {k: v for k, v in os.environ.items() if k != "PARITYWATCH_TOKEN"}
    with ProcessServer(db) as srv:
        out = subprocess.run([PARITYWATCH, "demo", "--url", srv.url, "--duration", "5", "--model-dir",
                              str(tmp_path / "model")], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "PARITYWATCH_TOKEN" in out.stderr and "--db" in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "model").exists()  # nothing built
