"""What a heartbeat says about how far along this process is: its policy version and its
throughput over the last heartbeat interval (`contract.HEARTBEAT_*`). Pure bookkeeping, no I/O:
the training thread sets and counts, the heartbeat thread reads at each beat."""
from __future__ import annotations

import threading
import time
from typing import Any

from . import contract


class Progress:
    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.policy_version: int | None = None
        self.samples = 0
        self._counted_samples = False
        # (time, points delivered, samples) at the previous beat: rates cover one interval
        self._last = (clock(), 0, 0)

    def set_policy_version(self, version: Any) -> bool:
        """Record the version; True when it changed (the caller may beat early)."""
        value = contract.policy_version_value(version)
        with self._lock:
            changed = value != self.policy_version
            self.policy_version = value
        return changed

    def add_samples(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise TypeError(f"a sample count is a non-negative int, not {n!r}")
        with self._lock:
            self.samples += n
            self._counted_samples = True

    def heartbeat_body(self, points_delivered: int) -> dict[str, Any]:
        """The body of the next heartbeat; moves the rate window on."""
        now = self._clock()
        with self._lock:
            then, points_before, samples_before = self._last
            self._last = (now, points_delivered, self.samples)
            body: dict[str, Any] = {}
            if self.policy_version is not None:
                body[contract.HEARTBEAT_POLICY_VERSION] = self.policy_version
            elapsed = now - then
            if elapsed > 0:
                body[contract.HEARTBEAT_POINTS_PER_S] = _rate(points_delivered - points_before, elapsed)
                if self._counted_samples:
                    body[contract.HEARTBEAT_SAMPLES_PER_S] = _rate(self.samples - samples_before, elapsed)
        return body


def _rate(count: int, elapsed: float) -> float:
    return round(min(max(count, 0) / elapsed, contract.MAX_RATE_PER_S), 3)
