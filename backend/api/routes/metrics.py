from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from paritywatch.backend.api.deps import AnswerRoute, IngestBulkDep, MetricsDep, ReadDep, ReadSession, SettingsDep, app_service
from paritywatch.backend.api.ingest import IngestServices, ingest_metric_batch
from paritywatch.backend.api.query import KeysPage, encode_cursor
from paritywatch.backend.middleware import BODY_SHAPE_KEY, metric_batch_series_keys
from paritywatch.backend.schemas.metrics import MetricBatch, MetricBatchResult, MetricKeyList, MetricKeyOut, SeriesOut, SeriesTimesOut
from paritywatch.backend.schemas.common import CONFLICT_RESPONSE
from trainer_hooks.contract import MAX_KEY_LENGTH, MAX_STEP

router = APIRouter(prefix="/runs/{run_id}", tags=["metrics"], route_class=AnswerRoute)


IngestDep = Annotated[IngestServices, Depends(app_service("ingest"))]
_BODY_DOC = {"requestBody": {"required": True, "content": {"application/json": {"schema": MetricBatch.model_json_schema()}}}}


# The body is read raw (its schema documented by hand): parse and validation happen in one pass
# in backend/api/ingest.py, which also serves this route's fast path (backend/api/fast_ingest.py).
@router.post("/metrics", response_model=MetricBatchResult, responses=CONFLICT_RESPONSE, summary="Post a columnar metric batch (idempotent)",
             openapi_extra=_BODY_DOC)
async def post_metrics(run_id: int, request: Request, _: IngestBulkDep, ingest: IngestDep) -> MetricBatchResult:
    return await ingest_metric_batch(ingest, run_id, await request.body(), request.headers.get("content-type"),
                                     metric_batch_series_keys(request.scope.get(BODY_SHAPE_KEY)))


@router.get("/metrics", response_model=MetricKeyList, summary="The run's metric keys with counts, by name (paginated)")
def list_keys(run_id: int, store: MetricsDep, s: ReadSession, _: ReadDep, page: KeysPage) -> MetricKeyList:
    keys, after = store.keys(s, run_id, page)
    return MetricKeyList(keys=[MetricKeyOut.model_validate(k, from_attributes=True) for k in keys],
                         next_cursor=encode_cursor(after))


@router.get("/series", response_model=SeriesOut, summary="One series downsampled in SQL (min/max/last per bucket)")
def read_series(
    run_id: int,
    store: MetricsDep,
    s: ReadSession,
    settings: SettingsDep,
    _: ReadDep,
    key: Annotated[str, Query(min_length=1, max_length=MAX_KEY_LENGTH)],
    points: Annotated[int, Query(ge=1, le=20_000)] = 1000,
    step_min: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None,
    step_max: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None,
) -> SeriesOut:
    limit = settings.max_read_raw_points
    return SeriesOut(**store.series(s, run_id, key, points, step_min, step_max, limit))


@router.get("/series/times", response_model=SeriesTimesOut,
            summary="When the batches carrying one series arrived: step to seconds since the run was created")
def read_series_times(
    run_id: int,
    store: MetricsDep,
    s: ReadSession,
    _: ReadDep,
    key: Annotated[str, Query(min_length=1, max_length=MAX_KEY_LENGTH)],
    points: Annotated[int, Query(ge=1, le=20_000)] = 1000,
) -> SeriesTimesOut:
    return SeriesTimesOut(**store.step_times(s, run_id, key, points))
