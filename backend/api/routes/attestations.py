"""Weight-sync attestations (docs/design.md, "Weight-sync attestation"): processes post the digests
of the weights they hold for a version; readers list them, or compare them version by version."""
from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query

from paritywatch.backend.alerts.effects import after_commit
from paritywatch.backend.api.deps import AnswerRoute, EngineDep, IngestBulkDep, ReadDep, ReadSession, WriteSession
from paritywatch.backend.api.query import AttestationsPage, VersionsPage, encode_cursor
from paritywatch.backend.detect import attest as attest_logic
from paritywatch.backend.schemas.attestations import (AttestationList, AttestationOut, AttestationStored, VersionComparison,
                                                      VersionComparisonList, WorkerVerdict)
from paritywatch.backend.store import attestations as att_store
from paritywatch.backend.store.attestations import Attested
from paritywatch.backend.store.runs import get_run

router = APIRouter(tags=["attestations"], route_class=AnswerRoute)
OptionalId = Annotated[int | None, Query(ge=0, le=2**53)]


@router.post(
    "/runs/{run_id}/components/{component_id}/attestations",
    response_model=AttestationStored,
    summary="Attest the weights a process holds for a version (one digest per tensor)",
)
def post_attestation(run_id: int, component_id: int, s: WriteSession, engine: EngineDep, _: IngestBulkDep,
                     body: dict[str, Any] = Body(...)) -> AttestationStored:
    """The body is what `ParityMonitor.attest_weights` computes (trainer_hooks/attest.py). The
    latest attestation of a version replaces an earlier one of the same process."""
    row = att_store.add_attestation(s, run_id, component_id, body)
    after_commit(s, lambda: engine.on_attestation(run_id))  # its job committed with it: evaluated once
    return AttestationStored(id=row.id, version=row.version, digest=row.digest, tensor_count=row.tensor_count,
                             backwards_from=row.backwards_from)


def _out(a: Attested) -> dict[str, Any]:
    algo, mode, block_bytes, sample = a.settings
    return {"id": a.id, "component_id": a.component_id, "side": a.side, "worker_id": a.worker_id,
            "version": a.version, "digest": a.digest, "tensor_count": a.tensor_count,
            "backwards_from": a.backwards_from, "created_at": a.created_at,
            "settings": {"algo": algo, "mode": mode, "block_bytes": block_bytes, "sample": dict(sample) or None}}


@router.get("/runs/{run_id}/attestations", response_model=AttestationList,
            summary="Weight attestations of a run, newest first (paginated)")
def list_attestations(run_id: int, s: ReadSession, _: ReadDep, page: AttestationsPage, version: OptionalId = None,
                      component_id: OptionalId = None) -> AttestationList:
    get_run(s, run_id)
    rows, after = att_store.list_attestations(s, run_id, page, version, component_id)
    return AttestationList(attestations=[AttestationOut(**_out(a)) for a in rows], next_cursor=encode_cursor(after))


@router.get("/runs/{run_id}/attestations/versions", response_model=VersionComparisonList,
            summary="Each version's rollout attestations compared with the trainer's, newest first (paginated)")
def compare_versions(run_id: int, s: ReadSession, _: ReadDep, page: VersionsPage) -> VersionComparisonList:
    get_run(s, run_id)
    versions, after = att_store.versions_page(s, run_id, page)
    rows = att_store.attestations_of_versions(s, run_id, versions)
    trainers = [a for a in rows if a.side == "trainer"]
    compared = {v: [(a, attest_logic.reference_for(trainers, v)) for a in rows if a.version == v and a.side != "trainer"]
                for v in versions}
    differing = [(a, ref) for pairs in compared.values() for a, ref in pairs
                 if attest_logic.verdict(ref, a) == "differs"]
    tensors = att_store.tensors_of(s, {a.id for a, _ in differing} | {ref.id for _, ref in differing})
    out = []
    for v in versions:
        ref = attest_logic.reference_for(trainers, v)
        workers = []
        for a, r in compared[v]:
            result = attest_logic.verdict(r, a)
            diff = attest_logic.compare_tensors(tensors[r.id], tensors[a.id]) if result == "differs" else None
            workers.append(WorkerVerdict(**_out(a), verdict=result, tensors=diff))
        out.append(VersionComparison(version=v, trainer=AttestationOut(**_out(ref)) if ref else None,
                                     workers=workers))
    return VersionComparisonList(versions=out, next_cursor=encode_cursor(after))
