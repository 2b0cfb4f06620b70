"""Scoped API tokens: secrets are shown once at creation and stored as sha256 only."""
from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from sqlalchemy import select, update

from backend.db import Database
from backend.models import ApiToken, utcnow

SCOPES = ("ingest", "read", "admin")
TOKEN_PREFIX = "pw_"
# admin can do everything; read and ingest are disjoint.
IMPLIED = {"admin": {"admin", "read", "ingest"}, "read": {"read"}, "ingest": {"ingest"}}


@dataclass(frozen=True)
class Principal:
    name: str
    scopes: frozenset[str]

    def has(self, scope: str) -> bool:
        return scope in self.scopes


OPEN_PRINCIPAL = Principal("open-loopback", frozenset(SCOPES))


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def expand_scopes(scopes: list[str] | tuple[str, ...]) -> frozenset[str]:
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown:
        raise ValueError(f"unknown scope(s) {unknown}; choose from {list(SCOPES)}")
    out: set[str] = set()
    for s in scopes:
        out |= IMPLIED[s]
    return frozenset(out)


def create_token(db: Database, name: str, scopes: list[str]) -> tuple[ApiToken, str]:
    expand_scopes(scopes)
    if not scopes:
        raise ValueError("a token needs at least one scope")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with db.write() as s:
        row = ApiToken(
            name=name,
            token_hash=hash_token(secret),
            prefix=secret[:10],
            scopes=",".join(sorted(set(scopes))),
        )
        s.add(row)
    return row, secret


def ensure_bootstrap_token(db: Database, secret: str) -> bool:
    """Store an operator-chosen admin token (from PARITYWATCH_BOOTSTRAP_TOKEN) once, hashed.

    Lets a fresh container on a public bind start with a known admin token. Returns True when
    it was created now."""
    if len(secret) < 24:
        raise ValueError("PARITYWATCH_BOOTSTRAP_TOKEN must be at least 24 characters")
    digest = hash_token(secret)
    with db.write() as s:
        if s.scalar(select(ApiToken.id).where(ApiToken.token_hash == digest)) is not None:
            return False
        s.add(ApiToken(name="bootstrap", token_hash=digest, prefix=secret[:6], scopes="admin"))
        return True


def list_tokens(db: Database) -> list[ApiToken]:
    with db.read() as s:
        return list(s.scalars(select(ApiToken).order_by(ApiToken.id)))


def revoke_token(db: Database, token_id: int) -> bool:
    with db.write() as s:
        res = s.execute(update(ApiToken).where(ApiToken.id == token_id).values(revoked=True))
        return res.rowcount > 0


def has_active_tokens(db: Database) -> bool:
    with db.read() as s:
        return s.scalar(select(ApiToken.id).where(ApiToken.revoked.is_(False)).limit(1)) is not None


class TokenCache:
    """Token lookups on every request would cost a query each: cache hash -> principal briefly."""

    def __init__(self, db: Database, ttl_s: float = 5.0):
        self.db = db
        self.ttl_s = ttl_s
        self._entries: dict[str, tuple[float, Principal | None]] = {}

    def lookup(self, secret: str, now: float) -> Principal | None:
        digest = hash_token(secret)
        hit = self._entries.get(digest)
        if hit and now - hit[0] < self.ttl_s:
            return hit[1]
        with self.db.read() as s:
            row = s.scalar(select(ApiToken).where(ApiToken.token_hash == digest))
        principal = None
        if row is not None and not row.revoked:
            principal = Principal(f"token:{row.name}", expand_scopes(row.scopes.split(",")))
        if len(self._entries) > 10_000:
            self._entries.clear()
        self._entries[digest] = (now, principal)
        return principal

    def invalidate(self) -> None:
        self._entries.clear()
