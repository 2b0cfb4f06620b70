"""API tokens: the SQL. Scopes, hashing and the per-process cache are backend/auth.py, which owns
the transaction of each call (the CLI, the token cache, open mode and live streams reach tokens
through it)."""
from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from paritywatch.backend.models import ApiToken


def add_token(s: Session, **fields) -> ApiToken:
    row = ApiToken(**fields)
    s.add(row)
    return row


def add_token_once(s: Session, **fields) -> bool:
    """Store a token unless one with its hash exists; True when it was stored now."""
    if s.scalar(select(ApiToken.id).where(ApiToken.token_hash == fields["token_hash"])) is not None:
        return False
    s.add(ApiToken(**fields))
    return True


def token_by_hash(s: Session, digest: str) -> ApiToken | None:
    return s.scalar(select(ApiToken).where(ApiToken.token_hash == digest))


def list_tokens(s: Session) -> list[ApiToken]:
    return list(s.scalars(select(ApiToken).order_by(ApiToken.id)))


def revoke(s: Session, token_id: int) -> tuple[bool, str | None]:
    """(whether the token exists, its hash)."""
    digest = s.scalar(select(ApiToken.token_hash).where(ApiToken.id == token_id))
    res = s.execute(update(ApiToken).where(ApiToken.id == token_id).values(revoked=True))
    return res.rowcount > 0, digest


def has_active_tokens(s: Session) -> bool:
    return s.scalar(select(ApiToken.id).where(ApiToken.revoked.is_(False)).limit(1)) is not None


def has_any_tokens(s: Session) -> bool:
    """A token was ever created (revoked ones count: revoking the last token must not reopen)."""
    return s.scalar(select(ApiToken.id).limit(1)) is not None


def active_among(s: Session, digests: set[str]) -> set[str]:
    """Which of these token hashes are still valid (one query for every open stream)."""
    q = select(ApiToken.token_hash).where(ApiToken.token_hash.in_(digests), ApiToken.revoked.is_(False))
    return set(s.scalars(q))
