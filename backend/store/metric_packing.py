"""Metric points as stored: packing a validated batch into raw chunks and roll-up rows, and
decoding chunks back into points.

Raw points land in `metric_chunks`, packed: one row per series per batch (and per window of
2**12 steps), steps and values as little-endian int64/float64 bytes. Each batch also folds its
points into `metric_rollups` at bucket widths 16, 256, 4096 and 65536 steps.

Dense chunks (>= DENSE_CHUNK points) skip the 16-step level: their one raw row stands in for the
two or more level-1 rows their points would fold into, and that level would be 80 of the 185 rows
of a 20-key, 50-step batch. Each chunk records which kind it is
(`metric_chunks.in_level1`): reads (backend/store/metric_reads.py) and retention go by that flag,
never by the count, so every point is counted exactly once whatever DENSE_CHUNK was when it was
written.

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
# A new chunk of at least this many points writes no level-1 roll-ups (see the module docstring).
# It decides new chunks only (stored ones carry their own in_level1), so it can change freely.
DENSE_CHUNK = 32
STEP_DTYPE, VALUE_DTYPE = np.dtype("<i8"), np.dtype("<f8")


def rollup_width(level: int) -> int:
    return ROLLUP_BASE**level


@dataclass
class KeyRows:
    """One series of a prepared batch, everything but its series id computed."""

    chunks: list[tuple] = field(default_factory=list)  # (step_min, step_max, count, steps, vals, in_level1)
    rollups: list[tuple] = field(default_factory=list)  # (level, bucket, min, max, last_step, last_value, count)
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

    def ledger_digest(self, component_id: int | None) -> str:
        """What the idempotency ledger keeps of the batch: its content and the process it names."""
        return hashlib.blake2b(self.content + repr(component_id).encode(), digest_size=16).hexdigest()

    def spans(self, keys: list[str]) -> dict[str, BatchSpan]:
        """What the batch brought for each of `keys` that it has: the input of a rule evaluation."""
        return {k: BatchSpan(kr.stats[1], kr.stats[2], *kr.extremes) for k in keys
                if (kr := self.points.get(k)) is not None}


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
    return PreparedBatch(out, total - skipped, skipped, last, content)


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


def _fold(keys: list[str], st: np.ndarray, vals: np.ndarray, out: dict[str, KeyRows]) -> None:
    """Rows of `keys` (vals: one row per key, all finite, aligned with sorted steps `st`)."""
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
    # roll-ups, folded straight from the points; level 1 from the sparse chunks' points only
    if bool(sparse.all()):
        _fold_all_points(rows, 1, st, vals)
    elif bool(sparse.any()):
        _fold_rollups(rows, 1, st[sparse], vals[:, sparse])
    for level in ROLLUP_LEVELS[1:]:
        _fold_all_points(rows, level, st, vals)
    for k, kr in zip(keys, rows):
        out[k] = kr


def _fold_all_points(rows: list[KeyRows], level: int, st: np.ndarray, vals: np.ndarray) -> None:
    """`_fold_rollups` of all of the batch's points (rows' stats and extremes are theirs). A batch
    inside one bucket of the level (most batches, at every level but the 16-step one) has one row
    per key there, its own min, max and last point: no arithmetic left to do."""
    shift = ROLLUP_SHIFT * level
    first, last = int(st[0]), int(st[-1])
    if first >> shift != last >> shift:
        _fold_rollups(rows, level, st, vals)
        return
    bucket, n = first >> shift, len(st)
    for kr in rows:
        kr.rollups.append((level, bucket, kr.extremes[0], kr.extremes[1], kr.stats[2], kr.stats[3], n))


def _fold_rollups(rows: list[KeyRows], level: int, st: np.ndarray, vals: np.ndarray) -> None:
    n = len(st)
    buckets = st >> (ROLLUP_SHIFT * level)
    starts = group_starts(buckets)
    ends = np.append(starts[1:], n) - 1
    bl = buckets[starts].tolist()
    cnt = np.diff(np.append(starts, n)).tolist()
    ls = st[ends].tolist()
    mins = np.minimum.reduceat(vals, starts, axis=1).tolist()
    maxs = np.maximum.reduceat(vals, starts, axis=1).tolist()
    lasts = vals[:, ends].tolist()
    for kr, mn, mx, lv in zip(rows, mins, maxs, lasts):
        kr.rollups.extend(zip([level] * len(bl), bl, mn, mx, ls, lv, cnt))


def combine_rollups(rows: list[tuple]) -> list[tuple]:
    """Roll-up rows (series_id, level, bucket, min, max, last_step, last_value, count) merged per
    (series, level, bucket) as the store merges them into a stored row (a later row's last value
    wins a tie of steps), sorted: what one statement can write (PostgreSQL refuses to update a row
    twice in one INSERT .. ON CONFLICT) in one lock order."""
    out: dict[tuple, list] = {}
    for sid, level, bucket, mn, mx, last_step, last_value, count in rows:
        row = out.get((sid, level, bucket))
        if row is None:
            out[(sid, level, bucket)] = [mn, mx, last_step, last_value, count]
            continue
        row[0], row[1], row[4] = min(row[0], mn), max(row[1], mx), row[4] + count
        if last_step >= row[2]:
            row[2], row[3] = last_step, last_value
    return [(*key, *row) for key, row in sorted(out.items())]


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


def level1_rollups(st: np.ndarray, vals: np.ndarray) -> list[tuple]:
    """Level-1 roll-up rows (level, bucket, min, max, last_step, last_value, count) of one
    series' points, sorted by step."""
    if not len(st):
        return []
    rows = [KeyRows()]
    _fold_rollups(rows, 1, st, vals[None, :])
    return rows[0].rollups


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
