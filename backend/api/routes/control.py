from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from backend.api.deps import AdminDep, DbDep, IngestDep, ReadDep, ReadOrIngestDep
from backend.schemas import ControlAction, ControlAudit, ControlEventOut, ControlOut, StopAcknowledgement
from backend.store import control as control_store
from backend.store import runs as run_store

router = APIRouter(prefix="/runs/{run_id}/control", tags=["control"])


@router.get("", response_model=ControlOut, summary="The run's control state")
def get_control(run_id: int, db: DbDep, _: ReadOrIngestDep) -> ControlOut:
    return ControlOut(**control_store.control_of(run_store.load_run(db, run_id)))


@router.get("/wait", response_model=ControlOut, summary="Long-poll: answers when the version changes")
async def wait_control(
    run_id: int,
    request: Request,
    _: ReadOrIngestDep,
    after_version: Annotated[int, Query(ge=0)] = 0,
    timeout: Annotated[float, Query(ge=0, le=600)] = 25.0,
) -> ControlOut:
    state = request.app.state
    timeout = min(timeout, state.settings.control_wait_max_s)
    await state.control_watcher.wait_for_change(run_id, after_version, timeout)
    run = await run_in_threadpool(run_store.load_run, state.db, run_id)
    return ControlOut(**control_store.control_of(run))


@router.post("", response_model=ControlOut, summary="Pause, resume or stop the run (admin)")
def post_control(run_id: int, body: ControlAction, request: Request, db: DbDep, who: AdminDep) -> ControlOut:
    actor = body.actor or who.name
    control = control_store.apply_action(db, run_id, body.action, actor, body.reason)
    request.app.state.control_watcher.notify(run_id)
    return ControlOut(**control)


@router.post("/stopped", response_model=ControlOut, summary="A hook reports its loop ended after a stop (ingest)")
def acknowledge_stop(run_id: int, body: StopAcknowledgement, request: Request, db: DbDep,
                     who: IngestDep) -> ControlOut:
    """`stopping` -> `stopped`. An ingest token may do this and nothing else with control: it
    can only complete a stop an admin started."""
    control = control_store.acknowledge_stop(db, run_id, body.component_id, who.name, body.reason)
    request.app.state.control_watcher.notify(run_id)
    return ControlOut(**control)


@router.get("/audit", response_model=ControlAudit, summary="Every control change of the run")
def control_audit(run_id: int, db: DbDep, _: ReadDep) -> ControlAudit:
    events = control_store.audit(db, run_id)
    return ControlAudit(events=[ControlEventOut.model_validate(e, from_attributes=True) for e in events])
