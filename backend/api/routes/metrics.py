from __future__ import annotations

import email.message
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from backend.api.deps import IngestDep, MetricsDep, ReadDep
from backend.schemas import MAX_STEP, MetricBatch, MetricBatchResult, MetricKeyList, MetricKeyOut, SeriesOut
from backend.store.metrics import prepare_batch

router = APIRouter(prefix="/runs/{run_id}", tags=["metrics"])


def _is_json(content_type: str | None) -> bool:
    """The content types FastAPI itself parses as JSON (none given counts as JSON)."""
    if not content_type:
        return True
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


async def metric_batch(request: Request) -> MetricBatch:
    """The body, parsed and validated in one pass from the raw bytes (pydantic's JSON parser:
    several times faster than json.loads + validation; it accepts NaN/Infinity literals too).
    Errors are the ones FastAPI would raise for a `MetricBatch` body parameter."""
    body = await request.body()
    if not body:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    if not _is_json(request.headers.get("content-type")):
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
def post_metrics(run_id: int, request: Request, store: MetricsDep, _: IngestDep,
                 batch: Annotated[MetricBatch, Depends(metric_batch)]) -> MetricBatchResult:
    settings = request.app.state.settings
    prepared = prepare_batch(batch.steps, batch.series, settings.max_points_per_batch, settings.max_key_length)
    stored = store.ingest(run_id, batch.client_id, batch.seq, prepared)
    request.app.state.counters.record_ingest(prepared.accepted if stored else 0, not stored)
    if not stored:
        return MetricBatchResult(accepted=0, skipped_nonfinite=0, duplicate=True)
    request.app.state.engine.on_metrics(run_id, set(prepared.points))
    return MetricBatchResult(accepted=prepared.accepted, skipped_nonfinite=prepared.skipped, duplicate=False)


@router.get("/metrics", response_model=MetricKeyList, summary="The run's metric keys with counts")
def list_keys(run_id: int, store: MetricsDep, _: ReadDep) -> MetricKeyList:
    keys = store.keys(run_id)
    return MetricKeyList(keys=[MetricKeyOut.model_validate(k, from_attributes=True) for k in keys])


@router.get("/series", response_model=SeriesOut, summary="One series downsampled in SQL (min/max/last per bucket)")
def read_series(
    run_id: int,
    store: MetricsDep,
    _: ReadDep,
    key: Annotated[str, Query(min_length=1, max_length=200)],
    points: Annotated[int, Query(ge=1, le=20_000)] = 1000,
    step_min: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None,
    step_max: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None,
) -> SeriesOut:
    return SeriesOut(**store.series(run_id, key, points, step_min, step_max))
