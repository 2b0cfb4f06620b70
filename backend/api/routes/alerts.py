from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from sqlalchemy import select

from backend.alerts import lifecycle
from backend.api.deps import AdminDep, DbDep, ReadDep
from backend.models import Alert, AlertEvent
from backend.schemas import AlertEvents, AlertEventOut, AlertList, AlertNote, AlertOut, RunSettings
from backend.store.runs import get_run

router = APIRouter(tags=["alerts"])
StatusFilter = Annotated[Literal["firing", "acknowledged", "resolved", "open"] | None, Query()]


def _query(status: str | None):  # noqa: ANN202
    q = select(Alert).order_by(Alert.fired_at.desc(), Alert.id.desc()).limit(1000)
    if status == "open":
        return q.where(Alert.status != "resolved")
    return q.where(Alert.status == status) if status else q


@router.get("/runs/{run_id}/alerts", response_model=AlertList, summary="Alerts of a run, newest first")
def run_alerts(run_id: int, db: DbDep, _: ReadDep, status: StatusFilter = None) -> AlertList:
    with db.read() as s:
        get_run(s, run_id)
        rows = s.scalars(_query(status).where(Alert.run_id == run_id))
        return AlertList(alerts=[AlertOut(**lifecycle.alert_dict(a)) for a in rows])


@router.get("/alerts", response_model=AlertList, summary="Alerts across runs")
def all_alerts(db: DbDep, _: ReadDep, status: StatusFilter = None) -> AlertList:
    with db.read() as s:
        return AlertList(alerts=[AlertOut(**lifecycle.alert_dict(a)) for a in s.scalars(_query(status))])


@router.post("/alerts/{alert_id}/acknowledge", response_model=AlertOut, summary="Acknowledge a firing alert")
def acknowledge(alert_id: int, body: AlertNote, db: DbDep, who: AdminDep) -> AlertOut:
    with db.write() as s:
        alert = lifecycle.acknowledge(s, lifecycle.get_alert(s, alert_id), who.name, body.note)
        return AlertOut(**lifecycle.alert_dict(alert))


@router.post("/alerts/{alert_id}/resolve", response_model=AlertOut, summary="Resolve an alert by hand")
def resolve(alert_id: int, body: AlertNote, db: DbDep, who: AdminDep) -> AlertOut:
    with db.write() as s:
        alert = lifecycle.get_alert(s, alert_id)
        alert = lifecycle.resolve(s, get_run(s, alert.run_id), alert, who.name, body.note)
        return AlertOut(**lifecycle.alert_dict(alert))


@router.get("/alerts/{alert_id}/events", response_model=AlertEvents, summary="Audit trail of an alert")
def alert_events(alert_id: int, db: DbDep, _: ReadDep) -> AlertEvents:
    with db.read() as s:
        lifecycle.get_alert(s, alert_id)
        rows = s.scalars(select(AlertEvent).where(AlertEvent.alert_id == alert_id).order_by(AlertEvent.id))
        return AlertEvents(events=[AlertEventOut.model_validate(e, from_attributes=True) for e in rows])


@router.get("/runs/{run_id}/settings", response_model=RunSettings, summary="Per-run detection settings")
def get_settings(run_id: int, db: DbDep, _: ReadDep) -> RunSettings:
    with db.read() as s:
        return RunSettings(on_mismatch=get_run(s, run_id).on_mismatch)


@router.put("/runs/{run_id}/settings", response_model=RunSettings, summary="Change per-run detection settings")
def put_settings(run_id: int, body: RunSettings, db: DbDep, _: AdminDep) -> RunSettings:
    with db.write() as s:
        get_run(s, run_id).on_mismatch = body.on_mismatch
    return body
