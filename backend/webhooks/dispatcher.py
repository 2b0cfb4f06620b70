"""Delivers outbox rows. Any number of backend processes may run one.

Each event goes out once:
- a delivery is claimed atomically (FOR UPDATE SKIP LOCKED on PostgreSQL, the write lock on
  SQLite) for `webhook_claim_s`, and the claim is renewed every third of that while the delivery
  is in flight, so a slow receiver never lets it expire and another replica send it again;
- a process claims only as many deliveries as it has free sending slots (`webhook_concurrency`),
  and sends them concurrently on its own asyncio loop: a receiver that answers slowly, or trickles
  its answer byte by byte, holds one slot until its wall-clock deadline (`webhook_timeout_s`),
  never the queue.

What is sent is checked at connection time (backend/webhooks/ssrf.py: resolve once, check every
address, connect to the checked one; no proxy from the environment). Of the receiver's answer
only the status, Retry-After and the size of at most `webhook_max_answer_bytes` raw (never
decompressed) bytes are kept: an admin reading the delivery log cannot read internal pages.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import httpx

from paritywatch.backend.db import Database
from paritywatch.backend.models import Webhook, WebhookDelivery, utcnow
from paritywatch.backend.settings import Settings
from paritywatch.backend.store import deliveries
from paritywatch.backend.webhooks import formats, retry, signing
from paritywatch.backend.webhooks.secrets import SecretBox, SecretUnreadable
from paritywatch.backend.webhooks.ssrf import (
    AddressPolicy, PinnedBackend, PinnedTransport, Resolver, UnsafeURL, is_refusal, parse_target, system_resolver,
)

log = logging.getLogger("paritywatch.webhooks")
# Passed to the retry policy for a target we refuse to contact: a permanent failure, no retry.
REFUSED = 400
STOP_GRACE_S = 5.0


@dataclass(frozen=True)
class Attempt:
    status_code: int | None  # what the receiver answered; None when no answer came
    error: str | None
    retry_after: float | None = None
    refused: bool = False  # we did not contact the target (unsafe address): never retried


class Dispatcher:
    def __init__(self, db: Database, settings: Settings, *, resolver: Resolver = system_resolver,
                 network_backend=None):
        self.db = db
        self.settings = settings
        self.box = SecretBox(settings.secret_keys)
        self._backend = PinnedBackend(AddressPolicy.from_settings(settings), resolver, network_backend)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._in_flight: set[int] = set()

    # --- lifecycle (called from other threads) ---

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return  # one loop per dispatcher, however often the app's lifespan runs
        self._stopping.clear()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="paritywatch-webhooks",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self.wake()
        if self._thread:
            self._thread.join(timeout=STOP_GRACE_S + 5)

    def wake(self) -> None:
        loop, event = self._loop, self._wake
        if loop is not None and event is not None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the loop has closed
                pass

    def run_once(self) -> int:
        """Claim what is due now (up to the concurrency), send it all, return how many. For tests
        and tools; never while the background thread runs."""
        async def once() -> int:
            async with self._client() as client:
                ids = await asyncio.to_thread(self._claim, self.settings.webhook_concurrency)
                await asyncio.gather(*(self._deliver(client, i) for i in ids))
                return len(ids)

        return asyncio.run(once())

    # --- the loop ---

    def _client(self) -> httpx.AsyncClient:
        # trust_env=False: HTTP(S)_PROXY / ALL_PROXY must not route deliveries around the checks.
        return httpx.AsyncClient(transport=PinnedTransport(self._backend, self.settings.webhook_concurrency),
                                 trust_env=False, follow_redirects=False,
                                 timeout=httpx.Timeout(self.settings.webhook_timeout_s))

    async def _main(self) -> None:
        wake = asyncio.Event()
        self._loop, self._wake = asyncio.get_running_loop(), wake
        tasks: set[asyncio.Task] = set()
        async with self._client() as client:
            renewer = asyncio.create_task(self._renew_claims())
            while not self._stopping.is_set():
                wake.clear()
                free = self.settings.webhook_concurrency - len(tasks)
                ids: list[int] = []
                if free > 0:
                    try:
                        ids = await asyncio.to_thread(self._claim, free)
                    except Exception:  # database down: keep the loop alive, try again shortly
                        log.warning("webhook claim failed", exc_info=True)
                for delivery_id in ids:
                    task = asyncio.create_task(self._deliver(client, delivery_id))
                    tasks.add(task)
                    task.add_done_callback(self._finished(tasks, wake))
                if ids and len(tasks) < self.settings.webhook_concurrency:
                    continue  # more may be due right now
                try:
                    await asyncio.wait_for(wake.wait(), self.settings.webhook_poll_interval_s)
                except TimeoutError:
                    pass
            if tasks:  # a short grace for in-flight deliveries; the rest are retried once their claim expires
                _, pending = await asyncio.wait(tasks, timeout=min(self.settings.webhook_timeout_s, STOP_GRACE_S))
                for task in pending:
                    task.cancel()
            renewer.cancel()
        self._loop = self._wake = None

    def _finished(self, tasks: set, wake: asyncio.Event):
        def done(task: asyncio.Task) -> None:
            tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                log.warning("webhook delivery crashed", exc_info=task.exception())
            wake.set()  # a slot is free

        return done

    async def _renew_claims(self) -> None:
        """Keep the claims of in-flight deliveries alive: nobody else may send them meanwhile."""
        every = max(0.05, self.settings.webhook_claim_s / 3)
        while True:
            await asyncio.sleep(every)
            if self._in_flight:
                try:
                    await asyncio.to_thread(self._extend_claims, set(self._in_flight))
                except Exception:
                    log.warning("renewing webhook claims failed", exc_info=True)

    def _extend_claims(self, ids: set[int]) -> None:
        with self.db.write() as s:
            deliveries.extend_claims(s, ids, utcnow() + timedelta(seconds=self.settings.webhook_claim_s))

    def _claim(self, limit: int) -> list[int]:
        now = utcnow()
        with self.db.read() as s:  # the idle poll: nothing due, no write transaction
            if not deliveries.any_due(s, now):
                return []
        with self.db.write() as s:
            return deliveries.claim_due(s, limit, now, now + timedelta(seconds=self.settings.webhook_claim_s))

    # --- one delivery ---

    async def _deliver(self, client: httpx.AsyncClient, delivery_id: int) -> None:
        self._in_flight.add(delivery_id)
        try:
            delivery, hook = await asyncio.to_thread(self._load, delivery_id)
            if delivery is None or hook is None:
                return
            started = time.monotonic()
            attempt = await self._send(client, hook, delivery)
            duration_ms = (time.monotonic() - started) * 1000
            await asyncio.to_thread(self._record, delivery, attempt, duration_ms)
        finally:
            self._in_flight.discard(delivery_id)

    def _load(self, delivery_id: int) -> tuple[WebhookDelivery | None, Webhook | None]:
        with self.db.read() as s:
            return deliveries.load_delivery(s, delivery_id)

    async def _send(self, client: httpx.AsyncClient, hook: Webhook, delivery: WebhookDelivery) -> Attempt:
        try:
            parse_target(hook.url)
        except UnsafeURL as exc:
            return Attempt(None, f"refused: {exc}", refused=True)
        try:
            secret = self.box.open(hook.secret)
        except SecretUnreadable as exc:  # retried: the operator may fix the key and restart
            return Attempt(None, f"cannot sign: {exc}")
        body = formats.render(hook.format, delivery.payload)
        headers = signing.headers_for(secret, delivery.event_id, int(time.time()), body)
        headers["user-agent"] = "paritywatch-webhooks/1"
        headers["accept-encoding"] = "identity"
        return await self._post(client, hook.url, body, headers)

    async def _post(self, client: httpx.AsyncClient, url: str, body: bytes, headers: dict) -> Attempt:
        """POST under one wall-clock deadline; of the answer keep status, Retry-After and size."""
        deadline_s = self.settings.webhook_timeout_s
        limit = self.settings.webhook_max_answer_bytes
        status, retry_after, size, cut = None, None, 0, ""
        try:
            async with asyncio.timeout(deadline_s):
                async with client.stream("POST", url, content=body, headers=headers) as resp:
                    status = resp.status_code
                    retry_after = retry.retry_after_s(resp.headers.get("retry-after"), time.time())
                    if not resp.is_success:  # its size says something; its text is not ours to keep
                        async for chunk in resp.aiter_raw():
                            size += len(chunk)
                            if size >= limit:
                                cut = " (not read further)"
                                break
        except TimeoutError:
            if status is None:
                return Attempt(None, f"no answer within {deadline_s:g} s")
            cut = f" (answer not complete within {deadline_s:g} s)"
        except httpx.HTTPError as exc:
            reason = is_refusal(exc)
            if reason:
                return Attempt(None, f"refused: {reason}", refused=True)
            if status is None:
                return Attempt(None, f"{type(exc).__name__}: {exc}"[:300])
            cut = f" (answer broken off: {type(exc).__name__})"
        if 200 <= status < 300:
            return Attempt(status, None, retry_after)
        return Attempt(status, f"HTTP {status}, {size} bytes{cut}", retry_after)

    def _record(self, delivery: WebhookDelivery, attempt: Attempt, duration_ms: float) -> None:
        now = utcnow()
        attempts = delivery.attempts + 1
        outcome = retry.next_step(
            REFUSED if attempt.refused else attempt.status_code,
            attempts,
            (now - delivery.created_at).total_seconds(),
            attempt.retry_after,
            self.settings.webhook_backoff_base_s,
            self.settings.webhook_backoff_cap_s,
            self.settings.webhook_give_up_after_s,
        )
        values = {"attempts": attempts, "status": outcome.status, "claimed_until": None, "last_error": attempt.error}
        if outcome.status == "delivered":
            values["delivered_at"] = now
        elif outcome.status == "pending":
            values["next_attempt_at"] = now + timedelta(seconds=outcome.delay_s)
        with self.db.write() as s:  # the attempt and its outcome in one transaction
            deliveries.record_attempt(s, delivery.id, attempt.status_code, attempt.error, duration_ms, values)
        if outcome.status == "failed":
            log.warning("webhook delivery %s failed for good after %d attempts: %s", delivery.event_id, attempts,
                        attempt.error)
