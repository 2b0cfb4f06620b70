"""metric chunks record whether their points are in the level-1 roll-ups

Until now "in level 1" was derived from the count (chunks under 256 points), so the threshold could
not change without rebuilding level 1, and retention has since dropped raw chunks whose roll-ups
stay, so level 1 can no longer be rebuilt. `metric_chunks.in_level1` stores the fact per chunk:
the upgrade sets it from the old rule and rebuilds nothing, so every stored chunk keeps its meaning
and new chunks may use another threshold (backend/store/metric_packing.py: DENSE_CHUNK). The
downgrade restores the old rule: chunks under 256 points written outside level 1 are folded into
it first. SQLite drops the column with its native DROP COLUMN, as 0005 does: a batch copy of
`metric_chunks` would rewrite every raw point.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 10:00:00
"""
from alembic import op
import numpy as np
import sqlalchemy as sa


revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None

DENSE_CHUNK = 256  # paritywatch.backend.store.metric_packing.DENSE_CHUNK at 0011: its rule for level 1
LEVEL1_SHIFT = 4  # level-1 buckets are 16 steps wide
CHUNK_SHIFT = 12  # a chunk's steps all lie in one window of 4096 steps


def upgrade() -> None:
    op.add_column('metric_chunks', sa.Column('in_level1', sa.Boolean(), server_default=sa.true(), nullable=False))
    chunks = sa.table('metric_chunks', sa.column('count', sa.Integer()), sa.column('in_level1', sa.Boolean()))
    op.execute(chunks.update().where(chunks.c.count >= DENSE_CHUNK).values(in_level1=False))


def downgrade() -> None:
    conn = op.get_bind()
    outside = f"NOT in_level1 AND count < {DENSE_CHUNK}"
    series_ids = [r[0] for r in conn.execute(sa.text(f"SELECT DISTINCT series_id FROM metric_chunks WHERE {outside}"))]
    for sid in series_ids:
        rows = conn.execute(sa.text(f"SELECT steps, vals FROM metric_chunks WHERE series_id = :sid AND {outside} "
                                    "ORDER BY batch_id"), {"sid": sid}).fetchall()
        _fold_level1(conn, sid, _level1_buckets(rows))
    if conn.dialect.name == 'sqlite':
        op.execute('ALTER TABLE metric_chunks DROP COLUMN in_level1')
    else:
        op.drop_column('metric_chunks', 'in_level1')


def _fold_level1(conn, sid: int, folded: list[dict]) -> None:
    """Merge level-1 rows of one series into the stored ones. Of equal last steps the point
    written last wins, as reads decide it: it is in the latest batch's chunk holding that step
    among those under DENSE_CHUNK points (all of them count toward level 1 after this)."""
    if not folded:
        return
    stored = {r[0]: r[1:] for r in conn.execute(sa.text(
        "SELECT bucket, min, max, last_step, last_value, count FROM metric_rollups "
        "WHERE series_id = :sid AND level = 1 AND bucket >= :lo AND bucket <= :hi"),
        {"sid": sid, "lo": folded[0]["bucket"], "hi": folded[-1]["bucket"]})}
    inserts, updates = [], []
    for b in folded:
        old = stored.get(b["bucket"])
        if old is None:
            inserts.append(b)
            continue
        mn, mx, last_step, last_value, count = old
        if last_step == b["last_step"]:
            b["last_value"] = _last_written(conn, sid, last_step)
        elif last_step > b["last_step"]:
            b["last_step"], b["last_value"] = last_step, last_value
        b.update(min=min(mn, b["min"]), max=max(mx, b["max"]), count=count + b["count"])
        updates.append(b)
    if inserts:
        conn.execute(sa.text(
            "INSERT INTO metric_rollups (series_id, level, bucket, min, max, last_step, last_value, count) "
            "VALUES (:sid, 1, :bucket, :min, :max, :last_step, :last_value, :count)"),
            [{"sid": sid, **b} for b in inserts])
    if updates:
        conn.execute(sa.text(
            "UPDATE metric_rollups SET min = :min, max = :max, last_step = :last_step, last_value = :last_value, "
            "count = :count WHERE series_id = :sid AND level = 1 AND bucket = :bucket"),
            [{"sid": sid, **b} for b in updates])


def _last_written(conn, sid: int, step: int) -> float:
    rows = conn.execute(sa.text(
        f"SELECT steps, vals FROM metric_chunks WHERE series_id = :sid AND count < {DENSE_CHUNK} "
        "AND step_min >= :w AND step_min <= :s AND step_max >= :s ORDER BY batch_id"),
        {"sid": sid, "w": step >> CHUNK_SHIFT << CHUNK_SHIFT, "s": step}).fetchall()
    steps, vals = _decode(rows)
    return float(vals[steps == step][-1])


def _decode(rows) -> tuple[np.ndarray, np.ndarray]:
    """Points of packed chunk rows (steps int64 LE, vals float64 LE) in batch order, stably
    sorted by step: of equal steps the later batch's point comes last."""
    steps = np.concatenate([np.frombuffer(bytes(r[0]), dtype="<i8") for r in rows])
    vals = np.concatenate([np.frombuffer(bytes(r[1]), dtype="<f8") for r in rows])
    order = np.argsort(steps, kind="stable")
    return steps[order], vals[order]


def _level1_buckets(rows) -> list[dict]:
    """min / max / last / count per 16-step bucket of packed chunk rows, sorted by bucket."""
    if not rows:
        return []
    steps, vals = _decode(rows)
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
