"""Runs and their components (processes): the SQL. The state machine that uses it is
backend/control/run_state.py."""
from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Callable

from sqlalchemy import case, func, select, update
from sqlalchemy.orm import Session

from paritywatch.backend.db import Database
from paritywatch.backend.errors import Invalid, NotFound, TooLarge
from paritywatch.backend.models import LIVE_RUN_STATES, Alert, Component, Rule, Run, utcnow
from paritywatch.backend.store import packs as pack_store
from paritywatch.backend.store.paging import PageRequest, keyset, split_page
from paritywatch.backend.store.rows import raced

MAX_RUN_TAGS = 100


def get_run(s: Session, run_id: int) -> Run:
    run = s.get(Run, run_id)
    if run is None or run.deleted_at is not None:  # a run being deleted is gone for the API
        raise NotFound(f"run {run_id} does not exist")
    return run


def lock_run(s: Session, run_id: int) -> Run:
    """The run, its row locked until the transaction ends (PostgreSQL; SQLite's write lock already
    serialises writers): detection and state changes of one run happen one at a time.

    Lock order, everywhere: the run, then its processes. FOR NO KEY UPDATE, not FOR UPDATE: rows
    that merely reference the run (a new alert, job or process checks its foreign key with FOR KEY
    SHARE) do not wait for it."""
    run = s.scalar(select(Run).where(Run.id == run_id).with_for_update(key_share=True)
                   .execution_options(populate_existing=True))
    if run is None or run.deleted_at is not None:  # a run being deleted is gone for the API
        raise NotFound(f"run {run_id} does not exist")
    return run


def create_or_get_run(s: Session, name: str, project: str, tags: dict, config: dict,
                      max_config_bytes: int | None = None, *, default_rules: Iterable[dict],
                      packs: Iterable[str] = (), pack_rules: Callable[[str], list[dict]] | None = None) -> Run:
    """Idempotent by (project, name); tags and config of an existing run are merged (and the
    merged ones must stay within MAX_RUN_TAGS tags and `max_config_bytes` of JSON). A new run
    gets `default_rules` (the caller passes detection's built-in rules: the store does not know
    them). `packs` are enabled for the run (added to the ones it has), their rules made by
    `pack_rules`."""
    def attempt(_n: int) -> Run:  # a concurrent creator can win the insert: then read its row
        run = s.scalar(select(Run).where(Run.project == project, Run.name == name))
        if run is None:
            check_run_size(tags, config, max_config_bytes)
            run = Run(project=project, name=name, tags=tags, config=config)
            s.add(run)
            s.flush()
            s.add_all(Rule(run_id=run.id, builtin=True, **r) for r in default_rules)
        elif tags or config:
            merged_tags, merged_config = {**(run.tags or {}), **tags}, {**(run.config or {}), **config}
            check_run_size(merged_tags, merged_config, max_config_bytes)
            run.tags, run.config = merged_tags, merged_config
        if packs:
            pack_store.set_packs(s, packs, pack_rules, run_id=run.id, remove_others=False)
        s.flush()
        return run
    return raced(s, attempt, "run creation")


def check_run_size(tags: dict, config: dict, max_config_bytes: int | None) -> None:
    if len(tags) > MAX_RUN_TAGS:
        raise Invalid(f"a run has at most {MAX_RUN_TAGS} tags (with the existing ones these would make {len(tags)})")
    if max_config_bytes is not None:
        size = len(json.dumps(config, separators=(",", ":"), ensure_ascii=False).encode())
        if size > max_config_bytes:
            raise TooLarge(f"the run's config would be {size:,} bytes of JSON; the limit is {max_config_bytes:,} "
                           "(keep big artefacts elsewhere and put a link in the config)")


def list_runs(s: Session, project: str | None = None, state: str | None = None,
              page: PageRequest = PageRequest(limit=100)) -> tuple[list[Run], int | None]:
    """One page of runs, newest first, and the position of the next page (None: the last)."""
    q = select(Run).where(Run.deleted_at.is_(None))
    if project:
        q = q.where(Run.project == project)
    if state:
        q = q.where(Run.control_state == state)
    return split_page(s.scalars(keyset(q, Run.id, page)), page, lambda r: r.id)


def components_of(s: Session, run_ids: list[int]) -> dict[int, list[Component]]:
    out: dict[int, list[Component]] = {rid: [] for rid in run_ids}
    if not run_ids:
        return out
    q = select(Component).where(Component.run_id.in_(run_ids)).order_by(Component.id)
    for comp in s.scalars(q):
        out[comp.run_id].append(comp)
    return out


def firing_alert_counts(s: Session, run_ids: list[int]) -> dict[int, dict[str, int]]:
    out: dict[int, dict[str, int]] = {rid: {} for rid in run_ids}
    if not run_ids:
        return out
    q = (
        select(Alert.run_id, Alert.severity, func.count())
        .where(Alert.run_id.in_(run_ids), Alert.status != "resolved")
        .group_by(Alert.run_id, Alert.severity)
    )
    for run_id, severity, n in s.execute(q):
        out[run_id][severity] = n
    return out


# ------------------------------------------------------------------ components

def find_component(s: Session, run_id: int, side: str, worker_id: str) -> Component | None:
    return s.scalar(select(Component).where(
        Component.run_id == run_id, Component.side == side, Component.worker_id == worker_id))


def upsert_component(s: Session, run_id: int, side: str, worker_id: str, host: str, pid: int) -> tuple[Component, str | None]:
    """Upsert by (run, side, worker_id): a restarted worker keeps its row and is live again.
    Returns the component and its status before (None when new)."""
    comp = find_component(s, run_id, side, worker_id)
    previous = comp.status if comp is not None else None
    now = utcnow()
    if comp is None:
        comp = Component(run_id=run_id, side=side, worker_id=worker_id)
        s.add(comp)
    comp.host, comp.pid, comp.started_at, comp.last_heartbeat = host, pid, now, now
    comp.status, comp.closed_at, comp.lost_at, comp.close_reason = "live", None, None, None
    s.flush()
    return comp, previous


def get_component(s: Session, run_id: int, component_id: int) -> Component:
    comp = s.get(Component, component_id)
    if comp is None or comp.run_id != run_id:
        raise NotFound(f"component {component_id} of run {run_id} does not exist")
    return comp


def live_run_ids(s: Session) -> list[int]:
    """Runs whose processes the heartbeat sweep watches (an index lookup: ended runs cost nothing)."""
    return list(s.scalars(select(Run.id).where(Run.control_state.in_(LIVE_RUN_STATES))))


def stale_components(s: Session, run_ids: list[int], cutoff: datetime) -> list[Component]:
    """Live processes of these runs that have not heartbeated since `cutoff`."""
    if not run_ids:
        return []
    return list(s.scalars(select(Component).where(
        Component.run_id.in_(run_ids), Component.status == "live", Component.last_heartbeat < cutoff,
    ).order_by(Component.id)))


def process_counts(s: Session, run_ids: list[int]) -> dict[int, dict[str, int]]:
    """Per run: its processes by status, and its trainers (all, and live)."""
    out = {rid: {"live": 0, "closed": 0, "lost": 0, "trainers": 0, "live_trainers": 0} for rid in run_ids}
    if not run_ids:
        return out
    trainer = Component.side == "trainer"
    q = (select(Component.run_id, Component.status, func.count(),
                func.sum(case((trainer, 1), else_=0)))
         .where(Component.run_id.in_(run_ids)).group_by(Component.run_id, Component.status))
    for run_id, status, n, trainers in s.execute(q):
        counts = out[run_id]
        counts[status] = counts.get(status, 0) + n
        counts["trainers"] += int(trainers or 0)
        if status == "live":
            counts["live_trainers"] += int(trainers or 0)
    return out


def mark_lost(s: Session, component_id: int, cutoff: datetime, now: datetime) -> bool:
    """live -> lost, only if it is still live and still silent since `cutoff` (a heartbeat that
    committed meanwhile wins: PostgreSQL re-checks the condition on the latest row)."""
    result = s.execute(
        update(Component)
        .where(Component.id == component_id, Component.status == "live", Component.last_heartbeat < cutoff)
        .values(status="lost", lost_at=now)
        .execution_options(synchronize_session="fetch")
    )
    return result.rowcount == 1


def mark_silent_lost(s: Session, run_id: int, cutoff: datetime, now: datetime) -> int:
    """live -> lost for the run's processes silent since `cutoff`, raising nothing: those a run
    that ended left behind (shown `ended`) when it comes back to life. How many."""
    result = s.execute(
        update(Component)
        .where(Component.run_id == run_id, Component.status == "live", Component.last_heartbeat < cutoff)
        .values(status="lost", lost_at=now)
        .execution_options(synchronize_session="fetch")
    )
    return result.rowcount


CONTROL_COLUMNS = ("control_state", "control_version", "control_actor", "control_reason", "control_updated_at")


def touch_component(db: Database, run_id: int, component_id: int, now: datetime,
                    progress: dict | None = None) -> tuple[str, dict]:
    """A heartbeat: one UPDATE that also reads the run's control state; returns (the component's
    status, the run's control). Hundreds of processes heartbeat: no ORM session, no second query.
    On SQLite through the group-commit writer (a few transactions a second, queued in Python,
    not on the database lock). On PostgreSQL its own short transaction: in a group transaction
    the process's row would stay locked behind the run rows the group's metric batches update,
    an order a state change (run, then process) would deadlock against.
    Hence the `Database`, not the request's session (backend/store/__init__.py)."""
    pg = db.dialect == "postgresql"
    p = "%s" if pg else "?"
    columns = ", ".join(f"(SELECT {c} FROM runs WHERE runs.id = components.run_id)" for c in CONTROL_COLUMNS)
    # The beat's progress: a version it does not send stays as it was, its rates are this interval's.
    sql = (f"UPDATE components SET last_heartbeat = {p}, policy_version = coalesce({p}, policy_version), "
           f"samples_per_s = {p}, points_per_s = {p} WHERE id = {p} AND run_id = {p} RETURNING status, {columns}")
    progress = progress or {}
    version, samples, points = (progress.get(k) for k in ("policy_version", "samples_per_s", "points_per_s"))
    # SQLite stores UTCDateTime as naive UTC text in SQLAlchemy's format.
    stamp = now if pg else now.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")

    def job(cur):
        cur.execute(sql, (stamp, version, samples, points, component_id, run_id))
        return cur.fetchone()

    if pg:
        conn = db.engine.raw_connection()
        try:
            cur = conn.cursor()
            row = job(cur)
            conn.commit()
        finally:
            conn.close()
    else:
        row = db.run_raw(job)
    if row is None:
        raise NotFound(f"component {component_id} of run {run_id} does not exist")
    state, version, actor, reason, updated = row[1:]
    if isinstance(updated, str):  # SQLite: text, UTC
        updated = datetime.fromisoformat(updated).replace(tzinfo=timezone.utc)
    return row[0], {"state": state, "version": version, "actor": actor, "reason": reason, "updated_at": updated}
