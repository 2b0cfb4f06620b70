from __future__ import annotations

from fastapi import APIRouter, Request, Response
from sqlalchemy import select

from backend.api.deps import AdminDep, DbDep
from backend.errors import Invalid, NotFound
from backend.models import DeliveryAttempt, Webhook, WebhookDelivery
from backend.schemas import (
    AttemptOut, DeliveryList, DeliveryOut, TestQueued, WebhookCreated, WebhookIn, WebhookList, WebhookOut, WebhookPatch,
)
from backend.webhooks.outbox import enqueue_for
from backend.webhooks.signing import new_secret
from backend.webhooks.ssrf import UnsafeURL, check_url

router = APIRouter(prefix="/webhooks", tags=["webhooks"])


def _out(hook: Webhook) -> WebhookOut:
    return WebhookOut.model_validate(hook, from_attributes=True)


def _get(s, hook_id: int) -> Webhook:  # noqa: ANN001
    hook = s.get(Webhook, hook_id)
    if hook is None:
        raise NotFound(f"webhook {hook_id} does not exist")
    return hook


@router.get("", response_model=WebhookList, summary="List webhooks (secrets are never returned)")
def list_webhooks(db: DbDep, _: AdminDep) -> WebhookList:
    with db.read() as s:
        return WebhookList(webhooks=[_out(h) for h in s.scalars(select(Webhook).order_by(Webhook.id))])


@router.post("", response_model=WebhookCreated, summary="Add a webhook; its signing secret is shown once")
def create_webhook(body: WebhookIn, request: Request, db: DbDep, _: AdminDep) -> WebhookCreated:
    try:
        check_url(body.url, request.app.state.settings.allow_loopback_webhooks)
    except UnsafeURL as exc:
        raise Invalid(f"webhook URL refused: {exc}") from exc
    secret = new_secret()
    with db.write() as s:
        hook = Webhook(url=body.url, format=body.format, events=list(body.events), project=body.project, secret=secret)
        s.add(hook)
        s.flush()
        return WebhookCreated(**_out(hook).model_dump(), secret=secret)


@router.patch("/{hook_id}", response_model=WebhookOut, summary="Enable or disable a webhook")
def patch_webhook(hook_id: int, body: WebhookPatch, db: DbDep, _: AdminDep) -> WebhookOut:
    with db.write() as s:
        hook = _get(s, hook_id)
        hook.enabled = body.enabled
        return _out(hook)


@router.delete("/{hook_id}", status_code=204, summary="Delete a webhook and its delivery log")
def delete_webhook(hook_id: int, db: DbDep, _: AdminDep) -> Response:
    with db.write() as s:
        s.delete(_get(s, hook_id))
    return Response(status_code=204)


@router.post("/{hook_id}/test", response_model=TestQueued, summary="Queue a signed test event")
def send_test(hook_id: int, request: Request, db: DbDep, _: AdminDep) -> TestQueued:
    with db.write() as s:
        delivery = enqueue_for(s, _get(s, hook_id), "test", {"message": "Paritywatch test event"})
        s.flush()
        delivery_id = delivery.id
    request.app.state.dispatcher_wake()
    return TestQueued(delivery_id=delivery_id)


@router.get("/{hook_id}/deliveries", response_model=DeliveryList, summary="Delivery log, newest first")
def deliveries(hook_id: int, db: DbDep, _: AdminDep, limit: int = 100) -> DeliveryList:
    with db.read() as s:
        _get(s, hook_id)
        rows = list(s.scalars(
            select(WebhookDelivery).where(WebhookDelivery.webhook_id == hook_id)
            .order_by(WebhookDelivery.id.desc()).limit(max(1, min(limit, 1000)))
        ))
        attempts: dict[int, list[AttemptOut]] = {d.id: [] for d in rows}
        if rows:
            q = select(DeliveryAttempt).where(DeliveryAttempt.delivery_id.in_(attempts)).order_by(DeliveryAttempt.id)
            for a in s.scalars(q):
                attempts[a.delivery_id].append(AttemptOut.model_validate(a, from_attributes=True))
        out = []
        for d in rows:
            item = DeliveryOut.model_validate(d, from_attributes=True)
            item.attempt_log = attempts[d.id]
            out.append(item)
        return DeliveryList(deliveries=out)
