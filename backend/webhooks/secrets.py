"""Webhook signing secrets at rest: encrypted with Fernet keys from the environment.

`PARITYWATCH_SECRET_KEYS` holds one or more Fernet keys, comma-separated, newest first: the first
encrypts, every one decrypts (cryptography's MultiFernet). Rotation: put a new key first, restart
every replica, run `paritywatch secret-key rotate` (re-encrypts every stored secret with the new
key), then drop the old key. A stored value is "enc:" + a Fernet token; a value without that
prefix is a secret stored before encryption existed, still read, and encrypted at the next start
or rotation.
"""
from __future__ import annotations

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from paritywatch.backend.db import Database
from paritywatch.backend.errors import ParitywatchError
from paritywatch.backend.store.webhooks import rewrite_secrets
from trainer_hooks import contract

PREFIX = "enc:"


class SecretKeyMissing(ParitywatchError):
    status = 503
    code = contract.ERROR_SECRET_KEY_MISSING


class SecretUnreadable(ValueError):
    """A stored secret that none of the configured keys decrypts."""


def generate_key() -> str:
    return Fernet.generate_key().decode()


class SecretBox:
    def __init__(self, keys: str):
        parsed = [k.strip() for k in keys.split(",") if k.strip()]
        try:
            self._fernet = MultiFernet([Fernet(k) for k in parsed]) if parsed else None
        except ValueError as exc:
            raise ValueError("PARITYWATCH_SECRET_KEYS must be Fernet keys (paritywatch secret-key generate)") from exc

    @property
    def configured(self) -> bool:
        return self._fernet is not None

    def seal(self, secret: str) -> str:
        if self._fernet is None:
            raise SecretKeyMissing(
                "webhook secrets are stored encrypted and no key is configured: set PARITYWATCH_SECRET_KEYS "
                "(create one with `paritywatch secret-key generate`) and restart")
        return PREFIX + self._fernet.encrypt(secret.encode()).decode()

    def open(self, stored: str) -> str:
        if not stored.startswith(PREFIX):
            return stored  # written before encryption at rest: re-sealed by reseal_all
        if self._fernet is None:
            raise SecretUnreadable("the secret is encrypted and PARITYWATCH_SECRET_KEYS is not set")
        try:
            return self._fernet.decrypt(stored[len(PREFIX):].encode()).decode()
        except InvalidToken as exc:
            raise SecretUnreadable("no key in PARITYWATCH_SECRET_KEYS decrypts this webhook's secret") from exc

    def reseal(self, stored: str) -> str:
        """The same secret under the newest key (plaintext legacy values get encrypted)."""
        if stored.startswith(PREFIX):
            return PREFIX + self._fernet.rotate(stored[len(PREFIX):].encode()).decode()
        return self.seal(stored)


def reseal_all(db: Database, box: SecretBox, legacy_only: bool = False) -> int:
    """Encrypt every webhook secret with the newest key; returns how many rows changed."""
    if not box.configured:
        return 0
    def resealed(secret: str) -> str | None:
        return None if legacy_only and secret.startswith(PREFIX) else box.reseal(secret)

    with db.write() as s:  # one transaction: every secret under the same key, or none
        return rewrite_secrets(s, resealed)
