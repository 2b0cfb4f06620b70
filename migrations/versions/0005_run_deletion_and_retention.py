"""run deletion and raw-point retention

`runs.deleted_at` hides a run being deleted while its rows go in batches; `run_deletions` is the
audit of deletions (no foreign key: it outlives the run); `metric_keys.raw_floor` marks the steps
whose raw points retention dropped (reads there use roll-ups alone). Columns are nullable: existing
rows need nothing. SQLite drops the columns with its native DROP COLUMN: a batch table copy would
drop `runs` and, with foreign keys on, cascade-delete every run's rows.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 09:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('runs', sa.Column('deleted_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('metric_keys', sa.Column('raw_floor', sa.BigInteger(), nullable=True))
    op.create_table('run_deletions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('project', sa.String(length=200), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('actor', sa.String(length=200), nullable=True),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('points', sa.BigInteger(), nullable=False),
    sa.Column('requested_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_run_deletions_run_id', 'run_deletions', ['run_id'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_run_deletions_run_id', table_name='run_deletions')
    op.drop_table('run_deletions')
    for table, column in (('metric_keys', 'raw_floor'), ('runs', 'deleted_at')):
        if op.get_bind().dialect.name == 'sqlite':
            op.execute(f'ALTER TABLE {table} DROP COLUMN {column}')
        else:
            op.drop_column(table, column)
