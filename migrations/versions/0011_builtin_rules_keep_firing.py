"""built-in align rules resolve after 10 clean batches in a row

Every rollout worker posts the same `align/*` keys, so a bad worker's batches arrive between the
healthy workers' clean ones, and a built-in rule resolved its alert on the first clean batch (then
fired it again on the next bad one). New runs get `keep_firing_for = 10`
(backend/detect/rules.py: BUILTIN_KEEP_FIRING_FOR); this gives existing runs' built-in rules the
same, unless someone changed theirs. Data only; migrations never import app code, so the keys are
listed here.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 15:20:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None

KEYS = ('align/prompt_rerender_mismatch_frac', 'align/decode_mismatch_frac', 'align/out_of_vocab_frac',
        'align/eos_disagreement_frac', 'align/kl_k3', 'align/prob_abs_diff_mean')
KEEP_FIRING_FOR = 10


def _set(new: int, old: int) -> None:
    rules = sa.table('rules', sa.column('builtin', sa.Boolean()), sa.column('key', sa.String()),
                     sa.column('keep_firing_for', sa.Integer()))
    op.execute(rules.update()
               .where(rules.c.builtin == sa.true(), rules.c.key.in_(KEYS),
                      sa.func.coalesce(rules.c.keep_firing_for, 0) == old)
               .values(keep_firing_for=new))


def upgrade() -> None:
    _set(KEEP_FIRING_FOR, 0)


def downgrade() -> None:
    _set(0, KEEP_FIRING_FOR)
