"""The live summary of runs that the event stream sends: five grouped queries for any number of
runs, so one poll per process serves every open dashboard."""
from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from paritywatch.backend.models import ENDED_RUN_STATES, Alert, Component, Run, Silence, utcnow
from paritywatch.backend.store.control import control_of
from paritywatch.backend.store.workers import silent_cutoff


def run_snapshots(s: Session, run_ids: set[int] | list[int], heartbeat_timeout_s: float | None = None) -> dict[int, dict]:
    """run id -> {last_step, control, firing_alerts, alerts_version, components_version,
    silences_version}; runs that do not exist are absent. `silences_version` moves when a silence
    starts or ends (also by running out): which alerts are `silenced` may have changed.
    `components_version` also moves when a process of an ended run falls silent for
    `heartbeat_timeout_s` (it is then shown `ended`: nothing is written)."""
    ids = sorted(set(run_ids))
    if not ids:
        return {}
    runs = {r.id: r for r in s.scalars(select(Run).where(Run.id.in_(ids)))}
    firing: dict[int, dict[str, int]] = {rid: {} for rid in runs}
    for rid, severity, n in s.execute(
            select(Alert.run_id, Alert.severity, func.count())
            .where(Alert.run_id.in_(ids), Alert.status != "resolved").group_by(Alert.run_id, Alert.severity)):
        firing[rid][severity] = n
    alerts = {rid: (n, last) for rid, n, last in s.execute(
        select(Alert.run_id, func.count(), func.max(Alert.updated_at))
        .where(Alert.run_id.in_(ids)).group_by(Alert.run_id))}
    # Anything the run page shows of its processes moves this version: one joined, one
    # fingerprinted, one closed or lost.
    comps = {row[0]: row[1:] for row in s.execute(
        select(Component.run_id, func.count(), func.max(Component.started_at), func.count(Component.fingerprint_digest),
               func.count(Component.closed_at), func.count(Component.lost_at))
        .where(Component.run_id.in_(ids)).group_by(Component.run_id))}
    now = utcnow()
    ended = [rid for rid, run in runs.items() if run.control_state in ENDED_RUN_STATES]
    silent = dict(s.execute(
        select(Component.run_id, func.count())
        .where(Component.run_id.in_(ended), Component.status == "live",
               Component.last_heartbeat < silent_cutoff(now, heartbeat_timeout_s))
        .group_by(Component.run_id)).all()) if ended and heartbeat_timeout_s is not None else {}
    active, newest = s.execute(select(func.count(), func.max(Silence.id))
                               .where(Silence.ends_at > now, Silence.starts_at <= now)).one()
    out = {}
    for rid, run in runs.items():
        control = control_of(run)
        control["updated_at"] = control["updated_at"].isoformat()
        n_alerts, last_alert = alerts.get(rid, (0, None))
        comp_counts = comps.get(rid, (0, None, 0, 0, 0))
        out[rid] = {
            "last_step": run.last_step,
            "control": control,
            "firing_alerts": firing[rid],
            "alerts_version": f"{n_alerts}:{last_alert}",
            "components_version": ":".join(str(c) for c in (*comp_counts, silent.get(rid, 0))),
            "silences_version": f"{active}:{newest}",
        }
    return out
