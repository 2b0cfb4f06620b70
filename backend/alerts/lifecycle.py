"""Alert lifecycle: firing -> acknowledged -> resolved, one open alert per (run, dedup key),
every change audited. Alerts are per cause; a change only marks the alert's notification groups
due (in the same transaction), and backend/alerts/notifier.py decides what goes out and when.
Each change also keeps the run's record of what it trained on (backend/alerts/taint.py), in the
same transaction."""
from __future__ import annotations

from sqlalchemy.orm import Session

from paritywatch.backend.alerts import grouping, taint
from paritywatch.backend.alerts.effects import effects_of, wakeups
from paritywatch.backend.errors import Conflict
from paritywatch.backend.models import Alert, Run, utcnow
from paritywatch.backend.store import alerts as store
from paritywatch.backend.store import notifications as notification_store
from paritywatch.backend.webhooks.outbox import enqueue_event, run_ref, wants
from trainer_hooks import contract

ACTOR = "paritywatch"
get_alert = store.get_alert
open_alert = store.open_alert
open_alerts = store.open_alerts


def alert_dict(a: Alert, silenced_by: list[int] | None = None) -> dict:
    return {
        "id": a.id, "run_id": a.run_id, "kind": a.kind, "severity": a.severity, "status": a.status,
        "dedup_key": a.dedup_key, "title": a.title, "detail": a.detail or {}, "step": a.step,
        "fired_at": a.fired_at, "updated_at": a.updated_at, "resolved_at": a.resolved_at,
        "silenced": bool(silenced_by), "silenced_by": list(silenced_by or []),
    }


def alert_json(a: Alert) -> dict:
    d = alert_dict(a)
    for k in ("fired_at", "updated_at", "resolved_at"):
        d[k] = d[k].isoformat() if d[k] else None
    del d["silenced"], d["silenced_by"]
    return d


def fire(s: Session, run: Run, kind: str, severity: str, dedup_key: str, title: str, detail: dict,
         step: int | None = None) -> tuple[Alert, bool]:
    """Open an alert, or refresh the open one with this key. Returns (alert, newly_fired)."""
    existing = store.open_alert(s, run.id, dedup_key)
    now = utcnow()
    if existing is not None:
        existing.detail, existing.title, existing.updated_at = detail, title, now
        if severity != existing.severity:
            existing.severity = severity
        taint.track(s, run, existing)
        return existing, False
    alert = store.add_alert(s, Alert(
        run_id=run.id, kind=kind, severity=severity, dedup_key=dedup_key, open_key=store.open_key(run.id, dedup_key),
        status="firing", title=title, detail=detail, step=step, fired_at=now, updated_at=now))
    store.add_event(s, alert.id, "fired", ACTOR, title)
    taint.track(s, run, alert)
    _groups_changed(s, run, alert)
    return alert, True


def resolve(s: Session, run: Run, alert: Alert, actor: str, note: str | None = None, auto: bool = False) -> Alert:
    if alert.status == "resolved":
        return alert
    now = utcnow()
    alert.status, alert.open_key, alert.resolved_at, alert.updated_at = "resolved", None, now, now
    store.add_event(s, alert.id, "auto_resolved" if auto else "resolved", actor, note)
    s.flush()
    taint.track(s, run, alert)
    _groups_changed(s, run, alert)
    return alert


def resolve_key(s: Session, run: Run, dedup_key: str, note: str) -> None:
    alert = store.open_alert(s, run.id, dedup_key)
    if alert is not None:
        resolve(s, run, alert, ACTOR, note, auto=True)


def resolve_rule_alerts(s: Session, rule_ids: list[int], actor: str | None, note: str) -> int:
    """Resolve what rules that are going away (deleted, disabled) raised: nothing would ever
    evaluate them again, so their alerts could never resolve by themselves."""
    alerts = store.open_alerts_of_rules(s, rule_ids)
    for alert in alerts:
        resolve(s, s.get(Run, alert.run_id), alert, actor, note)
    return len(alerts)


def resolve_all(s: Session, run: Run, note: str) -> int:
    """Resolve every open alert of a run (it ended: nothing is left to act on)."""
    alerts = store.open_alerts(s, run.id)
    for alert in alerts:
        resolve(s, run, alert, ACTOR, note, auto=True)
    return len(alerts)


def acknowledge(s: Session, run: Run, alert: Alert, actor: str, note: str | None = None) -> Alert:
    if alert.status == "resolved":
        raise Conflict("a resolved alert cannot be acknowledged")
    if alert.status == "firing":
        alert.status, alert.updated_at = "acknowledged", utcnow()
        store.add_event(s, alert.id, "acknowledged", actor, note)
        enqueue_event(s, contract.EVENT_ALERT_ACKNOWLEDGED,
                      {"alert": alert_json(alert), "run": run_ref(s, run), "actor": actor, "note": note,
                       "url": effects_of(s).run_url(run.id)}, run.project)
    return alert


def _groups_changed(s: Session, run: Run, alert: Alert) -> None:
    """The alert joined or left its groups (one per webhook that wants alert events): mark them
    due. Webhooks are read once per transaction (a sweep may fire a hundred alerts)."""
    cache = s.info.setdefault("paritywatch.hooks", {})
    hooks = cache.get(run.project)
    if hooks is None:
        hooks = cache[run.project] = [h for h in notification_store.webhooks_for(s, run.project)
                                      if wants(h, contract.EVENT_ALERT_FIRING) or wants(h, contract.EVENT_ALERT_RESOLVED)]
    now = utcnow()
    default_group_by = effects_of(s).default_group_by
    for hook in hooks:
        labels = grouping.labels_of(hook.group_by or default_group_by, run.id, run.project, alert.kind, alert.severity)
        notification_store.touch_group(s, hook.id, grouping.key_of(labels), labels, now)
    if hooks:
        wakeups(s).notify = True
