"""worker progress: policy versions, throughput, and which process sent each metric batch

`components.policy_version` is the weights version a process last reported on a heartbeat (the
trainer: the one it published; a rollout worker: the one it serves), `samples_per_s` and
`points_per_s` its throughput over its last heartbeat interval. `ingest_batches.component_id`
names the process that posted a batch, so a series' raw chunks split per worker (the workers
view's per-worker lines) without writing any point twice. No foreign key and no index: the
column is only read through the batch's primary key. All nullable: existing rows need nothing.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 11:40:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('components', sa.Column('policy_version', sa.BigInteger(), nullable=True))
    op.add_column('components', sa.Column('samples_per_s', sa.Float(), nullable=True))
    op.add_column('components', sa.Column('points_per_s', sa.Float(), nullable=True))
    op.add_column('ingest_batches', sa.Column('component_id', sa.Integer(), nullable=True))


def downgrade() -> None:
    # SQLite's native DROP COLUMN, as 0005: a batch copy of `components` would cascade-delete.
    for table, column in (('ingest_batches', 'component_id'), ('components', 'points_per_s'),
                          ('components', 'samples_per_s'), ('components', 'policy_version')):
        if op.get_bind().dialect.name == 'sqlite':
            op.execute(f'ALTER TABLE {table} DROP COLUMN {column}')
        else:
            op.drop_column(table, column)
