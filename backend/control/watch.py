"""Long-poll support: wake waiters the moment a run's control version changes.

Changes made by this process wake waiters at once; changes made by another backend process
on the same database are seen by one shared poll (one query for all watched runs). When the
server is told to stop, every long-poll answers with the current state at once, so shutdown
neither waits out its grace period nor cancels requests mid-wait (a traceback and a 500 per
hook).
"""
from __future__ import annotations

import asyncio
import logging
import signal

from starlette.concurrency import run_in_threadpool

from paritywatch.backend.db import Database
from paritywatch.backend.store import control as control_store

log = logging.getLogger("paritywatch.control")
LATEST_MAX = 4096


class ControlWatcher:
    def __init__(self, db: Database, poll_interval_s: float):
        self.db = db
        self.poll_interval_s = poll_interval_s
        self._waiters: dict[int, set[asyncio.Future]] = {}
        self._known: dict[int, int] = {}
        self._latest: dict[int, dict] = {}  # the newest control state this process committed, per run
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._closing = False

    def waiting(self) -> int:
        """Open long-polls in this process (a gauge on /metrics)."""
        return sum(len(w) for w in self._waiters.values())

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

    def notify(self, run_id: int, control: dict | None = None) -> None:
        """Thread-safe: called after a control change commits in this process, with the new
        control state when the caller has it (then woken waiters answer without a query: 256
        hooks long-polling one run see a pause at once)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake, run_id, control)

    async def wait_for_change(self, run_id: int, after_version: int, timeout_s: float) -> dict | None:
        """Return when the run's version differs from `after_version`, or after the timeout: the
        newer control state if this process made it (else None: the caller reads it)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self._closing:
            fut = loop.create_future()
            self._waiters.setdefault(run_id, set()).add(fut)
            try:
                latest = self._latest.get(run_id)
                if latest is not None and latest["version"] > after_version:
                    return latest  # versions only grow: newer than what the caller has seen
                current = (await run_in_threadpool(self._versions, [run_id])).get(run_id)
                if current is None or current != after_version:
                    return None
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return None
                try:
                    await asyncio.wait_for(fut, remaining)
                except asyncio.TimeoutError:
                    return None
            finally:
                waiters = self._waiters.get(run_id)
                if waiters is not None:
                    waiters.discard(fut)
                    if not waiters:
                        del self._waiters[run_id]
        return None  # the server is stopping: the caller answers with the current state

    def _versions(self, run_ids: list[int]) -> dict[int, int]:
        """One read of its own, on the thread pool, between waits: never one held through a wait."""
        with self.db.read() as s:
            return control_store.versions(s, run_ids)

    def _wake(self, run_id: int, control: dict | None = None) -> None:
        if control is not None:
            known = self._latest.get(run_id)
            if known is None or known["version"] < control["version"]:
                self._latest[run_id] = control
            if len(self._latest) > LATEST_MAX:  # keep the runs someone waits on
                self._latest = {r: c for r, c in self._latest.items() if r in self._waiters}
        for fut in list(self._waiters.get(run_id, ())):
            if not fut.done():
                fut.set_result(None)

    def _release_all(self) -> None:
        self._closing = True
        for run_id in list(self._waiters):
            self._wake(run_id)

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval_s)
            if not self._closing and _server_exiting():
                self._release_all()
            if not self._waiters:
                continue
            try:
                current = await run_in_threadpool(self._versions, list(self._waiters))
            except Exception:  # database blip: waiters time out and retry; never kill the poller
                log.warning("control poll failed", exc_info=True)
                continue
            for run_id, version in current.items():
                if self._known.get(run_id) not in (None, version):
                    self._wake(run_id)
                self._known[run_id] = version


def _server_exiting() -> bool:
    """True once uvicorn has been told to stop (SIGINT/SIGTERM): its signal handler is a bound
    method of its `Server`, whose `should_exit` is then set. uvicorn gives the app no shutdown
    signal before its grace period ends; sse-starlette detects the start of shutdown the same way."""
    server = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
    return bool(getattr(server, "should_exit", False))
