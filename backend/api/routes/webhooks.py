from __future__ import annotations

from fastapi import APIRouter, Response

from paritywatch.backend.alerts.notifier import grouping_of
from paritywatch.backend.api.deps import (AnswerRoute, AdminDep, DispatcherDep, EffectsDep, ReadDep, ReadSession, ResolverDep, SettingsDep,
                                          WriteSession)
from paritywatch.backend.api.query import DeliveriesPage, encode_cursor
from paritywatch.backend.errors import Invalid
from paritywatch.backend.models import Webhook
from paritywatch.backend.schemas.meta import EventTypeList, EventTypeOut
from paritywatch.backend.schemas.webhooks import (AttemptOut, DeliveryList, DeliveryOut, TestQueued, WebhookCreated, WebhookIn,
                                                  WebhookList, WebhookOut, WebhookPatch)
from paritywatch.backend.settings import Settings
from paritywatch.backend.store import webhooks as webhook_store
from paritywatch.backend.webhooks.outbox import enqueue_for
from paritywatch.backend.webhooks.signing import new_secret
from paritywatch.backend.webhooks.ssrf import AddressPolicy, UnsafeURL, check_url
from trainer_hooks.contract import WEBHOOK_EVENT_DESCRIPTIONS
from trainer_hooks import contract

router = APIRouter(prefix="/webhooks", tags=["webhooks"], route_class=AnswerRoute)
events_router = APIRouter(tags=["webhooks"], route_class=AnswerRoute)


@events_router.get("/webhook-events", response_model=EventTypeList, summary="The event types a webhook can subscribe to")
def event_types(_: ReadDep) -> EventTypeList:
    return EventTypeList(events=[EventTypeOut(type=k, description=v) for k, v in WEBHOOK_EVENT_DESCRIPTIONS.items()])


GROUPING_FIELDS = ("group_by", "group_wait_s", "group_interval_s", "repeat_interval_s")


def _out(hook: Webhook, settings: Settings) -> WebhookOut:
    out = WebhookOut.model_validate(hook, from_attributes=True)
    out.grouping = grouping_of(hook, settings)
    return out


@router.get("", response_model=WebhookList, summary="List webhooks (secrets are never returned)")
def list_webhooks(s: ReadSession, settings: SettingsDep, _: AdminDep) -> WebhookList:
    return WebhookList(webhooks=[_out(h, settings) for h in webhook_store.list_webhooks(s)])


@router.post("", response_model=WebhookCreated, summary="Add a webhook; its signing secret is shown once")
def create_webhook(body: WebhookIn, s: WriteSession, settings: SettingsDep, resolver: ResolverDep,
                   dispatcher: DispatcherDep, _: AdminDep) -> WebhookCreated:
    # Before the first statement: `s` has not begun, so the host's resolution holds no writer.
    try:
        check_url(body.url, AddressPolicy.from_settings(settings), resolver)
    except UnsafeURL as exc:
        raise Invalid(f"webhook URL refused: {exc}") from exc
    secret = new_secret()
    sealed = dispatcher.box.seal(secret)  # encrypted at rest; 503 when no key is configured
    hook = webhook_store.add_webhook(s, url=body.url, format=body.format, events=list(body.events),
                                     project=body.project, secret=sealed,
                                     **body.model_dump(include=set(GROUPING_FIELDS)))
    return WebhookCreated(**_out(hook, settings).model_dump(), secret=secret)


@router.patch("/{hook_id}", response_model=WebhookOut, summary="Enable or disable a webhook; change its grouping")
def patch_webhook(hook_id: int, body: WebhookPatch, s: WriteSession, settings: SettingsDep, _: AdminDep) -> WebhookOut:
    fields = body.model_dump(exclude_unset=True)
    if "enabled" in fields and fields["enabled"] is None:
        raise Invalid("enabled must be true or false")
    return _out(webhook_store.update_webhook(s, hook_id, fields), settings)


@router.delete("/{hook_id}", status_code=204, summary="Delete a webhook and its delivery log")
def delete_webhook(hook_id: int, s: WriteSession, _: AdminDep) -> Response:
    webhook_store.delete_webhook(s, hook_id)
    return Response(status_code=204)


@router.post("/{hook_id}/test", response_model=TestQueued, summary="Queue a signed test event")
def send_test(hook_id: int, s: WriteSession, effects: EffectsDep, _: AdminDep) -> TestQueued:
    dashboard = effects.public_url + "/"
    hook = webhook_store.get_webhook(s, hook_id)
    delivery = enqueue_for(s, hook, contract.EVENT_TEST, {"message": "Paritywatch test event", "url": dashboard})
    s.flush()
    return TestQueued(delivery_id=delivery.id)  # enqueue_for wakes the dispatcher once this commits


@router.get("/{hook_id}/deliveries", response_model=DeliveryList, summary="Delivery log, newest first (paginated)")
def deliveries(hook_id: int, s: ReadSession, _: AdminDep, page: DeliveriesPage) -> DeliveryList:
    rows, after = webhook_store.deliveries_page(s, hook_id, page)
    out = []
    for delivery, attempts in rows:
        item = DeliveryOut.model_validate(delivery, from_attributes=True)
        item.attempt_log = [AttemptOut.model_validate(a, from_attributes=True) for a in attempts]
        out.append(item)
    return DeliveryList(deliveries=out, next_cursor=encode_cursor(after))
