"""Webhooks and their delivery log: the SQL behind the admin routes. Delivery itself is
backend/webhooks/dispatcher.py; the outbox rows are written by backend/webhooks/outbox.py."""
from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm import Session

from paritywatch.backend.models import DeliveryAttempt, Webhook, WebhookDelivery
from paritywatch.backend.store.paging import PageRequest, keyset, split_page
from paritywatch.backend.store.rows import get_or_404, insert_row, update_row


def add_webhook(s: Session, **fields) -> Webhook:
    return insert_row(s, Webhook(**fields))


def update_webhook(s: Session, hook_id: int, fields: dict) -> Webhook:
    return update_row(s, Webhook, hook_id, "webhook", fields)


def get_webhook(s: Session, hook_id: int) -> Webhook:
    return get_or_404(s, Webhook, hook_id, "webhook")


def list_webhooks(s: Session) -> list[Webhook]:
    return list(s.scalars(select(Webhook).order_by(Webhook.id)))


def delete_webhook(s: Session, hook_id: int) -> None:
    s.delete(get_webhook(s, hook_id))
    s.flush()


def rewrite_secrets(s: Session, rewrite: Callable[[str], str | None]) -> int:
    """Replace every webhook's stored secret by `rewrite(secret)` (None: keep it), in the
    caller's transaction; how many changed."""
    changed = 0
    for hook in s.scalars(select(Webhook)):
        new = rewrite(hook.secret)
        if new is not None:
            hook.secret = new
            changed += 1
    return changed


def deliveries_page(s: Session, hook_id: int, page: PageRequest
                    ) -> tuple[list[tuple[WebhookDelivery, list[DeliveryAttempt]]], int | None]:
    """One page of a webhook's deliveries, newest first, each with its attempts (oldest first),
    and the position of the next page."""
    get_webhook(s, hook_id)
    q = keyset(select(WebhookDelivery).where(WebhookDelivery.webhook_id == hook_id), WebhookDelivery.id, page)
    rows, after = split_page(s.scalars(q), page, lambda d: d.id)
    attempts: dict[int, list[DeliveryAttempt]] = {d.id: [] for d in rows}
    if rows:
        q = select(DeliveryAttempt).where(DeliveryAttempt.delivery_id.in_(attempts)).order_by(DeliveryAttempt.id)
        for a in s.scalars(q):
            attempts[a.delivery_id].append(a)
    return [(d, attempts[d.id]) for d in rows], after
