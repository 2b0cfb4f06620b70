"""Webhook subscriptions, the notification log of alert groups, and outbox rows: the SQL behind
backend/alerts/notifier.py and backend/webhooks/outbox.py."""
from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from paritywatch.backend.models import NotificationGroup, Webhook, WebhookDelivery


def webhooks_for(s: Session, project: str | None) -> list[Webhook]:
    """Enabled webhooks that want events of this project (their own project, or every project)."""
    q = select(Webhook).where(Webhook.enabled.is_(True)).order_by(Webhook.id)
    return [h for h in s.scalars(q) if not h.project or h.project == project]


def add_delivery(s: Session, webhook_id: int, event_type: str, payload: dict) -> WebhookDelivery:
    """An outbox row, in the caller's transaction: the dispatcher sends it once committed."""
    delivery = WebhookDelivery(webhook_id=webhook_id, event_id="msg_" + uuid.uuid4().hex,
                               event_type=event_type, payload=payload)
    s.add(delivery)
    return delivery


def touch_group(s: Session, webhook_id: int, group_key: str, labels: dict, now: datetime) -> None:
    """Create the group's log row, or mark it due now: its membership changed."""
    insert = pg_insert if s.get_bind().dialect.name == "postgresql" else sqlite_insert
    stmt = insert(NotificationGroup).values(
        webhook_id=webhook_id, group_key=group_key, run_id=labels.get("run_id"), project=labels.get("project"),
        kind=labels.get("kind"), severity=labels.get("severity"), last_firing=[], next_check_at=now, created_at=now,
    ).on_conflict_do_update(index_elements=["webhook_id", "group_key"], set_={"next_check_at": now})
    s.execute(stmt)


def due_groups(s: Session, now: datetime, limit: int) -> list[int]:
    q = (select(NotificationGroup.id).where(NotificationGroup.next_check_at <= now)
         .order_by(NotificationGroup.next_check_at).limit(limit))
    return list(s.scalars(q))


def lock_group(s: Session, group_id: int) -> NotificationGroup | None:
    """The group, locked for this transaction; None when it is gone or another replica holds it
    (PostgreSQL SKIP LOCKED; on SQLite the write lock already serialises)."""
    q = (select(NotificationGroup).where(NotificationGroup.id == group_id)
         .with_for_update(skip_locked=True).execution_options(populate_existing=True))
    return s.scalar(q)


def get_webhook(s: Session, webhook_id: int) -> Webhook | None:
    return s.get(Webhook, webhook_id)


def recheck_waiting(s: Session, now: datetime) -> None:
    """Every group waiting for a later time is due now (a silence ended early: what it muted
    may need telling)."""
    s.execute(update(NotificationGroup).where(NotificationGroup.next_check_at > now).values(next_check_at=now))
