"""Content-addressed fingerprints and their attachment to components."""
from __future__ import annotations

import re

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from backend.db import Database
from backend.errors import FingerprintUnknown, Invalid, NotFound
from backend.models import Component, Fingerprint
from backend.store.runs import get_component

DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")


def validate_fingerprint(body: dict) -> tuple[str, int]:
    digest = body.get("digest")
    if not isinstance(digest, str) or not DIGEST_RE.match(digest):
        raise Invalid("fingerprint needs a 'digest': 64 lowercase hex characters")
    version = body.get("fingerprint_version")
    if version is None and set(body) == {"digest"}:
        return digest, 0  # digest-only reference
    if not isinstance(version, int) or isinstance(version, bool):
        raise Invalid("fingerprint needs an integer 'fingerprint_version'")
    if not isinstance(body.get("components"), dict):
        raise Invalid("fingerprint needs a 'components' object")
    return digest, version


def attach_fingerprint(db: Database, run_id: int, component_id: int, body: dict) -> tuple[str, bool]:
    """Store the body once per digest and point the component at it.

    A digest-only body attaches a fingerprint the server already has, so 256 workers with the
    same processor upload it once. The server trusts the client's digest: it is an identity
    for deduplication, not a security boundary (any ingest token can post any fingerprint).
    """
    digest, version = validate_fingerprint(body)
    stored = False
    for _ in range(2):
        try:
            with db.write() as s:
                comp = get_component(s, run_id, component_id)
                known = s.get(Fingerprint, digest) is not None
                if not known:
                    if version == 0:
                        raise FingerprintUnknown(
                            f"fingerprint {digest[:12]}… is unknown: send the full object"
                        )
                    s.add(Fingerprint(digest=digest, version=version, body=body))
                    s.flush()  # before the component points at it (no ORM relationship orders this)
                    stored = True
                comp.fingerprint_digest = digest
            return digest, stored
        except IntegrityError:  # another worker stored the same digest first
            stored = False
            body = {"digest": digest}
            version = 0
    raise RuntimeError("fingerprint store raced twice")  # pragma: no cover


def get_fingerprint(db: Database, digest: str) -> dict:
    with db.read() as s:
        fp = s.get(Fingerprint, digest)
        if fp is None:
            raise NotFound(f"fingerprint {digest} does not exist")
        return fp.body


def fingerprints_of_run(db: Database, run_id: int) -> list[tuple[Component, dict | None]]:
    with db.read() as s:
        rows = s.execute(
            select(Component, Fingerprint.body)
            .outerjoin(Fingerprint, Fingerprint.digest == Component.fingerprint_digest)
            .where(Component.run_id == run_id)
            .order_by(Component.id)
        ).all()
        return [(comp, body) for comp, body in rows]
