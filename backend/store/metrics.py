"""Metric ingest (batched, idempotent) and downsampled reads over multi-resolution roll-ups.

Raw points land in `metric_chunks`, packed: one row per series per batch (and per window of
2**12 steps), steps and values as little-endian int64/float64 bytes. Each batch also folds its
points into `metric_rollups` at bucket widths 16, 256, 4096 and 65536 steps. A read of N points
over a range picks the coarsest width that still gives N buckets, groups those roll-up rows in
SQL, and takes the ragged edges of the range from the raw chunks, so a 1M-point series reads a
few thousand rows.

Dense chunks (>= DENSE_CHUNK points, i.e. from big batches) skip the 16-step level: their raw
rows are already as compact as its roll-ups would be (one row per >= 256 points), and that level
is ~85% of the roll-up rows a big batch writes. A read at the 16-step level therefore groups the
level's roll-up rows (the sparse chunks' points) and buckets the dense chunks' raw points; every
point is counted exactly once, either way.

Ingest does all the arithmetic (validation, packing, roll-up folding, key stats) before it
touches the database; the write itself is a handful of executemany calls on a driver cursor,
run through `Database.run_raw` (group commit).
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from backend.db import Database
from backend.errors import Invalid, NotFound, TooLarge
from backend.models import MetricKey
from backend.store.runs import get_run

ROLLUP_BASE = 16
ROLLUP_LEVELS = (1, 2, 3, 4)  # bucket width = 16 ** level
CHUNK_SHIFT = 12  # a chunk's steps all lie in one window [k * 4096, (k + 1) * 4096)
# A chunk of at least this many points writes no level-1 roll-ups (see the module docstring).
# Migration 0002 relies on this value: changing it needs a migration that rebuilds level 1.
DENSE_CHUNK = 256
_CONTROL = re.compile(r"[\x00-\x1f]")
STEP_DTYPE, VALUE_DTYPE = np.dtype("<i8"), np.dtype("<f8")


def rollup_width(level: int) -> int:
    return ROLLUP_BASE**level


@dataclass
class KeyRows:
    """One series of a prepared batch, everything but its series id computed."""

    chunks: list[tuple] = field(default_factory=list)  # (step_min, step_max, count, steps, vals)
    rollups: list[tuple] = field(default_factory=list)  # (level, bucket, min, max, last_step, last_value, count)
    stats: tuple = ()  # (count, first_step, last_step, last_value)


@dataclass
class PreparedBatch:
    """A validated batch: per key with at least one finite value, its rows ready to write."""

    points: dict[str, KeyRows]
    accepted: int
    skipped: int
    last_step: int | None = None


def prepare_batch(steps: list[int], series: dict[str, list], max_points: int, max_key: int) -> PreparedBatch:
    """Validate everything before any write: a rejected batch leaves no rows."""
    n_steps = len(steps)
    total = n_steps * len(series)
    if total > max_points:
        raise TooLarge(f"batch has {total} points; the limit is {max_points} a batch")
    for key, values in series.items():
        _check_key(key, max_key)
        if len(values) != n_steps:
            raise Invalid(f"series {key!r} has {len(values)} values for {n_steps} steps")
    if not series or not n_steps:
        return PreparedBatch({}, 0, 0)
    st = np.asarray(steps, dtype=STEP_DTYPE)
    if n_steps > 1 and not bool((st[1:] >= st[:-1]).all()):
        order = np.argsort(st, kind="stable")  # stable: of equal steps the later one is "last"
        st = st[order]
    else:
        order = None
    keys = list(series)
    # None -> NaN; every row then has n_steps floats
    vals = np.array([series[k] for k in keys], dtype=VALUE_DTYPE).reshape(len(keys), n_steps)
    if order is not None:
        vals = vals[:, order]
    finite = np.isfinite(vals)
    out: dict[str, KeyRows] = {}
    if bool(finite.all()):
        _fold(keys, st, vals, out)
        skipped = 0
    else:
        counts = finite.sum(axis=1)
        skipped = total - int(counts.sum())
        dense = [i for i in range(len(keys)) if counts[i] == n_steps]
        if dense:
            _fold([keys[i] for i in dense], st, vals[dense], out)
        for i in range(len(keys)):
            if 0 < counts[i] < n_steps:
                m = finite[i]
                _fold([keys[i]], st[m], vals[i][m][None, :], out)
    last = max((kr.stats[2] for kr in out.values()), default=None)
    return PreparedBatch(out, total - skipped, skipped, last)


def _group_starts(b: np.ndarray) -> np.ndarray:
    """Start index of each run of equal values in sorted `b`."""
    if len(b) == 1:
        return np.zeros(1, dtype=np.intp)
    return np.concatenate(([0], np.flatnonzero(b[1:] != b[:-1]) + 1))


def _fold(keys: list[str], st: np.ndarray, vals: np.ndarray, out: dict[str, KeyRows]) -> None:
    """Rows of `keys` (vals: one row per key, all finite, aligned with sorted steps `st`)."""
    n = len(st)
    step_list = st.tolist()
    last_rows = vals[:, -1].tolist()
    rows = [KeyRows(stats=(n, step_list[0], step_list[-1], last_rows[i])) for i in range(len(keys))]
    # raw chunks: one per window of 2**CHUNK_SHIFT steps
    ws = _group_starts(st >> CHUNK_SHIFT).tolist()
    we = ws[1:] + [n]
    sparse = np.zeros(n, dtype=bool)  # points of chunks that get level-1 roll-ups
    for a, b in zip(ws, we):
        sb = st[a:b].tobytes()
        smin, smax = step_list[a], step_list[b - 1]
        for kr, row in zip(rows, vals[:, a:b]):
            kr.chunks.append((smin, smax, b - a, sb, row.tobytes()))
        if b - a < DENSE_CHUNK:
            sparse[a:b] = True
    # roll-ups, folded straight from the points; level 1 from the sparse chunks' points only
    if bool(sparse.all()):
        _fold_rollups(rows, 1, st, vals)
    elif bool(sparse.any()):
        _fold_rollups(rows, 1, st[sparse], vals[:, sparse])
    for level in ROLLUP_LEVELS[1:]:
        _fold_rollups(rows, level, st, vals)
    for k, kr in zip(keys, rows):
        out[k] = kr


def _fold_rollups(rows: list[KeyRows], level: int, st: np.ndarray, vals: np.ndarray) -> None:
    n = len(st)
    buckets = st >> (4 * level)
    starts = _group_starts(buckets)
    ends = np.append(starts[1:], n) - 1
    bl = buckets[starts].tolist()
    cnt = np.diff(np.append(starts, n)).tolist()
    ls = st[ends].tolist()
    mins = np.minimum.reduceat(vals, starts, axis=1).tolist()
    maxs = np.maximum.reduceat(vals, starts, axis=1).tolist()
    lasts = vals[:, ends].tolist()
    for kr, mn, mx, lv in zip(rows, mins, maxs, lasts):
        kr.rollups.extend(zip([level] * len(bl), bl, mn, mx, ls, lv, cnt))


def _check_key(key: str, max_key: int) -> None:
    if not key or len(key) > max_key:
        raise Invalid(f"metric key must be 1..{max_key} characters (got {len(key)})")
    if _CONTROL.search(key):
        raise Invalid(f"metric key {key!r} contains control characters")


def decode_chunks(rows) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    """(steps, values) of chunk rows (steps blob, vals blob), stably sorted by step: of equal
    steps the one from the later row comes last."""
    rows = list(rows)
    if not rows:
        return np.empty(0, STEP_DTYPE), np.empty(0, VALUE_DTYPE)
    st = np.concatenate([np.frombuffer(r[0], dtype=STEP_DTYPE) for r in rows])
    vs = np.concatenate([np.frombuffer(r[1], dtype=VALUE_DTYPE) for r in rows])
    if len(rows) > 1 and not bool((st[1:] >= st[:-1]).all()):
        order = np.argsort(st, kind="stable")
        st, vs = st[order], vs[order]
    return st, vs


def read_raw(s: Session, series_id: int, a: int, b: int | None,
             dense_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Raw points of a series with a <= step < b (b None: no upper bound), sorted by step;
    `dense_only`: just those of chunks with >= DENSE_CHUNK points (the ones level 1 leaves out)."""
    window = (max(a, 0) >> CHUNK_SHIFT) << CHUNK_SHIFT
    sql = ("SELECT steps, vals FROM metric_chunks WHERE series_id = :sid AND step_min >= :w "
           "AND step_max >= :a")
    params = {"sid": series_id, "w": window, "a": a}
    if b is not None:
        sql += " AND step_min < :b"
        params["b"] = b
    if dense_only:
        sql += " AND count >= :dense"
        params["dense"] = DENSE_CHUNK
    st, vs = decode_chunks(s.execute(text(sql + " ORDER BY batch_id"), params))
    if len(st):
        i = int(np.searchsorted(st, a, "left"))
        j = len(st) if b is None else int(np.searchsorted(st, b, "left"))
        st, vs = st[i:j], vs[i:j]
    return st, vs


def bucket_raw(st: np.ndarray, vs: np.ndarray, origin: int, width: int) -> list[tuple]:
    """(tb, min, max, last_step, last_value, count) per bucket of sorted raw points."""
    if not len(st):
        return []
    tb = (st - origin) // width
    starts = _group_starts(tb)
    ends = np.append(starts[1:], len(st)) - 1
    return list(zip(
        tb[starts].tolist(),
        np.minimum.reduceat(vs, starts).tolist(),
        np.maximum.reduceat(vs, starts).tolist(),
        st[ends].tolist(),
        vs[ends].tolist(),
        np.diff(np.append(starts, len(st))).tolist(),
    ))


class MetricStore:
    def __init__(self, db: Database):
        self.db = db
        self._series_ids: dict[tuple[int, str], int] = {}
        self._ids_lock = threading.Lock()
        self.pg = pg = db.dialect == "postgresql"
        self._least, self._greatest = ("LEAST", "GREATEST") if pg else ("min", "max")
        self._param = p = "%s" if pg else "?"
        lo, hi = self._least, self._greatest
        self._sql_claim = (
            "INSERT INTO ingest_batches (run_id, client_id, seq, points, received_at) "
            f"VALUES ({p}, {p}, {p}, {p}, CURRENT_TIMESTAMP) ON CONFLICT (client_id, seq) DO NOTHING RETURNING id"
        )
        self._sql_chunks = (
            "INSERT INTO metric_chunks (series_id, step_min, batch_id, step_max, count, steps, vals) "
            f"VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p})"
        )
        upd = (
            "ON CONFLICT (series_id, level, bucket) DO UPDATE SET "
            f"min = {lo}(metric_rollups.min, excluded.min), "
            f"max = {hi}(metric_rollups.max, excluded.max), "
            "last_value = CASE WHEN excluded.last_step >= metric_rollups.last_step "
            "THEN excluded.last_value ELSE metric_rollups.last_value END, "
            f"last_step = {hi}(metric_rollups.last_step, excluded.last_step), "
            "count = metric_rollups.count + excluded.count"
        )
        cols = "INSERT INTO metric_rollups (series_id, level, bucket, min, max, last_step, last_value, count) "
        if pg:  # one statement for all rows, in the sorted order of the arrays (lock order)
            self._sql_rollups = (
                cols + "SELECT * FROM unnest(%s::int[], %s::int[], %s::bigint[], %s::float8[], %s::float8[], "
                "%s::bigint[], %s::float8[], %s::bigint[]) " + upd
            )
        else:
            self._sql_rollups = cols + "VALUES (?, ?, ?, ?, ?, ?, ?, ?) " + upd
        self._sql_stats = (
            f"UPDATE metric_keys SET count = count + {p}, "
            f"first_step = CASE WHEN first_step IS NULL THEN {p} ELSE {lo}(first_step, {p}) END, "
            f"last_value = CASE WHEN last_step IS NULL OR {p} >= last_step THEN {p} ELSE last_value END, "
            f"last_step = CASE WHEN last_step IS NULL THEN {p} ELSE {hi}(last_step, {p}) END "
            f"WHERE id = {p}"
        )
        self._sql_run = f"UPDATE runs SET last_step = {p} WHERE id = {p} AND (last_step IS NULL OR last_step < {p})"

    # ---------------------------------------------------------------- ingest
    def ingest(self, run_id: int, client_id: str, seq: int, batch: PreparedBatch) -> bool:
        """Store a batch once. Returns False (and writes nothing) for a replayed (client, seq)."""
        keys = list(batch.points)
        with self._ids_lock:
            known = {k: self._series_ids[(run_id, k)] for k in keys if (run_id, k) in self._series_ids}

        def job(cur):  # noqa: ANN001, ANN202
            return self._write(cur, run_id, client_id, seq, batch, known)

        stored, ids = self.db.run_raw(job)
        if ids:
            self._remember_ids(run_id, ids)  # only after commit: a rolled-back key row has no id
        return stored

    def _write(self, cur, run_id: int, client_id: str, seq: int, batch: PreparedBatch,  # noqa: ANN001
               known: dict[str, int]) -> tuple[bool, dict[str, int]]:
        try:
            cur.execute(self._sql_claim, (run_id, client_id, seq, batch.accepted))
            row = cur.fetchone()
        except Exception as exc:
            if _is_fk_violation(exc):
                raise NotFound(f"run {run_id} does not exist") from None
            raise
        if row is None:  # replayed (client, seq), unless the run is gone
            cur.execute(f"SELECT 1 FROM runs WHERE id = {self._param}", (run_id,))
            if cur.fetchone() is None:
                raise NotFound(f"run {run_id} does not exist")
            return False, {}
        if not batch.points:
            return True, {}
        batch_id = row[0]
        missing = [k for k in batch.points if k not in known]
        created = self._create_keys(cur, run_id, missing) if missing else {}
        ids = {**known, **created}
        order = sorted(batch.points, key=ids.__getitem__)  # lock order on PostgreSQL
        chunks, rollups, stats = [], [], []
        for k in order:
            sid, kr = ids[k], batch.points[k]
            chunks.extend((sid, c[0], batch_id, c[1], c[2], c[3], c[4]) for c in kr.chunks)
            rollups.extend((sid, *r) for r in kr.rollups)
            n, first, last_step, last_value = kr.stats
            stats.append((n, first, first, last_step, last_value, last_step, last_step, sid))
        cur.executemany(self._sql_chunks, chunks)
        if self.pg:
            cur.execute(self._sql_rollups, [list(c) for c in zip(*rollups)])
        else:
            cur.executemany(self._sql_rollups, rollups)
        cur.executemany(self._sql_stats, stats)
        cur.execute(self._sql_run, (batch.last_step, run_id, batch.last_step))
        return True, created

    def _create_keys(self, cur, run_id: int, keys: list[str]) -> dict[str, int]:  # noqa: ANN001
        p = self._param
        out: dict[str, int] = {}
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            cur.executemany(
                f"INSERT INTO metric_keys (run_id, key, count) VALUES ({p}, {p}, 0) "
                "ON CONFLICT (run_id, key) DO NOTHING",
                [(run_id, k) for k in chunk],
            )
            cur.execute(
                f"SELECT key, id FROM metric_keys WHERE run_id = {p} AND key IN ({', '.join([p] * len(chunk))})",
                (run_id, *chunk),
            )
            out.update({k: i for k, i in cur.fetchall()})
        return out

    def _remember_ids(self, run_id: int, ids: dict[str, int]) -> None:
        with self._ids_lock:
            for k, v in ids.items():
                self._series_ids[(run_id, k)] = v

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
        if plan.level == 1:  # dense chunks have no level-1 roll-ups: bucket their raw points
            st, vs = read_raw(s, sid, *plan.rollup_range, dense_only=True)
            _merge(merged, bucket_raw(st, vs, plan.origin, plan.width))
        return merged

    def _raw_query(self, s: Session, sid: int, plan: "BucketPlan", a: int, b: int) -> list[tuple]:
        st, vs = read_raw(s, sid, a, b)
        return bucket_raw(st, vs, plan.origin, plan.width)

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


def _is_fk_violation(exc: Exception) -> bool:
    name = type(exc).__name__
    if name == "ForeignKeyViolation":  # psycopg
        return True
    return name == "IntegrityError" and "FOREIGN KEY" in str(exc)  # sqlite3
