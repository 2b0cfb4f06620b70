"""Long-poll support: wake waiters the moment a run's control version changes.

Changes made by this process wake waiters at once; changes made by another backend process
on the same database are seen by one shared poll (one query for all watched runs).
"""
from __future__ import annotations

import asyncio
import logging

from starlette.concurrency import run_in_threadpool

from backend.db import Database
from backend.store import control as control_store

log = logging.getLogger("paritywatch.control")


class ControlWatcher:
    def __init__(self, db: Database, poll_interval_s: float):
        self.db = db
        self.poll_interval_s = poll_interval_s
        self._waiters: dict[int, set[asyncio.Future]] = {}
        self._known: dict[int, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._poll_forever())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def notify(self, run_id: int) -> None:
        """Thread-safe: called after a control change commits in this process."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake, run_id)

    async def wait_for_change(self, run_id: int, after_version: int, timeout_s: float) -> None:
        """Return when the run's version differs from `after_version`, or after the timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            fut = loop.create_future()
            self._waiters.setdefault(run_id, set()).add(fut)
            try:
                current = (await run_in_threadpool(control_store.versions, self.db, [run_id])).get(run_id)
                if current is None or current != after_version:
                    return
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return
                try:
                    await asyncio.wait_for(fut, remaining)
                except asyncio.TimeoutError:
                    return
            finally:
                waiters = self._waiters.get(run_id)
                if waiters is not None:
                    waiters.discard(fut)
                    if not waiters:
                        del self._waiters[run_id]

    def _wake(self, run_id: int) -> None:
        for fut in list(self._waiters.get(run_id, ())):
            if not fut.done():
                fut.set_result(None)

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval_s)
            if not self._waiters:
                continue
            try:
                current = await run_in_threadpool(control_store.versions, self.db, list(self._waiters))
            except Exception:  # database blip: waiters time out and retry; never kill the poller
                log.warning("control poll failed", exc_info=True)
                continue
            for run_id, version in current.items():
                if self._known.get(run_id) not in (None, version):
                    self._wake(run_id)
                self._known[run_id] = version
