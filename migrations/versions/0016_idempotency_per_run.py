"""idempotency per run: (run_id, client_id, seq), with a content digest

Metric batches (`ingest_batches`) and per-sample audits (`sample_audits`) were idempotent by
(client_id, seq) over the whole server: a batch posted to one run with a client id another run's
process used made that process's real batch a "duplicate", stored nowhere. The key is now
(run_id, client_id, seq), and each row keeps a digest of its content so a replay with other
content is refused (409) instead of dropped. Existing rows keep their run_id (every row has one)
and get no digest: a replay of them is taken as the same content.

SQLite changes a unique constraint by copying the table; with foreign keys on, dropping the old
`sample_audits` would cascade to `sample_audit_samples`, so those rows are kept aside and put back.

Revision ID: 0016
Revises: 0015 (migration 0013 is not used: this change was written as 0013 and landed after 0015)
Create Date: 2026-12-04 09:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None

TABLES = (('ingest_batches', 'uq_ingest_batches_client_seq', 'uq_ingest_batches_run_client_seq'),
          ('sample_audits', 'uq_sample_audits_client_seq', 'uq_sample_audits_run_client_seq'))


def upgrade() -> None:
    for table, old, new in TABLES:
        with _children_kept(table), op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column('digest', sa.String(32), nullable=True))
            batch.drop_constraint(old, type_='unique')
            batch.create_unique_constraint(new, ['run_id', 'client_id', 'seq'])


def downgrade() -> None:
    # Fails (unique violation) where two runs hold batches of one (client_id, seq): the old key cannot hold both.
    for table, old, new in TABLES:
        with _children_kept(table), op.batch_alter_table(table) as batch:
            batch.drop_constraint(new, type_='unique')
            batch.create_unique_constraint(old, ['client_id', 'seq'])
            batch.drop_column('digest')


class _children_kept:
    """SQLite, `sample_audits`: its samples copied aside before the table copy, back after it."""

    def __init__(self, table: str):
        self.active = table == 'sample_audits' and op.get_bind().dialect.name == 'sqlite'

    def __enter__(self) -> None:
        if self.active:
            op.execute('CREATE TEMP TABLE _kept_samples AS SELECT * FROM sample_audit_samples')

    def __exit__(self, exc_type, *_) -> None:
        if self.active and exc_type is None:
            op.execute('INSERT INTO sample_audit_samples SELECT * FROM _kept_samples '
                       'WHERE id NOT IN (SELECT id FROM sample_audit_samples)')
            op.execute('DROP TABLE _kept_samples')
