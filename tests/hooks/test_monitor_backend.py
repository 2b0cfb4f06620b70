"""ParityMonitor against the real backend over real HTTP (tests/hooks/conftest.py starts it)."""
from __future__ import annotations

import gc
import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.hooks.conftest import ROOT, Backend, free_port
from tests.support.live import wait_for
from trainer_hooks.contract import dropped_points_key
from trainer_hooks.monitor import ParityMonitor
from trainer_hooks.worker import Worker
from trainer_hooks.settings import HookSettings


def test_points_arrive_once_with_the_component_registered_and_beating(backend: Backend, spool_dir: Path) -> None:
    with ParityMonitor("basic", side="trainer", url=backend.url, spool_dir=spool_dir,
                       heartbeat_interval_s=0.2, tags={"model": "tiny"}) as monitor:
        for step in range(300):
            monitor.log({"loss": 1.0 / (step + 1), "lr": 1e-4}, step)
        monitor.log({"loss": float("nan")}, 300)  # not finite: skipped, not an error
        assert monitor.flush(10.0)
        wait_for(lambda: monitor.stats()["heartbeats"] >= 2)
    run = backend.get(f"/runs/{backend.run_id('basic')}")
    assert backend.counts(run["id"]) == {"loss": 300, "lr": 300}
    assert run["tags"] == {"model": "tiny"} and run["last_step"] == 299
    [component] = run["components"]
    assert component["side"] == "trainer" and component["pid"] == os.getpid()
    assert component["last_heartbeat"] is not None


def test_done_when_backend_down_10s_during_5000_logs(own_backend: Backend, spool_dir: Path) -> None:
    """Every point arrives exactly once across a 10 s outage; no log() call blocked or worked > 1 ms.

    Judged by what each call runs, not by the clock: on these shared cores a call can take 2 ms of
    wall time with no switch at all (the virtual CPU paused), a thread made to hand over the GIL
    mid-call counts a voluntary switch that is not log()'s doing, and on a loaded machine one call
    in thousands is charged 10 ms of its thread's CPU time while it ran three O(1) built-ins (all
    seen in CI). So a profiler records every built-in log() calls (all must be ones that cannot
    wait: no lock, no I/O, no sleep), a tracer counts the bytecodes each call executes (bounded,
    and no more during the outage than before it), and the thread's CPU time is judged at the 99th
    percentile only."""
    monitor = ParityMonitor("outage", url=own_backend.url, spool_dir=spool_dir, max_backoff_s=2.0)
    run_id = own_backend.run_id("outage")
    outage = threading.Thread(target=_outage, args=(own_backend, 10.0))
    cpu_ns, bytecodes = [], []
    builtins: Counter = Counter()
    executed = 0

    def record_builtin_calls(frame, event, arg) -> None:
        if event == "c_call" and arg is not sys.setprofile:
            builtins[arg.__qualname__] += 1

    def count_bytecodes(frame, event, arg):
        nonlocal executed
        frame.f_trace_opcodes = True
        if event == "opcode":
            executed += 1
        return count_bytecodes

    gc.collect()
    gc.freeze()  # a full collection of pytest's own objects is the host's pause, not log()'s
    # and none runs during the loop: a collection inside log() would run other packages' gc
    # callbacks on this thread, which the profiler would charge to log() (hypothesis's, seen in CI).
    gc.disable()
    try:
        for step in range(5000):
            if step == 1000:
                outage.start()
            metrics = {"train/loss": 1.0 / (step + 1)}
            executed, cpu_start = 0, time.thread_time_ns()
            sys.settrace(count_bytecodes)
            sys.setprofile(record_builtin_calls)
            monitor.log(metrics, step)
            sys.setprofile(None)
            sys.settrace(None)
            cpu_ns.append(time.thread_time_ns() - cpu_start)
            bytecodes.append(executed)
            time.sleep(0.004)  # the training step itself (the workload, not a synchronisation)
    finally:
        sys.setprofile(None)
        sys.settrace(None)
        gc.enable()
        gc.unfreeze()
    outage.join()
    assert monitor.stats()["spooled_batches"] > 0, "the outage did not overlap the logging"
    assert monitor.flush(60.0), monitor.stats()
    monitor.close()  # nothing can be sent after this: the counts below are final
    assert own_backend.counts(run_id)["train/loss"] == 5000
    assert monitor.stats()["dropped_points"] == 0
    cpu = sorted(cpu_ns)
    print(f"log(): CPU median {cpu[2500]} ns, p99 {cpu[4950]} ns, slowest {cpu[-5:]} ns; bytecodes "
          f"{min(bytecodes)}..{max(bytecodes)}; built-ins called: {dict(builtins)}")
    assert set(builtins) <= CANNOT_WAIT, f"log() called what may block: {set(builtins) - CANNOT_WAIT}"
    assert max(bytecodes) <= LOG_BYTECODES_MAX, f"a log() call executed {max(bytecodes)} bytecodes"
    assert max(bytecodes[1000:]) <= max(bytecodes[:1000]), "log() did more work during and after the outage"
    assert cpu[4950] < 1_000_000, f"log() used {cpu[4950]} ns of CPU at the 99th percentile"


# The built-ins log() may call (sys.setprofile's c_call events): none can wait. A new one in log()
# must be added here knowingly; a lock, a socket call, an Event.set or a sleep never belongs.
CANNOT_WAIT = {"len", "deque.append", "getpid"}
# Bytecodes one log() call may execute: a few dozen today. Even 300 run in well under 0.1 ms; a
# log() that encoded, copied or wrote out its queue would run thousands.
LOG_BYTECODES_MAX = 300


def _outage(backend: Backend, seconds: float) -> None:
    """SIGTERM (uvicorn stops accepting at once), down for `seconds` from then, start again."""
    started = time.monotonic()
    backend.stop(signal.SIGTERM, timeout=5.0)
    time.sleep(max(0.0, seconds - (time.monotonic() - started)))  # the outage's length: the scenario itself
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
            time.sleep(0.01)  # training steps take time (the workload, not a synchronisation)
    assert monitor.flush(60.0), monitor.stats()
    monitor.close()  # nothing can be sent after this: the count below is final
    assert own_backend.counts(run_id)["loss"] == 2000


def test_pause_blocks_wait_if_paused_resume_releases_and_stop_sets_should_stop(backend: Backend, spool_dir: Path) -> None:
    monitor = ParityMonitor("control", url=backend.url, spool_dir=spool_dir)
    run_id = backend.run_id("control")
    wait_for(lambda: monitor.state == "running")
    backend.post(f"/runs/{run_id}/control", {"action": "pause", "reason": "test"})
    wait_for(lambda: monitor.state == "paused", timeout_s=5.0)

    released = threading.Event()
    waiter = threading.Thread(target=lambda: (monitor.wait_if_paused(), released.set()), daemon=True)
    waiter.start()
    assert monitor.wait_if_paused(timeout=0.1) is False  # paused: a bounded wait runs out
    assert not released.is_set(), "wait_if_paused returned while paused"
    paused_at = time.monotonic()
    backend.post(f"/runs/{run_id}/control", {"action": "resume"})
    assert released.wait(5.0)
    assert time.monotonic() - paused_at < 2.0  # the long-poll answers at once, no polling delay
    assert not monitor.should_stop

    backend.post(f"/runs/{run_id}/control", {"action": "stop", "reason": "enough"})
    wait_for(lambda: monitor.should_stop, timeout_s=5.0)
    assert monitor.state == "stopping"
    assert monitor.wait_if_paused(timeout=0.1) is True
    rollout = ParityMonitor("control", side="rollout", url=backend.url, spool_dir=spool_dir)
    wait_for(lambda: rollout.state == "stopping", timeout_s=5.0)
    rollout.close()  # a rollout worker does not answer for the run
    assert backend.get(f"/runs/{run_id}/control")["state"] == "stopping"
    monitor.close()  # the loop ended: the trainer reports it and the stop completes
    control = backend.get(f"/runs/{run_id}/control")
    assert control["state"] == "stopped" and control["actor"].startswith("trainer ")


def test_a_stop_issued_while_paused_releases_the_loop(backend: Backend, spool_dir: Path) -> None:
    monitor = ParityMonitor("pause-then-stop", url=backend.url, spool_dir=spool_dir)
    run_id = backend.run_id("pause-then-stop")
    wait_for(lambda: monitor.state == "running")
    backend.post(f"/runs/{run_id}/control", {"action": "pause"})
    wait_for(lambda: monitor.state == "paused", timeout_s=5.0)
    outcome: list[bool] = []
    waiter = threading.Thread(target=lambda: outcome.append(monitor.wait_if_paused(timeout=30.0)), daemon=True)
    waiter.start()
    assert monitor.wait_if_paused(timeout=0.1) is False  # held
    backend.post(f"/runs/{run_id}/control", {"action": "stop"})
    waiter.join(10.0)
    assert outcome == [True] and monitor.should_stop
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
    deadline = time.monotonic() + 30  # bounded wait until the worker spooled all of it
    while (monitor.stats()["queued"] or monitor._worker._busy) and time.monotonic() < deadline:
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
    assert list(spool_dir.rglob("*.jsonl")) == []


def test_drops_are_reported_as_a_metric_when_the_spool_is_full(own_backend: Backend, spool_dir: Path) -> None:
    own_backend.stop(signal.SIGKILL)
    monitor = ParityMonitor("drops", url=own_backend.url, spool_dir=spool_dir, spool_max_bytes=1, worker_id="w1",
                            flush_interval_s=0.05, max_backoff_s=0.5)
    for step in range(10):
        monitor.log({"loss": 1.0, "kl": 0.0}, step)
    wait_for(lambda: monitor.stats()["spool_dropped_points"] == 20)
    own_backend.start()
    run_id = own_backend.run_id("drops")
    key = dropped_points_key("w1")

    def reported() -> float | None:
        if key not in own_backend.counts(run_id):
            return None
        return own_backend.get(f"/runs/{run_id}/series", key=key, points=10)["buckets"]["last"][-1]

    wait_for(lambda: reported() is not None, timeout_s=20.0)
    monitor.close()
    assert reported() == 20.0  # the report's own lost copies are not counted as drops
    assert "loss" not in own_backend.counts(run_id)


def test_a_run_id_the_backend_does_not_have_is_said_and_its_batches_counted(backend: Backend, spool_dir: Path,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="paritywatch")
    with ParityMonitor(987654, url=backend.url, spool_dir=spool_dir, flush_interval_s=0.05) as monitor:
        for step in range(3):
            monitor.log({"loss": 1.0}, step)
            assert monitor.flush(5.0)  # nothing left to send: dropped, not retried
        stats = monitor.stats()
    assert stats["rejected_points"] == 3 and stats["spooled_batches"] == 0 and stats["dropped_batches"] == 3
    assert stats["backend_problem"] == "registration_refused" and not stats["healthy"]
    said = [r.getMessage() for r in caplog.records if "refused to register this process" in r.getMessage()]
    assert len(said) == 1 and "HTTP 404" in said[0] and "987654" in said[0]


def test_register_fingerprint_sends_the_digest_first_and_the_object_once(backend: Backend, spool_dir: Path) -> None:
    pytest.importorskip("trainer_hooks.fingerprint")
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


def _leftovers(url: str, spool_dir: Path, run: str, points: int) -> list[dict]:
    """What a process that could not reach `url` leaves in the spool when it ends."""
    monitor = ParityMonitor(run, url=url, spool_dir=spool_dir, worker_id="gone", max_backoff_s=0.5)
    for step in range(points):
        monitor.log({"loss": float(step)}, step)
    assert monitor.close(timeout=1.0) is False
    scoped = HookSettings.from_env().spool_directory(url, spool_dir)
    return [json.loads(line) for path in scoped.glob("*.jsonl") for line in path.read_text().splitlines()]


def _schedule_the_worker_late(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker thread's first tick runs late, as on a loaded machine."""
    tick = Worker._tick

    def late_first_tick(worker: Worker, closing: bool) -> None:
        if not getattr(worker, "_ticked_once", False):
            worker._ticked_once = True
            time.sleep(0.5)  # injected scheduling delay, not a synchronisation
        tick(worker, closing)

    monkeypatch.setattr(Worker, "_tick", late_first_tick)


def test_flush_waits_for_the_leftovers_it_adopted(own_backend: Backend, spool_dir: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    own_backend.stop(signal.SIGKILL)
    left = _leftovers(own_backend.url, spool_dir, "adopted", 40)
    assert left, "nothing was spooled"
    own_backend.start()
    _schedule_the_worker_late(monkeypatch)
    with ParityMonitor("adopted", url=own_backend.url, spool_dir=spool_dir) as survivor:
        assert survivor.flush(30.0)  # at once: before its worker even opened the spool
        assert survivor.stats()["replayed_batches"] == len(left)
    assert own_backend.counts(own_backend.run_id("adopted")) == {"loss": 40}


def test_leftovers_headed_to_another_backend_are_never_sent_here(backend: Backend, spool_dir: Path) -> None:
    elsewhere = f"http://127.0.0.1:{free_port()}"  # nothing listens: its batches stay in the spool
    left = _leftovers(elsewhere, spool_dir, "elsewhere", 30)
    assert left and {record["backend"] for record in left} == {elsewhere}
    # the same batches moved into this backend's directory are refused too: each says where it was headed
    here = HookSettings.from_env().spool_directory(backend.url, spool_dir)
    here.mkdir(parents=True, mode=0o700)
    (here / "moved.jsonl").write_text("".join(json.dumps(record) + "\n" for record in left))
    with ParityMonitor("here", url=backend.url, spool_dir=spool_dir) as monitor:
        assert monitor.flush(20.0)
        stats = monitor.stats()
    assert stats["replayed_batches"] == 0 and stats["spool_skipped_lines"] == len(left)
    assert "elsewhere" not in {run["name"] for run in backend.get("/runs", project="default")["runs"]}
    assert list(HookSettings.from_env().spool_directory(elsewhere, spool_dir).glob("*.jsonl")), \
        "the other backend's leftovers must stay for it"


def test_only_well_formed_records_are_replayed(backend: Backend, spool_dir: Path) -> None:
    here = HookSettings.from_env().spool_directory(backend.url, spool_dir)
    here.mkdir(parents=True, mode=0o700)
    good = {"v": 1, "backend": backend.url, "run": {"name": "shapes", "project": "default", "id": None},
            "component": {"side": "trainer", "worker_id": "w9", "host": "h", "pid": 1},
            "run_id": None, "component_id": None, "client_id": "c" * 32, "seq": 0,
            "steps": [1, 2], "series": {"loss": [0.5, None]}}
    bad = [
        {k: v for k, v in good.items() if k != "run"},               # no run: cannot be placed
        {**good, "seq": 1, "steps": [-1, 2]},                         # a step the server refuses
        {**good, "seq": 2, "series": {"loss": ["0.5", 1.0]}},         # text is not a number
        {**good, "seq": 3, "series": {"loss": [True, 1.0]}},          # nor is a bool
        {**good, "seq": 4, "series": {"loss": [1.0]}},                # not aligned with steps
        {**good, "seq": 5, "component": {**good["component"], "side": "root"}},
        {**good, "seq": 6, "client_id": 7},
    ]
    lines = [json.dumps(record) for record in bad] + [json.dumps({**good, "seq": 9})]
    (here / "dead.jsonl").write_text("\n".join(lines) + "\n")
    with ParityMonitor("other", url=backend.url, spool_dir=spool_dir) as monitor:
        assert monitor.flush(20.0)
        stats = monitor.stats()
    assert stats["replayed_batches"] == 1 and stats["spool_skipped_lines"] == len(bad)
    assert stats["rejected_points"] == 0  # nothing malformed ever reached the server
    assert backend.counts(backend.run_id("shapes")) == {"loss": 1}


def test_health_follows_the_backend(own_backend: Backend, spool_dir: Path) -> None:
    monitor = ParityMonitor("health", url=own_backend.url, spool_dir=spool_dir, max_backoff_s=0.5,
                            heartbeat_interval_s=0.2, poll_timeout_s=1.0)
    try:
        wait_for(lambda: monitor.healthy)
        assert monitor.stats()["backend_error"] is None
        own_backend.stop(signal.SIGKILL)
        wait_for(lambda: not monitor.healthy)
        stats = monitor.stats()
        assert stats["healthy"] is False and stats["backend_error"]  # refused, or reset mid-request
        assert stats["unreachable_s"] is not None
        own_backend.start()
        wait_for(lambda: monitor.healthy, timeout_s=20.0)
    finally:
        monitor.close()
    assert not monitor.healthy  # closed: nobody is watching any more


def test_sampling_params_join_the_processor_fingerprint_whenever_they_come(backend: Backend, spool_dir: Path) -> None:
    """Reported before the processor: posted alone; the same values again: nothing new; the
    processor afterwards: one fingerprint holding both, the processor's digests untouched."""
    from tests.fixtures.tokenizers import build_chatml_tokenizer
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(build_chatml_tokenizer(spool_dir.parent / "tok"))
    monitor = ParityMonitor("sp", side="rollout", url=backend.url, spool_dir=spool_dir, worker_id="w0")
    try:
        assert monitor.report_sampling_params({"temperature": 0.7, "top_k": 20}, logprobs_mode="raw_logprobs")
        assert monitor.report_sampling_params({"temperature": 0.7, "top_k": 20, "top_p": 1.0}, logprobs_mode="raw")
        assert monitor.flush(20.0) and monitor.stats()["fingerprints_posted"] == 1  # the second is the same setting
        run = backend.get(f"/runs/{backend.run_id('sp')}")
        alone = backend.get(f"/fingerprints/{run['components'][0]['fingerprint_digest']}")
        assert alone["kind"] == "sampling" and list(alone["components"]) == ["sampling_params"]

        processor = monitor.register_processor(tokenizer).result(timeout=60)
        assert monitor.flush(20.0) and monitor.stats()["fingerprints_posted"] == 2
        run = backend.get(f"/runs/{backend.run_id('sp')}")
        posted = backend.get(f"/fingerprints/{run['components'][0]['fingerprint_digest']}")
        assert posted["digest"] != processor["digest"] and posted["kind"] == processor["kind"]
        assert posted["components"]["sampling_params"]["value"] == {
            "temperature": 0.7, "top_p": None, "top_k": 20, "min_p": None, "repetition_penalty": None,
            "presence_penalty": None, "frequency_penalty": None, "logprobs_mode": "raw"}
        assert {n: c["digest"] for n, c in posted["components"].items() if n != "sampling_params"} == {
            n: c["digest"] for n, c in processor["components"].items()}
        # env (never compared) keeps the first spelling of a setting
        assert posted["env"]["sampling"]["as_given"] == {"temperature": 0.7, "top_k": 20}
    finally:
        monitor.close()


@pytest.mark.parametrize("fingerprinting", ["succeeds", "fails"])
def test_sampling_reported_while_the_processor_is_fingerprinted_waits_for_it(
        backend: Backend, spool_dir: Path, monkeypatch: pytest.MonkeyPatch, fingerprinting: str) -> None:
    """The trainer callback registers its processor (fingerprinted on a thread) and reports its
    sampling assumption at once: the backend must see one fingerprint holding both, never a
    sampling-only one first (the dashboard and a reader of the digest would see no chat template).
    If fingerprinting fails, the sampling report is not lost."""
    import trainer_hooks.composer as composer_module
    from tests.fixtures.tokenizers import build_chatml_tokenizer
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(build_chatml_tokenizer(spool_dir.parent / "tok"))
    release = threading.Event()
    real = composer_module.fingerprint_processor

    def held_fingerprint(*args, **kwargs):
        assert release.wait(30)
        if fingerprinting == "fails":
            raise RuntimeError("this processor cannot be fingerprinted")
        return real(*args, **kwargs)

    monkeypatch.setattr(composer_module, "fingerprint_processor", held_fingerprint)
    with ParityMonitor("held", side="trainer", url=backend.url, spool_dir=spool_dir) as monitor:
        pending = monitor.register_processor(tokenizer)
        assert monitor.report_sampling_params({"temperature": 0.9}, logprobs_mode="processed")
        assert monitor.flush(20.0) and monitor.stats()["fingerprints_posted"] == 0  # held for the processor
        release.set()
        concurrent_wait = pending.exception(timeout=60)
        assert (concurrent_wait is None) == (fingerprinting == "succeeds")
        wait_for(lambda: monitor.flush(5.0) and monitor.stats()["fingerprints_posted"] == 1, timeout_s=20)
        run = backend.get(f"/runs/{backend.run_id('held')}")
        posted = backend.get(f"/fingerprints/{run['components'][0]['fingerprint_digest']}")
    assert posted["components"]["sampling_params"]["value"]["temperature"] == 0.9
    if fingerprinting == "succeeds":
        assert posted["components"]["chat_template"]["value"]
    else:
        assert posted["kind"] == "sampling" and list(posted["components"]) == ["sampling_params"]
