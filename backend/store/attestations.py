"""Weight attestations (docs/design.md, "Weight-sync attestation"): the SQL. What they mean is
backend/detect/attest.py; the alerts they raise, backend/background/detectors/weights.py."""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from paritywatch.backend.errors import Invalid
from paritywatch.backend.models import Component, WeightAttestation
from paritywatch.backend.store import jobs
from paritywatch.backend.store.paging import PageRequest, keyset, split_page
from paritywatch.backend.store.rows import raced
from paritywatch.backend.store.runs import get_component
from trainer_hooks import contract

HEX_RE = re.compile(r"^[0-9a-f]{16,128}$")
KEEP_PER_COMPONENT = 50  # attestations kept per process; older ones are deleted as new ones come
TRAINER_VERSIONS_READ = 50  # trainer versions detection looks at (the newest)


# ------------------------------------------------------------------ validation

def validate_attestation(body: Any) -> dict:
    """The body as stored, or Invalid saying what is wrong. The whole digest is recomputed from
    the tensor digests: it is what comparisons trust."""
    if not isinstance(body, dict):
        raise Invalid("an attestation is a JSON object")
    try:
        version = contract.weights_version_value(body.get("version"))
    except (TypeError, ValueError) as exc:
        raise Invalid(f"'version': {exc}") from None
    if body.get("algo") not in contract.ATTEST_ALGOS or body.get("mode") not in contract.ATTEST_MODES:
        raise Invalid(f"'algo' is one of {contract.ATTEST_ALGOS} and 'mode' one of {contract.ATTEST_MODES}")
    block_bytes, sample = body.get("block_bytes"), body.get("sample")
    if not _count(block_bytes) or block_bytes < 1:
        raise Invalid("'block_bytes' is a positive integer")
    if body["mode"] == "sampled" and not (isinstance(sample, dict) and set(sample) == {"chunk_bytes", "chunks"}
                                          and all(_count(v) and v > 0 for v in sample.values())):
        raise Invalid("a sampled attestation has 'sample': {\"chunk_bytes\": int, \"chunks\": int}")
    tensors = _tensors(body.get("tensors"))
    digest = contract.weights_digest((t["name"], t["digest"]) for t in tensors)
    if body.get("digest") != digest:
        raise Invalid("'digest' does not match the tensor digests (contract.weights_digest)")
    seconds = body.get("seconds")
    return {"version": version, "algo": body["algo"], "mode": body["mode"], "block_bytes": block_bytes,
            "sample": sample if body["mode"] == "sampled" else None, "digest": digest, "tensors": tensors,
            "tensor_count": len(tensors), "bytes_total": sum(t["bytes"] for t in tensors),
            "bytes_hashed": body.get("bytes_hashed") if _count(body.get("bytes_hashed")) else 0,
            "seconds": float(seconds) if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else None}


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _tensors(tensors: Any) -> list[dict]:
    if not isinstance(tensors, list) or not 0 < len(tensors) <= contract.MAX_ATTEST_TENSORS:
        raise Invalid(f"'tensors' is a list of 1..{contract.MAX_ATTEST_TENSORS} tensors")
    out, names = [], set()
    for t in tensors:
        ok = (isinstance(t, dict) and isinstance(t.get("name"), str)
              and 0 < len(t["name"]) <= contract.MAX_TENSOR_NAME_LENGTH
              and isinstance(t.get("digest"), str) and HEX_RE.match(t["digest"])
              and isinstance(t.get("dtype"), str) and len(t["dtype"]) <= 32
              and isinstance(t.get("shape"), list) and len(t["shape"]) <= 16 and all(_count(d) for d in t["shape"])
              and _count(t.get("bytes")))
        if not ok:
            raise Invalid("each tensor is {\"name\", \"dtype\", \"shape\": [int], \"bytes\": int, \"digest\": hex}")
        if t["name"] in names:
            raise Invalid(f"tensor {t['name'][:100]!r} appears twice")
        names.add(t["name"])
        out.append({k: t[k] for k in ("name", "dtype", "shape", "bytes", "digest")})
    return out


# ------------------------------------------------------------------ writes

def add_attestation(s: Session, run_id: int, component_id: int, body: dict) -> WeightAttestation:
    """Store (or replace: the latest attestation of a version wins) and queue its evaluation.
    The body is checked before the first statement: a big one never holds the writer."""
    values = validate_attestation(body)

    def attempt(_n: int) -> WeightAttestation:  # a concurrent post of the same version can win the insert
        get_component(s, run_id, component_id)
        previous_max = s.scalar(select(func.max(WeightAttestation.version))
                                .where(WeightAttestation.component_id == component_id,
                                       WeightAttestation.version != values["version"]))
        s.execute(delete(WeightAttestation).where(WeightAttestation.component_id == component_id,
                                                  WeightAttestation.version == values["version"]))
        row = WeightAttestation(run_id=run_id, component_id=component_id, **values,
                                backwards_from=previous_max if previous_max is not None
                                and previous_max > values["version"] else None)
        s.add(row)
        s.flush()
        _prune(s, component_id)
        jobs.add(s, run_id, "attestation")  # evaluated exactly once (backend/store/jobs.py)
        s.flush()
        return row
    return raced(s, attempt, "attestation store")


def _prune(s: Session, component_id: int) -> None:
    keep = select(WeightAttestation.id).where(WeightAttestation.component_id == component_id) \
        .order_by(WeightAttestation.id.desc()).limit(KEEP_PER_COMPONENT)
    s.execute(delete(WeightAttestation).where(WeightAttestation.component_id == component_id,
                                              WeightAttestation.id.not_in(keep.scalar_subquery())))


# ------------------------------------------------------------------ what detection reads

@dataclass(frozen=True)
class Attested:
    """One attestation without its tensor list, with its process."""

    id: int
    component_id: int
    side: str
    worker_id: str
    status: str  # the process's: live | closed | lost
    version: int
    digest: str
    settings: tuple
    tensor_count: int
    backwards_from: int | None
    created_at: datetime


_COLUMNS = (WeightAttestation.id, WeightAttestation.component_id, Component.side, Component.worker_id,
            Component.status, WeightAttestation.version, WeightAttestation.digest, WeightAttestation.algo,
            WeightAttestation.mode, WeightAttestation.block_bytes, WeightAttestation.sample,
            WeightAttestation.tensor_count, WeightAttestation.backwards_from, WeightAttestation.created_at)


def _attested(row: Any) -> Attested:
    (id_, cid, side, worker_id, status, version, digest, algo, mode, block_bytes, sample, count,
     backwards_from, created_at) = row
    settings = (algo, mode, block_bytes, tuple(sorted((sample or {}).items())))
    return Attested(id_, cid, side, worker_id, status, version, digest, settings, count, backwards_from, created_at)


def _select() -> Any:
    return select(*_COLUMNS).join(Component, Component.id == WeightAttestation.component_id)


def trainer_attestations(s: Session, run_id: int) -> list[Attested]:
    """The trainers' attestations of the newest TRAINER_VERSIONS_READ versions, oldest first."""
    versions = select(WeightAttestation.version).join(Component, Component.id == WeightAttestation.component_id) \
        .where(WeightAttestation.run_id == run_id, Component.side == "trainer").distinct() \
        .order_by(WeightAttestation.version.desc()).limit(TRAINER_VERSIONS_READ)
    q = _select().where(WeightAttestation.run_id == run_id, Component.side == "trainer",
                        WeightAttestation.version.in_(versions.scalar_subquery())).order_by(WeightAttestation.id)
    return [_attested(r) for r in s.execute(q)]


def latest_rollout_attestations(s: Session, run_id: int) -> list[Attested]:
    """Each rollout process's latest attestation (by arrival), in process order."""
    latest = select(func.max(WeightAttestation.id)).join(Component, Component.id == WeightAttestation.component_id) \
        .where(WeightAttestation.run_id == run_id, Component.side == "rollout") \
        .group_by(WeightAttestation.component_id)
    q = _select().where(WeightAttestation.id.in_(latest.scalar_subquery())).order_by(WeightAttestation.component_id)
    return [_attested(r) for r in s.execute(q)]


def tensors_of(s: Session, attestation_ids: set[int]) -> dict[int, list[dict]]:
    if not attestation_ids:
        return {}
    q = select(WeightAttestation.id, WeightAttestation.tensors).where(WeightAttestation.id.in_(attestation_ids))
    return {id_: tensors for id_, tensors in s.execute(q)}


def runs_with_attestations(s: Session, run_ids: list[int]) -> list[int]:
    if not run_ids:
        return []
    q = select(WeightAttestation.run_id).where(WeightAttestation.run_id.in_(run_ids)).distinct()
    return sorted(s.scalars(q))


# ------------------------------------------------------------------ what the API lists

def list_attestations(s: Session, run_id: int, page: PageRequest, version: int | None = None,
                      component_id: int | None = None) -> tuple[list[Attested], int | None]:
    """One page of a run's attestations, newest first."""
    q = _select().where(WeightAttestation.run_id == run_id)
    if version is not None:
        q = q.where(WeightAttestation.version == version)
    if component_id is not None:
        q = q.where(WeightAttestation.component_id == component_id)
    return split_page([_attested(r) for r in s.execute(keyset(q, WeightAttestation.id, page))], page,
                      lambda a: a.id)


def versions_page(s: Session, run_id: int, page: PageRequest) -> tuple[list[int], int | None]:
    """One page of the versions anyone of the run attested, newest first."""
    q = select(WeightAttestation.version).where(WeightAttestation.run_id == run_id).distinct()
    return split_page(list(s.scalars(keyset(q, WeightAttestation.version, page))), page, lambda v: v)


def attestations_of_versions(s: Session, run_id: int, versions: list[int]) -> list[Attested]:
    if not versions:
        return []
    q = _select().where(WeightAttestation.run_id == run_id, WeightAttestation.version.in_(versions)) \
        .order_by(WeightAttestation.component_id)
    return [_attested(r) for r in s.execute(q)]
