"""per-sample audits: token identity, truncation, eos sampled past, image features

`sample_audit_samples` gains what the hooks now check per sample (trainer_hooks/audit.py): how many
ids the trainer trains on and where they leave the sampled ones, a cut the trainer made or a finish
reason lost, the first eos id sampled past, and both sides' image-feature summaries.
`sample_audits.failing` holds, per batch, the largest count of any cause (0: a clean batch), so
`GET .../audits?failing=true` sees every cause; existing rows get it from the two causes they had.
Columns only: the new causes' counts travel in `sample_audits.counts`, which already keeps every
count the hooks send.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03 18:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None

SAMPLE_COLUMNS = (
    ('n_trainer_ids', sa.Integer()),
    ('ids_mismatch', sa.Boolean()),
    ('ids_first_diff', sa.Integer()),
    ('eos_ignored_at', sa.Integer()),
    ('images_mismatch', sa.Boolean()),
    ('rollout_images', sa.JSON()),
    ('trainer_images', sa.JSON()),
)
SAMPLE_FLAGS = ('truncated', 'finish_lost')


def upgrade() -> None:
    for name, type_ in SAMPLE_COLUMNS:
        op.add_column('sample_audit_samples', sa.Column(name, type_, nullable=True))
    for name in SAMPLE_FLAGS:
        op.add_column('sample_audit_samples', sa.Column(name, sa.Boolean(), server_default=sa.false(), nullable=False))
    op.add_column('sample_audits', sa.Column('failing', sa.Integer(), server_default='0', nullable=False))
    audits = sa.table('sample_audits', sa.column('failing', sa.Integer()), sa.column('length_mismatches', sa.Integer()),
                      sa.column('rerender_mismatches', sa.Integer()))
    op.execute(audits.update().values(failing=sa.case(
        (audits.c.length_mismatches > audits.c.rerender_mismatches, audits.c.length_mismatches),
        else_=audits.c.rerender_mismatches)))


def downgrade() -> None:
    drops = [('sample_audits', 'failing')] + [('sample_audit_samples', n) for n in (*(c for c, _ in SAMPLE_COLUMNS),
                                                                                    *SAMPLE_FLAGS)]
    for table, column in drops:
        if op.get_bind().dialect.name == 'sqlite':  # its native DROP COLUMN, as 0005 and 0012: no table copy
            op.execute(f'ALTER TABLE {table} DROP COLUMN {column}')
        else:
            op.drop_column(table, column)
