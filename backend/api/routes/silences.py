"""Silences: mute notifications of a run, a project or an alert kind for a while. Muted alerts
still fire and show (marked); their notifications wait until the silence ends."""
from __future__ import annotations

import logging
from typing import Annotated, Literal

from fastapi import APIRouter, Query

from paritywatch.backend.alerts.effects import after_commit
from paritywatch.backend.api.deps import AnswerRoute, AdminDep, NotifierDep, ReadDep, ReadSession, WriteSession
from paritywatch.backend.models import Silence, utcnow
from paritywatch.backend.schemas.silences import SilenceIn, SilenceList, SilenceOut
from paritywatch.backend.schemas.common import CONFLICT_RESPONSE
from paritywatch.backend.store import notifications as notification_store
from paritywatch.backend.store import silences as store
from paritywatch.backend.store.runs import get_run

router = APIRouter(prefix="/silences", tags=["silences"], route_class=AnswerRoute)
log = logging.getLogger("paritywatch.silences")
StateFilter = Annotated[Literal["active", "expired", "all"], Query()]


def _out(silence: Silence) -> SilenceOut:
    return SilenceOut.model_validate({**{c: getattr(silence, c) for c in SilenceOut.model_fields if c != "active"},
                                      "active": silence.starts_at <= utcnow() < silence.ends_at})


@router.post("", response_model=SilenceOut, summary="Mute a run, a project or an alert kind for a duration (admin)")
def create_silence(body: SilenceIn, s: WriteSession, notifier: NotifierDep, who: AdminDep) -> SilenceOut:
    if body.run_id is not None:
        get_run(s, body.run_id)
    silence = store.create(s, run_id=body.run_id, project=body.project, kind=body.kind,
                           duration_s=body.duration_s, created_by=who.name, reason=body.reason)

    def created() -> None:
        log.info("silence %s created by %s until %s: %s", silence.id, who.name, silence.ends_at.isoformat(), body.reason)
        notifier.wake()
    after_commit(s, created)
    return _out(silence)


@router.get("", response_model=SilenceList, summary="Silences, newest first (with run_id: those that can match its alerts)")
def list_silences(s: ReadSession, _: ReadDep, state: StateFilter = "active", run_id: int | None = None) -> SilenceList:
    run = get_run(s, run_id) if run_id is not None else None
    return SilenceList(silences=[_out(x) for x in store.listing(s, state, utcnow(), run)])


@router.post("/{silence_id}/expire", response_model=SilenceOut, responses=CONFLICT_RESPONSE, summary="End a silence now (admin)")
def expire_silence(silence_id: int, s: WriteSession, notifier: NotifierDep, who: AdminDep) -> SilenceOut:
    silence = store.expire(s, silence_id, who.name)
    notification_store.recheck_waiting(s, utcnow())  # what it muted may be due now

    def ended() -> None:
        log.info("silence %s ended by %s", silence_id, who.name)
        notifier.wake()
    after_commit(s, ended)
    return _out(silence)
