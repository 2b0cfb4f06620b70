from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from paritywatch.backend.alerts import run_state
from paritywatch.backend.api.deps import (AdminDep, ControlWatcherDep, DbDep, EffectsDep, IngestDep, ReadDep, ReadOrIngestDep,
                              SettingsDep)
from paritywatch.backend.api.query import EventsPage, encode_cursor
from paritywatch.backend.schemas.control import ControlAction, ControlAudit, ControlEventOut, ControlOut, StopAcknowledgement
from paritywatch.backend.schemas.common import CONFLICT_RESPONSE
from paritywatch.backend.store import control as control_store
from paritywatch.backend.store import runs as run_store

router = APIRouter(prefix="/runs/{run_id}/control", tags=["control"])


@router.get("", response_model=ControlOut, summary="The run's control state")
def get_control(run_id: int, db: DbDep, _: ReadOrIngestDep) -> ControlOut:
    return ControlOut(**control_store.control_of(run_store.load_run(db, run_id)))


@router.get("/wait", response_model=ControlOut, summary="Long-poll: answers when the version changes")
async def wait_control(
    run_id: int,
    db: DbDep,
    settings: SettingsDep,
    watcher: ControlWatcherDep,
    _: ReadOrIngestDep,
    after_version: Annotated[int, Query(ge=0)] = 0,
    timeout: Annotated[float, Query(ge=0, le=600)] = 25.0,
) -> ControlOut:
    timeout = min(timeout, settings.control_wait_max_s)
    control = await watcher.wait_for_change(run_id, after_version, timeout)
    if control is None:
        control = control_store.control_of(await run_in_threadpool(run_store.load_run, db, run_id))
    return ControlOut(**control)


@router.post("", response_model=ControlOut, responses=CONFLICT_RESPONSE, summary="Pause, resume or stop the run (admin)")
def post_control(run_id: int, body: ControlAction, db: DbDep, effects: EffectsDep, who: AdminDep) -> ControlOut:
    actor = body.actor or who.name
    control = run_state.apply_action(effects, db, run_id, body.action, actor, body.reason)
    return ControlOut(**control)


@router.post("/stopped", response_model=ControlOut, responses=CONFLICT_RESPONSE,
             summary="A hook reports its loop ended after a stop (ingest)")
def acknowledge_stop(run_id: int, body: StopAcknowledgement, db: DbDep, effects: EffectsDep,
                     who: IngestDep) -> ControlOut:
    """`stopping` -> `stopped`. An ingest token may do this and nothing else with control: it
    can only complete a stop an admin started."""
    control = run_state.acknowledge_stop(effects, db, run_id, body.component_id, who.name,
                                         body.reason)
    return ControlOut(**control)


@router.get("/audit", response_model=ControlAudit, summary="The run's control changes, oldest first (paginated)")
def control_audit(run_id: int, db: DbDep, _: ReadDep, page: EventsPage) -> ControlAudit:
    events, after = control_store.audit(db, run_id, page)
    return ControlAudit(events=[ControlEventOut.model_validate(e, from_attributes=True) for e in events],
                        next_cursor=encode_cursor(after))
