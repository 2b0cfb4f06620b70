"""Transactional outbox: delivery rows are written in the caller's transaction, so a change and
its notifications commit (or roll back) together; the dispatcher sends due rows.

Alert notifications are built per group by backend/alerts/notifier.py; the events here go out one
by one (run.control, alert.acknowledged, test). Every payload names the run with its state and a
link to its page."""
from __future__ import annotations

from sqlalchemy.orm import Session

from paritywatch.backend.alerts.effects import effects_of, wakeups
from paritywatch.backend.models import Run, Webhook, WebhookDelivery, utcnow
from paritywatch.backend.store import notifications as store
from trainer_hooks.contract import WEBHOOK_EVENT_TYPES


def event_payload(event_type: str, data: dict) -> dict:
    return {"type": event_type, "timestamp": utcnow().isoformat(), "data": data}


def run_ref(s: Session, run: Run) -> dict:
    """How every payload names a run: with its state now and a link to its page."""
    return {"id": run.id, "name": run.name, "project": run.project, "state": run.control_state,
            "url": effects_of(s).run_url(run.id)}


def wants(hook: Webhook, event_type: str) -> bool:
    return not hook.events or event_type in hook.events


def enqueue_event(s: Session, event_type: str, data: dict, project: str | None) -> int:
    """One delivery per enabled webhook subscribed to this event (of this project)."""
    assert event_type in WEBHOOK_EVENT_TYPES, event_type
    n = 0
    for hook in store.webhooks_for(s, project):
        if wants(hook, event_type):
            enqueue_for(s, hook, event_type, data)
            n += 1
    return n


def enqueue_for(s: Session, hook: Webhook, event_type: str, data: dict) -> WebhookDelivery:
    delivery = store.add_delivery(s, hook.id, event_type, event_payload(event_type, data))
    wakeups(s).outbox = True
    return delivery
