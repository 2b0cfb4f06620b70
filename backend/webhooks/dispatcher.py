"""Delivers outbox rows. Any number of backend processes may run one: a delivery is claimed
atomically (FOR UPDATE SKIP LOCKED on PostgreSQL, the write lock on SQLite) before it is sent,
so each event goes out once."""
from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import httpx
from sqlalchemy import or_, select, update

from backend.db import Database
from backend.models import DeliveryAttempt, Webhook, WebhookDelivery, utcnow
from backend.settings import Settings
from backend.webhooks import formats, retry, signing
from backend.webhooks.ssrf import UnsafeURL, check_url

log = logging.getLogger("paritywatch.webhooks")
CLAIM_BATCH = 20


def _due(now):  # noqa: ANN001, ANN202
    """Pending, its next attempt due, and not claimed by a live dispatcher."""
    return (
        WebhookDelivery.status == "pending",
        WebhookDelivery.next_attempt_at <= now,
        or_(WebhookDelivery.claimed_until.is_(None), WebhookDelivery.claimed_until < now),
    )


class Dispatcher:
    def __init__(self, db: Database, settings: Settings):
        self.db = db
        self.settings = settings
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._http = httpx.Client(timeout=settings.webhook_timeout_s, follow_redirects=False)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="paritywatch-webhooks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread:
            self._thread.join(timeout=5)
        self._http.close()

    def wake(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                sent = self.run_once()
            except Exception:  # database down: keep the thread alive, try again shortly
                log.warning("webhook dispatch failed", exc_info=True)
                sent = 0
            if not sent:
                self._wake.wait(self.settings.webhook_poll_interval_s)
                self._wake.clear()

    def run_once(self) -> int:
        ids = self._claim()
        for delivery_id in ids:
            self._deliver(delivery_id)
        return len(ids)

    def _claim(self) -> list[int]:
        now = utcnow()
        until = now + timedelta(seconds=self.settings.webhook_claim_s)
        due = (
            select(WebhookDelivery.id)
            .where(*_due(now))
            .order_by(WebhookDelivery.id)
            .limit(CLAIM_BATCH)
            .with_for_update(skip_locked=True)
        )
        # Idle poll: a read (no write lock, no write transaction on SQLite) finds nothing due, the
        # common case; only then does the claiming write transaction run.
        probe = select(WebhookDelivery.id).where(*_due(now)).limit(1)
        with self.db.read() as s:
            if s.scalar(probe) is None:
                return []
        with self.db.write() as s:
            ids = list(s.scalars(due))
            if ids:
                s.execute(update(WebhookDelivery).where(WebhookDelivery.id.in_(ids)).values(claimed_until=until))
            return ids

    def _deliver(self, delivery_id: int) -> None:
        with self.db.read() as s:
            delivery = s.get(WebhookDelivery, delivery_id)
            hook = s.get(Webhook, delivery.webhook_id) if delivery else None
        if delivery is None or hook is None:
            return
        started = time.monotonic()
        status_code, error, retry_after = self._send(hook, delivery)
        duration_ms = (time.monotonic() - started) * 1000
        self._record(delivery, status_code, error, retry_after, duration_ms)

    def _send(self, hook: Webhook, delivery: WebhookDelivery) -> tuple[int | None, str | None, float | None]:
        try:
            check_url(hook.url, self.settings.allow_loopback_webhooks)
        except UnsafeURL as exc:
            return 400, f"refused: {exc}", None  # not retryable: the URL itself is unsafe
        body = formats.render(hook.format, delivery.payload)
        headers = signing.headers_for(hook.secret, delivery.event_id, int(time.time()), body)
        headers["user-agent"] = "paritywatch-webhooks/1"
        try:
            resp = self._http.post(hook.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return None, f"{type(exc).__name__}: {exc}"[:500], None
        error = None if resp.is_success else f"HTTP {resp.status_code}: {resp.text[:200]}"
        return resp.status_code, error, retry.retry_after_s(resp.headers.get("retry-after"), time.time())

    def _record(self, delivery, status_code, error, retry_after, duration_ms) -> None:  # noqa: ANN001
        now = utcnow()
        attempts = delivery.attempts + 1
        outcome = retry.next_step(
            status_code,
            attempts,
            (now - delivery.created_at).total_seconds(),
            retry_after,
            self.settings.webhook_backoff_base_s,
            self.settings.webhook_backoff_cap_s,
            self.settings.webhook_give_up_after_s,
        )
        with self.db.write() as s:
            s.add(DeliveryAttempt(delivery_id=delivery.id, status_code=status_code, error=error, duration_ms=duration_ms))
            values = {"attempts": attempts, "status": outcome.status, "claimed_until": None, "last_error": error}
            if outcome.status == "delivered":
                values["delivered_at"] = now
            elif outcome.status == "pending":
                values["next_attempt_at"] = now + timedelta(seconds=outcome.delay_s)
            s.execute(update(WebhookDelivery).where(WebhookDelivery.id == delivery.id).values(**values))
        if outcome.status == "failed":
            log.warning("webhook delivery %s failed for good after %d attempts: %s", delivery.event_id, attempts, error)
