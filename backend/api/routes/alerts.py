from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Body, Query

from paritywatch.backend.alerts import lifecycle
from paritywatch.backend.alerts.silences import muting
from paritywatch.backend.alerts.effects import after_commit
from paritywatch.backend.api.deps import AnswerRoute, AdminDep, EngineDep, ReadDep, ReadSession, WriteSession
from paritywatch.backend.api.query import AlertsPage, EventsPage, encode_cursor
from paritywatch.backend.models import Alert, utcnow
from paritywatch.backend.schemas.alerts import AlertEvents, AlertEventOut, AlertList, AlertNote, AlertOut
from paritywatch.backend.schemas.runs import RunSettings
from paritywatch.backend.schemas.common import CONFLICT_RESPONSE
from paritywatch.backend.detect import packs as pack_catalog
from paritywatch.backend.store import alerts as alert_store
from paritywatch.backend.store import packs as pack_store
from paritywatch.backend.store import silences as silence_store
from paritywatch.backend.store.runs import get_run

router = APIRouter(tags=["alerts"], route_class=AnswerRoute)
StatusFilter = Annotated[Literal["firing", "acknowledged", "resolved", "open"] | None, Query()]
OptionalNote = Annotated[AlertNote | None, Body()]


def _marked(s, rows: list[tuple[Alert, str]]) -> list[AlertOut]:
    """Alerts with the active silences that mute them: the notifier's own rule (an active silence
    that matches mutes an alert's notifications, its resolution included), so every view of an
    alert says `silenced` exactly when no message about it can go out."""
    silences = silence_store.active(s, utcnow())
    return [AlertOut(**lifecycle.alert_dict(a, muting(silences, a.run_id, project, a.kind))) for a, project in rows]


@router.get("/runs/{run_id}/alerts", response_model=AlertList, summary="Alerts of a run, newest first (paginated)")
def run_alerts(run_id: int, s: ReadSession, _: ReadDep, page: AlertsPage, status: StatusFilter = None) -> AlertList:
    get_run(s, run_id)
    rows, after = alert_store.list_alerts(s, status, run_id, page)
    return AlertList(alerts=_marked(s, rows), next_cursor=encode_cursor(after))


@router.get("/alerts", response_model=AlertList, summary="Alerts across runs, newest first (paginated)")
def all_alerts(s: ReadSession, _: ReadDep, page: AlertsPage, status: StatusFilter = None) -> AlertList:
    rows, after = alert_store.list_alerts(s, status, None, page)
    return AlertList(alerts=_marked(s, rows), next_cursor=encode_cursor(after))


@router.post("/alerts/{alert_id}/acknowledge", response_model=AlertOut, responses=CONFLICT_RESPONSE, summary="Acknowledge a firing alert")
def acknowledge(alert_id: int, s: WriteSession, who: AdminDep, body: OptionalNote = None) -> AlertOut:
    alert = lifecycle.get_alert(s, alert_id)
    run = get_run(s, alert.run_id)
    alert = lifecycle.acknowledge(s, run, alert, who.name, _note(body))
    return _marked(s, [(alert, run.project)])[0]


@router.post("/alerts/{alert_id}/resolve", response_model=AlertOut, summary="Resolve an alert by hand")
def resolve(alert_id: int, s: WriteSession, who: AdminDep, body: OptionalNote = None) -> AlertOut:
    alert = lifecycle.get_alert(s, alert_id)
    run = get_run(s, alert.run_id)
    alert = lifecycle.resolve(s, run, alert, who.name, _note(body))
    return _marked(s, [(alert, run.project)])[0]


def _note(body: AlertNote | None) -> str | None:
    """The body is optional: no body (or `{}`) is an action without a note."""
    return body.note if body is not None else None


@router.get("/alerts/{alert_id}/events", response_model=AlertEvents, summary="Audit trail of an alert, oldest first (paginated)")
def alert_events(alert_id: int, s: ReadSession, _: ReadDep, page: EventsPage) -> AlertEvents:
    rows, after = alert_store.events_of(s, alert_id, page)
    return AlertEvents(events=[AlertEventOut.model_validate(e, from_attributes=True) for e in rows],
                       next_cursor=encode_cursor(after))


@router.get("/runs/{run_id}/settings", response_model=RunSettings, summary="Per-run detection settings")
def get_settings(run_id: int, s: ReadSession, _: ReadDep) -> RunSettings:
    return RunSettings(on_mismatch=get_run(s, run_id).on_mismatch, packs=pack_store.enabled(s, run_id=run_id))


@router.put("/runs/{run_id}/settings", response_model=RunSettings, summary="Change per-run detection settings")
def put_settings(run_id: int, body: RunSettings, s: WriteSession, engine: EngineDep, who: AdminDep) -> RunSettings:
    run = get_run(s, run_id)
    if body.on_mismatch is not None:
        run.on_mismatch = body.on_mismatch
    if body.packs is not None:
        change = pack_store.set_packs(s, body.packs, pack_catalog.rules_of, run_id=run_id)
        lifecycle.resolve_rule_alerts(s, change.removed_rule_ids, who.name, "its framework pack was turned off")
    after_commit(s, lambda: engine.forget_rules(run_id))
    return RunSettings(on_mismatch=run.on_mismatch, packs=pack_store.enabled(s, run_id=run_id))
