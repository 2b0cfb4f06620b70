"""ParityMonitor against the real backend over real HTTP (tests/hooks/conftest.py starts it)."""
from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.hooks.conftest import ROOT, Backend
from trainer_hooks.monitor import ParityMonitor
from trainer_hooks.worker import DROPPED_KEY


def _wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_points_arrive_once_with_the_component_registered_and_beating(backend: Backend, spool_dir: Path) -> None:
    with ParityMonitor("basic", side="trainer", url=backend.url, spool_dir=spool_dir,
                       heartbeat_interval_s=0.2, tags={"model": "tiny"}) as monitor:
        for step in range(300):
            monitor.log({"loss": 1.0 / (step + 1), "lr": 1e-4}, step)
        monitor.log({"loss": float("nan")}, 300)  # not finite: skipped, not an error
        assert monitor.flush(10.0)
        assert _wait_until(lambda: monitor.stats()["heartbeats"] >= 2)
    run = backend.get(f"/runs/{backend.run_id('basic')}")
    assert backend.counts(run["id"]) == {"loss": 300, "lr": 300}
    assert run["tags"] == {"model": "tiny"} and run["last_step"] == 299
    [component] = run["components"]
    assert component["side"] == "trainer" and component["pid"] == os.getpid()
    assert component["last_heartbeat"] is not None


def test_done_when_backend_down_10s_during_5000_logs(own_backend: Backend, spool_dir: Path) -> None:
    """Every point arrives exactly once across a 10 s outage; no log() call blocked > 1 ms.

    "Blocked" is told apart from "preempted": each call's voluntary context switches (the thread
    waited on a lock, the GIL or I/O) must be zero, and a call over 1 ms of wall time is only
    allowed when the kernel preempted the thread (involuntary switch) on these shared cores."""
    monitor = ParityMonitor("outage", url=own_backend.url, spool_dir=spool_dir, max_backoff_s=2.0)
    run_id = own_backend.run_id("outage")
    outage = threading.Thread(target=_outage, args=(own_backend, 10.0))
    calls = []
    gc.collect()
    gc.freeze()  # a full collection of pytest's own objects is the host's pause, not log()'s
    try:
        for step in range(5000):
            if step == 1000:
                outage.start()
            before = resource.getrusage(resource.RUSAGE_THREAD)
            start = time.perf_counter_ns()
            monitor.log({"train/loss": 1.0 / (step + 1)}, step)
            elapsed = time.perf_counter_ns() - start
            after = resource.getrusage(resource.RUSAGE_THREAD)
            calls.append((elapsed, after.ru_nvcsw - before.ru_nvcsw, after.ru_nivcsw - before.ru_nivcsw))
            time.sleep(0.004)  # a (very fast) training step
    finally:
        gc.unfreeze()
    outage.join()
    assert monitor.stats()["spooled_batches"] > 0, "the outage did not overlap the logging"
    assert monitor.flush(60.0), monitor.stats()
    assert own_backend.wait_for_count(run_id, "train/loss", 5000) == 5000
    monitor.close()
    assert monitor.stats()["dropped_points"] == 0
    durations = sorted(elapsed for elapsed, _, _ in calls)
    slow = [call for call in calls if call[0] > 1_000_000]
    print(f"log(): median {durations[2500]} ns, slowest {durations[-5:]} ns, over 1 ms: {slow}")
    assert [call for call in calls if call[1]] == [], "log() blocked (voluntary context switch)"
    assert [call for call in slow if not call[2]] == [], "log() took > 1 ms without being preempted"


def _outage(backend: Backend, seconds: float) -> None:
    """SIGTERM (uvicorn stops accepting at once), down for `seconds` from then, start again."""
    started = time.monotonic()
    backend.stop(signal.SIGTERM, timeout=5.0)
    time.sleep(max(0.0, seconds - (time.monotonic() - started)))
    backend.start()
    print(f"outage: unreachable for {time.monotonic() - started:.1f}s")


def test_a_killed_backend_mid_stream_loses_and_duplicates_nothing(own_backend: Backend, spool_dir: Path) -> None:
    monitor = ParityMonitor("killed", url=own_backend.url, spool_dir=spool_dir, max_backoff_s=1.0,
                            flush_interval_s=0.05)
    run_id = own_backend.run_id("killed")
    for step in range(2000):
        monitor.log({"loss": float(step)}, step)
        if step == 700:
            own_backend.stop(signal.SIGKILL)
        if step == 1400:
            own_backend.start()
        if step % 20 == 0:
            time.sleep(0.01)
    assert monitor.flush(60.0), monitor.stats()
    assert own_backend.wait_for_count(run_id, "loss", 2000) == 2000
    monitor.close()


def test_pause_blocks_wait_if_paused_resume_releases_and_stop_sets_should_stop(backend: Backend, spool_dir: Path) -> None:
    monitor = ParityMonitor("control", url=backend.url, spool_dir=spool_dir)
    run_id = backend.run_id("control")
    assert _wait_until(lambda: monitor.state == "running")
    backend.post(f"/runs/{run_id}/control", {"action": "pause", "reason": "test"})
    assert _wait_until(lambda: monitor.state == "paused", timeout=5.0)

    released = threading.Event()
    waiter = threading.Thread(target=lambda: (monitor.wait_if_paused(), released.set()), daemon=True)
    waiter.start()
    assert not released.wait(1.0), "wait_if_paused returned while paused"
    assert monitor.wait_if_paused(timeout=0.1) is False
    paused_at = time.monotonic()
    backend.post(f"/runs/{run_id}/control", {"action": "resume"})
    assert released.wait(5.0)
    assert time.monotonic() - paused_at < 2.0  # the long-poll answers at once, no polling delay
    assert not monitor.should_stop

    backend.post(f"/runs/{run_id}/control", {"action": "stop", "reason": "enough"})
    assert _wait_until(lambda: monitor.should_stop, timeout=5.0)
    assert monitor.state == "stopping"
    assert monitor.wait_if_paused(timeout=0.1) is True
    rollout = ParityMonitor("control", side="rollout", url=backend.url, spool_dir=spool_dir)
    assert _wait_until(lambda: rollout.state == "stopping", timeout=5.0)
    rollout.close()  # a rollout worker does not answer for the run
    assert backend.get(f"/runs/{run_id}/control")["state"] == "stopping"
    monitor.close()  # the loop ended: the trainer reports it and the stop completes
    control = backend.get(f"/runs/{run_id}/control")
    assert control["state"] == "stopped" and control["actor"].startswith("trainer ")


def test_a_stop_issued_while_paused_releases_the_loop(backend: Backend, spool_dir: Path) -> None:
    monitor = ParityMonitor("pause-then-stop", url=backend.url, spool_dir=spool_dir)
    run_id = backend.run_id("pause-then-stop")
    assert _wait_until(lambda: monitor.state == "running")
    backend.post(f"/runs/{run_id}/control", {"action": "pause"})
    assert _wait_until(lambda: monitor.state == "paused", timeout=5.0)
    threading.Timer(0.5, backend.post, args=(f"/runs/{run_id}/control", {"action": "stop"})).start()
    assert monitor.wait_if_paused(timeout=10.0) is True
    assert monitor.should_stop
    monitor.close()


def _log_in_child(monitor: ParityMonitor, key: str, points: int) -> None:
    for step in range(points):
        monitor.log({key: float(step)}, step)
    if not monitor.close(timeout=20.0):
        sys.exit(3)


def test_a_monitor_works_in_a_spawned_child(backend: Backend, spool_dir: Path) -> None:
    parent = ParityMonitor("spawned", side="rollout", url=backend.url, spool_dir=spool_dir, worker_id="w0")
    child = multiprocessing.get_context("spawn").Process(target=_log_in_child, args=(parent, "child/x", 50))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    parent.close()
    run = backend.get(f"/runs/{backend.run_id('spawned')}")
    assert backend.counts(run["id"]) == {"child/x": 50}
    assert [c["pid"] for c in run["components"]] == [child.pid]  # same worker id: upserted by the child


def _log_in_forked_child(monitor: ParityMonitor) -> None:
    for step in range(30):
        monitor.log({"fork/x": float(step)}, step)
    # no close(): multiprocessing's exit finalizer must flush the child's monitor


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_a_forked_child_restarts_the_worker_and_never_resends_the_parents_points(backend: Backend, spool_dir: Path) -> None:
    monitor = ParityMonitor("forked", url=backend.url, spool_dir=spool_dir, flush_interval_s=5.0)
    for step in range(20):
        monitor.log({"parent/x": float(step)}, step)  # still queued when the child forks
    child = multiprocessing.get_context("fork").Process(target=_log_in_forked_child, args=(monitor,))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert monitor.close(timeout=20.0)
    run = backend.get(f"/runs/{backend.run_id('forked')}")
    assert backend.counts(run["id"]) == {"parent/x": 20, "fork/x": 30}
    assert {c["pid"] for c in run["components"]} == {os.getpid(), child.pid}


CRASHING_CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from trainer_hooks.monitor import ParityMonitor
    url, spool_dir = sys.argv[1], sys.argv[2]
    monitor = ParityMonitor("crash", url=url, spool_dir=spool_dir, worker_id="w1")
    for step in range(100):
        monitor.log({"loss": float(step)}, step)
    assert monitor.flush(20.0)
    print("sent", flush=True)
    sys.stdin.readline()  # the test stops the backend meanwhile
    for step in range(100, 250):
        monitor.log({"loss": float(step)}, step)
    while monitor.stats()["queued"] or monitor._worker._busy:
        time.sleep(0.05)
    print("spooled", monitor.stats()["spooled_batches"], flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_new_monitor_replays_the_spool_of_a_crashed_process(own_backend: Backend, spool_dir: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", CRASHING_CHILD, own_backend.url, str(spool_dir)],
                             cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "sent"
    own_backend.stop(signal.SIGKILL)
    child.stdin.write("go\n")
    child.stdin.flush()
    spooled = child.stdout.readline().split()
    assert spooled[0] == "spooled" and int(spooled[1]) > 0
    child.wait(10)
    assert child.returncode == -signal.SIGKILL
    own_backend.start()

    with ParityMonitor("crash", url=own_backend.url, spool_dir=spool_dir, worker_id="w1") as survivor:
        assert survivor.flush(30.0)
        assert survivor.stats()["replayed_batches"] == int(spooled[1])
    assert own_backend.counts(own_backend.run_id("crash")) == {"loss": 250}
    assert list(spool_dir.glob("*.jsonl")) == []


def test_drops_are_reported_as_a_metric_when_the_spool_is_full(own_backend: Backend, spool_dir: Path) -> None:
    own_backend.stop(signal.SIGKILL)
    monitor = ParityMonitor("drops", url=own_backend.url, spool_dir=spool_dir, spool_max_bytes=1,
                            flush_interval_s=0.05, max_backoff_s=0.5)
    for step in range(10):
        monitor.log({"loss": 1.0, "kl": 0.0}, step)
    assert _wait_until(lambda: monitor.stats()["spool_dropped_points"] == 20)
    own_backend.start()
    run_id = own_backend.run_id("drops")

    def reported() -> float | None:
        if DROPPED_KEY not in own_backend.counts(run_id):
            return None
        return own_backend.get(f"/runs/{run_id}/series", key=DROPPED_KEY, points=10)["buckets"]["last"][-1]

    assert _wait_until(lambda: reported() is not None, timeout=20.0)
    monitor.close()
    assert reported() == 20.0  # the report's own lost copies are not counted as drops
    assert "loss" not in own_backend.counts(run_id)


def test_a_rejected_batch_is_not_retried_and_logged_once(backend: Backend, spool_dir: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="paritywatch")
    with ParityMonitor(987654, url=backend.url, spool_dir=spool_dir, flush_interval_s=0.05) as monitor:
        for step in range(3):
            monitor.log({"loss": 1.0}, step)
            assert monitor.flush(5.0)
        stats = monitor.stats()
    assert stats["rejected_points"] == 3 and stats["spooled_batches"] == 0
    rejections = [r for r in caplog.records if "rejected a metric batch" in r.getMessage()]
    assert len(rejections) == 1 and "404" in rejections[0].getMessage()


def test_register_fingerprint_sends_the_digest_first_and_the_object_once(backend: Backend, spool_dir: Path) -> None:
    fingerprint_processor = pytest.importorskip("trainer_hooks.fingerprint").fingerprint_processor
    from tests.fixtures.tokenizers import build_chatml_tokenizer
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(build_chatml_tokenizer(spool_dir.parent / "tok"))
    monitors = [ParityMonitor("fp", side=side, url=backend.url, spool_dir=spool_dir, worker_id=side)
                for side in ("trainer", "rollout")]
    futures = [m.register_processor(tokenizer) for m in monitors]
    digests = {future.result(timeout=60)["digest"] for future in futures}
    for monitor in monitors:
        assert monitor.flush(20.0)
        assert monitor.stats()["fingerprints_posted"] == 1
        monitor.close()
    run = backend.get(f"/runs/{backend.run_id('fp')}")
    assert {c["fingerprint_digest"] for c in run["components"]} == digests and len(digests) == 1
    assert backend.get(f"/fingerprints/{digests.pop()}")["digest"]
