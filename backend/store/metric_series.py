"""The answers of series reads: GET /runs/{id}/series (from merged buckets) and
GET /runs/{id}/series/times (from batch arrival times)."""
from __future__ import annotations

from datetime import datetime


def series_response(key, points, width, lo, hi, rows, origin=0) -> dict:
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


def step_times_response(key: str, started_at: datetime, rows: list, points: int) -> dict:
    """Rows of (last step, received_at) as sorted, thinned columns; a step carried by several
    batches (a replay) keeps its first arrival."""
    first: dict[int, float] = {}
    for step, received_at in rows:
        seconds = max(0.0, (received_at - started_at).total_seconds())
        first[step] = min(seconds, first.get(step, seconds))
    steps = sorted(first)
    if len(steps) > points:
        stride = (len(steps) - 1) / max(1, points - 1)
        steps = [steps[round(i * stride)] for i in range(points)] if points > 1 else steps[-1:]
    return {"key": key, "started_at": started_at, "steps": steps, "seconds": [round(first[x], 3) for x in steps]}
