"""per-sample audits of rollout batches

`sample_audits`: one row per audited batch (its counts), idempotent by (client_id, seq);
`sample_audit_samples`: the batch's worst samples with the token windows around each first
mismatch. Both are deleted with their run (the janitor's steps) and by raw-data retention.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 12:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    op.create_table('sample_audits',
    sa.Column('id', BigId, autoincrement=True, nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('component_id', sa.Integer(), nullable=True),
    sa.Column('client_id', sa.String(length=64), nullable=False),
    sa.Column('seq', sa.BigInteger(), nullable=False),
    sa.Column('step', sa.BigInteger(), nullable=True),
    sa.Column('received_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('samples', sa.Integer(), nullable=False),
    sa.Column('length_mismatches', sa.Integer(), nullable=False),
    sa.Column('rerender_mismatches', sa.Integer(), nullable=False),
    sa.Column('truncated', sa.Integer(), nullable=False),
    sa.Column('counts', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('client_id', 'seq', name='uq_sample_audits_client_seq')
    )
    op.create_index('ix_sample_audits_run_id_id', 'sample_audits', ['run_id', 'id'], unique=False)
    op.create_index('ix_sample_audits_received_at', 'sample_audits', ['received_at'], unique=False)
    op.create_table('sample_audit_samples',
    sa.Column('id', BigId, autoincrement=True, nullable=False),
    sa.Column('audit_id', sa.BigInteger(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('sample_index', sa.Integer(), nullable=False),
    sa.Column('finish', sa.String(length=16), nullable=False),
    sa.Column('finish_reason', sa.String(length=32), nullable=True),
    sa.Column('n_ids', sa.Integer(), nullable=False),
    sa.Column('n_rollout_logprobs', sa.Integer(), nullable=True),
    sa.Column('n_trainer_logprobs', sa.Integer(), nullable=True),
    sa.Column('length_mismatch', sa.Boolean(), nullable=False),
    sa.Column('prompt_len', sa.Integer(), nullable=False),
    sa.Column('rendered_len', sa.Integer(), nullable=True),
    sa.Column('rerender_first_diff', sa.Integer(), nullable=True),
    sa.Column('windows', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['audit_id'], ['sample_audits.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_sample_audit_samples_audit_id', 'sample_audit_samples', ['audit_id'], unique=False)
    op.create_index('ix_sample_audit_samples_run_id_id', 'sample_audit_samples', ['run_id', 'id'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_sample_audit_samples_run_id_id', table_name='sample_audit_samples')
    op.drop_index('ix_sample_audit_samples_audit_id', table_name='sample_audit_samples')
    op.drop_table('sample_audit_samples')
    op.drop_index('ix_sample_audits_received_at', table_name='sample_audits')
    op.drop_index('ix_sample_audits_run_id_id', table_name='sample_audits')
    op.drop_table('sample_audits')
