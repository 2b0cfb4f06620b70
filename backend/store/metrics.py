"""Metric ingest (batched, idempotent) and downsampled reads over multi-resolution roll-ups.

Points land in `metric_points`; each batch also folds them into `metric_rollups` at bucket
widths 16, 256, 4096 and 65536 steps. A read of N points over a range picks the coarsest
width that still gives N buckets, groups those roll-up rows in SQL, and takes the ragged
edges of the range from raw points, so a 1M-point series reads a few thousand rows.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from backend.db import Database
from backend.errors import Invalid, NotFound, TooLarge
from backend.models import MetricKey
from backend.store.runs import get_run

ROLLUP_BASE = 16
ROLLUP_LEVELS = (1, 2, 3, 4)  # bucket width = 16 ** level


def rollup_width(level: int) -> int:
    return ROLLUP_BASE**level


@dataclass
class PreparedBatch:
    """A validated batch: per key, the finite (step, value) pairs, in step order of the batch."""

    points: dict[str, list[tuple[int, float]]]
    accepted: int
    skipped: int


def prepare_batch(steps: list[int], series: dict[str, list], max_points: int, max_key: int) -> PreparedBatch:
    """Validate everything before any write: a rejected batch leaves no rows."""
    n_steps = len(steps)
    total = n_steps * len(series)
    if total > max_points:
        raise TooLarge(f"batch has {total} points; the limit is {max_points} a batch")
    points: dict[str, list[tuple[int, float]]] = {}
    skipped = 0
    for key, values in series.items():
        _check_key(key, max_key)
        if len(values) != n_steps:
            raise Invalid(f"series {key!r} has {len(values)} values for {n_steps} steps")
        kept = [(st, v) for st, v in zip(steps, values) if v is not None and math.isfinite(v)]
        skipped += n_steps - len(kept)
        if kept:
            points[key] = kept
    return PreparedBatch(points, total - skipped, skipped)


def _check_key(key: str, max_key: int) -> None:
    if not key or len(key) > max_key:
        raise Invalid(f"metric key must be 1..{max_key} characters (got {len(key)})")
    if any(ord(c) < 32 for c in key):
        raise Invalid(f"metric key {key!r} contains control characters")


def fold_rollups(points: dict[int, list[tuple[int, float]]]) -> dict[tuple[int, int, int], list]:
    """(series, level, bucket) -> [min, max, last_step, last_value, count] for every level.

    Level 1 is folded from the points, each coarser level from the level below (16x fewer).
    """
    out: dict[tuple[int, int, int], list] = {}
    level_rows: dict[tuple[int, int], list] = {}
    for sid, pts in points.items():
        for step, v in pts:
            k = (sid, step >> 4)
            agg = level_rows.get(k)
            if agg is None:
                level_rows[k] = [v, v, step, v, 1]
            else:
                if v < agg[0]:
                    agg[0] = v
                if v > agg[1]:
                    agg[1] = v
                if step >= agg[2]:
                    agg[2], agg[3] = step, v
                agg[4] += 1
    for level in ROLLUP_LEVELS:
        for (sid, bucket), agg in level_rows.items():
            out[(sid, level, bucket)] = agg
        if level == ROLLUP_LEVELS[-1]:
            break
        coarser: dict[tuple[int, int], list] = {}
        for (sid, bucket), agg in level_rows.items():
            k = (sid, bucket >> 4)
            c = coarser.get(k)
            if c is None:
                coarser[k] = list(agg)
            else:
                c[0] = min(c[0], agg[0])
                c[1] = max(c[1], agg[1])
                if agg[2] >= c[2]:
                    c[2], c[3] = agg[2], agg[3]
                c[4] += agg[4]
        level_rows = coarser
    return out


class MetricStore:
    def __init__(self, db: Database):
        self.db = db
        self._series_ids: dict[tuple[int, str], int] = {}
        self._ids_lock = threading.Lock()
        pg = db.dialect == "postgresql"
        self._least, self._greatest = ("LEAST", "GREATEST") if pg else ("min", "max")
        self._param = "%s" if pg else "?"

    # ---------------------------------------------------------------- ingest
    def ingest(self, run_id: int, client_id: str, seq: int, batch: PreparedBatch) -> bool:
        """Store a batch once. Returns False (and writes nothing) for a replayed (client, seq)."""
        ids: dict[str, int] = {}
        with self.db.write() as s:
            get_run(s, run_id)
            if not self._claim_batch(s, run_id, client_id, seq, batch.accepted):
                return False
            if not batch.points:
                return True
            ids = self._series_ids_for(s, run_id, list(batch.points))
            by_sid = {ids[k]: pts for k, pts in batch.points.items()}
            cur = s.connection().connection.driver_connection.cursor()
            self._insert_points(cur, by_sid)
            self._upsert_rollups(cur, fold_rollups(by_sid))
            self._update_key_stats(cur, by_sid)
            last = max(st for pts in by_sid.values() for st, _ in pts)
            p = self._param
            cur.execute(
                f"UPDATE runs SET last_step = {p} WHERE id = {p} AND (last_step IS NULL OR last_step < {p})",
                (last, run_id, last),
            )
        self._remember_ids(run_id, ids)  # only after commit: a rolled-back key row has no id
        return True

    def _claim_batch(self, s: Session, run_id: int, client_id: str, seq: int, n: int) -> bool:
        res = s.execute(
            text(
                "INSERT INTO ingest_batches (run_id, client_id, seq, points, received_at) "
                "VALUES (:r, :c, :q, :n, CURRENT_TIMESTAMP) ON CONFLICT (client_id, seq) DO NOTHING"
            ),
            {"r": run_id, "c": client_id, "q": seq, "n": n},
        )
        return res.rowcount == 1

    def _series_ids_for(self, s: Session, run_id: int, keys: list[str]) -> dict[str, int]:
        with self._ids_lock:
            out = {k: self._series_ids[(run_id, k)] for k in keys if (run_id, k) in self._series_ids}
        missing = [k for k in keys if k not in out]
        if missing:
            for i in range(0, len(missing), 500):
                chunk = missing[i : i + 500]
                s.execute(
                    text(
                        "INSERT INTO metric_keys (run_id, key, count) VALUES (:r, :k, 0) "
                        "ON CONFLICT (run_id, key) DO NOTHING"
                    ),
                    [{"r": run_id, "k": k} for k in chunk],
                )
                rows = s.execute(
                    select(MetricKey.key, MetricKey.id).where(
                        MetricKey.run_id == run_id, MetricKey.key.in_(chunk)
                    )
                )
                out.update({k: i for k, i in rows})
        return out

    def _remember_ids(self, run_id: int, ids: dict[str, int]) -> None:
        with self._ids_lock:
            for k, v in ids.items():
                self._series_ids[(run_id, k)] = v

    def _insert_points(self, cur, by_sid: dict[int, list[tuple[int, float]]]) -> None:  # noqa: ANN001
        rows = [(sid, st, v) for sid, pts in by_sid.items() for st, v in pts]
        if self.db.dialect == "postgresql":
            with cur.copy("COPY metric_points (series_id, step, value) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            cur.executemany("INSERT INTO metric_points (series_id, step, value) VALUES (?, ?, ?)", rows)

    def _upsert_rollups(self, cur, rollups: dict) -> None:  # noqa: ANN001
        p, lo, hi = self._param, self._least, self._greatest
        sql = (
            "INSERT INTO metric_rollups (series_id, level, bucket, min, max, last_step, last_value, count) "
            f"VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}) "
            "ON CONFLICT (series_id, level, bucket) DO UPDATE SET "
            f"min = {lo}(metric_rollups.min, excluded.min), "
            f"max = {hi}(metric_rollups.max, excluded.max), "
            "last_value = CASE WHEN excluded.last_step >= metric_rollups.last_step "
            "THEN excluded.last_value ELSE metric_rollups.last_value END, "
            f"last_step = {hi}(metric_rollups.last_step, excluded.last_step), "
            "count = metric_rollups.count + excluded.count"
        )
        # Sorted: concurrent PostgreSQL writers lock rows in one order, never deadlock.
        cur.executemany(sql, [(*k, *v) for k, v in sorted(rollups.items())])

    def _update_key_stats(self, cur, by_sid: dict[int, list[tuple[int, float]]]) -> None:  # noqa: ANN001
        p, lo, hi = self._param, self._least, self._greatest
        sql = (
            f"UPDATE metric_keys SET count = count + {p}, "
            f"first_step = CASE WHEN first_step IS NULL THEN {p} ELSE {lo}(first_step, {p}) END, "
            f"last_value = CASE WHEN last_step IS NULL OR {p} >= last_step THEN {p} ELSE last_value END, "
            f"last_step = CASE WHEN last_step IS NULL THEN {p} ELSE {hi}(last_step, {p}) END "
            f"WHERE id = {p}"
        )
        rows = []
        for sid in sorted(by_sid):
            pts = by_sid[sid]
            first = min(st for st, _ in pts)
            last_step, last_value = max(pts, key=lambda sv: sv[0])
            rows.append((len(pts), first, first, last_step, last_value, last_step, last_step, sid))
        cur.executemany(sql, rows)

    # ----------------------------------------------------------------- reads
    def keys(self, run_id: int) -> list[MetricKey]:
        with self.db.read() as s:
            get_run(s, run_id)
            return list(s.scalars(select(MetricKey).where(MetricKey.run_id == run_id).order_by(MetricKey.key)))

    def series(self, run_id: int, key: str, points: int, step_min: int | None, step_max: int | None) -> dict:
        with self.db.read() as s:
            get_run(s, run_id)
            mk = s.scalar(select(MetricKey).where(MetricKey.run_id == run_id, MetricKey.key == key))
            if mk is None:
                raise NotFound(f"run {run_id} has no metric {key!r}")
            lo = mk.first_step if step_min is None else step_min
            hi = mk.last_step if step_max is None else step_max
            if lo is None or hi is None or hi < lo:
                return _series_out(key, points, 1, lo, hi, {}, lo or 0)
            plan = plan_buckets(lo, hi, points)
            rows = self._read_buckets(s, mk.id, plan)
            return _series_out(key, points, plan.width, lo, hi, rows, plan.origin)

    def _read_buckets(self, s: Session, sid: int, plan: "BucketPlan") -> dict[int, list]:
        merged: dict[int, list] = {}
        for a, b in plan.raw_ranges:
            _merge(merged, self._raw_query(s, sid, plan, a, b))
        if plan.level:
            _merge(merged, self._rollup_query(s, sid, plan))
        return merged

    def _raw_query(self, s: Session, sid: int, plan: "BucketPlan", a: int, b: int):
        last = self._last_expr("value", "step")
        q = text(
            f"SELECT (step - :o) / :w AS tb, min(value), max(value), max(step), {last}, count(*) "
            "FROM metric_points WHERE series_id = :sid AND step >= :a AND step < :b GROUP BY tb"
        )
        return s.execute(q, {"o": plan.origin, "w": plan.width, "sid": sid, "a": a, "b": b})

    def _rollup_query(self, s: Session, sid: int, plan: "BucketPlan"):
        last = self._last_expr("last_value", "last_step")
        q = text(
            f"SELECT (bucket * :bw - :o) / :w AS tb, min(min), max(max), max(last_step), {last}, sum(count) "
            "FROM metric_rollups WHERE series_id = :sid AND level = :lvl "
            "AND bucket >= :ba AND bucket < :bb GROUP BY tb"
        )
        bw = rollup_width(plan.level)
        return s.execute(
            q,
            {"bw": bw, "o": plan.origin, "w": plan.width, "sid": sid, "lvl": plan.level,
             "ba": plan.rollup_range[0] // bw, "bb": plan.rollup_range[1] // bw},
        )

    def _last_expr(self, value_col: str, step_col: str) -> str:
        if self.db.dialect == "postgresql":
            return f"(array_agg({value_col} ORDER BY {step_col} DESC))[1]"
        # SQLite: a bare column next to max() takes its value from the row holding the max.
        return value_col


@dataclass
class BucketPlan:
    origin: int
    width: int
    level: int  # 0 = raw points only
    rollup_range: tuple[int, int]  # [a, b) steps read from roll-ups, aligned to the level width
    raw_ranges: list[tuple[int, int]]  # [a, b) steps read from raw points


def plan_buckets(lo: int, hi: int, points: int) -> BucketPlan:
    """Choose bucket width and roll-up level for `points` buckets over steps [lo, hi]."""
    end = hi + 1
    wanted = max(1, -(-(end - lo) // points))
    level = max((lv for lv in ROLLUP_LEVELS if rollup_width(lv) <= wanted), default=0)
    unit = rollup_width(level) if level else 1
    origin = (lo // unit) * unit
    width = -(-(-(-(end - origin) // points)) // unit) * unit
    if not level:
        return BucketPlan(lo, width, 0, (lo, lo), [(lo, end)])
    a = -(-lo // unit) * unit
    b = (end // unit) * unit
    if a >= b:
        return BucketPlan(origin, width, 0, (lo, lo), [(lo, end)])
    raw = [r for r in ((lo, a), (b, end)) if r[0] < r[1]]
    return BucketPlan(origin, width, level, (a, b), raw)


def _merge(merged: dict[int, list], rows) -> None:  # noqa: ANN001
    for tb, mn, mx, last_step, last_value, count in rows:
        cur = merged.get(tb)
        if cur is None:
            merged[tb] = [mn, mx, last_step, last_value, count]
            continue
        cur[0] = min(cur[0], mn)
        cur[1] = max(cur[1], mx)
        if last_step >= cur[2]:
            cur[2], cur[3] = last_step, last_value
        cur[4] += count


def _series_out(key, points, width, lo, hi, rows, origin=0) -> dict:  # noqa: ANN001
    order = sorted(rows)
    return {
        "key": key,
        "points": points,
        "bucket_width": width,
        "origin": origin if rows else (lo or 0),
        "step_min": lo,
        "step_max": hi,
        "buckets": {
            "step": [max(origin + tb * width, lo) for tb in order],
            "min": [rows[tb][0] for tb in order],
            "max": [rows[tb][1] for tb in order],
            "last": [rows[tb][3] for tb in order],
            "count": [int(rows[tb][4]) for tb in order],
        },
    }
