"""Planning a downsampled read: a read of N points over a range picks the coarsest roll-up
width that still gives N buckets, groups those roll-up rows in SQL, and takes the ragged edges of
the range from the raw chunks, so a 1M-point series reads a few thousand rows. A raw budget bounds
how many raw points one read may decode."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from paritywatch.backend.errors import Invalid
from paritywatch.backend.models import MetricKey
from paritywatch.backend.store.metric_packing import ROLLUP_BASE, ROLLUP_LEVELS, decode_range, rollup_width
from paritywatch.backend.store.metric_sql import chunk_point_count, chunk_rows, chunks_where


def metric_key(s: Session, run_id: int, key: str) -> MetricKey | None:
    return s.scalar(select(MetricKey).where(MetricKey.run_id == run_id, MetricKey.key == key))


def read_raw(s: Session, series_id: int, a: int, b: int | None,
             dense_only: bool = False, budget: "RawBudget | None" = None) -> tuple[np.ndarray, np.ndarray]:
    """Raw points of a series with a <= step < b (b None: no upper bound), sorted by step;
    `dense_only`: just those of chunks not folded into level-1 roll-ups (`in_level1` false), which a
    level-1 read buckets beside the roll-ups.
    A `budget` refuses (before fetching any) more raw points than it has left."""
    where, params = chunks_where(series_id, a, b, dense_only)
    if budget is not None and budget.limit is not None:
        budget.spend(chunk_point_count(s, where, params))
    return decode_range(chunk_rows(s, where, params), a, b)


class RawBudget:
    """How many raw points one series read may decode: a read beyond it is refused with a 422
    that says how to narrow it, instead of decoding millions of points."""

    def __init__(self, limit: int | None):
        self.limit, self.used = limit, 0

    def spend(self, points: int) -> None:
        self.used += points
        if self.limit is not None and self.used > self.limit:
            raise Invalid(f"this read would decode more than {self.limit:,} raw points: ask for fewer `points` "
                          "(coarser buckets come from roll-ups) or a narrower step_min..step_max range")


@dataclass
class BucketPlan:
    origin: int
    width: int
    level: int  # 0 = raw points only
    rollup_range: tuple[int, int]  # [a, b) steps read from roll-ups, aligned to the level width
    raw_ranges: list[tuple[int, int]]  # [a, b) steps read from raw points


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def plan_buckets(lo: int, hi: int, points: int) -> BucketPlan:
    """Choose bucket width and roll-up level for `points` buckets over steps [lo, hi]."""
    end = hi + 1
    wanted = max(1, _ceil_div(end - lo, points))
    level = max((lv for lv in ROLLUP_LEVELS if rollup_width(lv) <= wanted), default=0)
    unit = rollup_width(level) if level else 1
    origin = (lo // unit) * unit
    width = _ceil_div(_ceil_div(end - origin, points), unit) * unit
    if not level:
        return BucketPlan(lo, width, 0, (lo, lo), [(lo, end)])
    a = _ceil_div(lo, unit) * unit
    b = (end // unit) * unit
    if a >= b:
        return BucketPlan(origin, width, 0, (lo, lo), [(lo, end)])
    raw = [r for r in ((lo, a), (b, end)) if r[0] < r[1]]
    return BucketPlan(origin, width, level, (a, b), raw)


def plan_from_rollups(lo: int, hi: int, points: int) -> BucketPlan:
    """A plan that reads no raw range, for series whose raw points retention dropped: buckets
    at least 16 steps wide, the range widened to the roll-up grid at both ends (the first and
    last bucket may hold points just outside [lo, hi])."""
    end = hi + 1
    wanted = max(ROLLUP_BASE, _ceil_div(end - lo, points))
    level = max(lv for lv in ROLLUP_LEVELS if rollup_width(lv) <= wanted)
    unit = rollup_width(level)
    a, b = (lo // unit) * unit, _ceil_div(end, unit) * unit
    width = _ceil_div(_ceil_div(b - a, points), unit) * unit
    return BucketPlan(a, width, level, (a, b), [])


def merge_buckets(merged: dict[int, list], rows) -> None:
    """Fold bucket rows (tb, min, max, last_step, last_value, count) into `merged` (tb -> [min, max,
    last_step, last_value, count]); of equal last steps the row merged later wins."""
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
