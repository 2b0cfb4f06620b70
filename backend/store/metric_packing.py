"""Metric points as stored: packing a validated batch into raw chunks and roll-up rows, and
decoding chunks back into points.

Raw points land in `metric_chunks`, packed: one row per series per batch (and per window of
2**12 steps), steps and values as little-endian int64/float64 bytes. Each batch also folds its
points into `metric_rollups` at bucket widths 16, 256, 4096 and 65536 steps.

Dense chunks (>= DENSE_CHUNK points) skip the 16-step level: their one raw row stands in for the
level-1 rows their points would fold into. A level-1 row holds at most 16 points, so a chunk of 16
or more never costs a read more rows than those roll-ups would. That level would be 80 of the 185
rows of a 20-key, 50-step batch, and a third of the rows of a worker's batch whose steps interleave
with 256 other posters' (every point its own bucket; bench/load.py: 1,259 -> 838). Each chunk
records which kind it is (`metric_chunks.in_level1`): reads (backend/store/metric_reads.py) and
retention go by that flag, never by the count, so every point is counted exactly once whatever
DENSE_CHUNK was when it was written.

All the arithmetic happens here, before the write touches the database.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from paritywatch.backend.store.jobs import BatchSpan
from paritywatch.backend.store.metric_validation import check_batch

ROLLUP_SHIFT = 4  # a step's bucket at a level is step >> (ROLLUP_SHIFT * level)
ROLLUP_BASE = 1 << ROLLUP_SHIFT  # 16
ROLLUP_LEVELS = (1, 2, 3, 4)  # bucket width = 16 ** level
CHUNK_SHIFT = 12  # a chunk's steps all lie in one window [k * 4096, (k + 1) * 4096)
# A new chunk of at least this many points writes no level-1 roll-ups (see the module docstring):
# a level-1 row's most points, so a raw row never holds fewer. It decides new chunks only (stored
# ones carry their own in_level1), so it can change freely.
DENSE_CHUNK = ROLLUP_BASE
STEP_DTYPE, VALUE_DTYPE = np.dtype("<i8"), np.dtype("<f8")


def rollup_width(level: int) -> int:
    return ROLLUP_BASE**level


@dataclass(frozen=True)
class Rollups:
    """Roll-up rows (series, level, bucket, min, max, last_step, last_value, count) column-wise, one
    array a column: a batch makes hundreds of them a key where its points are sparse (each its own
    bucket), and the group-commit writer merges every batch's (combine_rollups) before it writes
    them; as Python tuples the two cost most of the server's CPU under load (docs/design.md,
    section 9). `series` holds a key's index in the batch until the write gives it its series id."""

    series: np.ndarray
    level: np.ndarray
    bucket: np.ndarray
    min: np.ndarray
    max: np.ndarray
    last_step: np.ndarray
    last_value: np.ndarray
    count: np.ndarray

    @classmethod
    def empty(cls) -> "Rollups":
        return cls(*(np.empty(0, dtype=d) for d in ROLLUP_DTYPES))

    @classmethod
    def concat(cls, parts: list["Rollups"]) -> "Rollups":
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls.empty()
        return cls(*(np.concatenate(cols) for cols in zip(*(p.columns() for p in parts))))

    def __len__(self) -> int:
        return len(self.series)

    def columns(self) -> tuple[np.ndarray, ...]:
        return (self.series, self.level, self.bucket, self.min, self.max, self.last_step, self.last_value,
                self.count)

    def with_series(self, series: np.ndarray) -> "Rollups":
        return Rollups(series, *self.columns()[1:])

    def take(self, index: np.ndarray) -> "Rollups":
        return Rollups(*(c[index] for c in self.columns()))

    def lists(self) -> list[list]:
        """The columns as lists of Python numbers (what a driver binds)."""
        return [c.tolist() for c in self.columns()]

    def rows(self) -> list[tuple]:
        """As tuples of Python numbers, in column order."""
        return list(zip(*self.lists()))


ROLLUP_DTYPES = (np.int64, np.int64, np.int64, VALUE_DTYPE, VALUE_DTYPE, np.int64, VALUE_DTYPE, np.int64)


@dataclass
class KeyRows:
    """One series of a prepared batch, everything but its series id computed (its roll-ups are
    the batch's, PreparedBatch.rollups)."""

    chunks: list[tuple] = field(default_factory=list)  # (step_min, step_max, count, steps, vals, in_level1)
    stats: tuple = ()  # (count, first_step, last_step, last_value)
    extremes: tuple = ()  # (min, max) of the batch's values: what a rule judges (backend/store/jobs.py)


@dataclass
class PreparedBatch:
    """A validated batch: per key with at least one finite value, its rows ready to write."""

    points: dict[str, KeyRows]
    accepted: int
    skipped: int
    last_step: int | None = None
    content: bytes = b""  # digest of the steps and series as sent (sorted), see content_digest
    # Every key's roll-up rows; their `series` column is the key's index in `points`.
    rollups: Rollups = field(default_factory=Rollups.empty)

    def ledger_digest(self, component_id: int | None) -> str:
        """What the idempotency ledger keeps of the batch: its content and the process it names."""
        return hashlib.blake2b(self.content + repr(component_id).encode(), digest_size=16).hexdigest()

    def spans(self, keys: list[str]) -> dict[str, BatchSpan]:
        """What the batch brought for each of `keys` that it has: the input of a rule evaluation."""
        return {k: BatchSpan(kr.stats[1], kr.stats[2], *kr.extremes) for k in keys
                if (kr := self.points.get(k)) is not None}

    def rollups_of(self, ids: dict[str, int]) -> Rollups:
        """The roll-up rows with each key's series id from `ids` (key -> series id)."""
        if not len(self.rollups):
            return self.rollups
        sids = np.array([ids[k] for k in self.points], dtype=np.int64)
        return self.rollups.with_series(sids[self.rollups.series])

    def key_rollup_rows(self, key: str) -> list[tuple]:
        """(level, bucket, min, max, last_step, last_value, count) rows of one key."""
        if key not in self.points:
            return []
        mine = self.rollups.take(np.flatnonzero(self.rollups.series == list(self.points).index(key)))
        return [row[1:] for row in mine.rows()]


def prepare_batch(steps: list[int], series: dict[str, list], max_points: int, max_key: int) -> PreparedBatch:
    """Validate everything before any write (a rejected batch leaves no rows), then pack."""
    check_batch(steps, series, max_points, max_key)
    n_steps = len(steps)
    total = n_steps * len(series)
    if not series or not n_steps:
        return PreparedBatch({}, 0, 0, content=content_digest(np.asarray(steps, dtype=STEP_DTYPE), list(series),
                                                              np.zeros((len(series), n_steps))))
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
    content = content_digest(st, keys, vals)
    finite = np.isfinite(vals)
    out: dict[str, KeyRows] = {}
    rollups: list[Rollups] = []
    if bool(finite.all()):
        rollups.append(_fold(keys, st, vals, out))
        skipped = 0
    else:
        counts = finite.sum(axis=1)
        skipped = total - int(counts.sum())
        dense = [i for i in range(len(keys)) if counts[i] == n_steps]
        if dense:
            rollups.append(_fold([keys[i] for i in dense], st, vals[dense], out))
        for i in range(len(keys)):
            if 0 < counts[i] < n_steps:
                m = finite[i]
                rollups.append(_fold([keys[i]], st[m], vals[i][m][None, :], out, first_index=len(out)))
    last = max((kr.stats[2] for kr in out.values()), default=None)
    return PreparedBatch(out, total - skipped, skipped, last, content, Rollups.concat(rollups))


def content_digest(steps: np.ndarray, keys: list[str], vals: np.ndarray) -> bytes:
    """A batch's content whatever the order of its keys: its steps (sorted), its keys (sorted) and
    their values in that order (null, NaN and infinities as sent; NaN as one NaN)."""
    order = sorted(range(len(keys)), key=keys.__getitem__)
    h = hashlib.blake2b(digest_size=16)
    h.update(steps.tobytes())
    h.update("\0".join(keys[i] for i in order).encode())
    rows = vals[order] if order else vals
    h.update(np.where(np.isnan(rows), np.nan, rows).tobytes())
    return h.digest()


def group_starts(b: np.ndarray) -> np.ndarray:
    """Start index of each run of equal values in sorted `b`."""
    if len(b) == 1:
        return np.zeros(1, dtype=np.intp)
    return np.concatenate(([0], np.flatnonzero(b[1:] != b[:-1]) + 1))


def _fold(keys: list[str], st: np.ndarray, vals: np.ndarray, out: dict[str, KeyRows],
          first_index: int = 0) -> Rollups:
    """Rows of `keys` (vals: one row per key, all finite, aligned with sorted steps `st`) into
    `out`; returns their roll-ups, `series` counting keys from `first_index` (their index in `out`)."""
    n = len(st)
    step_list = st.tolist()
    last_rows = vals[:, -1].tolist()
    mins, maxs = vals.min(axis=1).tolist(), vals.max(axis=1).tolist()
    rows = [KeyRows(stats=(n, step_list[0], step_list[-1], last_rows[i]), extremes=(mins[i], maxs[i]))
            for i in range(len(keys))]
    # raw chunks: one per window of 2**CHUNK_SHIFT steps
    ws = group_starts(st >> CHUNK_SHIFT).tolist()
    we = ws[1:] + [n]
    sparse = np.zeros(n, dtype=bool)  # points of chunks that get level-1 roll-ups
    for a, b in zip(ws, we):
        sb = st[a:b].tobytes()
        smin, smax = step_list[a], step_list[b - 1]
        in_level1 = b - a < DENSE_CHUNK
        for kr, row in zip(rows, vals[:, a:b]):
            kr.chunks.append((smin, smax, b - a, sb, row.tobytes(), in_level1))
        if in_level1:
            sparse[a:b] = True
    for k, kr in zip(keys, rows):
        out[k] = kr
    # roll-ups, folded straight from the points; level 1 from the sparse chunks' points only
    series = np.arange(first_index, first_index + len(keys), dtype=np.int64)
    levels = [fold_rollups(series, 1, st[sparse], vals[:, sparse])] if bool(sparse.any()) else []
    levels += [fold_rollups(series, level, st, vals) for level in ROLLUP_LEVELS[1:]]
    return Rollups.concat(levels)


def fold_rollups(series: np.ndarray, level: int, st: np.ndarray, vals: np.ndarray) -> Rollups:
    """Level-`level` roll-ups of points `vals` (one row per series, finite, aligned with sorted
    steps `st`): per series, one row per bucket in bucket order."""
    n = len(st)
    buckets = st >> (ROLLUP_SHIFT * level)
    starts = group_starts(buckets)
    ends = np.append(starts[1:], n) - 1
    per_series = len(starts)

    def tiled(column: np.ndarray) -> np.ndarray:  # the same for every series
        return np.tile(column, len(series))

    return Rollups(
        np.repeat(series, per_series), np.full(len(series) * per_series, level, dtype=np.int64),
        tiled(buckets[starts]), np.minimum.reduceat(vals, starts, axis=1).ravel(),
        np.maximum.reduceat(vals, starts, axis=1).ravel(), tiled(st[ends]), vals[:, ends].ravel(),
        tiled(np.diff(np.append(starts, n))),
    )


def combine_rollups(parts: list[Rollups]) -> Rollups:
    """Roll-up rows merged per (series, level, bucket) as the store merges them into a stored row
    (of equal last steps, the row that came later wins), sorted: what one statement can write
    (PostgreSQL refuses to update a row twice in one INSERT .. ON CONFLICT) in one lock order."""
    r = Rollups.concat(parts)
    n = len(r)
    if n < 2:
        return r
    # sorted by series, level, bucket; within a bucket by last step, then arrival: a bucket's
    # last row holds its last point
    r = r.take(np.lexsort((np.arange(n), r.last_step, r.bucket, r.level, r.series)))
    edge = (r.series[1:] != r.series[:-1]) | (r.level[1:] != r.level[:-1]) | (r.bucket[1:] != r.bucket[:-1])
    starts = np.concatenate(([0], np.flatnonzero(edge) + 1))
    ends = np.append(starts[1:], n) - 1
    return Rollups(r.series[starts], r.level[starts], r.bucket[starts], np.minimum.reduceat(r.min, starts),
                   np.maximum.reduceat(r.max, starts), r.last_step[ends], r.last_value[ends],
                   np.add.reduceat(r.count, starts))


def combine_key_stats(rows: list[tuple]) -> list[tuple]:
    """Per-series stats (series_id, count, first_step, last_step, last_value) merged per series
    (a later row's last value wins a tie of steps), sorted by series id (one lock order)."""
    out: dict[int, list] = {}
    for sid, count, first_step, last_step, last_value in rows:
        row = out.get(sid)
        if row is None:
            out[sid] = [count, first_step, last_step, last_value]
            continue
        row[0], row[1] = row[0] + count, min(row[1], first_step)
        if last_step >= row[2]:
            row[2], row[3] = last_step, last_value
    return [(sid, *row) for sid, row in sorted(out.items())]


def level1_rollups(series_id: int, st: np.ndarray, vals: np.ndarray) -> Rollups:
    """Level-1 roll-ups of one series' points, sorted by step."""
    if not len(st):
        return Rollups.empty()
    return fold_rollups(np.array([series_id], dtype=np.int64), 1, st, vals[None, :])


def decode_chunks(rows) -> tuple[np.ndarray, np.ndarray]:
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


def decode_range(rows, a: int, b: int | None) -> tuple[np.ndarray, np.ndarray]:
    """`decode_chunks`, keeping the points with a <= step < b (b None: no upper bound): a chunk
    row can hold steps on both sides of a range edge."""
    st, vs = decode_chunks(rows)
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
    starts = group_starts(tb)
    ends = np.append(starts[1:], len(st)) - 1
    return list(zip(
        tb[starts].tolist(),
        np.minimum.reduceat(vs, starts).tolist(),
        np.maximum.reduceat(vs, starts).tolist(),
        st[ends].tolist(),
        vs[ends].tolist(),
        np.diff(np.append(starts, len(st))).tolist(),
    ))
