"""Retry policy of webhook deliveries: pure functions, time passed in.

The schedule and the Retry-After parsing are urllib3's `Retry`, as in the hooks' transport
(docs/design.md, "Libraries and why"); which statuses are worth retrying is the rule the hooks
use too (`trainer_hooks.contract.is_retryable_status`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from urllib3.exceptions import InvalidHeader
from urllib3.util.retry import RequestHistory, Retry

from trainer_hooks.contract import is_retryable_status

_RETRY_AFTER = Retry(total=None)
_FAILED_ATTEMPT = RequestHistory("POST", None, None, None, None)


def is_retryable(status_code: int | None) -> bool:
    """Network errors (None), timeouts, throttling and server errors are worth retrying."""
    return status_code is None or is_retryable_status(status_code)


def backoff_s(attempts: int, base_s: float, cap_s: float) -> float:
    """Delay after `attempts` failed attempts: the first retry at once, then base_s * 2**(n-2) plus up
    to base_s of random jitter, capped at cap_s (urllib3's schedule with a factor of base_s / 2)."""
    policy = Retry(total=None, backoff_factor=base_s / 2, backoff_max=cap_s, backoff_jitter=base_s,
                   history=(_FAILED_ATTEMPT,) * max(0, attempts))
    return policy.get_backoff_time()


def retry_after_s(header: str | None, now: float) -> float | None:
    """Seconds from `now` (a time.time() value) that a Retry-After header asks to wait; None when
    absent or unreadable. Delta-seconds or an HTTP-date, parsed by urllib3."""
    if not header:
        return None
    try:
        seconds = _RETRY_AFTER.parse_retry_after(header)
    except InvalidHeader:
        return None
    if header.strip().isdigit():
        return float(seconds)
    # urllib3 measures an HTTP-date from time.time(); the caller's clock is `now`.
    return max(0.0, seconds + time.time() - now)


@dataclass(frozen=True)
class Outcome:
    status: str  # delivered | pending | failed
    delay_s: float = 0.0


def next_step(
    status_code: int | None,
    attempts: int,
    age_s: float,
    retry_after: float | None,
    base_s: float,
    cap_s: float,
    give_up_after_s: float,
) -> Outcome:
    """What to do after an attempt: delivered, retry later (and when), or give up."""
    if status_code is not None and 200 <= status_code < 300:
        return Outcome("delivered")
    if not is_retryable(status_code):
        return Outcome("failed")
    delay = backoff_s(attempts, base_s, cap_s)
    if retry_after is not None:
        delay = max(delay, min(retry_after, cap_s))
    if age_s + delay > give_up_after_s:
        return Outcome("failed")
    return Outcome("pending", delay)
