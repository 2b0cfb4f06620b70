"""Metric ingest (batched, idempotent, group-committed) and downsampled reads: the store the
routes call. Its parts, one job each:

- backend/store/metric_validation.py: checks on a batch beyond its schema;
- backend/store/metric_packing.py: the storage layout (chunks, roll-ups), packing and decoding;
- backend/store/metric_sql.py: the SQL, per database;
- backend/store/metric_reads.py: read planning (bucket width, roll-up level, raw edges, budget);
- backend/store/metric_series.py: the answer's shape.

Ingest does all the arithmetic before it touches the database; the write itself is a handful of
statements on a driver cursor, run through `Database.run_raw` (group commit). That is why ingest
takes the `Database`, not a caller's session (the store's convention, backend/store/__init__.py):
the writer thread commits many requests' batches in one transaction, so no request owns it. The
reads (`keys`, `series`, `step_times`) follow the convention: they take the answer's session.
"""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any, Callable

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from paritywatch.backend.db import Database, FirstThen
from paritywatch.backend.errors import Conflict, Invalid, NotFound
from paritywatch.backend.models import IngestBatch, MetricChunk, MetricKey
from paritywatch.backend.store.jobs import encode_keys
from paritywatch.backend.store.metric_packing import PreparedBatch, Rollups, bucket_raw, prepare_batch, rollup_width
from paritywatch.backend.store.metric_reads import (BucketPlan, RawBudget, merge_buckets, metric_key, plan_buckets,
                                        plan_from_rollups, read_raw)
from paritywatch.backend.store.metric_series import series_response, step_times_response
from paritywatch.backend.store.metric_sql import ROLLUP_BUCKETS, MetricSql, is_fk_violation
from paritywatch.backend.store.paging import PageRequest, keyset, split_page
from paritywatch.backend.store.runs import get_run
from trainer_hooks.contract import MAX_KEYS_PER_RUN, MAX_NEW_KEYS_PER_BATCH

__all__ = ["Ingested", "MetricStore", "PreparedBatch", "prepare_batch"]  # prepare_batch: the ingest route's entry

# Keys a batch creates in its own transaction on the group-commit writer. A batch with more keys
# this process has no id for has them looked up and created ahead, this many a transaction of
# their own, off the writer: key creation never holds the writer (other runs' batches) for long.
KEYS_PER_TRANSACTION = 2_000


@dataclass(frozen=True)
class Ingested:
    stored: bool  # False: a replayed (client_id, seq), nothing written
    job_id: int | None  # the detection job written with it, if any


def check_replay(stored: str | None, digest: str, what: str) -> None:
    """A replay of a stored (run, client_id, seq) must carry the same content: Conflict when its
    digest differs (rows stored before migration 0016 have none and match anything)."""
    if stored is not None and stored != digest:
        raise Conflict(f"{what} was stored already with other content; a replay must repeat it exactly "
                       "(a new batch needs a new seq). Nothing was stored")


class MetricStore:
    def __init__(self, db: Database, max_step_ahead: int | None = None,
                 max_new_keys_per_batch: int = MAX_NEW_KEYS_PER_BATCH, max_keys_per_run: int = MAX_KEYS_PER_RUN):
        self.db = db
        self.max_new_keys_per_batch, self.max_keys_per_run = max_new_keys_per_batch, max_keys_per_run
        # A batch reaching further than this past the run's last step is refused (None: no bound).
        self.max_step_ahead = max_step_ahead
        # run id -> (the run's created_at as the driver returns it, {key: series id}). The
        # creation time tells a run from a later one that got the same id after a deletion
        # (SQLite reuses the highest rowid), so a cached id never points into another run.
        self._series_ids: dict[int, tuple[object, dict[str, int]]] = {}
        self._ids_lock = threading.Lock()
        self.sql = MetricSql(db.dialect)
        self.pg = self.sql.pg

    # ---------------------------------------------------------------- ingest
    def ingest(self, run_id: int, client_id: str, seq: int, batch: PreparedBatch,
               component_id: int | None = None) -> bool:
        """Store a batch once. Returns False (and writes nothing) for a replayed (client, seq)."""
        return self.ingest_batch(run_id, client_id, seq, batch, component_id=component_id).stored

    def ingest_batch(self, run_id: int, client_id: str, seq: int, batch: PreparedBatch,
                     detect_keys: list[str] | None = None, component_id: int | None = None) -> "Ingested":
        """Store a batch once; with `detect_keys` (the batch's keys some rule watches), also a
        detection job for them in the same transaction (backend/store/jobs.py). NotFound, with
        nothing written, when the run does not exist (or is being deleted) or `component_id` is
        not one of its components. Invalid when its new keys exceed a cap."""
        if self._uncached_keys(run_id, batch) > KEYS_PER_TRANSACTION:
            self._create_keys_ahead(run_id, batch, component_id)
        job, finish = self._ingest_job(run_id, client_id, seq, batch, detect_keys, component_id)
        return finish(self.db.run_raw(job))

    async def ingest_batch_async(self, run_id: int, client_id: str, seq: int, batch: PreparedBatch,
                                 detect_keys: list[str] | None = None, component_id: int | None = None,
                                 ) -> "Ingested":
        """`ingest_batch` for the event loop (the ingest route): no thread waits for the commit."""
        if self._uncached_keys(run_id, batch) > KEYS_PER_TRANSACTION:
            await asyncio.to_thread(self._create_keys_ahead, run_id, batch, component_id)
        job, finish = self._ingest_job(run_id, client_id, seq, batch, detect_keys, component_id)
        return finish(await self.db.run_raw_async(job))

    def _ingest_job(self, run_id: int, client_id: str, seq: int, batch: PreparedBatch,
                    detect_keys: list[str] | None, component_id: int | None,
                    ) -> tuple[Callable[[Any], tuple], Callable[[tuple], "Ingested"]]:
        """The write to run on the group-commit writer, and what to do with its result."""
        with self._ids_lock:
            epoch, cached = self._series_ids.get(run_id, (None, {}))
            known = {k: cached[k] for k in batch.points if k in cached}

        digest = batch.ledger_digest(component_id)
        claim = (run_id, client_id, seq, batch.accepted, component_id, digest)

        def write(cur, target: tuple | None, batch_id: int | None) -> tuple:
            # A refused batch raises after its claim: the group writer undoes the claim with it.
            run_epoch, run_last_step = self._judge_target(target, run_id, component_id)
            self._check_step_bound(run_last_step, batch.last_step)
            if batch_id is None:  # replayed (run, client, seq)
                cur.execute(self.sql.claimed, (run_id, client_id, seq))
                check_replay(cur.fetchone()[0], digest, f"metric batch seq {seq} of client {client_id!r}")
                return False, {}, None, run_epoch
            fresh = known if run_epoch == epoch else {}  # ids cached for an earlier run of this id
            return self._write(cur, run_id, batch_id, batch, fresh, detect_keys) + (run_epoch,)

        if self.pg:  # the claims of a group's batches go to PostgreSQL together
            job: Callable[[Any], tuple] = FirstThen(*self.sql.claim_statement(*claim),
                                                    then=lambda cur, first: write(cur, *self.sql.claim_result(first.fetchone())))
        else:
            def job(cur):
                return write(cur, *self.sql.claim(cur, *claim))

        def finish(written: tuple) -> Ingested:
            stored, ids, job_id, run_epoch = written
            if ids or run_epoch != epoch:
                self._remember_ids(run_id, run_epoch, ids)  # only after commit: a rolled-back key row has no id
            return Ingested(stored, job_id)

        return job, finish

    def _check_target(self, cur, run_id: int, component_id: int | None) -> tuple[object, int | None]:
        """The run's creation time and last step, after checking that the run and the component exist."""
        cur.execute(self.sql.target, (component_id, run_id))
        return self._judge_target(cur.fetchone(), run_id, component_id)

    @staticmethod
    def _judge_target(row: tuple | None, run_id: int, component_id: int | None) -> tuple[object, int | None]:
        if row is None or row[1] is not None:
            raise NotFound(f"run {run_id} does not exist")
        if component_id is not None and row[2] is None:
            raise NotFound(f"component {component_id} of run {run_id} does not exist")
        return row[0], row[3]

    def _write(self, cur, run_id: int, batch_id: int, batch: PreparedBatch, known: dict[str, int],
               detect_keys: list[str] | None) -> tuple[bool, dict[str, int], int | None]:
        """The claimed batch's keys, points, roll-ups and detection job."""
        if not batch.points:
            return True, {}, None
        missing = [k for k in batch.points if k not in known]  # at most KEYS_PER_TRANSACTION, or a race
        created = self._write_keys(cur, run_id, missing) if missing else {}
        ids = {**known, **created}
        order = sorted(batch.points, key=ids.__getitem__)  # rows in series order (the merged rows are sorted again)
        chunks, stats = [], []
        for k in order:
            sid, kr = ids[k], batch.points[k]
            chunks.extend((sid, c[0], batch_id, *c[1:]) for c in kr.chunks)
            stats.append((sid, *kr.stats))
        # Written once per group, not per batch: each statement is a round trip of the one writer,
        # and every batch of a run updates the same roll-up buckets, key stats and run row.
        self.db.merge_at_commit(cur, self.sql.insert_chunks, chunks)
        self.db.merge_at_commit(cur, self.sql.merge_rollups, [batch.rollups_of(ids)])
        self.db.merge_at_commit(cur, self.sql.merge_key_stats, stats)
        self.db.merge_at_commit(cur, self.sql.advance_runs, [(run_id, batch.last_step)])
        job_id = None
        if detect_keys:
            cur.execute(self.sql.job, (run_id, encode_keys(detect_keys, batch.spans(detect_keys))))
            job_id = cur.fetchone()[0]
        return True, created, job_id

    def _check_step_bound(self, run_last_step: int | None, last_step: int | None) -> None:
        """A step absurdly far ahead (a nanosecond clock used as a step, a forged 2**53) would pin
        the run's last step, and every later read and rule, for good: refuse it."""
        if self.max_step_ahead is None or last_step is None:
            return
        current = run_last_step or 0
        if last_step > current + self.max_step_ahead:
            raise Invalid(f"step {last_step} is more than {self.max_step_ahead} steps past the run's last step "
                          f"{current} (PARITYWATCH_MAX_STEP_AHEAD)")

    def write_rollups(self, cur, rollups: Rollups) -> None:
        """Merge roll-up rows into the stored ones, as ingest does."""
        self.sql.merge_rollups(cur, [rollups])

    async def check_new_keys_async(self, run_id: int, keys: list[str]) -> None:
        """Before a batch is packed: Invalid when its keys the run lacks are over a cap. Looked up
        (off the event loop) only when more than KEYS_PER_TRANSACTION of them are not cached, so
        a batch far over the cap is refused before it costs the loop its packing (counts every
        key of the batch, even one whose values are all null)."""
        with self._ids_lock:
            cached = self._series_ids.get(run_id, (None, {}))[1]
            uncached = [k for k in keys if k not in cached]
        if len(uncached) > KEYS_PER_TRANSACTION:
            await asyncio.to_thread(self._check_new_keys, run_id, uncached)

    async def check_key_count_async(self, run_id: int, keys: int) -> None:
        """Before a batch is parsed: Invalid when it names `keys` keys and the run holds so few
        that more than the cap of them must be new. Counted (off the event loop) only when this
        process knows too few of the run's keys to rule it out."""
        with self._ids_lock:
            cached = len(self._series_ids.get(run_id, (None, {}))[1])
        if keys - cached > self.max_new_keys_per_batch:
            await asyncio.to_thread(self._check_key_count, run_id, keys)

    def _check_key_count(self, run_id: int, keys: int) -> None:
        with self.db.read() as s:
            self._refuse_far_over_cap(s.connection().connection.cursor(), run_id, keys)

    def _check_new_keys(self, run_id: int, keys: list[str]) -> None:
        with self.db.read() as s:
            cur = s.connection().connection.cursor()
            self._refuse_far_over_cap(cur, run_id, len(keys))
            new = len(keys) - len(self.sql.lookup_keys(cur, run_id, keys))
            if new > self.max_new_keys_per_batch:
                self._check_key_caps(run_id, new, 0)

    def _refuse_far_over_cap(self, cur, run_id: int, keys: int) -> None:
        """At least `keys` - held of a batch's keys are new: a batch that far over the cap is
        refused on one indexed count, before a lookup of every key (99,000 keys: 1.6 s on
        PostgreSQL). NotFound when the run does not exist."""
        self._check_target(cur, run_id, None)
        at_least_new = keys - self.sql.count_keys(cur, run_id)
        if at_least_new > self.max_new_keys_per_batch:
            self._check_key_caps(run_id, at_least_new, 0, at_least=True)

    def _uncached_keys(self, run_id: int, batch: PreparedBatch) -> int:
        with self._ids_lock:
            cached = self._series_ids.get(run_id, (None, {}))[1]
            return sum(k not in cached for k in batch.points)

    def _create_keys_ahead(self, run_id: int, batch: PreparedBatch, component_id: int | None) -> None:
        """Look up the batch's keys this process has no id for, check the target and the caps
        on new keys, and create the new ones KEYS_PER_TRANSACTION a transaction, before the batch
        goes to the group-commit writer. (A batch refused after this, a replay with other content
        or one racing a deletion, leaves its new keys empty: count 0, no points.)"""
        with self._ids_lock:
            cached = self._series_ids.get(run_id, (None, {}))[1]
            uncached = [k for k in batch.points if k not in cached]
        with self.db.read() as s:
            cur = s.connection().connection.cursor()
            epoch, last_step = self._check_target(cur, run_id, component_id)
            self._check_step_bound(last_step, batch.last_step)
            ids = self.sql.lookup_keys(cur, run_id, uncached)
            new = [k for k in uncached if k not in ids]
            if new:
                self._check_key_caps(run_id, len(new), self.sql.count_keys(cur, run_id))
        for i in range(0, len(new), KEYS_PER_TRANSACTION):
            ids.update(self._create_keys(run_id, new[i : i + KEYS_PER_TRANSACTION]))
        self._remember_ids(run_id, epoch, ids)

    def _write_keys(self, cur, run_id: int, keys: list[str]) -> dict[str, int]:
        """Ids of `keys` in the batch's own transaction, creating the new ones within the caps."""
        ids = self.sql.lookup_keys(cur, run_id, keys)
        new = [k for k in keys if k not in ids]
        if new:
            self._check_key_caps(run_id, len(new), self.sql.count_keys(cur, run_id))
            ids.update(self.sql.create_keys(cur, run_id, new))
        return ids

    def _check_key_caps(self, run_id: int, new: int, held: int, at_least: bool = False) -> None:
        if new > self.max_new_keys_per_batch:
            raise Invalid(f"the batch has {'at least ' if at_least else ''}{new:,} new metric keys; a batch may create at most "
                          f"{self.max_new_keys_per_batch:,} (PARITYWATCH_MAX_NEW_KEYS_PER_BATCH). Nothing was stored")
        if held + new > self.max_keys_per_run:
            raise Invalid(f"the batch has {new:,} new metric keys and run {run_id} has {held:,}; a run may hold at "
                          f"most {self.max_keys_per_run:,} (PARITYWATCH_MAX_KEYS_PER_RUN). Nothing was stored")

    def _create_keys(self, run_id: int, keys: list[str]) -> dict[str, int]:
        """Create keys in one short transaction of their own (SQLite: under the process's write lock)."""
        try:
            with self.db.write() as s:
                return self.sql.create_keys(s.connection().connection.cursor(), run_id, keys)
        except Exception as exc:
            if is_fk_violation(exc) or is_fk_violation(getattr(exc, "orig", exc)):
                raise NotFound(f"run {run_id} does not exist") from None
            raise

    def _remember_ids(self, run_id: int, epoch: object, ids: dict[str, int]) -> None:
        with self._ids_lock:
            cached_epoch, cached = self._series_ids.get(run_id, (None, {}))
            if cached_epoch != epoch:
                cached = {}
                self._series_ids[run_id] = (epoch, cached)
            cached.update(ids)

    # ----------------------------------------------------------------- reads
    def keys(self, s: Session, run_id: int, page: PageRequest = PageRequest(limit=10_000)) -> tuple[list[MetricKey], str | None]:
        """One page of the run's keys in name order, and the next page's position (a key)."""
        get_run(s, run_id)
        q = keyset(select(MetricKey).where(MetricKey.run_id == run_id), MetricKey.key, page, newest_first=False)
        return split_page(s.scalars(q), page, lambda k: k.key)

    def series(self, s: Session, run_id: int, key: str, points: int, step_min: int | None, step_max: int | None,
               max_raw_points: int | None = None) -> dict:
        get_run(s, run_id)
        mk = metric_key(s, run_id, key)
        if mk is None:
            raise NotFound(f"run {run_id} has no metric {key!r}")
        lo = mk.first_step if step_min is None else step_min
        hi = mk.last_step if step_max is None else step_max
        if lo is None or hi is None or hi < lo:
            return series_response(key, points, 1, lo, hi, {}, lo or 0)
        plan = plan_buckets(lo, hi, points)
        if mk.raw_floor is not None and lo < mk.raw_floor:
            plan = plan_from_rollups(lo, hi, points)
        rows = self._read_buckets(s, mk.id, plan, RawBudget(max_raw_points))
        return series_response(key, points, plan.width, lo, hi, rows, plan.origin)

    def step_times(self, s: Session, run_id: int, key: str, points: int) -> dict:
        """When the server received the batches that carried `key`: the last step of each batch
        and its seconds since the run was created, sorted by step, at most `points` rows (evenly
        spaced, the last kept). Lets runs be compared by wall time; batches whose raw points are
        past retention have no row (their roll-ups keep no batch)."""
        run = get_run(s, run_id)
        mk = metric_key(s, run_id, key)
        if mk is None:
            raise NotFound(f"run {run_id} has no metric {key!r}")
        rows = s.execute(
            select(func.max(MetricChunk.step_max), IngestBatch.received_at)
            .join(IngestBatch, IngestBatch.id == MetricChunk.batch_id)
            .where(MetricChunk.series_id == mk.id)
            .group_by(IngestBatch.id, IngestBatch.received_at)
        ).all()
        return step_times_response(key, run.created_at, rows, points)

    def _read_buckets(self, s: Session, sid: int, plan: BucketPlan, budget: RawBudget | None = None) -> dict[int, list]:
        merged: dict[int, list] = {}
        for a, b in plan.raw_ranges:
            merge_buckets(merged, self._raw_query(s, sid, plan, a, b, budget))
        if plan.level:
            merge_buckets(merged, self._rollup_query(s, sid, plan))
        if plan.level == 1:  # dense chunks have no level-1 roll-ups: bucket their raw points
            st, vs = read_raw(s, sid, *plan.rollup_range, dense_only=True, budget=budget)
            dense = bucket_raw(st, vs, plan.origin, plan.width)
            # A bucket whose last step is in both a dense chunk and a roll-up: which point was
            # written later is known only from the chunks' batch order, so read that one step.
            tied = [(tb, last_step) for tb, _, _, last_step, _, _ in dense
                    if tb in merged and merged[tb][2] == last_step]
            merge_buckets(merged, dense)
            for tb, step in tied:
                merged[tb][3] = float(read_raw(s, sid, step, step + 1)[1][-1])
        return merged

    def _raw_query(self, s: Session, sid: int, plan: BucketPlan, a: int, b: int,
                   budget: RawBudget | None = None) -> list[tuple]:
        st, vs = read_raw(s, sid, a, b, budget=budget)
        return bucket_raw(st, vs, plan.origin, plan.width)

    def _rollup_query(self, s: Session, sid: int, plan: BucketPlan):
        q = ROLLUP_BUCKETS
        bw = rollup_width(plan.level)
        return s.execute(
            q,
            {"bw": bw, "o": plan.origin, "w": plan.width, "sid": sid, "lvl": plan.level,
             "ba": plan.rollup_range[0] // bw, "bb": plan.rollup_range[1] // bw},
        )
