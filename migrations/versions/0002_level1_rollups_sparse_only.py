"""level-1 roll-ups cover sparse chunks only

Dense chunks (>= 256 points, from big batches) no longer write 16-step roll-ups; reads at that
level bucket their raw points instead (backend/store/metrics.py). Level-1 rows written before
this revision also hold the dense chunks' points, which a read would now count twice, so both
directions rebuild level 1 from the raw chunks: upgrade from the sparse chunks only, downgrade
from all of them (0001's meaning). Empty tables make this a no-op.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 11:30:00
"""
from alembic import op
import numpy as np
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

DENSE_CHUNK = 256  # paritywatch.backend.store.metric_packing.DENSE_CHUNK at this revision
LEVEL1_SHIFT = 4  # level-1 buckets are 16 steps wide


def upgrade() -> None:
    _rebuild_level1(dense_chunk=DENSE_CHUNK)


def downgrade() -> None:
    _rebuild_level1(dense_chunk=None)


def _rebuild_level1(dense_chunk: int | None) -> None:
    """Replace every level-1 roll-up row with ones folded from the chunks that count toward it
    (those under `dense_chunk` points; all of them when None), one series at a time."""
    conn = op.get_bind()
    conn.execute(sa.text("DELETE FROM metric_rollups WHERE level = 1"))
    series_ids = [r[0] for r in conn.execute(sa.text("SELECT DISTINCT series_id FROM metric_chunks"))]
    select_chunks = "SELECT steps, vals FROM metric_chunks WHERE series_id = :sid"
    if dense_chunk is not None:
        select_chunks += f" AND count < {int(dense_chunk)}"
    select_chunks = sa.text(select_chunks + " ORDER BY batch_id")
    insert = sa.text(
        "INSERT INTO metric_rollups (series_id, level, bucket, min, max, last_step, last_value, count) "
        "VALUES (:sid, 1, :bucket, :min, :max, :last_step, :last_value, :count)"
    )
    for sid in series_ids:
        rows = conn.execute(select_chunks, {"sid": sid}).fetchall()
        buckets = _level1_buckets(rows)
        if buckets:
            conn.execute(insert, [{"sid": sid, **b} for b in buckets])


def _level1_buckets(rows) -> list[dict]:
    """min / max / last / count per 16-step bucket of packed chunk rows (steps int64 LE, vals
    float64 LE) in batch order: of equal steps the later batch's point is the last."""
    if not rows:
        return []
    steps = np.concatenate([np.frombuffer(bytes(r[0]), dtype="<i8") for r in rows])
    vals = np.concatenate([np.frombuffer(bytes(r[1]), dtype="<f8") for r in rows])
    order = np.argsort(steps, kind="stable")
    steps, vals = steps[order], vals[order]
    bucket = steps >> LEVEL1_SHIFT
    starts = np.concatenate(([0], np.flatnonzero(bucket[1:] != bucket[:-1]) + 1))
    ends = np.append(starts[1:], len(steps)) - 1
    return [
        {"bucket": b, "min": mn, "max": mx, "last_step": ls, "last_value": lv, "count": c}
        for b, mn, mx, ls, lv, c in zip(
            bucket[starts].tolist(),
            np.minimum.reduceat(vals, starts).tolist(),
            np.maximum.reduceat(vals, starts).tolist(),
            steps[ends].tolist(),
            vals[ends].tolist(),
            np.diff(np.append(starts, len(steps))).tolist(),
        )
    ]
