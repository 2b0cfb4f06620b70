"""The workers view's SQL: a run's processes with their progress, filtered and paged; the run's
fingerprint groups and open alerts; and a series' raw points split by the process that posted
them (a chunk belongs to one batch, `ingest_batches.component_id` names its sender)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
from sqlalchemy import case, false, func, or_, select, text
from sqlalchemy.orm import Session

from paritywatch.backend.errors import NotFound
from paritywatch.backend.models import ENDED_PROCESS, ENDED_RUN_STATES, Alert, Component, MetricKey
from paritywatch.backend.store.metric_packing import decode_range
from paritywatch.backend.store.metric_reads import RawBudget
from paritywatch.backend.store.metric_reads import metric_key as find_metric_key
from paritywatch.backend.store.metric_sql import chunk_point_count, chunks_where
from paritywatch.backend.store.paging import PageRequest, keyset, split_page
from paritywatch.backend.store.runs import get_run

MISSING_FINGERPRINT = "missing"  # the `fingerprint` filter for processes that sent none


@dataclass(frozen=True)
class WorkerFilter:
    state: str | None = None  # live | closed | lost | ended (detect/workers.py, process_state)
    side: str | None = None  # trainer | rollout
    fingerprint: str | None = None  # a digest, or MISSING_FINGERPRINT
    text: str | None = None  # a substring of the worker id or the host


@dataclass
class RunWorkers:
    """What every row needs from the whole run, whatever page is read."""

    run_state: str
    trainer_policy_version: int | None
    trainer_digest: str | None
    digests: list[tuple[str, str, int]]  # (digest, side of its first process, processes), by first process
    counts: dict[str, int]  # processes by the state they are shown in, and "total"
    open_alerts: list[Alert]


def _like_escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def silent_cutoff(now: datetime, heartbeat_timeout_s: float) -> datetime:
    """A process whose last heartbeat is older than this has been silent for the heartbeat timeout."""
    return now - timedelta(seconds=heartbeat_timeout_s)


def _silent_since(run_state: str, cutoff: datetime) -> datetime | None:
    """The cutoff where the run's silent live processes are shown `ended` (an ended run;
    detect/workers.py, process_state), else None: in a live run the sweep is about to lose them."""
    return cutoff if run_state in ENDED_RUN_STATES else None


def _state_is(state: str, silent_since: datetime | None):
    """The SQL of "shown in `state`" (see _silent_since)."""
    if silent_since is None:
        return false() if state == ENDED_PROCESS else Component.status == state
    if state == ENDED_PROCESS:
        return (Component.status == "live") & (Component.last_heartbeat < silent_since)
    if state == "live":
        return (Component.status == "live") & (Component.last_heartbeat >= silent_since)
    return Component.status == state


def _filtered(run_id: int, f: WorkerFilter, silent_since: datetime | None):
    q = select(Component).where(Component.run_id == run_id)
    if f.state:
        q = q.where(_state_is(f.state, silent_since))
    if f.side:
        q = q.where(Component.side == f.side)
    if f.fingerprint == MISSING_FINGERPRINT:
        q = q.where(Component.fingerprint_digest.is_(None))
    elif f.fingerprint:
        q = q.where(Component.fingerprint_digest == f.fingerprint)
    if f.text:
        pattern = f"%{_like_escaped(f.text.lower())}%"
        q = q.where(or_(func.lower(Component.worker_id).like(pattern, escape="\\"),
                        func.lower(Component.host).like(pattern, escape="\\")))
    return q


def worker_page(s: Session, run_id: int, f: WorkerFilter, page: PageRequest,
                cutoff: datetime) -> tuple[list[Component], int | None]:
    """One page of the run's processes matching `f`, in registration (id) order; `cutoff`: a
    process silent since then has been silent for the heartbeat timeout."""
    run = get_run(s, run_id)
    rows = s.scalars(keyset(_filtered(run_id, f, _silent_since(run.control_state, cutoff)), Component.id, page,
                            newest_first=False))
    return split_page(rows, page, lambda c: c.id)


def run_workers(s: Session, run_id: int, cutoff: datetime) -> RunWorkers:
    run = get_run(s, run_id)
    trainer = s.execute(
        select(Component.policy_version, Component.fingerprint_digest)
        .where(Component.run_id == run_id, Component.side == "trainer")
        # the reference trainer of the parity check: the first registered with a fingerprint
        .order_by(Component.fingerprint_digest.is_(None), Component.id).limit(1)
    ).first()
    version = s.scalar(select(func.max(Component.policy_version))
                       .where(Component.run_id == run_id, Component.side == "trainer"))
    counts = _counts(s, run_id, _silent_since(run.control_state, cutoff))
    return RunWorkers(run.control_state, version, trainer[1] if trainer else None, _digests(s, run_id), counts,
                      list(s.scalars(select(Alert).where(Alert.run_id == run_id, Alert.open_key.is_not(None))
                                     .order_by(Alert.id))))


def _counts(s: Session, run_id: int, silent_since: datetime | None) -> dict[str, int]:
    """Processes by the state they are shown in, and "total"."""
    silent = (Component.status == "live") & (Component.last_heartbeat < silent_since) if silent_since else false()
    shown = case((silent, ENDED_PROCESS), else_=Component.status)
    counts = {"live": 0, "closed": 0, "lost": 0, ENDED_PROCESS: 0}
    for state, n in s.execute(select(shown, func.count()).where(Component.run_id == run_id).group_by(shown)):
        counts[state] = n
    counts["total"] = sum(counts.values())
    return counts


def _digests(s: Session, run_id: int) -> list[tuple[str, str, int]]:
    q = (select(Component.fingerprint_digest, func.min(Component.id), func.count())
         .where(Component.run_id == run_id, Component.fingerprint_digest.is_not(None))
         .group_by(Component.fingerprint_digest))
    rows = sorted(s.execute(q), key=lambda r: r[1])
    firsts = [r[1] for r in rows]
    sides = {cid: side for cid, side in s.execute(select(Component.id, Component.side).where(Component.id.in_(firsts)))} if rows else {}
    return [(digest, sides[first], n) for digest, first, n in rows]


def workers_by_id(s: Session, run_id: int, component_ids: list[int]) -> dict[int, Component]:
    if not component_ids:
        return {}
    q = select(Component).where(Component.run_id == run_id, Component.id.in_(component_ids))
    return {c.id: c for c in s.scalars(q)}


# ------------------------------------------------------------------ per-worker points

def metric_key(s: Session, run_id: int, key: str) -> MetricKey:
    get_run(s, run_id)
    mk = find_metric_key(s, run_id, key)
    if mk is None:
        raise NotFound(f"run {run_id} has no metric {key!r}")
    return mk


def points_by_worker(s: Session, series_id: int, a: int, b: int,
                     budget: RawBudget) -> dict[int | None, tuple[np.ndarray, np.ndarray]]:
    """Raw points of one series with a <= step < b, split by the process that posted them:
    {component_id: (steps, values) sorted by step}. Batches that named no process (or were
    posted before migration 0010) are under None."""
    where, params = chunks_where(series_id, a, b, dense_only=False, table="ch")
    budget.spend(chunk_point_count(s, f"ch {where}", params))
    rows = s.execute(text(
        "SELECT ib.component_id, ch.steps, ch.vals FROM metric_chunks ch "
        f"LEFT JOIN ingest_batches ib ON ib.id = ch.batch_id {where} ORDER BY ch.batch_id"), params).all()
    parts: dict[int | None, list[tuple[bytes, bytes]]] = {}
    for component_id, steps, vals in rows:
        parts.setdefault(component_id, []).append((steps, vals))
    out = {component_id: decode_range(chunks, a, b) for component_id, chunks in parts.items()}
    return {component_id: points for component_id, points in out.items() if len(points[0])}
