from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from paritywatch.backend.api.deps import EngineDep, IngestBulkDep, MetricsDep, ReadDep, SettingsDep
from paritywatch.backend.api.query import KeysPage, encode_cursor
from paritywatch.backend.api.routes.meta import CountersDep
from paritywatch.backend.middleware import is_json_type
from paritywatch.backend.schemas import MetricBatch, MetricBatchResult, MetricKeyList, MetricKeyOut, SeriesOut, SeriesTimesOut
from paritywatch.backend.store.jobs import Job
from paritywatch.backend.store.metrics import prepare_batch
from trainer_hooks.contract import MAX_KEY_LENGTH, MAX_STEP

router = APIRouter(prefix="/runs/{run_id}", tags=["metrics"])


async def metric_batch(request: Request) -> MetricBatch:
    """The body, parsed and validated in one pass from the raw bytes (pydantic's JSON parser:
    several times faster than json.loads + validation; it accepts NaN/Infinity literals too).
    Errors are the ones FastAPI would raise for a `MetricBatch` body parameter."""
    body = await request.body()
    if not body:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    if not is_json_type(request.headers.get("content-type")):  # the guard answers 415 first
        raise RequestValidationError([{
            "type": "model_attributes_type", "loc": ("body",),
            "msg": "Input should be a valid dictionary or object to extract fields from", "input": None,
        }])
    try:
        return MetricBatch.model_validate_json(body)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e.get("loc", ()))} for e in exc.errors(include_url=False)]
        ) from None


_BODY_DOC = {"requestBody": {"required": True, "content": {"application/json": {"schema": MetricBatch.model_json_schema()}}}}


@router.post("/metrics", response_model=MetricBatchResult, summary="Post a columnar metric batch (idempotent)",
             openapi_extra=_BODY_DOC)
async def post_metrics(run_id: int, store: MetricsDep, settings: SettingsDep, engine: EngineDep,
                       counters: CountersDep, _: IngestBulkDep,
                       batch: Annotated[MetricBatch, Depends(metric_batch)]) -> MetricBatchResult:
    # The hot path, on the event loop: packing is CPU work either way, and the write waits for the
    # group-commit writer without holding a thread. Anything that may query goes to the pool.
    prepared = prepare_batch(batch.steps, batch.series, settings.max_points_per_batch, settings.max_key_length)
    keys = set(prepared.points)
    watched = engine.cached_watched_keys(run_id, keys)
    if watched is None:
        watched = await run_in_threadpool(engine.watched_keys, run_id, keys)
    result = await store.ingest_batch_async(run_id, batch.client_id, batch.seq, prepared, detect_keys=watched,
                                            component_id=batch.component_id)
    counters.record_ingest(prepared.accepted if result.stored else 0, not result.stored)
    if not result.stored:
        # A replay: if the first attempt's evaluation failed, its job is still queued. Do it now.
        await run_in_threadpool(engine.process_pending, run_id=run_id)
        return MetricBatchResult(accepted=0, skipped_nonfinite=0, duplicate=True)
    if result.job_id is not None:  # written with the batch: evaluated exactly once (backend/detect/engine.py)
        await run_in_threadpool(engine.evaluate, Job(result.job_id, run_id, "metrics", tuple(watched),
                                                     prepared.spans(watched)))
    return MetricBatchResult(accepted=prepared.accepted, skipped_nonfinite=prepared.skipped, duplicate=False)


@router.get("/metrics", response_model=MetricKeyList, summary="The run's metric keys with counts, by name (paginated)")
def list_keys(run_id: int, store: MetricsDep, _: ReadDep, page: KeysPage) -> MetricKeyList:
    keys, after = store.keys(run_id, page)
    return MetricKeyList(keys=[MetricKeyOut.model_validate(k, from_attributes=True) for k in keys],
                         next_cursor=encode_cursor(after))


@router.get("/series", response_model=SeriesOut, summary="One series downsampled in SQL (min/max/last per bucket)")
def read_series(
    run_id: int,
    store: MetricsDep,
    settings: SettingsDep,
    _: ReadDep,
    key: Annotated[str, Query(min_length=1, max_length=MAX_KEY_LENGTH)],
    points: Annotated[int, Query(ge=1, le=20_000)] = 1000,
    step_min: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None,
    step_max: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None,
) -> SeriesOut:
    limit = settings.max_read_raw_points
    return SeriesOut(**store.series(run_id, key, points, step_min, step_max, limit))


@router.get("/series/times", response_model=SeriesTimesOut,
            summary="When the batches carrying one series arrived: step to seconds since the run was created")
def read_series_times(
    run_id: int,
    store: MetricsDep,
    _: ReadDep,
    key: Annotated[str, Query(min_length=1, max_length=MAX_KEY_LENGTH)],
    points: Annotated[int, Query(ge=1, le=20_000)] = 1000,
) -> SeriesTimesOut:
    return SeriesTimesOut(**store.step_times(run_id, key, points))
