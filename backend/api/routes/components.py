from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body

from paritywatch.backend.control import run_state
from paritywatch.backend.alerts.effects import after_commit
from paritywatch.backend.api.deps import (AnswerRoute, DbDep, EngineDep, IngestBulkDep, IngestDep, ReadDep, ReadSession, SettingsDep,
                                          WriteSession)
from paritywatch.backend.schemas.components import (ComponentClose, ComponentCreate, ComponentOut, FingerprintStored,
                                                    HeartbeatIn, HeartbeatOut)
from paritywatch.backend.store import fingerprints as fp_store
from paritywatch.backend.store.control import control_of

router = APIRouter(tags=["components"], route_class=AnswerRoute)


@router.post(
    "/runs/{run_id}/components",
    response_model=ComponentOut,
    summary="Register a process (upsert by side and worker_id)",
)
def register_component(run_id: int, body: ComponentCreate, s: WriteSession, settings: SettingsDep,
                       _: IngestDep) -> ComponentOut:
    comp = run_state.register(s, run_id, body.side, body.worker_id, body.host, body.pid, settings.heartbeat_timeout_s)
    return ComponentOut.model_validate(comp, from_attributes=True)


@router.post(
    "/runs/{run_id}/components/{component_id}/heartbeat",
    response_model=HeartbeatOut,
    summary="Heartbeat; answers with the run's control state",
)
def heartbeat(run_id: int, component_id: int, db: DbDep, s: WriteSession, _: IngestDep,
              body: HeartbeatIn | None = None) -> HeartbeatOut:
    """The body (optional) says how far along the process is: its policy version and throughput,
    shown in `GET /runs/{id}/workers`. A beat without one leaves the version as it was."""
    # The beat itself goes through the group-commit writer (`db`, backend/control/run_state.py);
    # `s` begins only for a lost process coming back.
    progress = body if body is not None else HeartbeatIn()
    return HeartbeatOut(control=run_state.heartbeat(db, s, run_id, component_id, progress.model_dump()))


@router.post(
    "/runs/{run_id}/components/{component_id}/close",
    response_model=HeartbeatOut,
    summary="The process ends cleanly (idempotent); the trainer closing finishes the run",
)
def close_component(run_id: int, component_id: int, s: WriteSession, _: IngestDep,
                    body: ComponentClose | None = None) -> HeartbeatOut:
    """`live` or `lost` -> `closed`: no `heartbeat_lost` for it, and an open one resolves. The last
    trainer closing makes a running or paused run `finished` (a stopping one `stopped`)."""
    reason = body.reason if body is not None else None
    run = run_state.close(s, run_id, component_id, reason)
    return HeartbeatOut(control=control_of(run))


@router.post(
    "/runs/{run_id}/components/{component_id}/fingerprint",
    response_model=FingerprintStored,
    summary="Attach a processor fingerprint (full object, or {digest} of a known one)",
)
def post_fingerprint(
    run_id: int, component_id: int, s: WriteSession, engine: EngineDep, _: IngestBulkDep, body: dict[str, Any] = Body(...)
) -> FingerprintStored:
    digest, stored = fp_store.attach_fingerprint(s, run_id, component_id, body)
    after_commit(s, lambda: engine.on_fingerprint(run_id))  # its job committed with it: evaluated once
    return FingerprintStored(digest=digest, stored=stored)


@router.get("/fingerprints/{digest}", summary="A stored fingerprint object")
def get_fingerprint(digest: str, s: ReadSession, _: ReadDep) -> dict[str, Any]:
    return fp_store.get_fingerprint(s, digest)
