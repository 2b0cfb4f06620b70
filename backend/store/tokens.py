"""API tokens: the SQL. Scopes, hashing and the per-process cache are backend/auth.py."""
from __future__ import annotations

from sqlalchemy import select, update

from paritywatch.backend.db import Database
from paritywatch.backend.models import ApiToken


def add_token(db: Database, **fields) -> ApiToken:
    with db.write() as s:
        row = ApiToken(**fields)
        s.add(row)
    return row


def add_token_once(db: Database, **fields) -> bool:
    """Store a token unless one with its hash exists; True when it was stored now."""
    with db.write() as s:
        if s.scalar(select(ApiToken.id).where(ApiToken.token_hash == fields["token_hash"])) is not None:
            return False
        s.add(ApiToken(**fields))
        return True


def token_by_hash(db: Database, digest: str) -> ApiToken | None:
    with db.read() as s:
        return s.scalar(select(ApiToken).where(ApiToken.token_hash == digest))


def list_tokens(db: Database) -> list[ApiToken]:
    with db.read() as s:
        return list(s.scalars(select(ApiToken).order_by(ApiToken.id)))


def revoke(db: Database, token_id: int) -> tuple[bool, str | None]:
    """(whether the token exists, its hash)."""
    with db.write() as s:
        digest = s.scalar(select(ApiToken.token_hash).where(ApiToken.id == token_id))
        res = s.execute(update(ApiToken).where(ApiToken.id == token_id).values(revoked=True))
        return res.rowcount > 0, digest


def has_active_tokens(db: Database) -> bool:
    with db.read() as s:
        return s.scalar(select(ApiToken.id).where(ApiToken.revoked.is_(False)).limit(1)) is not None


def has_any_tokens(db: Database) -> bool:
    """A token was ever created (revoked ones count: revoking the last token must not reopen)."""
    with db.read() as s:
        return s.scalar(select(ApiToken.id).limit(1)) is not None


def active_among(db: Database, digests: set[str]) -> set[str]:
    """Which of these token hashes are still valid (one query for every open stream)."""
    if not digests:
        return set()
    with db.read() as s:
        q = select(ApiToken.token_hash).where(ApiToken.token_hash.in_(digests), ApiToken.revoked.is_(False))
        return set(s.scalars(q))
