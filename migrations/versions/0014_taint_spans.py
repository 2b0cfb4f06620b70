"""taint spans: what a run trained on

`taint_spans`: one row per episode of an alert that means misaligned training (a processor or
weights mismatch, a per-sample audit failure, an error rule on an `align/*` metric), with the
steps the run trained while it was open (docs/design.md, "What a run trained on"). Alerts still
open at the upgrade get an open span (their start as well as it is known: the step the alert
recorded, the one after it for a processor mismatch, else the run's first step); alerts that
resolved before it get none (the step they resolved at was never recorded). Migrations never import app code: the classification of
backend/detect/taint.py at this revision is copied below.

Revision ID: 0014
Revises: 0012 (0013 was never used)
Create Date: 2026-12-04 10:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0014'
down_revision = '0012'
branch_labels = None
depends_on = None

AUDIT_WHAT = {"length_parity": "log-probs misaligned with the completion ids (per-sample audit)",
              "rerender": "prompts re-render differently on the trainer (per-sample audit)"}


def upgrade() -> None:
    op.create_table('taint_spans',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('alert_id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=64), nullable=False),
    sa.Column('cause', sa.String(length=300), nullable=False),
    sa.Column('what', sa.Text(), nullable=False),
    sa.Column('first_step', sa.BigInteger(), nullable=False),
    sa.Column('last_step', sa.BigInteger(), nullable=True),
    sa.Column('worker_ids', sa.JSON(), nullable=False),
    sa.Column('workers', sa.Integer(), nullable=False),
    sa.Column('rollout_workers', sa.Integer(), nullable=False),
    sa.Column('opened_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('closed_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_taint_spans_run_id', 'taint_spans', ['run_id'], unique=False)
    op.create_index('ix_taint_spans_alert_id', 'taint_spans', ['alert_id'], unique=False)
    _backfill_open_alerts()


def downgrade() -> None:
    op.drop_index('ix_taint_spans_alert_id', table_name='taint_spans')
    op.drop_index('ix_taint_spans_run_id', table_name='taint_spans')
    op.drop_table('taint_spans')


def _backfill_open_alerts() -> None:
    conn = op.get_bind()
    alerts = sa.table('alerts', sa.column('id', sa.Integer()), sa.column('run_id', sa.Integer()),
                      sa.column('kind', sa.String()), sa.column('severity', sa.String()),
                      sa.column('open_key', sa.String()), sa.column('detail', sa.JSON()),
                      sa.column('step', sa.BigInteger()), sa.column('fired_at', sa.DateTime(timezone=True)))
    components = sa.table('components', sa.column('run_id', sa.Integer()), sa.column('side', sa.String()),
                          sa.column('status', sa.String()))
    spans = sa.table('taint_spans', *(sa.column(c) for c in (
        'run_id', 'alert_id', 'kind', 'cause', 'what', 'first_step', 'workers', 'rollout_workers')),
        sa.column('worker_ids', sa.JSON()), sa.column('opened_at', sa.DateTime(timezone=True)))
    rows = conn.execute(sa.select(alerts).where(alerts.c.open_key.is_not(None), alerts.c.severity == 'error', alerts.c.kind.in_(
        ('processor_mismatch', 'weights_mismatch', 'sample_audit', 'metric_threshold')))).all()
    live = dict(conn.execute(sa.select(components.c.run_id, sa.func.count())
                             .where(components.c.side == 'rollout', components.c.status == 'live')
                             .group_by(components.c.run_id)).all())
    new = []
    for a in rows:
        cause = _cause(a.kind, a.detail or {}, a.step)
        if cause is not None:
            key, what, workers, first = cause
            new.append({'run_id': a.run_id, 'alert_id': a.id, 'kind': a.kind, 'cause': key, 'what': what,
                        'first_step': first, 'worker_ids': workers, 'workers': len(workers),
                        'rollout_workers': live.get(a.run_id, 0), 'opened_at': a.fired_at})
    if new:
        op.bulk_insert(spans, new)


def _cause(kind: str, detail: dict, step):
    """(cause key, what, worker ids, first step) of an open error alert, or None."""
    if kind == 'processor_mismatch':
        names = [str(c) for c in detail.get('components') or []]
        what = f"{', '.join(names)} {'differs' if len(names) == 1 else 'differ'}" if names else 'processor differs'
        first = 0 if step is None else step + 1  # its step: the run's last step when it was found
        return 'processor:' + ','.join(sorted(names)), what, [str(w) for w in detail.get('worker_ids') or []], first
    if kind == 'weights_mismatch':
        return 'weights', "weights differ from the trainer's", [str(detail['worker_id'])] if detail.get('worker_id') else [], 0
    if kind == 'sample_audit':
        cause = str(detail.get('cause') or '')
        return f'sample_audit:{cause}', AUDIT_WHAT.get(cause, f'per-sample audit: {cause}'), [], step or 0
    rule_key = str(detail.get('rule_key') or '')
    if not rule_key.startswith('align/'):
        return None
    threshold = detail.get('threshold')
    what = f"{rule_key} {detail.get('comparison', '>')} {threshold:g}" if isinstance(threshold, (int, float)) else rule_key
    batch_steps = detail.get('steps') or []
    first = batch_steps[0] if batch_steps else (step or 0)
    return f'metric:{rule_key}', what, [str(detail['worker_id'])] if detail.get('worker_id') else [], first
