from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from paritywatch.backend.alerts import taint
from paritywatch.backend.alerts.silences import muted_count
from paritywatch.backend.alerts.effects import after_commit
from paritywatch.backend.api.deps import (AnswerRoute, AdminDep, EngineDep, IngestDep, JanitorDep, ReadDep, ReadSession, SettingsDep,
                                          WriteSession, require_project)
from paritywatch.backend.api.query import DeletionsPage, RunsPage, encode_cursor
from paritywatch.backend.detect import packs as pack_catalog
from paritywatch.backend.detect import taint as taint_logic
from paritywatch.backend.detect.workers import process_state
from paritywatch.backend.detect.rules import BUILTIN_RULES
from paritywatch.backend.models import ENDED_RUN_STATES, utcnow
from paritywatch.backend.schemas.common import ControlStateName
from paritywatch.backend.schemas.components import ComponentOut
from paritywatch.backend.schemas.runs import PackSuggestion, RunCreate, RunDeletionList, RunDeletionOut, RunList, RunOut, RunTaintOut
from paritywatch.backend.store import alerts as alert_store
from paritywatch.backend.store import packs as pack_store
from paritywatch.backend.store import retention
from paritywatch.backend.store import runs as run_store
from paritywatch.backend.store import silences as silence_store
from paritywatch.backend.store.control import control_of
from paritywatch.backend.store.workers import silent_cutoff
from trainer_hooks import contract
from trainer_hooks.contract import MAX_STEP

router = APIRouter(prefix="/runs", tags=["runs"], route_class=AnswerRoute)
deletions = APIRouter(prefix="/run-deletions", tags=["runs"], route_class=AnswerRoute)
StateFilter = Annotated[ControlStateName | None, Query(description="Only runs in this state")]


def component_out(c, run, cutoff) -> ComponentOut:
    """A process as readers see it: `ended` when its run ended and it went silent (process_state)."""
    out = ComponentOut.model_validate(c, from_attributes=True)
    out.status = process_state(c.status, c.last_heartbeat, run.control_state, cutoff)
    return out


def run_out(run, components, firing, packs, suggested=(), facts=None, *, cutoff) -> RunOut:
    """`cutoff`: a process silent since then has been silent for the heartbeat timeout."""
    facts = facts or {}
    return RunOut(
        id=run.id,
        name=run.name,
        project=run.project,
        tags=run.tags or {},
        config=contract.config_value(run.config or {}),  # rows from before: SQLite kept a bare NaN
        created_at=run.created_at,
        last_step=run.last_step,
        control=control_of(run),
        components=[component_out(c, run, cutoff) for c in components],
        firing_alerts=firing or {},
        silenced_alerts=facts.get("silenced_alerts", 0),
        taint=facts.get("taint") or {},
        ended_at=run.control_updated_at if run.control_state in (*ENDED_RUN_STATES, "crashed") else None,
        packs=list(packs),
        suggested_packs=[PackSuggestion(pack=x.pack, keys=list(x.keys), message=x.message) for x in suggested],
    )


@router.post("", response_model=RunOut, summary="Create a run, or get it if (project, name) exists")
def create_or_get_run(body: RunCreate, s: WriteSession, settings: SettingsDep, engine: EngineDep, who: IngestDep) -> RunOut:
    require_project(who, body.project)
    max_config = settings.max_run_config_bytes
    run = run_store.create_or_get_run(s, body.name, body.project, body.tags, body.config, max_config,
                                      default_rules=BUILTIN_RULES, packs=body.packs, pack_rules=pack_catalog.rules_of)
    if body.packs:
        after_commit(s, lambda: engine.forget_rules(run.id))
    return _detailed(s, run, settings)


@router.get("", response_model=RunList, summary="List runs, newest first (paginated)")
def list_runs(s: ReadSession, settings: SettingsDep, _: ReadDep, page: RunsPage, project: str | None = None,
              state: StateFilter = None) -> RunList:
    runs, after = run_store.list_runs(s, project, state, page)
    ids = [r.id for r in runs]
    comps = run_store.components_of(s, ids)
    firing = run_store.firing_alert_counts(s, ids)
    packs = pack_store.enabled_for_runs(s, [(r.id, r.project) for r in runs])
    facts = _facts(s, runs)
    cutoff = silent_cutoff(utcnow(), settings.heartbeat_timeout_s)
    return RunList(runs=[run_out(r, comps[r.id], firing[r.id], packs[r.id], facts=facts[r.id], cutoff=cutoff) for r in runs],
                   next_cursor=encode_cursor(after))


@router.get("/{run_id}", response_model=RunOut, summary="One run with its components and control state")
def get_run(run_id: int, s: ReadSession, settings: SettingsDep, _: ReadDep) -> RunOut:
    return _detailed(s, run_store.get_run(s, run_id), settings)


@router.delete("/{run_id}", status_code=204, summary="Delete a run with all its data (admin)")
def delete_run(run_id: int, s: WriteSession, janitor: JanitorDep, who: AdminDep,
               reason: Annotated[str | None, Query(max_length=2000)] = None) -> Response:
    """The run is gone for the API at once (404, ingest refused, its name free); its points,
    roll-ups, alerts and webhook deliveries are removed in the background in small steps that do
    not stall ingest. `GET /run-deletions` keeps the record."""
    retention.request_deletion(s, run_id, who.name, reason)
    after_commit(s, janitor.wake)
    return Response(status_code=204)


@deletions.get("", response_model=RunDeletionList, summary="Run deletions, newest first (paginated)")
def list_deletions(s: ReadSession, _: ReadDep, page: DeletionsPage) -> RunDeletionList:
    rows, after = retention.list_deletions(s, page)
    return RunDeletionList(deletions=[RunDeletionOut.model_validate(d, from_attributes=True) for d in rows],
                           next_cursor=encode_cursor(after))


@router.get("/{run_id}/taint", response_model=RunTaintOut,
            summary="What the run trained on: its tainted step ranges, and whether a checkpoint at `step` was trained on them")
def get_taint(run_id: int, s: ReadSession, _: ReadDep,
              step: Annotated[int | None, Query(ge=0, le=MAX_STEP, description="a checkpoint's step: judge it")] = None,
              ) -> RunTaintOut:
    run = run_store.get_run(s, run_id)
    record = taint.record_of(s, run)
    checkpoint = taint_logic.checkpoint(record, step) if step is not None else None
    return RunTaintOut(**record, run_id=run.id, state=run.control_state, last_step=run.last_step, checkpoint=checkpoint)


def _detailed(s, run, settings) -> RunOut:
    comps = run_store.components_of(s, [run.id])[run.id]
    firing = run_store.firing_alert_counts(s, [run.id])[run.id]
    packs = pack_store.enabled_for_runs(s, [(run.id, run.project)])[run.id]
    posted = pack_store.keys_present(s, run.id, pack_catalog.all_keys())
    facts = _facts(s, [run])[run.id]
    return run_out(run, comps, firing, packs, pack_catalog.suggest(posted, set(packs)), facts,
                   cutoff=silent_cutoff(utcnow(), settings.heartbeat_timeout_s))


def _facts(s, runs: list) -> dict[int, dict]:
    """run id -> what the runs list and the run page show beside the alert counts: how many open
    alerts a silence mutes now, and the record of what the run trained on."""
    silences = silence_store.active(s, utcnow())
    kinds = alert_store.open_alert_kinds(s, [r.id for r in runs]) if silences else {}
    records = taint.records_of(s, runs)
    return {r.id: {"silenced_alerts": muted_count(silences, r.id, r.project, kinds.get(r.id, {})),
                   "taint": records[r.id]} for r in runs}
