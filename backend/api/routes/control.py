from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from paritywatch.backend.control import run_state
from paritywatch.backend.api.deps import (AnswerRoute, AdminDep, ControlWatcherDep, IngestDep, ReadDep, ReadOrIngestDep, ReadSession,
                                          SettingsDep, WriteSession)
from paritywatch.backend.api.query import EventsPage, encode_cursor
from paritywatch.backend.schemas.control import ControlAction, ControlAudit, ControlEventOut, ControlOut, StopAcknowledgement
from paritywatch.backend.schemas.common import CONFLICT_RESPONSE
from paritywatch.backend.store import control as control_store
from paritywatch.backend.store import runs as run_store

router = APIRouter(prefix="/runs/{run_id}/control", tags=["control"], route_class=AnswerRoute)


@router.get("", response_model=ControlOut, summary="The run's control state")
def get_control(run_id: int, s: ReadSession, _: ReadOrIngestDep) -> ControlOut:
    return ControlOut(**control_store.control_of(run_store.get_run(s, run_id)))


@router.get("/wait", response_model=ControlOut, summary="Long-poll: answers when the version changes")
async def wait_control(
    run_id: int,
    s: ReadSession,
    settings: SettingsDep,
    watcher: ControlWatcherDep,
    _: ReadOrIngestDep,
    after_version: Annotated[int, Query(ge=0)] = 0,
    timeout: Annotated[float, Query(ge=0, le=600)] = 25.0,
) -> ControlOut:
    timeout = min(timeout, settings.control_wait_max_s)
    # `s` has not begun yet (it begins at its first statement): no transaction is held through the wait.
    control = await watcher.wait_for_change(run_id, after_version, timeout)
    if control is None:
        control = control_store.control_of(await run_in_threadpool(run_store.get_run, s, run_id))
    return ControlOut(**control)


@router.post("", response_model=ControlOut, responses=CONFLICT_RESPONSE, summary="Pause, resume or stop the run (admin)")
def post_control(run_id: int, body: ControlAction, s: WriteSession, who: AdminDep) -> ControlOut:
    actor = body.actor or who.name
    control = run_state.apply_action(s, run_id, body.action, actor, body.reason)
    return ControlOut(**control)


@router.post("/stopped", response_model=ControlOut, responses=CONFLICT_RESPONSE,
             summary="A hook reports its loop ended after a stop (ingest)")
def acknowledge_stop(run_id: int, body: StopAcknowledgement, s: WriteSession, who: IngestDep) -> ControlOut:
    """`stopping` -> `stopped`. An ingest token may do this and nothing else with control: it
    can only complete a stop an admin started."""
    control = run_state.acknowledge_stop(s, run_id, body.component_id, who.name, body.reason)
    return ControlOut(**control)


@router.get("/audit", response_model=ControlAudit, summary="The run's control changes, oldest first (paginated)")
def control_audit(run_id: int, s: ReadSession, _: ReadDep, page: EventsPage) -> ControlAudit:
    events, after = control_store.audit(s, run_id, page)
    return ControlAudit(events=[ControlEventOut.model_validate(e, from_attributes=True) for e in events],
                        next_cursor=encode_cursor(after))
