"""A metric batch from its bytes to its answer: parse, check, pack, write, evaluate. One definition
for the two ways a batch arrives: the FastAPI route (`POST /runs/{run_id}/metrics`, which the
OpenAPI schema documents) and its fast path (backend/api/fast_ingest.py), the hot path of every
training run."""
from __future__ import annotations

from dataclasses import dataclass

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from paritywatch.backend.api.routes.meta import IngestCounters
from paritywatch.backend.background.engine import DetectionEngine
from paritywatch.backend.middleware import is_json_type
from paritywatch.backend.schemas.metrics import MetricBatch, MetricBatchResult
from paritywatch.backend.settings import Settings
from paritywatch.backend.store.jobs import Job
from paritywatch.backend.store.metrics import MetricStore, prepare_batch


@dataclass(frozen=True)
class IngestServices:
    """What a metric batch needs from the application (create_app builds it once)."""

    store: MetricStore
    settings: Settings
    engine: DetectionEngine
    counters: IngestCounters


def parse_metric_batch(body: bytes, content_type: str | None) -> MetricBatch:
    """The body, parsed and validated in one pass from the raw bytes (pydantic's JSON parser:
    several times faster than json.loads + validation; it accepts NaN/Infinity literals too).
    Errors are the ones FastAPI would raise for a `MetricBatch` body parameter."""
    if not body:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    if not is_json_type(content_type):  # the request guard answers 415 first
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


async def ingest_metric_batch(svc: IngestServices, run_id: int, body: bytes, content_type: str | None,
                              series_keys: int | None = None) -> MetricBatchResult:
    """Store one batch once (a replayed client_id/seq is a duplicate) and evaluate the rules that
    watch its keys. The caller has checked who may write to the run. `series_keys`: how many keys
    the body names, counted as it arrived (backend/middleware.py), for a body big enough to be
    measured: a batch with that many more keys than the run holds is refused before its parse
    (99,000 keys: ~150 ms of the event loop)."""
    if series_keys is not None:
        await svc.store.check_key_count_async(run_id, series_keys)
    batch = parse_metric_batch(body, content_type)
    # On the event loop: packing is CPU work either way, and the write waits for the group-commit
    # writer without holding a thread. Anything that may query goes to the pool.
    settings = svc.settings
    await svc.store.check_new_keys_async(run_id, list(batch.series))  # far over a cap: refused before packing
    prepared = prepare_batch(batch.steps, batch.series, settings.max_points_per_batch, settings.max_key_length)
    keys = set(prepared.points)
    watched = svc.engine.cached_watched_keys(run_id, keys)
    if watched is None:
        watched = await run_in_threadpool(svc.engine.watched_keys, run_id, keys)
    result = await svc.store.ingest_batch_async(run_id, batch.client_id, batch.seq, prepared, detect_keys=watched,
                                                component_id=batch.component_id)
    svc.counters.record_ingest(prepared.accepted if result.stored else 0, not result.stored)
    if not result.stored:
        # A replay: if the first attempt's evaluation failed, its job is still queued. Do it now.
        await run_in_threadpool(svc.engine.process_pending, run_id=run_id)
        return MetricBatchResult(accepted=0, skipped_nonfinite=0, duplicate=True)
    if result.job_id is not None:  # written with the batch: evaluated exactly once (backend/background/engine.py)
        await run_in_threadpool(svc.engine.evaluate, Job(result.job_id, run_id, "metrics", tuple(watched),
                                                         prepared.spans(watched)))
    return MetricBatchResult(accepted=prepared.accepted, skipped_nonfinite=prepared.skipped, duplicate=False)
