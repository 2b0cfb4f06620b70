"""Run deletion and raw-point retention: many rows removed in small steps.

One DELETE of a 10M-point run would hold SQLite's write lock (or, on PostgreSQL, run one
transaction for minutes) and stall every metric batch behind it. Here each step removes at most
a few hundred to a few thousand rows in a short transaction of its own, so a batch waits behind
one small step at most; `backend/background/janitor.py` sizes and paces the steps by what each one cost.

Deleting a run: `request_deletion` hides it at once (`runs.deleted_at`: 404 everywhere, ingest
refused, its name free for a new run) and records a `run_deletions` row; then its chunks,
roll-ups, ingest ledger, per-sample audits, alerts and webhook deliveries go in steps, and last the run row, whose
cascade takes the small rest (keys, components, rules, control events).

Retention: raw chunks of batches received more than N days ago are dropped, and so are per-sample
audits received that long ago (their samples cascade: at most 64 an audit); roll-ups stay, so
old runs still chart (at >= 16-step buckets: `metric_keys.raw_floor` tells reads where raw
points end). Dense chunks have no level-1 roll-ups (`metric_chunks.in_level1` false; see
store/metric_packing.py), so each is folded into level 1 in the transaction that deletes it: every
point stays counted exactly once.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import delete, func, select, text
from sqlalchemy.orm import Session

from paritywatch.backend.db import Database
from paritywatch.backend.models import Component, MetricKey, RunDeletion, utcnow
from paritywatch.backend.store.metric_packing import decode_chunks, level1_rollups
from paritywatch.backend.store.metrics import MetricStore
from paritywatch.backend.store.paging import PageRequest, keyset, split_page
from paritywatch.backend.store.runs import get_run


def tombstone_name(run_id: int) -> str:
    """The name a run being deleted carries: frees (project, name) for a new run at once and can
    never clash with a real name (the API refuses control characters in names)."""
    return f"\x01deleted run {run_id}"


def request_deletion(s: Session, run_id: int, actor: str | None, reason: str | None) -> RunDeletion:
    """Hide the run and record who deleted it; its rows go later, in steps (`RowRemover`, driven
    by backend/background/janitor.py)."""
    run = get_run(s, run_id)
    points = s.scalar(select(func.coalesce(func.sum(MetricKey.count), 0)).where(MetricKey.run_id == run_id))
    record = RunDeletion(run_id=run.id, project=run.project, name=run.name, actor=actor, reason=reason,
                         points=int(points or 0))
    s.add(record)
    run.deleted_at = utcnow()
    run.name = tombstone_name(run.id)
    # Its processes go now: no heartbeat_lost alerts for a run being deleted.
    s.execute(delete(Component).where(Component.run_id == run_id))
    s.flush()
    return record


def list_deletions(s: Session, page: PageRequest) -> tuple[list[RunDeletion], int | None]:
    return split_page(s.scalars(keyset(select(RunDeletion), RunDeletion.id, page)), page, lambda d: d.id)


def pending_deletions(s: Session) -> list[int]:
    return list(s.scalars(select(RunDeletion.run_id).where(RunDeletion.finished_at.is_(None))
                          .order_by(RunDeletion.id)))


@dataclass(frozen=True)
class PurgeStep:
    """One table a run's rows are deleted from, `batch` rows a step to start with."""

    table: str
    where: str  # with one run-id placeholder `{p}`
    batch: int


def _steps(pg: bool) -> tuple[PurgeStep, ...]:
    # Webhook payloads name their run in data.run.id (backend/alerts/lifecycle.py).
    payload_run = "(payload -> 'data' -> 'run' ->> 'id') = CAST({p} AS TEXT)" if pg else \
        "json_extract(payload, '$.data.run.id') = {p}"
    series = "series_id IN (SELECT id FROM metric_keys WHERE run_id = {p})"
    return (
        PurgeStep("metric_chunks", series, 200),  # rows of up to ~1 MB
        PurgeStep("metric_rollups", series, 1000),
        PurgeStep("ingest_batches", "run_id = {p}", 2000),
        PurgeStep("sample_audit_samples", "run_id = {p}", 1000),  # rows of up to a few KB
        PurgeStep("sample_audits", "run_id = {p}", 1000),
        PurgeStep("weight_attestations", "run_id = {p}", 50),  # a tensor list each: up to a few MB
        PurgeStep("alerts", "run_id = {p}", 200),  # their events cascade
        PurgeStep("webhook_deliveries", payload_run, 200),  # their attempts cascade
    )


class RowRemover:
    """Small deletes through the ingest writer, in the driver's own SQL. It takes the `Database`,
    not a caller's session (backend/store/__init__.py): each step is its own short transaction on
    the writer ingest uses, so a purge queues behind metric batches instead of holding a
    transaction beside them."""

    def __init__(self, db: Database, metrics: MetricStore):
        self.db, self.metrics = db, metrics
        self.pg = db.dialect == "postgresql"
        self.p = "%s" if self.pg else "?"
        self.steps = _steps(self.pg)

    def _run(self, job):
        """(job(cursor), seconds) in one transaction, the seconds counting the commit and any
        wait for the writer: what the step cost the metric batches.

        SQLite: a job of the group-commit writer (the one writer; its connection leaves WAL
        checkpoints to the checkpointer thread, where a connection of our own would run one
        inside its commit, holding the write lock). PostgreSQL: a transaction of its own beside
        ingest (these rows take no lock a batch of another run needs)."""
        started = time.perf_counter()
        if not self.pg:
            result = self.db.run_raw(job)
        else:
            with self.db.write() as s:
                cur = s.connection().connection.driver_connection.cursor()
                try:
                    # No WAL flush wait per step: the fsyncs would compete with the batches' own.
                    # Safe: a crash loses whole steps only (never half of one), and a lost step
                    # is simply done again.
                    cur.execute("SET LOCAL synchronous_commit TO OFF")
                    result = job(cur)
                finally:
                    cur.close()
        return result, time.perf_counter() - started

    def _limited(self, table: str, where: str, returning: str = "") -> str:
        """DELETE of at most {p} rows of `table` matching `where` (by physical row id: no sort)."""
        if self.pg:
            sql = f"DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} WHERE {where} LIMIT %s))"
        else:
            sql = f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE {where} LIMIT ?)"
        return sql + (f" RETURNING {returning}" if returning else "")

    # ------------------------------------------------------------ run deletion
    def delete_some(self, step: PurgeStep, run_id: int, limit: int) -> tuple[int, float]:
        """Delete up to `limit` of the run's rows from `step.table`: (rows deleted, seconds)."""
        sql = self._limited(step.table, step.where.format(p=self.p))

        def job(cur):
            cur.execute(sql, (run_id, limit))
            return cur.rowcount

        return self._run(job)

    def finish_deletion(self, run_id: int) -> None:
        """Delete the run row (its small remaining rows cascade) and close the audit record."""
        p = self.p

        def job(cur):
            cur.execute(f"DELETE FROM runs WHERE id = {p} AND deleted_at IS NOT NULL", (run_id,))
            cur.execute(f"UPDATE run_deletions SET finished_at = {p} WHERE run_id = {p} AND finished_at IS NULL",
                        (_db_time(utcnow(), self.pg), run_id))

        self._run(job)

    # ------------------------------------------------------------ retention
    def retention_watermark(self, cutoff: datetime) -> int | None:
        """The newest ingest batch received before `cutoff` (batch ids grow with time)."""
        with self.db.read() as s:
            return s.execute(text("SELECT max(id) FROM ingest_batches WHERE received_at < :c"),
                             {"c": _db_time(cutoff, self.pg)}).scalar()

    def series_with_batches_between(self, after: int, upto: int) -> list[int]:
        """Series of the runs that stored batches with after < id <= upto."""
        with self.db.read() as s:
            return list(s.execute(text(
                "SELECT k.id FROM metric_keys k WHERE k.run_id IN "
                "(SELECT DISTINCT run_id FROM ingest_batches WHERE id > :a AND id <= :b) ORDER BY k.id"),
                {"a": after, "b": upto}).scalars())

    def prune_some(self, series_id: int, upto_batch: int, limit: int) -> tuple[int, float]:
        """Drop up to `limit` raw chunks of a series from batches <= `upto_batch`, folding the
        dense ones (`in_level1` false) into level-1 roll-ups first and raising the series' raw
        floor: (chunks dropped, seconds). DELETE ... RETURNING: only the transaction that deleted
        a chunk folds it."""
        p = self.p
        sql = self._limited("metric_chunks", f"series_id = {p} AND batch_id <= {p}",
                            "step_max, in_level1, batch_id, steps, vals")

        def job(cur):
            cur.execute(sql, (series_id, upto_batch, limit))
            rows = cur.fetchall()
            if not rows:
                return 0
            # in batch order: of equal steps the later batch's point is the bucket's last
            dense = [(r[3], r[4]) for r in sorted(rows, key=lambda r: r[2]) if not r[1]]
            if dense:
                st, vs = decode_chunks(dense)
                self.metrics.write_rollups(cur, level1_rollups(series_id, st, vs))
            floor = max(r[0] for r in rows) + 1
            cur.execute(f"UPDATE metric_keys SET raw_floor = {p} WHERE id = {p} AND (raw_floor IS NULL OR raw_floor < {p})",
                        (floor, series_id, floor))
            return len(rows)

        return self._run(job)

    def prune_audits_some(self, cutoff: datetime, limit: int) -> tuple[int, float]:
        """Drop up to `limit` audits received before `cutoff` (their samples cascade): (audits
        dropped, seconds)."""
        sql = self._limited("sample_audits", f"received_at < {self.p}")

        def job(cur):
            cur.execute(sql, (_db_time(cutoff, self.pg), limit))
            return cur.rowcount

        return self._run(job)


def _db_time(t: datetime, pg: bool):
    """A UTC time as the raw driver compares it with stored times: SQLite holds naive UTC text
    (models.UTCDateTime; CURRENT_TIMESTAMP has the same shape without the fraction)."""
    return t if pg else t.astimezone(timezone.utc).replace(tzinfo=None).strftime("%Y-%m-%d %H:%M:%S.%f")
