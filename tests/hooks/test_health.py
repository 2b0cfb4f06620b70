"""A wrong backend URL is not silent: the hooks say, at once and then at a bounded rate, that the
run is unprotected (issue 17.2), in the training process's own stderr."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.hooks.conftest import ROOT, free_port
from trainer_hooks.health import BackendHealth
from trainer_hooks.transport import TransportError

# A training loop as a user writes it: no logging configured, PARITYWATCH_URL from the environment.
TRAINING_PROCESS = textwrap.dedent("""
    import sys, time
    from trainer_hooks import ParityMonitor
    monitor = ParityMonitor("unwatched", spool_dir=sys.argv[1])
    print("training", flush=True)
    started, step = time.monotonic(), 0
    while time.monotonic() - started < float(sys.argv[2]):
        monitor.wait_if_paused()
        monitor.log({"loss": 1.0 / (step + 1)}, step)
        time.sleep(0.05)  # the training step itself
        step += 1
    stats = monitor.stats()
    print("healthy", monitor.healthy, stats["healthy"], bool(stats["backend_error"]), step, flush=True)
""")


def _read_lines(stream, lines: list[tuple[float, str]], seen: threading.Event, marker: str) -> None:
    for line in stream:
        lines.append((time.monotonic(), line.rstrip("\n")))
        if marker in line:
            seen.set()


def test_a_training_process_with_a_wrong_url_says_so_on_stderr_within_seconds(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARITYWATCH_")}
    env.update(PARITYWATCH_URL=f"http://127.0.0.1:{free_port()}", XDG_CACHE_HOME=str(tmp_path / "cache"))
    child = subprocess.Popen([sys.executable, "-c", TRAINING_PROCESS, str(tmp_path / "spool"), "8"], cwd=ROOT,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "training"
        started = time.monotonic()
        stderr: list[tuple[float, str]] = []
        warned = threading.Event()
        reader = threading.Thread(target=_read_lines, args=(child.stderr, stderr, warned, "UNPROTECTED"), daemon=True)
        reader.start()
        assert warned.wait(10.0), f"no warning on stderr: {stderr}"
        first = next(t for t, line in stderr if "UNPROTECTED" in line)
        assert first - started < 5.0
        summary = child.stdout.readline().split()
        assert child.wait(30) == 0
        reader.join(10)
    finally:
        child.kill()
    lines = [line for _, line in stderr]
    loud = [line for line in lines if "cannot reach the backend" in line]
    assert len(loud) == 1, lines  # once, not once per step or per retry
    assert len(lines) <= 3, lines
    assert env["PARITYWATCH_URL"] in loud[0] and "fail_closed=True" in loud[0]
    assert summary[:4] == ["healthy", "False", "False", "True"] and int(summary[4]) > 50  # training went on


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


REFUSED = TransportError("ConnectError: [Errno 111] Connection refused", retryable=True)


@pytest.fixture
def said(caplog: pytest.LogCaptureFixture):
    """What the hooks logged at WARNING so far."""
    caplog.set_level(logging.WARNING, logger="paritywatch")
    return lambda: [record.getMessage() for record in caplog.records]


def test_a_long_outage_warns_at_once_then_once_a_minute_then_says_it_is_over(said) -> None:
    clock = Clock()
    changes: list[bool] = []
    health = BackendHealth("http://backend:8321", clock=clock, repeat_s=60.0, on_change=changes.append)
    assert not health.healthy  # nobody answered yet
    for _ in range(301):  # a failed retry every second for five minutes
        health.observe(REFUSED)
        clock.now += 1.0
    messages = said()
    assert len(messages) == 6  # t = 0, 60, 120, 180, 240, 300
    assert "cannot reach the backend at http://backend:8321" in messages[0] and "UNPROTECTED" in messages[0]
    assert all("still cannot reach" in m and "UNPROTECTED" in m for m in messages[1:])
    assert "after 300 s" in messages[-1]
    assert health.stats()["unreachable_s"] == 301.0 and "Connection refused" in health.stats()["backend_error"]
    health.observe(None)
    assert health.healthy and health.stats()["backend_error"] is None
    assert "protected again" in said()[-1]
    assert changes == [False, True]


def test_a_flapping_backend_cannot_flood_the_log(said) -> None:
    clock = Clock()
    health = BackendHealth("http://backend:8321", clock=clock, repeat_s=60.0)
    for second in range(600):
        health.observe(REFUSED if second % 2 else None)
        clock.now += 1.0
    unreachable = [m for m in said() if "cannot reach" in m]
    again = [m for m in said() if "protected again" in m]
    assert len(unreachable) == 10 and len(again) <= len(unreachable)


def test_answers_that_are_not_an_outage_keep_it_healthy(said) -> None:
    health = BackendHealth("http://backend:8321", clock=Clock())
    health.observe(TransportError("HTTP 422", retryable=False, status=422))
    health.observe(TransportError("HTTP 404", retryable=False, status=404))
    assert health.healthy and said() == []
    health.observe(TransportError("HTTP 401 unauthorized", retryable=False, status=401))
    assert not health.healthy  # a refused token protects nothing either
    health.observe(TransportError("HTTP 503", retryable=True, status=503))
    assert len(said()) == 1


def test_fail_closed_says_training_is_held(said) -> None:
    health = BackendHealth("http://backend:8321", fail_closed=True, clock=Clock())
    health.observe(REFUSED)
    [message] = said()
    assert "HELD" in message and "UNPROTECTED" not in message
