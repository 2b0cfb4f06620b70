"""Alerts and their audit events: the SQL behind backend/alerts/lifecycle.py and the alert routes."""
from __future__ import annotations

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from paritywatch.backend.models import Alert, AlertEvent, Run
from paritywatch.backend.store.paging import PageRequest, keyset, split_page
from paritywatch.backend.store.rows import get_or_404


def heartbeat_key(component_id: int) -> str:
    """The dedup key of a process's `heartbeat_lost` alert (one open alert per silent process)."""
    return f"heartbeat:{component_id}"


def open_key(run_id: int, dedup_key: str) -> str:
    return f"{run_id}:{dedup_key}"


def open_alert(s: Session, run_id: int, dedup_key: str) -> Alert | None:
    return s.scalar(select(Alert).where(Alert.open_key == open_key(run_id, dedup_key)))


def open_alerts(s: Session, run_id: int, kind: str | None = None) -> list[Alert]:
    q = select(Alert).where(Alert.run_id == run_id, Alert.open_key.is_not(None))
    if kind is not None:
        q = q.where(Alert.kind == kind)
    return list(s.scalars(q.order_by(Alert.id)))


def open_alerts_of_rules(s: Session, rule_ids: list[int]) -> list[Alert]:
    """Open alerts that rules raised (`rule:<id>`, and `rule:<id>:<series>` for per-worker ones), every run."""
    if not rule_ids:
        return []
    keys = [f"rule:{i}" for i in rule_ids]
    match = or_(Alert.dedup_key.in_(keys), *(Alert.dedup_key.like(f"{k}:%") for k in keys))
    return list(s.scalars(select(Alert).where(Alert.status != "resolved", match).order_by(Alert.id)))


def open_alert_kinds(s: Session, run_ids: list[int]) -> dict[int, dict[str, int]]:
    """run id -> {alert kind: open alerts of that kind} (what silences are matched against)."""
    out: dict[int, dict[str, int]] = {rid: {} for rid in run_ids}
    if run_ids:
        q = (select(Alert.run_id, Alert.kind, func.count()).where(Alert.run_id.in_(run_ids), Alert.open_key.is_not(None))
             .group_by(Alert.run_id, Alert.kind))
        for run_id, kind, n in s.execute(q):
            out[run_id][kind] = n
    return out


def add_alert(s: Session, alert: Alert) -> Alert:
    s.add(alert)
    s.flush()
    return alert


def add_event(s: Session, alert_id: int, action: str, actor: str | None, note: str | None) -> None:
    s.add(AlertEvent(alert_id=alert_id, action=action, actor=actor, note=note))


def get_alert(s: Session, alert_id: int) -> Alert:
    return get_or_404(s, Alert, alert_id, "alert")


def list_alerts(s: Session, status: str | None, run_id: int | None = None,
                page: PageRequest = PageRequest(limit=100)) -> tuple[list[tuple[Alert, str]], int | None]:
    """One page of (alert, its run's project), newest first, and the next page's position;
    status "open" = not resolved."""
    q = select(Alert, Run.project).join(Run, Run.id == Alert.run_id)
    if run_id is not None:
        q = q.where(Alert.run_id == run_id)
    if status == "open":
        q = q.where(Alert.status != "resolved")
    elif status:
        q = q.where(Alert.status == status)
    return split_page(s.execute(keyset(q, Alert.id, page)).all(), page, lambda row: row[0].id)


def events_of(s: Session, alert_id: int, page: PageRequest = PageRequest(limit=100)) -> tuple[list[AlertEvent], int | None]:
    """One page of an alert's audit events, oldest first, and the next page's position."""
    get_alert(s, alert_id)
    q = keyset(select(AlertEvent).where(AlertEvent.alert_id == alert_id), AlertEvent.id, page, newest_first=False)
    return split_page(s.scalars(q), page, lambda e: e.id)


def group_members(s: Session, labels: dict, project_filter: str | None,
                  also_ids: list[int]) -> list[tuple[Alert, Run]]:
    """Open alerts whose labels (run_id, kind, project, severity: those given) match, plus the
    alerts among `also_ids` (the ones last announced as firing), with their runs."""
    def scoped(q):
        if labels.get("run_id") is not None:
            q = q.where(Alert.run_id == labels["run_id"])
        if labels.get("kind") is not None:
            q = q.where(Alert.kind == labels["kind"])
        if labels.get("severity") is not None:
            q = q.where(Alert.severity == labels["severity"])
        if labels.get("project") is not None:
            q = q.where(Run.project == labels["project"])
        if project_filter:
            q = q.where(Run.project == project_filter)
        return q

    base = select(Alert, Run).join(Run, Run.id == Alert.run_id)
    rows = {a.id: (a, r) for a, r in s.execute(scoped(base.where(Alert.open_key.is_not(None))))}
    if also_ids:
        for a, r in s.execute(base.where(Alert.id.in_(also_ids))):
            rows.setdefault(a.id, (a, r))
    return [rows[k] for k in sorted(rows)]
