"""Scoped API tokens: secrets are shown once at creation and stored as sha256 only.

An ingest token may be bound to one project: it then creates and feeds only that project's runs.
Read and admin tokens are global.
"""
from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass

from paritywatch.backend.db import Database
from paritywatch.backend.models import ApiToken
from paritywatch.backend.store import tokens as token_store

SCOPES = ("ingest", "read", "admin")
TOKEN_PREFIX = "pw_"
# admin can do everything; read and ingest are disjoint.
IMPLIED = {"admin": {"admin", "read", "ingest"}, "read": {"read"}, "ingest": {"ingest"}}


@dataclass(frozen=True)
class Principal:
    name: str
    scopes: frozenset[str]
    # The one project this caller may write to; None = every project.
    project: str | None = None
    # sha256 of the token (None in open mode): lets long-lived streams re-check it is not revoked.
    token_hash: str | None = None

    def has(self, scope: str) -> bool:
        return scope in self.scopes

    def may_write(self, project: str) -> bool:
        return self.project is None or self.project == project


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


def create_token(db: Database, name: str, scopes: list[str], project: str | None = None) -> tuple[ApiToken, str]:
    expand_scopes(scopes)
    if not scopes:
        raise ValueError("a token needs at least one scope")
    if project is not None and set(scopes) != {"ingest"}:
        raise ValueError("only ingest tokens are bound to a project (read and admin tokens are global)")
    if project is not None and not project.strip():
        raise ValueError("the project name is empty")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with db.write() as s:
        row = token_store.add_token(s, name=name, token_hash=hash_token(secret), prefix=secret[:10],
                                    scopes=",".join(sorted(set(scopes))), project=project)
    return row, secret


def ensure_bootstrap_token(db: Database, secret: str) -> bool:
    """Store an operator-chosen admin token (from PARITYWATCH_BOOTSTRAP_TOKEN) once, hashed.

    Lets a fresh container on a public bind start with a known admin token. Returns True when
    it was created now."""
    if len(secret) < 24:
        raise ValueError("PARITYWATCH_BOOTSTRAP_TOKEN must be at least 24 characters")
    with db.write() as s:
        return token_store.add_token_once(s, name="bootstrap", token_hash=hash_token(secret), prefix=secret[:6],
                                          scopes="admin")


def revoke_token(db: Database, token_id: int, cache: "TokenCache | None" = None) -> bool:
    """Revoke; a cache in this process forgets the token at once (other processes within their
    cache TTL, and their open event streams within `stream_auth_check_s`)."""
    with db.write() as s:
        ok, digest = token_store.revoke(s, token_id)
    if ok and cache is not None and digest:
        cache.invalidate(digest)
    return ok


def list_tokens(db: Database) -> list[ApiToken]:
    with db.read() as s:
        return token_store.list_tokens(s)


def has_active_tokens(db: Database) -> bool:
    with db.read() as s:
        return token_store.has_active_tokens(s)


def active_among(db: Database, digests: set[str]) -> set[str]:
    """Which of these token hashes are still valid (one query for every open stream)."""
    if not digests:
        return set()
    with db.read() as s:
        return token_store.active_among(s, digests)


class TokenCache:
    """Token lookups on every request would cost a query each: cache hash -> principal briefly.
    A revocation in another process is seen within `ttl_s`."""

    def __init__(self, db: Database, ttl_s: float = 2.0):
        self.db = db
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[float, Principal | None]] = {}

    def cached(self, secret: str, now: float) -> tuple[bool, Principal | None]:
        """(hit, principal) without touching the database: lets async callers skip a thread hop."""
        hit = self._entries.get(hash_token(secret))
        if hit and now - hit[0] < self.ttl_s:
            return True, hit[1]
        return False, None

    def lookup(self, secret: str, now: float | None = None) -> Principal | None:
        now = time.monotonic() if now is None else now
        found, principal = self.cached(secret, now)
        if found:
            return principal
        digest = hash_token(secret)
        with self.db.read() as s:
            row = token_store.token_by_hash(s, digest)
        principal = None
        if row is not None and not row.revoked:
            principal = Principal(f"token:{row.name}", expand_scopes(row.scopes.split(",")), row.project, digest)
        with self._lock:
            if len(self._entries) > 10_000:
                self._entries.clear()
            self._entries[digest] = (now, principal)
        return principal

    def invalidate(self, digest: str | None = None) -> None:
        with self._lock:
            if digest is None:
                self._entries.clear()
            else:
                self._entries.pop(digest, None)


class OpenMode:
    """Open mode: the operator asked for it (`settings.open_mode`; `paritywatch serve` on a loopback
    bind does) and no API token was ever created. Creating a token closes it within `ttl_s`;
    revoking tokens never reopens it. Which requests it admits (local callers only) is the
    request guard's job (backend/middleware.py)."""

    def __init__(self, db: Database, enabled: bool, ttl_s: float = 2.0):
        self.db, self.enabled, self.ttl_s = db, enabled, ttl_s
        self._checked_at = -1e9
        self._open = False
        self._refresh = threading.Lock()  # one query re-checks; requests that found it stale wait for it

    def cached(self) -> bool | None:
        """The answer without a query, or None when it must be re-checked."""
        if not self.enabled:
            return False
        if time.monotonic() - self._checked_at > self.ttl_s:
            return None
        return self._open

    def is_open(self) -> bool:
        with self._refresh:
            known = self.cached()
            if known is not None:
                return known
            with self.db.read() as s:
                self._open = not token_store.has_any_tokens(s)
            self._checked_at = time.monotonic()
            return self._open
