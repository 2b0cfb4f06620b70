"""Webhook deliveries as the dispatcher sees them: claiming due rows, renewing claims, loading
one with its webhook, recording an attempt. The SQL; the delivery policy is backend/webhooks/."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import or_, select, update

from sqlalchemy.orm import Session
from paritywatch.backend.models import DeliveryAttempt, Webhook, WebhookDelivery


def _due(now: datetime) -> tuple:
    """Pending, its next attempt due, and not claimed by a live dispatcher."""
    return (
        WebhookDelivery.status == "pending",
        WebhookDelivery.next_attempt_at <= now,
        or_(WebhookDelivery.claimed_until.is_(None), WebhookDelivery.claimed_until < now),
    )


def any_due(s: Session, now: datetime) -> bool:
    """Whether a delivery is due: the dispatcher's idle poll, a read (no write lock, no write
    transaction on SQLite) before it opens the claiming write, the common case being nothing."""
    return s.scalar(select(WebhookDelivery.id).where(*_due(now)).limit(1)) is not None


def claim_due(s: Session, limit: int, now: datetime, until: datetime) -> list[int]:
    """Claim up to `limit` due deliveries until `until` (FOR UPDATE SKIP LOCKED on PostgreSQL, the
    write lock on SQLite); their ids, oldest first. In a write transaction."""
    due = (
        select(WebhookDelivery.id)
        .where(*_due(now))
        .order_by(WebhookDelivery.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    ids = list(s.scalars(due))
    if ids:
        s.execute(update(WebhookDelivery).where(WebhookDelivery.id.in_(ids)).values(claimed_until=until))
    return ids


def extend_claims(s: Session, ids: set[int], until: datetime) -> None:
    """Keep in-flight deliveries claimed (those still pending) until `until`."""
    s.execute(update(WebhookDelivery)
              .where(WebhookDelivery.id.in_(ids), WebhookDelivery.status == "pending")
              .values(claimed_until=until))


def load_delivery(s: Session, delivery_id: int) -> tuple[WebhookDelivery | None, Webhook | None]:
    delivery = s.get(WebhookDelivery, delivery_id)
    hook = s.get(Webhook, delivery.webhook_id) if delivery else None
    return delivery, hook


def record_attempt(s: Session, delivery_id: int, status_code: int | None, error: str | None, duration_ms: float,
                   changes: dict) -> None:
    """Log one attempt and apply its outcome (`changes` to the delivery row)."""
    s.add(DeliveryAttempt(delivery_id=delivery_id, status_code=status_code, error=error, duration_ms=duration_ms))
    s.execute(update(WebhookDelivery).where(WebhookDelivery.id == delivery_id).values(**changes))
