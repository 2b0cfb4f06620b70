"""When could this backend hear its processes? Silence counts against a process only while it could.

A process is lost when it has been silent for the heartbeat timeout. But a backend that was itself
down (a restart, an upgrade) or stalled (an event loop that did not run: CPU starvation, a paused
VM, a blocked call) heard nobody meanwhile: every process would look silent, and the first sweep
after it would page for all of them and mark the run crashed. So the sweep asks this clock for its
cutoff: the last moment from which the backend has been able to hear for the whole timeout. Time
before this process started, and time its event loop did not tick, does not count.

The event loop ticks `pulse()` every PULSE_S. A gap over STALL_S between ticks (or, seen from the
sweep's thread, a tick that is overdue) is a deaf interval, widened by DRAIN_S for the requests
that queued during it to be served. Silence is measured up to the loop's last tick, not to now: a
loop late by less than STALL_S may hold unread beats. A dead process is never hidden by a loaded
server, only delayed by the backend's own deaf time (plus at most PULSE_S).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from datetime import datetime, timezone
from typing import Callable

log = logging.getLogger("paritywatch")

PULSE_S = 0.5  # how often the event loop ticks
STALL_S = 2.0  # a loop that did not tick for this long heard nobody
DRAIN_S = 2.0  # after a stall, time for the beats that waited in the sockets to be served
MAX_INTERVALS = 1024  # deaf intervals remembered (the oldest go first)


class HearingClock:
    """Deaf intervals of this backend process, as wall-clock seconds; thread-safe."""

    def __init__(self, *, monotonic: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self._monotonic, self._wall = monotonic, wall
        self._lock = threading.Lock()
        self.started = wall()  # before it this process heard nothing; the loop's first tick moves it
        self._deaf: deque[tuple[float, float]] = deque(maxlen=MAX_INTERVALS)
        self._last_tick: tuple[float, float] | None = None  # (monotonic, wall) of the loop's last tick

    def pulse(self) -> None:
        """The event loop ran: called by `listen()` every PULSE_S."""
        mono, wall = self._monotonic(), self._wall()
        with self._lock:
            if self._last_tick is None:
                self.started = wall  # serving begins now (migrations and startup heard nobody)
            gap = 0.0 if self._last_tick is None else mono - self._last_tick[0]
            if gap > STALL_S:
                self._deaf.append((self._last_tick[1], wall + DRAIN_S))
            self._last_tick = (mono, wall)
        if gap > STALL_S:
            log.warning("the backend's event loop did not run for %.1f s: processes' silence during it "
                        "is not counted against them", gap)

    async def listen(self) -> None:
        """Tick until cancelled (the app's lifespan runs it on the serving loop)."""
        while True:
            self.pulse()
            await asyncio.sleep(PULSE_S)

    def deaf_intervals(self) -> list[tuple[float, float]]:
        """Sorted, merged, including the time before start and an overdue tick's open interval."""
        now_mono, now_wall = self._monotonic(), self._wall()
        with self._lock:
            spans = [(float("-inf"), self.started), *self._deaf]
            if self._last_tick is not None and now_mono - self._last_tick[0] > STALL_S:
                spans.append((self._last_tick[1], now_wall + DRAIN_S))  # deaf right now
        merged: list[tuple[float, float]] = []
        for start, end in sorted(spans):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        return merged

    def cutoff(self, now: datetime, timeout_s: float) -> datetime | None:
        """The latest moment with `timeout_s` of hearing between it and `now`: a process whose
        last heartbeat is older was silent while the backend listened. None: not heard that long."""
        t, need = now.timestamp(), timeout_s
        with self._lock:
            if self._last_tick is not None:
                # Heard only up to the loop's last tick: a loop stalled for less than STALL_S may
                # hold beats unread in its sockets right now (seen in CI: a 2 s timeout fired 2.0 s
                # into a stall). This delays a real loss by at most PULSE_S.
                t = min(t, self._last_tick[1])
        # Walk back from `t` over the hearing between deaf intervals; the first one (before
        # this process started) begins at -inf, so the walk always ends in the loop.
        for start, end in reversed(self.deaf_intervals()):
            heard = t - end
            if heard >= need:
                return datetime.fromtimestamp(t - need, timezone.utc)
            need -= max(heard, 0.0)
            t = min(t, start)
        return None
