from __future__ import annotations

from fastapi import APIRouter

from backend.api.deps import DbDep, IngestDep, ReadDep
from backend.schemas import ComponentOut, RunCreate, RunList, RunOut
from backend.store import runs as run_store
from backend.store.control import control_of

router = APIRouter(prefix="/runs", tags=["runs"])


def run_out(run, components=(), firing=None) -> RunOut:  # noqa: ANN001
    return RunOut(
        id=run.id,
        name=run.name,
        project=run.project,
        tags=run.tags or {},
        config=run.config or {},
        created_at=run.created_at,
        last_step=run.last_step,
        control=control_of(run),
        components=[ComponentOut.model_validate(c, from_attributes=True) for c in components],
        firing_alerts=firing or {},
    )


@router.post("", response_model=RunOut, summary="Create a run, or get it if (project, name) exists")
def create_or_get_run(body: RunCreate, db: DbDep, _: IngestDep) -> RunOut:
    run = run_store.create_or_get_run(db, body.name, body.project, body.tags, body.config)
    return _detailed(db, run)


@router.get("", response_model=RunList, summary="List runs, newest first")
def list_runs(db: DbDep, _: ReadDep, project: str | None = None, state: str | None = None) -> RunList:
    runs = run_store.list_runs(db, project, state)
    ids = [r.id for r in runs]
    comps = run_store.components_of(db, ids)
    firing = run_store.firing_alert_counts(db, ids)
    return RunList(runs=[run_out(r, comps[r.id], firing[r.id]) for r in runs])


@router.get("/{run_id}", response_model=RunOut, summary="One run with its components and control state")
def get_run(run_id: int, db: DbDep, _: ReadDep) -> RunOut:
    return _detailed(db, run_store.load_run(db, run_id))


def _detailed(db, run) -> RunOut:  # noqa: ANN001
    comps = run_store.components_of(db, [run.id])[run.id]
    firing = run_store.firing_alert_counts(db, [run.id])[run.id]
    return run_out(run, comps, firing)
