"""The monitor with no backend at all (or a hung one): it must never hurt its host."""
from __future__ import annotations

import json
import socket
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Iterator

import pytest

from tests.hooks.conftest import ROOT, free_port
from tests.support.live import wait_for
from trainer_hooks.monitor import ParityMonitor
from trainer_hooks.settings import HookSettings


@pytest.fixture
def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


@pytest.fixture
def hung_url() -> Iterator[tuple[str, threading.Event]]:
    """Accepts connections and never answers, like a wedged server."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted = threading.Event()
    conns: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conns.append(listener.accept()[0])
            except OSError:
                return
            accepted.set()

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", accepted
    listener.close()
    for conn in conns:
        conn.close()


class Exploding(Mapping):
    """A caller's mapping that fails when read."""

    def __getitem__(self, key):
        raise RuntimeError("boom")

    def __iter__(self):
        raise RuntimeError("boom")

    def __len__(self):
        return 1


def test_constructor_rejects_wrong_arguments_loudly(dead_url: str) -> None:
    with pytest.raises(ValueError):
        ParityMonitor("r", side="learner", url=dead_url)
    with pytest.raises(TypeError):
        ParityMonitor(3.5, url=dead_url)


def test_log_never_raises_whatever_it_is_given(dead_url: str, spool_dir: Path) -> None:
    with ParityMonitor("r", url=dead_url, spool_dir=spool_dir) as monitor:
        assert monitor.log(Exploding(), 1) is False
        assert monitor.log(None, 1) is False  # type: ignore[arg-type]
        assert monitor.log({"loss": "not a number", "": 1.0, "x" * 201: 1.0}, 2) is True
        assert monitor.log({"loss": 1.0}, "step") is True  # bad step: dropped by the worker
        assert monitor.log({"loss": 1.0}, -1) is True
        # The worker thread judges the queued values: wait until it has (the backend is dead, so
        # flush() would wait for a spool that never drains; a fixed flush time raced a loaded CI box).
        stats = wait_for(lambda: (s := monitor.stats())["invalid_values"] >= 5 and s, timeout_s=30,
                         what="the worker counted the invalid values")
    assert stats["internal_errors"] == 2
    assert stats["invalid_values"] == 5


def test_a_full_queue_drops_and_counts_instead_of_blocking(hung_url, spool_dir: Path) -> None:
    url, accepted = hung_url
    monitor = ParityMonitor("r", url=url, spool_dir=spool_dir, max_queue=3, request_timeout_s=3.0)
    try:
        assert accepted.wait(5.0)  # the worker is now stuck registering the run
        results = [monitor.log({"a": 1.0, "b": 2.0}, step) for step in range(10)]
        assert results == [True] * 3 + [False] * 7
        assert monitor.stats()["queue_dropped_points"] == 14
    finally:
        monitor.close(timeout=0.2)


def test_unreachable_backend_spools_to_disk_and_close_keeps_the_spool(dead_url: str, spool_dir: Path) -> None:
    monitor = ParityMonitor("r", url=dead_url, spool_dir=spool_dir)
    for step in range(100):
        assert monitor.log({"loss": float(step)}, step)
    assert monitor.close(timeout=0.5) is False
    lines = [json.loads(line) for f in spool_dir.rglob("*.jsonl") for line in f.read_text().splitlines()]
    assert {record["backend"] for record in lines} == {dead_url}
    assert [s for record in lines for s in record["steps"]] == list(range(100))
    assert {record["client_id"] for record in lines} == {monitor.stats()["client_id"]}
    assert [record["seq"] for record in lines] == sorted(record["seq"] for record in lines)
    assert monitor.log({"loss": 1.0}, 101) is False  # closed


def test_fail_open_keeps_training_and_fail_closed_blocks_while_unreachable(dead_url: str, spool_dir: Path) -> None:
    with ParityMonitor("r", url=dead_url, spool_dir=spool_dir) as open_monitor:
        # Released once the poller finds the backend refusing (or, at the latest, when the 2 s
        # start-up grace ends); False would mean it held the loop for all 30 s. A 0.3 s bound was a
        # race with the poller thread's first connection attempt on a loaded machine (seen).
        assert open_monitor.wait_if_paused(timeout=30) is True
    with ParityMonitor("r", url=dead_url, spool_dir=spool_dir, fail_closed=True) as closed_monitor:
        assert closed_monitor.wait_if_paused(timeout=0.3) is False
        assert not closed_monitor.reachable


def test_disabled_monitor_is_a_no_op(monkeypatch: pytest.MonkeyPatch, dead_url: str, spool_dir: Path) -> None:
    monkeypatch.setenv("PARITYWATCH_DISABLED", "1")
    monitor = ParityMonitor("r", url=dead_url, spool_dir=spool_dir)
    assert monitor.log({"loss": 1.0}, 1) is False
    assert monitor.wait_if_paused() is True and monitor.state == "disabled" and not monitor.should_stop
    assert monitor._worker._thread is None and not spool_dir.exists()
    monitor.close()


def test_env_vars_supply_the_defaults(monkeypatch: pytest.MonkeyPatch, dead_url: str, spool_dir: Path) -> None:
    monkeypatch.setenv("PARITYWATCH_URL", dead_url)
    monkeypatch.setenv("PARITYWATCH_RUN", "from-env")
    monkeypatch.setenv("PARITYWATCH_PROJECT", "proj")
    monkeypatch.setenv("PARITYWATCH_TOKEN", "secret")
    with ParityMonitor(side="rollout", spool_dir=spool_dir) as monitor:
        assert monitor.url == dead_url
        assert (monitor._run_key.name, monitor._run_key.project) == ("from-env", "proj")
        assert monitor._transport_config.token == "secret"


def test_env_flags_are_strict(monkeypatch: pytest.MonkeyPatch, dead_url: str, spool_dir: Path) -> None:
    monkeypatch.setenv("PARITYWATCH_FAIL_CLOSED", "yes")
    with ParityMonitor("r", url=dead_url, spool_dir=spool_dir) as monitor:
        assert monitor.fail_closed and monitor.wait_if_paused(timeout=0.2) is False
    monkeypatch.setenv("PARITYWATCH_DISABLED", "maybe")
    with pytest.raises(ValueError, match="PARITYWATCH_DISABLED"):
        ParityMonitor("r", url=dead_url, spool_dir=spool_dir)


def test_every_environment_setting_is_documented() -> None:
    readme = (ROOT / "README.md").read_text()
    missing = [name for name in HookSettings.variables() if f"`{name}" not in readme]
    assert missing == []


def test_unknown_state_holds_the_first_step_briefly_then_fails_open():
    """A run paused before the process starts must hold step 1 too: until the server first
    answers, wait_if_paused() waits (bounded by the start-up grace), then fails open."""
    import time

    from trainer_hooks.control import ControlState

    state = ControlState(startup_grace_s=0.3)
    t0 = time.monotonic()
    assert state.wait_if_paused() is True
    assert time.monotonic() - t0 >= 0.25
    paused = ControlState(startup_grace_s=5.0)
    paused.observe({"state": "paused", "version": 2})
    assert paused.wait_if_paused(timeout=0.2) is False
    down = ControlState(startup_grace_s=60.0)
    down.set_reachable(False)  # backend unreachable: fail-open at once
    t0 = time.monotonic()
    assert down.wait_if_paused() is True and time.monotonic() - t0 < 10.0  # not the grace's 60 s


def test_a_failure_releases_a_first_step_already_waiting_out_the_grace():
    """Issue 29.3: the first wait_if_paused() sat out the whole start-up grace when the backend was
    unreachable, because the failure came while it was already waiting and woke nobody."""
    from trainer_hooks.control import ControlState

    state = ControlState(startup_grace_s=30.0)
    outcome: list[bool] = []
    waiter = threading.Thread(target=lambda: outcome.append(state.wait_if_paused()), daemon=True)
    waiter.start()
    wait_for(lambda: state._cond._waiters, what="the first step waiting")
    state.set_reachable(False)  # the poller's first request was refused
    waiter.join(10.0)
    assert outcome == [True]


def test_close_does_not_wait_on_an_unreachable_backend(dead_url: str, spool_dir: Path) -> None:
    import time

    monitor = ParityMonitor("r", url=dead_url, spool_dir=spool_dir)
    for step in range(10):
        monitor.log({"loss": 1.0}, step)
    wait_for(lambda: monitor.stats()["backend_problem"] == "unreachable")
    started = time.monotonic()
    assert monitor.close(timeout=30.0) is False
    assert time.monotonic() - started < 10.0  # spooled at once, not retried until the deadline
    assert monitor.stats()["spool_waiting_batches"] >= 1
