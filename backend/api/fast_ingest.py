"""The fast path of `POST /api/v1/runs/{run_id}/metrics`: every training process posts a batch a
second or more, and FastAPI's routing, dependency solving and response validation cost a batch
about as much CPU as storing it (docs/design.md, Targets). This ASGI middleware answers those
requests itself, with the same code as the route (backend/api/ingest.py), the same checks and the
same answers, byte for byte (tests/api/test_fast_ingest.py holds it to that).

It sits inside the request guard (backend/middleware.py: the caller is authenticated, its scope
checked, the body read, bounded and checked before this runs) and inside the security headers.
Whatever it does not take verbatim — another path or method, a query string (the route answers
422 for it), a run id that is not a plain number — goes on to the app unchanged.
"""
from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from paritywatch.backend.api.deps import INGEST_BULK, PRINCIPAL_KEY, RunProjects
from paritywatch.backend.api.errors import handler_response
from paritywatch.backend.api.ingest import IngestServices, ingest_metric_batch
from paritywatch.backend.middleware import BATCH_PATH, BODY_SHAPE_KEY, header, metric_batch_series_keys


class MetricBatchFastPath:
    def __init__(self, app: ASGIApp, *, services: IngestServices, projects: RunProjects):
        self.app, self.services, self.projects = app, services, projects

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = None
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("query_string") \
                and not scope.get("root_path"):
            match = BATCH_PATH.fullmatch(scope["path"])
        if match is None:
            await self.app(scope, receive, send)
            return
        run_id = int(match.group(1))
        try:
            await INGEST_BULK.authorize(scope.get(PRINCIPAL_KEY), run_id, self.projects)
            body = await _read_body(receive)
            if body is None:  # the client went away: nobody to answer
                return
            result = await ingest_metric_batch(self.services, run_id, body, header(scope, b"content-type"),
                                               metric_batch_series_keys(scope.get(BODY_SHAPE_KEY)))
            response = JSONResponse(result.model_dump())
        except Exception as exc:
            response = await handler_response(scope, exc)
        await response(scope, receive, send)


async def _read_body(receive: Receive) -> bytes | None:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)
