"""ingest tokens bound to a project; webhook secrets stored encrypted

`api_tokens.project` (nullable: existing tokens stay global). `webhooks.secret` becomes TEXT on
PostgreSQL (an encrypted secret is longer than 128 characters; SQLite does not enforce lengths).
Existing plaintext secrets are encrypted by the server at its next start (backend/webhooks/
secrets.py: it needs PARITYWATCH_SECRET_KEYS, which a migration must not depend on). A downgrade
decrypts them again with the same keys, since earlier revisions sign with the stored value.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 10:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(sa.Column("project", sa.String(length=200), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column("webhooks", "secret", type_=sa.Text(), existing_nullable=False)


def downgrade() -> None:
    _decrypt_secrets()
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column("webhooks", "secret", type_=sa.String(length=128), existing_nullable=False)
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("project")


def _decrypt_secrets() -> None:
    conn = op.get_bind()
    rows = conn.execute(sa.text("SELECT id, secret FROM webhooks WHERE secret LIKE 'enc:%'")).all()
    if not rows:
        return
    from paritywatch.backend.settings import Settings
    from paritywatch.backend.webhooks.secrets import SecretBox

    box = SecretBox(Settings().secret_keys)  # raises SecretUnreadable without the keys: nothing changed
    for hook_id, secret in rows:
        conn.execute(sa.text("UPDATE webhooks SET secret = :s WHERE id = :i"), {"s": box.open(secret), "i": hook_id})
