"""Retry policy of webhook deliveries: pure functions, time passed in."""
from __future__ import annotations

import random
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

RETRYABLE_STATUS = {408, 425, 429}


def is_retryable(status_code: int | None) -> bool:
    """Network errors (None), timeouts, throttling and server errors are worth retrying."""
    return status_code is None or status_code in RETRYABLE_STATUS or status_code >= 500


def backoff_s(attempts: int, base_s: float, cap_s: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with 'equal jitter': half fixed, half random, capped."""
    delay = min(cap_s, base_s * 2 ** max(0, attempts - 1))
    r = (rng or random).random()
    return delay / 2 + r * delay / 2


def retry_after_s(header: str | None, now: float) -> float | None:
    if not header:
        return None
    header = header.strip()
    if header.isdigit():
        return float(header)
    try:
        return max(0.0, parsedate_to_datetime(header).timestamp() - now)
    except (TypeError, ValueError):
        return None


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
    rng: random.Random | None = None,
) -> Outcome:
    """What to do after an attempt: delivered, retry later (and when), or give up."""
    if status_code is not None and 200 <= status_code < 300:
        return Outcome("delivered")
    if not is_retryable(status_code):
        return Outcome("failed")
    delay = backoff_s(attempts, base_s, cap_s, rng)
    if retry_after is not None:
        delay = max(delay, min(retry_after, cap_s))
    if age_s + delay > give_up_after_s:
        return Outcome("failed")
    return Outcome("pending", delay)
