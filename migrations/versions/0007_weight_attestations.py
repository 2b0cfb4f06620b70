"""weight-sync attestations

`weight_attestations`: the per-tensor digests each process of a run attested for a weights
version (docs/design.md, "Weight-sync attestation"). A new table only: nothing existing changes.

Revision ID: 0007
Revises: 0005 (written on 0005; chained after main's 0010 in the merge so the history keeps one head)
Create Date: 2026-12-01 12:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('weight_attestations',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('component_id', sa.Integer(), nullable=False),
    sa.Column('version', sa.BigInteger(), nullable=False),
    sa.Column('algo', sa.String(length=16), nullable=False),
    sa.Column('mode', sa.String(length=8), nullable=False),
    sa.Column('block_bytes', sa.BigInteger(), nullable=False),
    sa.Column('sample', sa.JSON(), nullable=True),
    sa.Column('digest', sa.String(length=64), nullable=False),
    sa.Column('tensor_count', sa.Integer(), nullable=False),
    sa.Column('bytes_total', sa.BigInteger(), nullable=False),
    sa.Column('bytes_hashed', sa.BigInteger(), nullable=False),
    sa.Column('seconds', sa.Float(), nullable=True),
    sa.Column('backwards_from', sa.BigInteger(), nullable=True),
    sa.Column('tensors', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['component_id'], ['components.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('component_id', 'version', name='uq_weight_attestations_component_version')
    )
    op.create_index('ix_weight_attestations_component_id', 'weight_attestations', ['component_id'], unique=False)
    op.create_index('ix_weight_attestations_run_version', 'weight_attestations', ['run_id', 'version'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_weight_attestations_run_version', table_name='weight_attestations')
    op.drop_index('ix_weight_attestations_component_id', table_name='weight_attestations')
    op.drop_table('weight_attestations')
