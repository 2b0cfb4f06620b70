"""Run control state (running / paused / stopping / stopped) with a version and an audit log."""
from __future__ import annotations

from sqlalchemy import select

from backend.db import Database
from backend.errors import Conflict
from backend.models import ControlEvent, Run, utcnow
from backend.store.runs import get_component, get_run

# action -> (states it may start from, resulting state)
TRANSITIONS = {
    "pause": ({"running"}, "paused"),
    "resume": ({"paused"}, "running"),
    "stop": ({"running", "paused"}, "stopping"),
}


def control_of(run: Run) -> dict:
    return {
        "state": run.control_state,
        "version": run.control_version,
        "actor": run.control_actor,
        "reason": run.control_reason,
        "updated_at": run.control_updated_at,
    }


def apply_action(db: Database, run_id: int, action: str, actor: str | None, reason: str) -> dict:
    """Change the state; repeating an action that is already in effect is a no-op, not an error."""
    allowed_from, target = TRANSITIONS[action]
    with db.write() as s:
        run = get_run(s, run_id)
        current = run.control_state
        if current == target or (action == "stop" and current == "stopped"):
            return control_of(run)
        if current not in allowed_from:
            raise Conflict(f"cannot {action} a run that is {current}")
        set_state(s, run, target, actor, reason)
        return control_of(run)


def acknowledge_stop(db: Database, run_id: int, component_id: int | None, actor: str, reason: str) -> dict:
    """A hook reports that its loop has ended after a stop: `stopping` becomes `stopped`.
    Idempotent (a second report is a no-op); a run nobody asked to stop is a conflict."""
    with db.write() as s:
        run = get_run(s, run_id)
        if component_id is not None:
            component = get_component(s, run_id, component_id)
            actor = f"{component.side} {component.worker_id}"
        if run.control_state == "stopped":
            return control_of(run)
        if run.control_state != "stopping":
            raise Conflict(f"run {run_id} is {run.control_state}: there is no stop to acknowledge")
        set_state(s, run, "stopped", actor, reason or "the training loop ended after the stop")
        return control_of(run)


def set_state(s, run: Run, target: str, actor: str | None, reason: str) -> None:  # noqa: ANN001
    s.add(
        ControlEvent(
            run_id=run.id,
            version=run.control_version + 1,
            from_state=run.control_state,
            to_state=target,
            actor=actor,
            reason=reason,
        )
    )
    run.control_state = target
    run.control_version += 1
    run.control_actor = actor
    run.control_reason = reason
    run.control_updated_at = utcnow()


def versions(db: Database, run_ids: list[int]) -> dict[int, int]:
    with db.read() as s:
        rows = s.execute(select(Run.id, Run.control_version).where(Run.id.in_(run_ids)))
        return {rid: v for rid, v in rows}


def audit(db: Database, run_id: int) -> list[ControlEvent]:
    with db.read() as s:
        get_run(s, run_id)
        q = select(ControlEvent).where(ControlEvent.run_id == run_id).order_by(ControlEvent.id)
        return list(s.scalars(q))
