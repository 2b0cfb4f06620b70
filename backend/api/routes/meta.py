"""whoami, the live event stream, and Prometheus metrics."""
from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sse_starlette import EventSourceResponse

from paritywatch.backend.api.deps import AnswerRoute, OpenModeDep, ReadDep, ReadOrIngestDep, StreamsDep, app_service, require
from paritywatch.backend.control.watch import ControlWatcher
from paritywatch.backend.db import Database
from paritywatch.backend.models import RUN_STATES
from paritywatch.backend.schemas.meta import WhoAmI
from paritywatch.backend.store.observability import service_counts
from trainer_hooks.contract import SEVERITIES

router = APIRouter(tags=["meta"], route_class=AnswerRoute)
PING_EVERY_S = 15.0
DELIVERY_STATES = ("pending", "delivered", "failed")


@router.get("/whoami", response_model=WhoAmI, summary="The caller's identity and scopes")
def whoami(who: ReadOrIngestDep, open_mode: OpenModeDep) -> WhoAmI:
    return WhoAmI(name=who.name, scopes=sorted(who.scopes), open_mode=open_mode.is_open())


@router.get("/runs/{run_id}/stream", summary="Server-sent events: the run's live summary")
async def stream(run_id: int, request: Request, who: ReadDep, hub: StreamsDep) -> EventSourceResponse:
    sub = await hub.subscribe(run_id, who)  # 404 / 429 before the stream starts

    async def events():
        try:
            yield {"event": "run", "data": json.dumps(sub.latest)}
            while (snapshot := await sub.next()) is not None:
                yield {"event": "run", "data": json.dumps(snapshot)}
            yield {"event": "end", "data": json.dumps({"reason": sub.ended})}
        finally:
            hub.unsubscribe(sub)

    return EventSourceResponse(events(), ping=PING_EVERY_S, sep="\n",
                               headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class IngestCounters:
    """Process-local ingest counters, exported by prometheus-client."""

    def __init__(self, registry: CollectorRegistry):
        self.points = Counter("paritywatch_ingest_points", "Metric points stored by this process.", registry=registry)
        self.batches = Counter("paritywatch_ingest_batches", "Metric batches received by this process.",
                               registry=registry)
        self.duplicates = Counter("paritywatch_ingest_duplicate_batches", "Replayed batches ignored by this process.",
                                  registry=registry)

    def record_ingest(self, points: int, duplicate: bool) -> None:
        self.batches.inc()
        self.points.inc(points)
        if duplicate:
            self.duplicates.inc()


CountersDep = Annotated[IngestCounters, Depends(app_service("counters"))]


class StoreCollector(Collector):
    """Gauges read from the database at scrape time: one read of its own per scrape
    (prometheus_client calls `collect` with nothing to pass a session in)."""

    def __init__(self, db: Database):
        self.db = db

    def collect(self):
        with self.db.read() as s:
            counts = service_counts(s)
        yield _gauge("paritywatch_runs", "Runs by control state.", "state", RUN_STATES, counts["runs"])
        yield _gauge("paritywatch_alerts_open", "Open (firing or acknowledged) alerts by severity.", "severity",
                     SEVERITIES, counts["alerts"])
        yield _gauge("paritywatch_webhook_deliveries", "Webhook deliveries by outcome.", "status", DELIVERY_STATES,
                     counts["deliveries"])


def _gauge(name: str, help_: str, label: str, known: tuple[str, ...], values: dict) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_, labels=[label])
    for value in dict.fromkeys([*known, *values]):  # known ones always (0 too), new ones as they appear
        family.add_metric([str(value)], values.get(value, 0))
    return family


def make_registry(db: Database, control_watcher: ControlWatcher) -> tuple[CollectorRegistry, IngestCounters]:
    """One registry per app (tests build many apps in one process)."""
    registry = CollectorRegistry(auto_describe=False)
    counters = IngestCounters(registry)
    registry.register(StoreCollector(db))
    Gauge("paritywatch_control_long_polls", "Hooks long-polling for pause/resume/stop in this process.",
          registry=registry).set_function(control_watcher.waiting)
    return registry, counters


def add_prometheus(app) -> None:
    @app.get("/metrics", include_in_schema=False, dependencies=[Depends(require("read"))])
    def prometheus() -> Response:
        return Response(generate_latest(app.state.registry), media_type=CONTENT_TYPE_LATEST)
