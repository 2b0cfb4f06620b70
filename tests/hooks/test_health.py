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
from trainer_hooks import health
from trainer_hooks.health import BackendHealth, Undelivered
from trainer_hooks.transport import FOREIGN, PROBE, REGISTRATION, TransportError

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


def test_a_long_outage_is_said_within_seconds_then_once_a_minute_then_said_to_be_over(said) -> None:
    clock = Clock()
    changes: list[bool] = []
    health = BackendHealth("http://backend:8321", clock=clock, repeat_s=60.0, on_change=changes.append)
    assert not health.healthy  # nobody answered yet
    for _ in range(301):  # a failed retry every second for five minutes, no batch affected
        health.observe(REFUSED)
        clock.now += 1.0
    messages = said()
    assert len(messages) == 5  # t = 2 (FIRST_WARNING_S), 62, 122, 182, 242
    assert "cannot reach the backend at http://backend:8321" in messages[0] and "UNPROTECTED" in messages[0]
    assert "0 metric batches not delivered so far" in messages[0]
    assert all("still, after" in m and "UNPROTECTED" in m for m in messages[1:])
    assert "after 242 s" in messages[-1]
    assert health.stats()["unreachable_s"] == 301.0 and "Connection refused" in health.stats()["backend_error"]
    assert health.stats()["backend_problem"] == "unreachable"
    health.observe(None)
    assert health.healthy and health.stats()["backend_error"] is None
    assert "protected again" in said()[-1]
    assert changes == [False, True]


def test_the_first_warning_comes_with_the_first_batch_it_cost(said) -> None:
    """Said as soon as a metric batch was not delivered, with the count, before FIRST_WARNING_S."""
    clock = Clock()
    lost = Undelivered()
    health = BackendHealth("http://backend:8321", clock=clock, spool_dir="/spool", undelivered=lambda: lost)
    health.observe(REFUSED)
    health.check()
    assert said() == []  # nothing lost yet: it waits (at most FIRST_WARNING_S) to say what it costs
    clock.now += 0.5
    lost = Undelivered(waiting=3)
    health.check()  # the worker's tick after it spooled the batches
    [message] = said()
    assert "3 metric batches not delivered so far: 3 waiting in the spool (/spool)" in message
    assert "sent once the backend takes them" in message


def test_a_flapping_backend_cannot_flood_the_log(said) -> None:
    clock = Clock()
    health = BackendHealth("http://backend:8321", clock=clock, repeat_s=60.0)
    for second in range(600):  # down 3 s of every 5, for ten minutes
        health.observe(REFUSED if second % 5 < 3 else None)
        clock.now += 1.0
    unreachable = [m for m in said() if "cannot reach" in m]
    again = [m for m in said() if "protected again" in m]
    assert len(unreachable) == 10 and len(again) <= len(unreachable)


def test_a_new_kind_of_problem_is_said_at_once_during_an_outage(said) -> None:
    clock = Clock()
    health = BackendHealth("http://backend:8321", clock=clock, first_warning_s=0.0)
    health.observe(REFUSED)
    clock.now += 5.0
    health.observe(TransportError("HTTP 401", retryable=False, status=401, code="unauthorized",
                                  detail="unknown or revoked token"))
    assert len(said()) == 2 and "refused this process's token (HTTP 401: unknown or revoked token)" in said()[1]
    assert health.stats()["unreachable_s"] == 5.0  # one outage, whatever it turned into


def _error(status: int | None, code: str | None = "x", purpose: str | None = None, retryable: bool = False):
    return TransportError(f"HTTP {status}", retryable=retryable, status=status, code=code, purpose=purpose)


@pytest.mark.parametrize(("error", "problem", "kept"), [
    (REFUSED, health.UNREACHABLE, True),
    (_error(503, retryable=True), health.UNREACHABLE, True),
    (_error(429, retryable=True), None, True),  # busy, but there: retried, protected
    (_error(401), health.TOKEN_REFUSED, True),
    (_error(403, purpose=PROBE), health.TOKEN_REFUSED, True),  # open mode refusing another machine
    (_error(403, purpose=REGISTRATION), health.WRONG_PROJECT, True),
    (_error(404, purpose=PROBE), health.WRONG_URL, False),  # no /whoami here
    (_error(405, purpose=PROBE), health.WRONG_URL, False),
    (_error(404, code=None), health.WRONG_URL, False),  # another server's 404
    (_error(200), health.WRONG_URL, False),  # a 2xx that is not our JSON
    (_error(404, purpose=REGISTRATION), health.NOT_REGISTERED, False),  # a run id the backend does not have
    (_error(422, purpose=REGISTRATION), health.NOT_REGISTERED, False),
    (_error(422), None, False),  # a batch refused for its content: counted, the process is fine
    (_error(404), None, False),
    (_error(403, purpose=FOREIGN), None, False),  # another process's leftover of a run this token may not write
])
def test_what_each_failure_means(error: TransportError, problem: str | None, kept: bool) -> None:
    assert health.problem_of(error) == problem
    assert health.keeps_batches(error) is kept


def test_answers_that_are_not_an_outage_keep_it_healthy(said) -> None:
    clock = Clock()
    backend = BackendHealth("http://backend:8321", clock=clock, first_warning_s=0.0)
    backend.observe(_error(422))
    backend.observe(_error(404, code="not_found"))
    assert backend.healthy and said() == []
    backend.observe(_error(401))
    assert not backend.healthy  # a refused token protects nothing either
    assert len(said()) == 1


def test_fail_closed_says_training_is_held(said) -> None:
    health = BackendHealth("http://backend:8321", fail_closed=True, clock=Clock(), first_warning_s=0.0)
    health.observe(REFUSED)
    [message] = said()
    assert "HELD" in message and "UNPROTECTED" not in message
