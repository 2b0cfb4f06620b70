"""The webhook dispatcher's retry policy (backend/webhooks/retry.py): pure, time passed in."""
from __future__ import annotations

import email.utils
import time

import pytest

from paritywatch.backend.webhooks.retry import Outcome, backoff_s, next_step, retry_after_s

BASE, CAP, WINDOW = 2.0, 300.0, 6 * 3600.0


def test_the_schedule_retries_at_once_then_doubles_with_jitter_up_to_the_cap() -> None:
    assert backoff_s(1, BASE, CAP) == 0.0
    for attempts, floor in ((2, 2.0), (3, 4.0), (4, 8.0), (8, 128.0)):
        assert floor <= backoff_s(attempts, BASE, CAP) <= floor + BASE
    assert backoff_s(12, BASE, CAP) == CAP
    assert len({backoff_s(3, BASE, CAP) for _ in range(20)}) > 1  # jittered: receivers are not hit in step


@pytest.mark.parametrize("status", [200, 201, 204])
def test_a_2xx_is_delivered(status: int) -> None:
    assert next_step(status, 1, 0.0, None, BASE, CAP, WINDOW) == Outcome("delivered")


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 410, 413, 422])
def test_a_permanent_refusal_fails_at_once(status: int) -> None:
    assert next_step(status, 1, 0.0, None, BASE, CAP, WINDOW) == Outcome("failed")


@pytest.mark.parametrize("status", [None, 408, 425, 429, 500, 502, 503])
def test_network_errors_throttling_and_server_errors_are_retried(status: int | None) -> None:
    outcome = next_step(status, 3, 10.0, None, BASE, CAP, WINDOW)
    assert outcome.status == "pending" and 4.0 <= outcome.delay_s <= 6.0


def test_retry_after_wins_when_longer_but_never_past_the_cap() -> None:
    assert next_step(503, 1, 0.0, 30.0, BASE, CAP, WINDOW) == Outcome("pending", 30.0)
    assert next_step(429, 1, 0.0, 86400.0, BASE, CAP, WINDOW) == Outcome("pending", CAP)


def test_it_gives_up_once_the_next_try_would_pass_the_window() -> None:
    assert next_step(500, 12, WINDOW - 10.0, None, BASE, CAP, WINDOW) == Outcome("failed")


def test_retry_after_header_as_seconds_or_as_a_date() -> None:
    now = time.time()
    assert retry_after_s("120", now) == 120.0
    assert 28.0 <= retry_after_s(email.utils.formatdate(now + 30, usegmt=True), now) <= 30.0
    assert 38.0 <= retry_after_s(email.utils.formatdate(now + 30, usegmt=True), now - 10) <= 40.0
    assert retry_after_s(email.utils.formatdate(now - 60, usegmt=True), now) == pytest.approx(0.0, abs=1.0)
    for unreadable in (None, "", "soon", "-5", "1.5"):
        assert retry_after_s(unreadable, now) is None
