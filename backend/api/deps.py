"""Typed dependencies: a route's signature reads like a sentence (`run_id: int, who: AdminDep`)."""
from __future__ import annotations

import time
from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi.exceptions import HTTPException

from backend.auth import OPEN_PRINCIPAL, Principal
from backend.db import Database
from backend.store.metrics import MetricStore


def get_db(request: Request) -> Database:
    return request.app.state.db


def get_metric_store(request: Request) -> MetricStore:
    return request.app.state.metrics


def _principal(request: Request, authorization: str | None) -> Principal:
    state = request.app.state
    if authorization:
        scheme, _, secret = authorization.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise HTTPException(401, "Authorization must be 'Bearer <token>'", {"WWW-Authenticate": "Bearer"})
        principal = state.tokens.lookup(secret.strip(), time.monotonic())
        if principal is None:
            raise HTTPException(401, "unknown or revoked token", {"WWW-Authenticate": "Bearer"})
        return principal
    if state.open_mode.is_open():
        return OPEN_PRINCIPAL
    raise HTTPException(401, "a bearer token is required", {"WWW-Authenticate": "Bearer"})


def require(*any_of: str):
    """Dependency: the caller holds at least one of these scopes."""

    def dependency(request: Request, authorization: Annotated[str | None, Header()] = None) -> Principal:
        principal = _principal(request, authorization)
        if not any(principal.has(s) for s in any_of):
            raise HTTPException(403, f"this needs the {' or '.join(any_of)} scope")
        return principal

    return dependency


DbDep = Annotated[Database, Depends(get_db)]
MetricsDep = Annotated[MetricStore, Depends(get_metric_store)]
IngestDep = Annotated[Principal, Depends(require("ingest"))]
ReadDep = Annotated[Principal, Depends(require("read"))]
ReadOrIngestDep = Annotated[Principal, Depends(require("read", "ingest"))]
AdminDep = Annotated[Principal, Depends(require("admin"))]
