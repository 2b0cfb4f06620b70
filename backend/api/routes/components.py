from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Request

from backend.api.deps import DbDep, IngestDep, ReadDep
from backend.schemas import ComponentCreate, ComponentOut, FingerprintStored, HeartbeatOut
from backend.store import fingerprints as fp_store
from backend.store import runs as run_store
from backend.store.control import control_of

router = APIRouter(tags=["components"])


@router.post(
    "/runs/{run_id}/components",
    response_model=ComponentOut,
    summary="Register a process (upsert by side and worker_id)",
)
def register_component(run_id: int, body: ComponentCreate, db: DbDep, _: IngestDep) -> ComponentOut:
    comp = run_store.register_component(db, run_id, body.side, body.worker_id, body.host, body.pid)
    return ComponentOut.model_validate(comp, from_attributes=True)


@router.post(
    "/runs/{run_id}/components/{component_id}/heartbeat",
    response_model=HeartbeatOut,
    summary="Heartbeat; answers with the run's control state",
)
def heartbeat(run_id: int, component_id: int, db: DbDep, _: IngestDep) -> HeartbeatOut:
    run = run_store.heartbeat(db, run_id, component_id)
    return HeartbeatOut(control=control_of(run))


@router.post(
    "/runs/{run_id}/components/{component_id}/fingerprint",
    response_model=FingerprintStored,
    summary="Attach a processor fingerprint (full object, or {digest} of a known one)",
)
def post_fingerprint(
    run_id: int, component_id: int, request: Request, db: DbDep, _: IngestDep, body: dict[str, Any] = Body(...)
) -> FingerprintStored:
    digest, stored = fp_store.attach_fingerprint(db, run_id, component_id, body)
    request.app.state.engine.on_fingerprint(run_id)
    return FingerprintStored(digest=digest, stored=stored)


@router.get("/fingerprints/{digest}", summary="A stored fingerprint object")
def get_fingerprint(digest: str, db: DbDep, _: ReadDep) -> dict[str, Any]:
    return fp_store.get_fingerprint(db, digest)
