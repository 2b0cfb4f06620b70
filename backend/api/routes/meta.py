"""whoami, the live event stream, and Prometheus metrics."""
from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, StreamingResponse
from sqlalchemy import func, select
from starlette.concurrency import run_in_threadpool

from backend.api.deps import ReadDep, ReadOrIngestDep
from backend.models import Alert, Component, Run, WebhookDelivery
from backend.schemas import WhoAmI
from backend.store.control import control_of
from backend.store.runs import get_run

router = APIRouter(tags=["meta"])
STREAM_INTERVAL_S = 0.5
PING_EVERY_S = 15.0


@router.get("/whoami", response_model=WhoAmI, summary="The caller's identity and scopes")
def whoami(request: Request, who: ReadOrIngestDep) -> WhoAmI:
    return WhoAmI(name=who.name, scopes=sorted(who.scopes), open_mode=request.app.state.open_mode.is_open())


def run_snapshot(db, run_id: int) -> dict:  # noqa: ANN001
    with db.read() as s:
        run = get_run(s, run_id)
        firing = dict(s.execute(
            select(Alert.severity, func.count()).where(Alert.run_id == run_id, Alert.status != "resolved")
            .group_by(Alert.severity)).all())
        alerts_version = s.execute(
            select(func.count(), func.max(Alert.updated_at)).where(Alert.run_id == run_id)).one()
        comps = s.execute(
            select(func.count(), func.max(Component.started_at), func.count(Component.fingerprint_digest))
            .where(Component.run_id == run_id)).one()
        control = control_of(run)
        control["updated_at"] = control["updated_at"].isoformat()
        return {
            "last_step": run.last_step,
            "control": control,
            "firing_alerts": firing,
            "alerts_version": f"{alerts_version[0]}:{alerts_version[1]}",
            "components_version": f"{comps[0]}:{comps[1]}:{comps[2]}",
        }


@router.get("/runs/{run_id}/stream", summary="Server-sent events: the run's live summary")
async def stream(run_id: int, request: Request, _: ReadDep) -> StreamingResponse:
    db = request.app.state.db
    first = await run_in_threadpool(run_snapshot, db, run_id)  # 404 before the stream starts

    async def events():
        last, since_ping = None, 0.0
        snap = first
        while not await request.is_disconnected():
            if snap != last:
                yield f"event: run\ndata: {json.dumps(snap)}\n\n"
                last, since_ping = snap, 0.0
            elif since_ping >= PING_EVERY_S:
                yield ": ping\n\n"
                since_ping = 0.0
            await asyncio.sleep(STREAM_INTERVAL_S)
            since_ping += STREAM_INTERVAL_S
            try:
                snap = await run_in_threadpool(run_snapshot, db, run_id)
            except Exception:  # database blip: keep the stream, try again next tick
                continue

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def prometheus_text(db, counters) -> str:  # noqa: ANN001
    lines = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[dict, float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines.append(f"{name}{{{lab}}} {value}" if lab else f"{name} {value}")

    with db.read() as s:
        runs = dict(s.execute(select(Run.control_state, func.count()).group_by(Run.control_state)).all())
        alerts = dict(s.execute(select(Alert.severity, func.count()).where(Alert.status != "resolved")
                                .group_by(Alert.severity)).all())
        hooks = dict(s.execute(select(WebhookDelivery.status, func.count()).group_by(WebhookDelivery.status)).all())
    metric("paritywatch_runs", "gauge", "Runs by control state.",
           [({"state": st}, runs.get(st, 0)) for st in ("running", "paused", "stopping", "stopped")])
    metric("paritywatch_alerts_open", "gauge", "Open (firing or acknowledged) alerts by severity.",
           [({"severity": sv}, alerts.get(sv, 0)) for sv in ("error", "warning", "info")])
    metric("paritywatch_webhook_deliveries", "gauge", "Webhook deliveries by outcome.",
           [({"status": st}, hooks.get(st, 0)) for st in ("pending", "delivered", "failed")])
    metric("paritywatch_ingest_points_total", "counter", "Metric points stored by this process.", [({}, counters.points)])
    metric("paritywatch_ingest_batches_total", "counter", "Metric batches received by this process.", [({}, counters.batches)])
    metric("paritywatch_ingest_duplicate_batches_total", "counter", "Replayed batches ignored by this process.",
           [({}, counters.duplicates)])
    return "\n".join(lines) + "\n"


def add_prometheus(app) -> None:  # noqa: ANN001
    from backend.api.deps import require
    from fastapi import Depends

    @app.get("/metrics", include_in_schema=False, dependencies=[Depends(require("read"))])
    def prometheus() -> PlainTextResponse:
        text = prometheus_text(app.state.db, app.state.counters)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")
