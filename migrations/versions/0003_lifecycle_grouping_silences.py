"""process lifecycle, grouped notifications, silences, durable detection jobs

- components: `status` live | closed | lost (existing rows: live; the first heartbeat sweep after
  the upgrade marks the silent ones lost, as the old sweep already alerted on them), with the
  times and the reason of a close.
- runs: an index on `control_state` (the sweep looks at live runs only); the column gains the
  values `finished` and `crashed` (a String column: no DDL).
- rules: `keep_firing_for`; rule_states: `clear_streak`.
- webhooks: per-webhook grouping (NULL = the server's defaults).
- silences, notification_groups (the notification log), detect_jobs (the detection outbox).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 09:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')
DROPPED_COLUMNS = (
    ('webhooks', ('repeat_interval_s', 'group_interval_s', 'group_wait_s', 'group_by')),
    ('rules', ('keep_firing_for',)),
    ('rule_states', ('clear_streak',)),
    ('components', ('close_reason', 'lost_at', 'closed_at', 'status')),
)


def upgrade() -> None:
    op.create_table('detect_jobs',
    sa.Column('id', BigId, autoincrement=True, nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('payload', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_detect_jobs_run_id', 'detect_jobs', ['run_id'], unique=False)
    op.create_table('notification_groups',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('webhook_id', sa.Integer(), nullable=False),
    sa.Column('group_key', sa.String(length=300), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=True),
    sa.Column('project', sa.String(length=200), nullable=True),
    sa.Column('kind', sa.String(length=64), nullable=True),
    sa.Column('severity', sa.String(length=16), nullable=True),
    sa.Column('last_sent_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_firing', sa.JSON(), nullable=False),
    sa.Column('last_reason', sa.Text(), nullable=True),
    sa.Column('next_check_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['webhook_id'], ['webhooks.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('webhook_id', 'group_key', name='uq_notification_groups_key')
    )
    op.create_index('ix_notification_groups_due', 'notification_groups', ['next_check_at'], unique=False)
    op.create_table('silences',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=True),
    sa.Column('project', sa.String(length=200), nullable=True),
    sa.Column('kind', sa.String(length=64), nullable=True),
    sa.Column('starts_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ends_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_by', sa.String(length=200), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ended_by', sa.String(length=200), nullable=True),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_silences_ends_at', 'silences', ['ends_at'], unique=False)
    with op.batch_alter_table('components', schema=None) as batch_op:
        batch_op.add_column(sa.Column('status', sa.String(length=8), server_default='live', nullable=False))
        batch_op.add_column(sa.Column('closed_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('lost_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('close_reason', sa.Text(), nullable=True))
    with op.batch_alter_table('rule_states', schema=None) as batch_op:
        batch_op.add_column(sa.Column('clear_streak', sa.Integer(), server_default='0', nullable=False))
    with op.batch_alter_table('rules', schema=None) as batch_op:
        batch_op.add_column(sa.Column('keep_firing_for', sa.Integer(), server_default='0', nullable=False))
    op.create_index('ix_runs_control_state', 'runs', ['control_state'], unique=False)
    with op.batch_alter_table('webhooks', schema=None) as batch_op:
        batch_op.add_column(sa.Column('group_by', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('group_wait_s', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('group_interval_s', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('repeat_interval_s', sa.Float(), nullable=True))


def downgrade() -> None:
    # 0002 knows four run states: a finished run ends stopped, a crashed one stays running.
    op.execute("UPDATE runs SET control_state = 'stopped' WHERE control_state = 'finished'")
    op.execute("UPDATE runs SET control_state = 'running' WHERE control_state = 'crashed'")
    # Plain DROP COLUMN (PostgreSQL; SQLite >= 3.35), never a batch table copy: copying `runs`,
    # `rules` or `webhooks` with foreign keys on would cascade-delete the rows that point at them.
    for table, columns in DROPPED_COLUMNS:
        for column in columns:
            op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    op.drop_index('ix_runs_control_state', table_name='runs')
    op.drop_index('ix_silences_ends_at', table_name='silences')
    op.drop_table('silences')
    op.drop_index('ix_notification_groups_due', table_name='notification_groups')
    op.drop_table('notification_groups')
    op.drop_index('ix_detect_jobs_run_id', table_name='detect_jobs')
    op.drop_table('detect_jobs')
