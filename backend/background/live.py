"""In-process event bus for the live run streams.

One poll per process (every `stream_poll_interval_s`) reads the summary of every run someone is
watching, in four grouped queries however many dashboards are open, and hands each open stream
the new summary when its run's changed. Several replicas each poll once: the database sees one
poll per process, not one per browser tab.

The bus also bounds streams: at most `max_streams_per_token` open per token (429 beyond), each
ended after `stream_max_age_s` (the dashboard reconnects and so re-authenticates), and the
streams of a revoked token ended within `stream_auth_check_s` (one query for all open streams).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict

from paritywatch.backend.auth import Principal, TokenCache, active_among
from paritywatch.backend.db import Database
from paritywatch.backend.errors import NotFound, ParitywatchError
from paritywatch.backend.store.snapshots import run_snapshots
from trainer_hooks import contract

log = logging.getLogger("paritywatch.live")


class TooManyStreams(ParitywatchError):
    status = 429
    code = contract.ERROR_TOO_MANY_REQUESTS


class Subscription:
    """One open stream: the latest summary of its run, or the reason it ended."""

    def __init__(self, run_id: int, owner: str, token_hash: str | None, snapshot: dict, max_age_s: float):
        self.run_id, self.owner, self.token_hash = run_id, owner, token_hash
        self.latest = snapshot
        self.ends_at = time.monotonic() + max_age_s
        self.ended: str | None = None
        self._changed = asyncio.Event()

    def offer(self, snapshot: dict) -> None:
        if snapshot != self.latest:
            self.latest = snapshot
            self._changed.set()

    def end(self, reason: str) -> None:
        self.ended = reason
        self._changed.set()

    async def next(self) -> dict | None:
        """The next changed summary; None once the stream must end."""
        while True:
            if self.ended is None and time.monotonic() >= self.ends_at:
                self.ended = "maximum stream age reached: reconnect"
            if self.ended is not None:
                return None
            try:
                await asyncio.wait_for(self._changed.wait(), max(0.0, self.ends_at - time.monotonic()))
            except TimeoutError:
                continue
            self._changed.clear()
            if self.ended is None:
                return self.latest


class StreamHub:
    def __init__(self, db: Database, tokens: TokenCache, open_mode, settings):
        self.db, self.tokens, self.open_mode, self.settings = db, tokens, open_mode, settings
        self._subs: set[Subscription] = set()
        self._task: asyncio.Task | None = None
        self._last_auth_check = 0.0
        self.polls = 0  # for /metrics and tests: how often the shared poll ran

    def _snapshots(self, run_ids) -> dict[int, dict]:
        with self.db.read() as s:  # one read per poll, for every open stream: none held between polls
            return run_snapshots(s, run_ids, self.settings.heartbeat_timeout_s)

    def open_count(self, owner: str) -> int:
        return sum(1 for s in self._subs if s.owner == owner)

    async def subscribe(self, run_id: int, who: Principal) -> Subscription:
        owner = who.token_hash or "open-mode"
        if self.open_count(owner) >= self.settings.max_streams_per_token:
            raise TooManyStreams(f"at most {self.settings.max_streams_per_token} open streams per token")
        snapshot = (await asyncio.to_thread(self._snapshots, [run_id])).get(run_id)
        if snapshot is None:
            raise NotFound(f"run {run_id} does not exist")
        sub = Subscription(run_id, owner, who.token_hash, snapshot, self.settings.stream_max_age_s)
        self._subs.add(sub)
        self._ensure_polling()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subs.discard(sub)

    def close_all(self, reason: str = "server shutting down") -> None:
        for sub in list(self._subs):
            sub.end(reason)
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def _ensure_polling(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._poll_loop())

    async def _poll_loop(self) -> None:
        while self._subs:
            await asyncio.sleep(self.settings.stream_poll_interval_s)
            try:
                await self.poll_once()
            except Exception:  # database blip: keep the streams, try again next tick
                log.warning("live stream poll failed", exc_info=True)

    async def poll_once(self) -> None:
        subs = list(self._subs)
        if not subs:
            return
        now = time.monotonic()
        if now - self._last_auth_check >= self.settings.stream_auth_check_s:
            self._last_auth_check = now
            await self._end_revoked(subs)
        by_run: dict[int, list[Subscription]] = defaultdict(list)
        for sub in subs:
            if sub.ended is None:
                by_run[sub.run_id].append(sub)
        if not by_run:
            return
        snapshots = await asyncio.to_thread(self._snapshots, set(by_run))
        self.polls += 1
        for run_id, watchers in by_run.items():
            snap = snapshots.get(run_id)
            for sub in watchers:
                if snap is None:
                    sub.end("the run was deleted")
                else:
                    sub.offer(snap)

    async def _end_revoked(self, subs: list[Subscription]) -> None:
        """End the streams of revoked tokens, and open-mode streams once the server closed."""
        if any(s.token_hash is None for s in subs) and not await asyncio.to_thread(self.open_mode.is_open):
            for sub in subs:
                if sub.token_hash is None:
                    sub.end("the server left open mode: sign in with a token")
        hashes = {s.token_hash for s in subs if s.token_hash}
        if not hashes:
            return
        active = await asyncio.to_thread(active_among, self.db, hashes)
        for digest in hashes - active:
            self.tokens.invalidate(digest)
            for sub in subs:
                if sub.token_hash == digest:
                    sub.end("token revoked")
