"""Content-addressed fingerprints and their attachment to components."""
from __future__ import annotations

import re
from collections import OrderedDict
from threading import Lock

from sqlalchemy import select
from sqlalchemy.orm import Session

from paritywatch.backend.errors import FingerprintUnknown, Invalid, NotFound
from paritywatch.backend.models import Component, Fingerprint
from paritywatch.backend.store import jobs
from paritywatch.backend.store.rows import raced
from paritywatch.backend.store.runs import get_component
from trainer_hooks import contract
from trainer_hooks.fingerprint.core import assemble

DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")


class DigestMismatch(Invalid):
    code = contract.ERROR_FINGERPRINT_DIGEST_MISMATCH


def validate_fingerprint(body: dict) -> tuple[str, int]:
    digest = body.get("digest")
    if not isinstance(digest, str) or not DIGEST_RE.match(digest):
        raise Invalid("fingerprint needs a 'digest': 64 lowercase hex characters")
    version = body.get("fingerprint_version")
    if version is None and set(body) == {"digest"}:
        return digest, 0  # digest-only reference
    if not isinstance(version, int) or isinstance(version, bool):
        raise Invalid("fingerprint needs an integer 'fingerprint_version'")
    components = body.get("components")
    if not isinstance(components, dict):
        raise Invalid("fingerprint needs a 'components' object")
    _check_digests(digest, components)
    return digest, version


def _check_digests(digest: str, components: dict) -> None:
    """The digests must be the ones the hooks' canonical hashing gives for these values: the
    digest is the identity later comparisons trust (a planted body under another body's digest
    would make a real drift read `same`)."""
    if not all(isinstance(c, dict) and "value" in c and isinstance(c.get("digest"), str) for c in components.values()):
        raise Invalid("every fingerprint component needs a 'digest' and a 'value'")
    recomputed = assemble("", {name: c["value"] for name, c in components.items()}, {})
    wrong = sorted(name for name, c in components.items() if recomputed["components"][name]["digest"] != c["digest"])
    if wrong:
        raise DigestMismatch(f"fingerprint component digest(s) do not match their values: {', '.join(wrong[:5])}")
    if recomputed["digest"] != digest:
        raise DigestMismatch("fingerprint 'digest' does not match its components")


def attach_fingerprint(s: Session, run_id: int, component_id: int, body: dict) -> tuple[str, bool]:
    """Store the body once per digest and point the component at it.

    A digest-only body attaches a fingerprint the server already has, so 256 workers with the
    same processor upload it once. A full body is stored only if it hashes to its digest
    (checked before the first statement: the hashing never holds the writer).
    """
    digest, version = validate_fingerprint(body)

    def attempt(n: int) -> tuple[str, bool]:  # n = 1: another worker stored the same digest first
        stored = False
        comp = get_component(s, run_id, component_id)
        if s.get(Fingerprint, digest) is None:
            if version == 0 or n > 0:
                raise FingerprintUnknown(f"fingerprint {digest[:12]}… is unknown: send the full object")
            s.add(Fingerprint(digest=digest, version=version, body=body))
            s.flush()  # before the component points at it (no ORM relationship orders this)
            stored = True
        comp.fingerprint_digest = digest
        jobs.add(s, run_id, "fingerprint")  # evaluated exactly once (backend/store/jobs.py)
        s.flush()
        return digest, stored
    return raced(s, attempt, "fingerprint store")


def get_fingerprint(s: Session, digest: str) -> dict:
    fp = s.get(Fingerprint, digest)
    if fp is None:
        raise NotFound(f"fingerprint {digest} does not exist")
    return fp.body


def fingerprint_rows(s: Session, run_id: int, light: bool = False) -> list[tuple[Component, dict | None]]:
    """Every component of a run with its fingerprint body. Bodies are content-addressed and
    immutable: each distinct one is read (and parsed) once, not once per component; 256 workers
    sharing three processors cost three bodies. `light`: plain rows (id, side, worker_id,
    fingerprint_digest) instead of ORM objects, for detection, which reads nothing else."""
    if light:
        q = (select(Component.id, Component.side, Component.worker_id, Component.fingerprint_digest)
             .where(Component.run_id == run_id).order_by(Component.id))
        comps = list(s.execute(q))
    else:
        comps = list(s.scalars(select(Component).where(Component.run_id == run_id).order_by(Component.id)))
    bodies = _bodies(s, {c.fingerprint_digest for c in comps if c.fingerprint_digest})
    return [(c, bodies.get(c.fingerprint_digest)) for c in comps]


def digests_of_run(s: Session, run_id: int) -> list[tuple[str, str]]:
    """The distinct (side, digest) pairs of a run's processes: a few rows however many workers."""
    q = (select(Component.side, Component.fingerprint_digest).distinct()
         .where(Component.run_id == run_id, Component.fingerprint_digest.is_not(None)))
    return [(side, digest) for side, digest in s.execute(q)]


def bodies_of(s: Session, digests: set[str]) -> dict[str, dict]:
    return _bodies(s, digests)


_BODY_CACHE: "OrderedDict[str, dict]" = OrderedDict()
_BODY_CACHE_SIZE = 64
_BODY_LOCK = Lock()


def _bodies(s: Session, digests: set[str]) -> dict[str, dict]:
    with _BODY_LOCK:
        out = {d: _BODY_CACHE[d] for d in digests if d in _BODY_CACHE}
    missing = digests - set(out)
    if missing:
        rows = s.execute(select(Fingerprint.digest, Fingerprint.body).where(Fingerprint.digest.in_(missing))).all()
        with _BODY_LOCK:
            for digest, body in rows:
                out[digest] = _BODY_CACHE[digest] = body
                _BODY_CACHE.move_to_end(digest)
            while len(_BODY_CACHE) > _BODY_CACHE_SIZE:
                _BODY_CACHE.popitem(last=False)
    return out
