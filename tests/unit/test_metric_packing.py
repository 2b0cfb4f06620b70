"""Packing a batch into roll-up rows (backend/store/metric_packing.py) against a fold by hand of
its points: every level, sparse and dense chunks, unsorted and repeated steps, skipped values,
batches inside one bucket and across bucket edges."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from paritywatch.backend.store.metric_packing import (CHUNK_SHIFT, DENSE_CHUNK, ROLLUP_DTYPES, ROLLUP_LEVELS,
                                                      Rollups, combine_rollups, prepare_batch, rollup_width)


def brute_force_rollups(steps: list[int], values: list[float | None]) -> set[tuple]:
    """(level, bucket, min, max, last_step, last_value, count) of one series' points: of equal
    steps the one given later is the last; level 1 holds the points of sparse chunks only."""
    points = sorted(((s, v) for s, v in zip(steps, values) if v is not None and math.isfinite(v)),
                    key=lambda p: p[0])  # sorted() is stable: of equal steps the later stays later
    per_window: dict[int, int] = {}
    for s, _ in points:
        per_window[s >> CHUNK_SHIFT] = per_window.get(s >> CHUNK_SHIFT, 0) + 1
    rows = set()
    for level in ROLLUP_LEVELS:
        buckets: dict[int, list] = {}
        for s, v in points:
            if level == 1 and per_window[s >> CHUNK_SHIFT] >= DENSE_CHUNK:
                continue
            buckets.setdefault(s // rollup_width(level), []).append((s, v))
        for bucket, pts in buckets.items():
            vals = [v for _, v in pts]
            rows.add((level, bucket, min(vals), max(vals), pts[-1][0], pts[-1][1], len(pts)))
    return rows


finite = st.floats(-1e6, 1e6, allow_nan=False, width=64)
value = st.one_of(finite, finite, finite, st.none(), st.just(math.nan), st.just(math.inf))


@st.composite
def batches(draw) -> tuple[list[int], dict[str, list]]:
    n = draw(st.integers(1, 120))
    # starts near bucket edges of every level (and far out): one bucket, or across an edge
    edge = draw(st.sampled_from([0, 16, 256, 4096, 65536, 3 * 65536, 2**40]))
    start = max(0, edge + draw(st.integers(-130, 130)))
    if draw(st.booleans()):
        steps = list(range(start, start + n))
    else:  # unsorted, with repeats
        steps = draw(st.lists(st.integers(start, start + 300), min_size=n, max_size=n))
    keys = draw(st.integers(1, 3))
    series = {f"k{i}": draw(st.lists(value, min_size=n, max_size=n)) for i in range(keys)}
    return steps, series


@settings(max_examples=300, deadline=None)
@given(batches())
def test_rollup_rows_are_the_fold_of_the_points(batch) -> None:
    steps, series = batch
    prepared = prepare_batch(steps, series, max_points=10**6, max_key=200)
    for key, values in series.items():
        expected = brute_force_rollups(steps, values)
        got = set(prepared.key_rollup_rows(key))
        assert got == expected, key


def merged_by_hand(rows: list[tuple]) -> list[tuple]:
    """Rows (series, level, bucket, min, max, last_step, last_value, count) merged one at a time
    into a bucket, as the store's UPDATE merges a row into a stored one: of equal last steps the
    row that came later wins."""
    out: dict[tuple, list] = {}
    for sid, level, bucket, mn, mx, last_step, last_value, count in rows:
        row = out.setdefault((sid, level, bucket), [mn, mx, last_step, last_value, 0])
        row[0], row[1], row[4] = min(row[0], mn), max(row[1], mx), row[4] + count
        if last_step >= row[2]:
            row[2], row[3] = last_step, last_value
    return [(*key, *row) for key, row in sorted(out.items())]


rollup_row = st.tuples(st.integers(1, 3), st.integers(1, 2), st.integers(0, 3), finite, finite,
                       st.integers(0, 5), finite, st.integers(1, 50))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(rollup_row, max_size=12), max_size=5))
def test_combined_rollups_are_the_rows_merged_one_by_one_in_order(parts) -> None:
    """A group commit merges every batch's roll-ups before it writes: the result must be what
    merging them into the stored rows one at a time, in order, would leave (ties on the last
    step included: the later row's value stays)."""
    blocks = [Rollups(*(np.array(c, dtype=d) for c, d in zip(zip(*rows), ROLLUP_DTYPES))) if rows
              else Rollups.empty() for rows in parts]
    assert combine_rollups(blocks).rows() == merged_by_hand([r for rows in parts for r in rows])
