"""Runs and their components."""
from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backend.db import Database
from backend.errors import NotFound
from backend.detect.rules import BUILTIN_RULES
from backend.models import Alert, Component, Rule, Run, utcnow


def get_run(s: Session, run_id: int) -> Run:
    run = s.get(Run, run_id)
    if run is None:
        raise NotFound(f"run {run_id} does not exist")
    return run


def create_or_get_run(db: Database, name: str, project: str, tags: dict, config: dict) -> Run:
    """Idempotent by (project, name); tags and config of an existing run are merged."""
    for _ in range(2):  # a concurrent creator can win the insert: then read its row
        try:
            with db.write() as s:
                run = s.scalar(select(Run).where(Run.project == project, Run.name == name))
                if run is None:
                    run = Run(project=project, name=name, tags=tags, config=config)
                    s.add(run)
                    s.flush()
                    s.add_all(Rule(run_id=run.id, builtin=True, **r) for r in BUILTIN_RULES)
                elif tags or config:
                    run.tags = {**(run.tags or {}), **tags}
                    run.config = {**(run.config or {}), **config}
                s.flush()
                return run
        except IntegrityError:
            continue
    raise RuntimeError("run creation raced twice")  # pragma: no cover


def list_runs(db: Database, project: str | None = None, state: str | None = None) -> list[Run]:
    with db.read() as s:
        q = select(Run).order_by(Run.created_at.desc(), Run.id.desc())
        if project:
            q = q.where(Run.project == project)
        if state:
            q = q.where(Run.control_state == state)
        return list(s.scalars(q))


def components_of(db: Database, run_ids: list[int]) -> dict[int, list[Component]]:
    out: dict[int, list[Component]] = {rid: [] for rid in run_ids}
    if not run_ids:
        return out
    with db.read() as s:
        q = select(Component).where(Component.run_id.in_(run_ids)).order_by(Component.id)
        for comp in s.scalars(q):
            out[comp.run_id].append(comp)
    return out


def firing_alert_counts(db: Database, run_ids: list[int]) -> dict[int, dict[str, int]]:
    out: dict[int, dict[str, int]] = {rid: {} for rid in run_ids}
    if not run_ids:
        return out
    with db.read() as s:
        q = (
            select(Alert.run_id, Alert.severity, func.count())
            .where(Alert.run_id.in_(run_ids), Alert.status != "resolved")
            .group_by(Alert.run_id, Alert.severity)
        )
        for run_id, severity, n in s.execute(q):
            out[run_id][severity] = n
    return out


def load_run(db: Database, run_id: int) -> Run:
    with db.read() as s:
        return get_run(s, run_id)


def register_component(
    db: Database, run_id: int, side: str, worker_id: str, host: str, pid: int
) -> Component:
    """Upsert by (run, side, worker_id): a restarted worker keeps its row."""
    for _ in range(2):
        try:
            with db.write() as s:
                get_run(s, run_id)
                comp = s.scalar(
                    select(Component).where(
                        Component.run_id == run_id,
                        Component.side == side,
                        Component.worker_id == worker_id,
                    )
                )
                now = utcnow()
                if comp is None:
                    comp = Component(run_id=run_id, side=side, worker_id=worker_id)
                    s.add(comp)
                comp.host, comp.pid, comp.started_at, comp.last_heartbeat = host, pid, now, now
                s.flush()
                return comp
        except IntegrityError:
            continue
    raise RuntimeError("component registration raced twice")  # pragma: no cover


def get_component(s: Session, run_id: int, component_id: int) -> Component:
    comp = s.get(Component, component_id)
    if comp is None or comp.run_id != run_id:
        raise NotFound(f"component {component_id} of run {run_id} does not exist")
    return comp


def heartbeat(db: Database, run_id: int, component_id: int) -> Run:
    with db.write() as s:
        comp = get_component(s, run_id, component_id)
        comp.last_heartbeat = utcnow()
        return get_run(s, run_id)
