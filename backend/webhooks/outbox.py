"""Transactional outbox: delivery rows are written in the caller's transaction, so an alert
and its notifications commit (or roll back) together."""
from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.models import Webhook, WebhookDelivery, utcnow

EVENT_TYPES = ("alert.firing", "alert.resolved", "alert.acknowledged", "run.control", "test")


def event_payload(event_type: str, data: dict) -> dict:
    return {"type": event_type, "timestamp": utcnow().isoformat(), "data": data}


def enqueue_event(s: Session, event_type: str, data: dict, project: str | None) -> int:
    hooks = s.scalars(select(Webhook).where(Webhook.enabled.is_(True)))
    n = 0
    for hook in hooks:
        if hook.project and hook.project != project:
            continue
        if hook.events and event_type not in hook.events:
            continue
        enqueue_for(s, hook, event_type, data)
        n += 1
    return n


def enqueue_for(s: Session, hook: Webhook, event_type: str, data: dict) -> WebhookDelivery:
    delivery = WebhookDelivery(
        webhook_id=hook.id,
        event_id="msg_" + uuid.uuid4().hex,
        event_type=event_type,
        payload=event_payload(event_type, data),
    )
    s.add(delivery)
    return delivery
