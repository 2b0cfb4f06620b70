"""Heartbeats: tell the backend this process is alive, and hear the run's control state back."""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from . import contract
from .health import keeps_batches, problem_of
from .logs import LogOnce
from .progress import Progress
from .registry import Registry
from .transport import Backoff, Transport, TransportError


# A new policy version beats early, so the workers view sees a lag soon; but no sooner than this
# after the last beat (a trainer publishing every step must not beat every tick).
EARLY_BEAT_MIN_S = 2.0


class Heartbeat:
    """Runs on a thread of its own (worker.py), with its own connection: at most one beat per
    `interval_s` (or an early one after a new policy version), none while backing off. Each beat
    carries the process's progress."""

    def __init__(self, *, registry: Registry, backoff: Backoff, interval_s: float,
                 on_control: Callable[[Mapping[str, Any]], None], log_once: LogOnce,
                 progress: Progress | None = None, delivered_points: Callable[[], int] = lambda: 0) -> None:
        self.registry = registry
        self.backoff = backoff
        self.interval_s = interval_s
        self.sent = 0
        self.progress = progress if progress is not None else Progress()
        self._delivered_points = delivered_points
        self._on_control = on_control
        self._log_once = log_once
        self._next = 0.0
        self._last = -float("inf")

    def beat_soon(self) -> None:
        """Beat as soon as EARLY_BEAT_MIN_S have passed since the last beat."""
        self._next = min(self._next, self._last + EARLY_BEAT_MIN_S)

    def seconds_to_next(self) -> float:
        """How long the heartbeat thread may sleep before the next beat can be due."""
        return max(0.0, self._next - time.monotonic(), self.backoff.remaining())

    def beat_if_due(self, transport: Transport) -> None:
        now = time.monotonic()
        if now < self._next or not self.backoff.ready():
            return
        self._next, self._last = now + self.interval_s, now
        try:
            run_id, component_id = self.registry.ids(transport)
            body = self.progress.heartbeat_body(self._delivered_points())
            answer = transport.request("POST", contract.component_path(run_id, component_id, "heartbeat"), json=body)
        except TransportError as exc:
            if keeps_batches(exc):  # the backend may take the next beat: do not hammer it meanwhile
                self.backoff.failed(exc.retry_after)
            elif problem_of(exc) is None:  # a problem (a wrong URL...) is said by health.py
                self._log_once.warning(("heartbeat", exc.status, exc.code), "paritywatch: heartbeat failed: %s", exc)
            return
        self.sent += 1
        if isinstance(answer.get("control"), Mapping):
            self._on_control(answer["control"])
