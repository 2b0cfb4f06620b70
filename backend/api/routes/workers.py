"""The workers view: a run's processes with their policy version, lag, throughput, fingerprint
group and alerts; and one metric split by the process that posted it, outliers first."""
from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from paritywatch.backend.api.deps import AnswerRoute, ReadDep, ReadSession, SettingsDep
from paritywatch.backend.api.query import WorkersPage, encode_cursor
from paritywatch.backend.detect import workers as view
from paritywatch.backend.models import PROCESS_STATES, utcnow
from trainer_hooks.contract import MAX_STEP
from paritywatch.backend.schemas.workers import WorkerGroupOut, WorkerList, WorkerOut, WorkerSeriesLine, WorkerSeriesOut
from paritywatch.backend.store import workers as store
from paritywatch.backend.store.metrics import RawBudget
from trainer_hooks import contract

router = APIRouter(prefix="/runs/{run_id}/workers", tags=["workers"], route_class=AnswerRoute)

Fingerprint = Annotated[str | None, Query(
    pattern=r"^([0-9a-f]{64}|missing)$",
    description="only processes with this fingerprint digest (`missing`: those that sent none)")]


@router.get("", response_model=WorkerList, summary="The run's processes with version, lag, throughput and alerts (paginated)")
def list_workers(
    run_id: int, s: ReadSession, settings: SettingsDep, _: ReadDep, page: WorkersPage,
    state: Annotated[Literal[PROCESS_STATES] | None, Query(description="only processes in this state")] = None,
    side: Annotated[Literal[contract.SIDES] | None, Query(description="only this side")] = None,
    fingerprint: Fingerprint = None,
    q: Annotated[str | None, Query(min_length=1, max_length=200, description="a substring of the worker id or host")] = None,
) -> WorkerList:
    """Rows in registration order; `counts`, `groups` and `trainer_policy_version` describe the
    whole run, whatever the filter. Lag = the trainer's version minus the worker's. A live process
    of an ended run silent for the heartbeat timeout is `ended` (shut down without closing)."""
    cutoff = store.silent_cutoff(utcnow(), settings.heartbeat_timeout_s)
    run = store.run_workers(s, run_id, cutoff)
    rows, after = store.worker_page(s, run_id, store.WorkerFilter(state, side, fingerprint, q), page, cutoff)
    labels = view.group_labels([d for d, _, _ in run.digests], run.trainer_digest)
    alerts = view.alerts_by_component(run.open_alerts, rows)
    return WorkerList(
        trainer_policy_version=run.trainer_policy_version,
        lagging_versions=view.LAGGING_VERSIONS,
        counts=run.counts,
        groups=[WorkerGroupOut(label=labels[d], digest=d, side=side_, processes=n,
                               same_as_trainer=None if run.trainer_digest is None else d == run.trainer_digest)
                for d, side_, n in sorted(run.digests, key=lambda g: labels[g[0]])],
        workers=[_worker_out(c, run, labels, alerts[c.id], cutoff) for c in rows],
        next_cursor=encode_cursor(after),
    )


def _worker_out(c, run: store.RunWorkers, labels: dict[str, str], alerts: list, cutoff) -> WorkerOut:
    lag = view.lag(c.side, c.policy_version, run.trainer_policy_version)
    return WorkerOut(
        component_id=c.id, side=c.side, worker_id=c.worker_id, host=c.host, pid=c.pid,
        state=view.process_state(c.status, c.last_heartbeat, run.run_state, cutoff),
        started_at=c.started_at, last_heartbeat=c.last_heartbeat, policy_version=c.policy_version,
        lag=lag, lagging=lag is not None and lag >= view.LAGGING_VERSIONS,
        samples_per_s=c.samples_per_s, points_per_s=c.points_per_s, fingerprint_digest=c.fingerprint_digest,
        group=labels.get(c.fingerprint_digest) if c.fingerprint_digest else None,
        alerts=[{"id": a.id, "kind": a.kind, "severity": a.severity, "title": a.title} for a in alerts],
    )


@router.get("/series", response_model=WorkerSeriesOut,
            summary="One metric per process that posted it: the outlier workers' lines over the aggregate")
def worker_series(
    run_id: int, settings: SettingsDep, s: ReadSession, _: ReadDep,
    key: Annotated[str, Query(min_length=1, max_length=200)],
    points: Annotated[int, Query(ge=1, le=2000, description="buckets over the range")] = 200,
    top: Annotated[int, Query(ge=1, le=64, description="how many workers to return, furthest from the median first")] = 8,
    step_min: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None,
    step_max: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None,
) -> WorkerSeriesOut:
    """Read from the raw points (each batch knows its sender; roll-ups do not), so the range
    costs at most `PARITYWATCH_MAX_READ_RAW_POINTS` decoded points (422 beyond: narrow it)."""
    mk = store.metric_key(s, run_id, key)
    lo = mk.first_step if step_min is None else step_min
    hi = mk.last_step if step_max is None else step_max
    if lo is None or hi is None or hi < lo:
        lo = hi = None
    parts: dict = {}
    width = 1
    if lo is not None:
        width = max(1, -(-(hi + 1 - lo) // points))
        budget = RawBudget(settings.max_read_raw_points)
        parts = store.points_by_worker(s, mk.id, lo, hi + 1, budget)
    aggregate = view.bucket_means(*view.all_points(parts), lo or 0, width)
    unattributed = parts.pop(None, None)
    outliers, median = view.rank_outliers(parts, top)
    comps = store.workers_by_id(s, run_id, [o.component_id for o in outliers])
    return WorkerSeriesOut(
        key=key, step_min=lo, step_max=hi, bucket_width=width, aggregate=aggregate,
        workers_median=median, workers_with_points=len(parts),
        unattributed_points=0 if unattributed is None else len(unattributed[0]),
        workers=[WorkerSeriesLine(component_id=o.component_id, worker_id=comps[o.component_id].worker_id,
                                  side=comps[o.component_id].side, score=o.score, mean=o.mean, points=o.points,
                                  buckets=view.bucket_means(*parts[o.component_id], lo, width))
                 for o in outliers if o.component_id in comps],
    )
