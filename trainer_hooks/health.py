"""Is this process protected? Reachability of the backend, judged from every request, said out loud.

A wrong PARITYWATCH_URL must not be silent: the run trains with nobody able to pause it. So the
first failure to reach the backend is logged at WARNING at once (Python prints warnings to stderr
even when the host configured no logging), then again at most once per `repeat_s` while it lasts,
and once more when the backend answers again. `healthy` and the monitor's `stats()` show it.
"""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from .logs import log

if TYPE_CHECKING:  # pragma: no cover
    from .transport import TransportError

# Answers that mean "nobody is protecting this run": no answer at all, a broken server, or a
# server that refuses our token. Any other answer (a 404 for one batch, a 422) is contact.
_UNUSABLE_STATUSES = frozenset({401, 403})


def means_unreachable(error: "TransportError") -> bool:
    return error.status is None or error.status >= 500 or error.status in _UNUSABLE_STATUSES


class BackendHealth:
    """Fed the outcome of every request (from any thread); warns at a bounded rate."""

    def __init__(self, url: str, *, fail_closed: bool = False, spool_dir: Any = None, repeat_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[bool], None] = lambda reachable: None) -> None:
        self.url = url
        self.fail_closed = fail_closed
        self.spool_dir = spool_dir
        self.repeat_s = repeat_s
        self._clock = clock
        self._on_change = on_change
        self._lock = threading.Lock()
        self._closed = False
        self.reset_after_fork()

    def reset_after_fork(self) -> None:
        self._lock = threading.Lock()  # the parent's may have been held at fork time
        self.reachable: bool | None = None  # None until the first outcome
        self.last_error: str | None = None
        self.failures = 0  # consecutive
        self.warnings = 0
        self._down_since: float | None = None
        self._last_warning: float | None = None
        self._warned_this_outage = False

    @property
    def healthy(self) -> bool:
        """The backend answered the last request: metrics arrive and a pause reaches the loop."""
        return self.reachable is True

    def observe(self, error: "TransportError | None") -> None:
        if self._closed:
            return
        if error is None or not means_unreachable(error):
            self._contact()
        else:
            self._failure(str(error))

    def close(self) -> None:
        """Stop judging: a closing monitor's own aborted requests say nothing about the backend."""
        self._closed = True

    def stats(self) -> dict[str, Any]:
        down = self._down_since
        return {"healthy": self.healthy, "backend_error": None if self.healthy else self.last_error,
                "unreachable_s": None if down is None else round(self._clock() - down, 3),
                "unreachable_warnings": self.warnings}

    # -- transitions

    def _contact(self) -> None:
        with self._lock:
            was, outage, warned = self.reachable, self._down_since, self._warned_this_outage
            self.reachable, self.failures, self._down_since, self._warned_this_outage = True, 0, None, False
        if warned and outage is not None:
            log.warning("paritywatch: reached the backend at %s again after %.0f s: the run is protected again.",
                        self.url, self._clock() - outage)
        if was is not True:
            self._on_change(True)

    def _failure(self, reason: str) -> None:
        now = self._clock()
        with self._lock:
            was = self.reachable
            self.reachable, self.last_error = False, reason
            self.failures += 1
            if self._down_since is None:
                self._down_since = now
            due = self._last_warning is None or now - self._last_warning >= self.repeat_s
            if due:
                self._last_warning = now
                self.warnings += 1
                first, self._warned_this_outage = not self._warned_this_outage, True
            down_for = now - self._down_since
        if due:
            self._warn(reason, first, down_for)
        if was is not False:
            self._on_change(False)

    def _warn(self, reason: str, first: bool, down_for: float) -> None:
        if self.fail_closed:
            consequence = ("training is HELD in wait_if_paused() until it answers (fail_closed=True); "
                           "metrics wait in the spool")
        else:
            consequence = ("this run is UNPROTECTED: Paritywatch cannot pause or stop it while training goes on, "
                           f"and its metrics wait in the spool ({self.spool_dir}). Check PARITYWATCH_URL and "
                           "PARITYWATCH_TOKEN; to refuse to train unmonitored, use ParityMonitor(fail_closed=True) "
                           "or PARITYWATCH_FAIL_CLOSED=1")
        if first:
            log.warning("paritywatch: cannot reach the backend at %s (%s): %s.", self.url, reason, consequence)
        else:
            log.warning("paritywatch: still cannot reach the backend at %s after %.0f s (%s): %s.",
                        self.url, down_for, reason, consequence)
