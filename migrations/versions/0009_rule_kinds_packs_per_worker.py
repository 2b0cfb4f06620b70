"""trend rules, framework packs, per-worker rules

rules: `kind` (threshold | trend), `per_worker`, `min_change`, `pack` (the framework pack that
added the rule); `rule_series_states` keeps a per-worker rule's streaks per series. Columns are
added with plain ALTER TABLE (constant defaults): a SQLite batch copy of `rules` would cascade-delete
its `rule_states`.

Revision ID: 0009
Revises: 0008 (chained after main's 0010 worker_progress at merge; the lead may re-number)
Create Date: 2026-12-01 12:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

COLUMNS = ('kind', 'per_worker', 'min_change', 'pack')


def upgrade() -> None:
    op.add_column('rules', sa.Column('kind', sa.String(length=16), server_default='threshold', nullable=False))
    op.add_column('rules', sa.Column('per_worker', sa.Boolean(), server_default=sa.false(), nullable=False))
    op.add_column('rules', sa.Column('min_change', sa.Float(), server_default='0', nullable=False))
    op.add_column('rules', sa.Column('pack', sa.String(length=32), nullable=True))
    op.create_index('ix_rules_pack', 'rules', ['pack'], unique=False)
    op.create_table('rule_series_states',
    sa.Column('rule_id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('series_key', sa.String(length=200), nullable=False),
    sa.Column('streak', sa.Integer(), nullable=False),
    sa.Column('clear_streak', sa.Integer(), nullable=False),
    sa.Column('last_value', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['rule_id'], ['rules.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('rule_id', 'run_id', 'series_key')
    )


def downgrade() -> None:
    op.drop_table('rule_series_states')
    op.drop_index('ix_rules_pack', table_name='rules')
    for column in reversed(COLUMNS):
        if op.get_bind().dialect.name == 'sqlite':
            op.execute(f'ALTER TABLE rules DROP COLUMN {column}')
        else:
            op.drop_column('rules', column)
