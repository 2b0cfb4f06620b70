"""Typed dependencies: a route's signature reads like a sentence (`run_id: int, who: AdminDep`).

Who may call a route is declared once, by the scope dependency in its signature (`IngestDep`,
`ReadDep`...). The request guard (backend/middleware.py) reads those declarations from the app
before it reads any request body, so an unauthenticated or under-scoped caller costs nothing;
`route_access_table` turns them into the table in docs/api.md.
"""
from __future__ import annotations

import asyncio
import functools
import inspect
import re
import sys
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from contextlib import AbstractContextManager, asynccontextmanager
from typing import Annotated, Any, AsyncIterator, Callable, Iterator

from fastapi import Depends, Header, Request
from fastapi.routing import APIRoute
from fastapi.exceptions import HTTPException
from starlette.concurrency import run_in_threadpool
from sqlalchemy.orm import Session
from starlette.routing import Mount, Route, compile_path

from paritywatch.backend.alerts.effects import Effects
from paritywatch.backend.alerts.notifier import Notifier
from paritywatch.backend.auth import OpenMode, Principal
from paritywatch.backend.control.watch import ControlWatcher
from paritywatch.backend.db import Database
from paritywatch.backend.background.engine import DetectionEngine
from paritywatch.backend.background.janitor import Janitor
from paritywatch.backend.background.live import StreamHub
from paritywatch.backend.settings import Settings
from paritywatch.backend.store import runs as run_store
from paritywatch.backend.store.metrics import MetricStore
from paritywatch.backend.webhooks.dispatcher import Dispatcher
from paritywatch.backend.webhooks.ssrf import Resolver

PRINCIPAL_KEY = "paritywatch.principal"  # where the request guard leaves the caller, in the ASGI scope


# The dependencies below are `async def` though they do no I/O: FastAPI runs a plain `def`
# dependency on its thread pool, a thread hop per dependency per request (on the ingest path that
# was a fifth of the server's time). One that may query runs it on the pool itself.

async def get_db(request: Request) -> Database:
    return request.app.state.db


async def get_metric_store(request: Request) -> MetricStore:
    return request.app.state.metrics


def app_service(name: str) -> Callable[[Request], Any]:
    """A dependency that hands a route one of the services create_app keeps on app.state, so a
    route names what it uses in its signature (`engine: EngineDep`) and never reaches into
    request.app.state itself."""
    async def service(request: Request) -> Any:
        return getattr(request.app.state, name)
    service.__name__ = f"get_{name}"
    return service


# --- the answer's transaction (docs/design.md, "The store and its transactions") ---


# Ending an answer's transaction has threads of its own. Until it ends, a transaction holds what
# other requests wait for (SQLite's write lock, PostgreSQL's row locks, a pooled connection), and
# those waiters can hold every thread of the pool the routes run on: 256 processes' heartbeats
# queued behind the group-commit writer did (bench/alerts.py), and an end waiting for a thread of
# that pool waited for threads that waited for it, for ever. An end (a commit or rollback, a
# connection returned) waits for no other transaction, so a few threads serve every request.
_ENDINGS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="paritywatch-tx-end")


@asynccontextmanager
async def _transaction(opened: AbstractContextManager[Session], effects: Effects | None = None
                       ) -> AsyncIterator[Session]:
    """The session of one answer, its transaction closed before the answer is sent (the
    dependencies are declared with scope="function": FastAPI's default closes them after
    sending, so a failed commit would follow a 200). The session begins at its first
    statement, so a route that awaits first (a long poll) holds no transaction while it waits.
    Entering opens nothing. A plain `def` route has ended it already (`AnswerRoute`); one still
    open (an `async def` route's) is ended on `_ENDINGS`; a session that never began (a heartbeat
    of a live process) closes on the loop. What the commit sets off
    (`effects`: wake-ups, `after_commit` work such as detection, which may wait for the writer)
    runs afterwards on the routes' pool."""
    s = opened.__enter__()
    wake = effects.track(s) if effects is not None else None
    failure: tuple = (None, None, None)
    try:
        yield s
    except BaseException:
        failure = sys.exc_info()
        raise
    finally:
        if s.in_transaction():
            # Shielded: a cancelled request must not leave its transaction (and the lock) open.
            await asyncio.shield(asyncio.get_running_loop().run_in_executor(_ENDINGS, opened.__exit__, *failure))
        else:
            opened.__exit__(*failure)
    if wake is not None and wake.pending():  # committed: an error was re-raised above
        await run_in_threadpool(effects.fire, wake)


class AnswerRoute(APIRoute):
    """The route class of every API router: a plain `def` endpoint ends its answer's transactions
    in its own thread, as it returns (commit) or raises (rollback).

    FastAPI closes a dependency only once the response is validated, and it validates a plain
    `def` endpoint's response on the thread pool: a second thread, asked for while the transaction
    still holds what other requests wait for (SQLite's write lock, PostgreSQL's row locks). Under
    load those waiters hold every thread of the pool (200 rollout workers registering at once in
    bench/alerts.py), and the validation waited for a thread that waited for it: the server
    stopped answering. Ended in the endpoint's thread, nothing is held past it."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        if not inspect.iscoroutinefunction(endpoint) and not getattr(endpoint, "ends_its_transactions", False):
            endpoint = _ending_its_transactions(endpoint)
        super().__init__(path, endpoint, **kwargs)


def _ending_its_transactions(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(endpoint)  # FastAPI reads the signature (and its globals) through __wrapped__
    def answer(*args: Any, **kwargs: Any) -> Any:
        sessions = [value for value in kwargs.values() if isinstance(value, Session)]
        try:
            result = endpoint(*args, **kwargs)
            for s in sessions:
                if s.in_transaction():
                    s.commit()
        except BaseException:
            for s in sessions:
                s.rollback()
            raise
        return result
    answer.ends_its_transactions = True  # type: ignore[attr-defined]
    return answer


async def read_session(request: Request) -> AsyncIterator[Session]:
    """One read transaction for the answer (SQLite: DEFERRED, beside the writer)."""
    async with _transaction(request.app.state.db.read()) as s:
        yield s


async def write_session(request: Request) -> AsyncIterator[Session]:
    """One write transaction for the answer, committed before it is sent; its wake-ups and
    `after_commit` calls run once it has committed (backend/alerts/effects.py)."""
    state = request.app.state
    async with _transaction(state.db.write(), state.effects) as s:
        yield s


@dataclass(frozen=True)
class Access:
    scopes: tuple[str, ...] | None  # any one of these; None = public
    large_body: bool = False  # metric batches and fingerprints: max_body_bytes, else max_small_body_bytes

    def describe(self) -> str:
        return "public" if not self.scopes else " or ".join(self.scopes)


PUBLIC = Access(None)


class ScopeRequirement:
    """Dependency: the caller holds one of `scopes`; a project-bound token only reaches runs of
    its project. The guard already authenticated the caller and checked the scope before the
    body was read; this re-check keeps a route safe even if it were mounted without the guard."""

    def __init__(self, scopes: tuple[str, ...], large_body: bool = False):
        self.access = Access(scopes, large_body)

    # `authorization` is not read here (the guard did): it stays so the OpenAPI schema documents it.
    async def __call__(self, request: Request, authorization: Annotated[str | None, Header()] = None) -> Principal:
        return await self.authorize(request.scope.get(PRINCIPAL_KEY), request.path_params.get("run_id"),
                                    request.app.state.run_projects)

    async def authorize(self, principal: Principal | None, run_id: int | str | None,
                        projects: "RunProjects") -> Principal:
        """The caller, if it holds one of the scopes and (a project-bound token) `run_id` is a run
        of its project; 401 / 403 otherwise (404 for a run that does not exist)."""
        if principal is None:
            raise HTTPException(401, "a bearer token is required", {"WWW-Authenticate": "Bearer"})
        if not any(principal.has(s) for s in self.access.scopes):
            raise HTTPException(403, f"this needs the {' or '.join(self.access.scopes)} scope")
        if principal.project is not None and run_id is not None:
            run_id = int(run_id)
            project = projects.cached(run_id)
            if project is None:  # a query: on the thread pool, never on the event loop
                project = await run_in_threadpool(projects.project_of, run_id)
            if project != principal.project:
                raise HTTPException(403, f"this token writes only to project {principal.project!r}")
        return principal


def require(*any_of: str, large_body: bool = False) -> ScopeRequirement:
    return ScopeRequirement(tuple(any_of), large_body)


def require_project(who: Principal, project: str) -> None:
    """For routes that name the project in the body (creating a run)."""
    if not who.may_write(project):
        raise HTTPException(403, f"this token writes only to project {who.project!r}, not {project!r}")


class RunProjects:
    """run id -> project, cached (a run never changes project): the binding check costs no query
    on the hot ingest path."""

    def __init__(self, db: Database, size: int = 4096):
        self.db, self.size = db, size
        self._lock = threading.Lock()
        self._cache: OrderedDict[int, str] = OrderedDict()

    def cached(self, run_id: int) -> str | None:
        with self._lock:
            if run_id in self._cache:
                self._cache.move_to_end(run_id)
                return self._cache[run_id]
        return None

    def project_of(self, run_id: int) -> str:
        project = self.cached(run_id)
        if project is not None:
            return project
        with self.db.read() as s:  # its own read: authorising comes before the answer's session
            project = run_store.get_run(s, run_id).project  # NotFound -> 404
        with self._lock:
            self._cache[run_id] = project
            while len(self._cache) > self.size:
                self._cache.popitem(last=False)
        return project


# --- the route x scope table, read from the app ---


@dataclass(frozen=True)
class RouteAccess:
    method: str
    path: str
    access: Access
    regex: re.Pattern


def _walk(routes, prefix: str = "") -> Iterator[tuple[str, Route]]:
    for route in routes:
        if hasattr(route, "original_router"):  # fastapi's included router (nested, not copied)
            yield from _walk(route.original_router.routes, prefix + route.include_context.prefix)
        elif isinstance(route, Route):
            yield prefix + route.path, route
        elif isinstance(route, Mount):
            continue  # the static dashboard: public
        # anything else (websocket routes...) is not served by this app


def _access_of(route: Route) -> Access:
    dependant = getattr(route, "dependant", None)
    stack = [dependant] if dependant is not None else []
    while stack:
        dep = stack.pop()
        if isinstance(dep.call, ScopeRequirement):
            return dep.call.access
        stack.extend(dep.dependencies)
    return PUBLIC


def route_access_table(app) -> list[RouteAccess]:
    """Every (method, path) the app serves with who may call it, in routing order."""
    table = []
    for path, route in _walk(app.routes):
        regex = compile_path(path)[0]
        access = _access_of(route)
        for method in sorted(route.methods or ()):
            table.append(RouteAccess(method, path, access, regex))
    return table


def access_for(app, method: str, path: str) -> Access:
    table = getattr(app.state, "route_access", None)
    if table is None:
        table = app.state.route_access = route_access_table(app)
    for entry in table:
        if entry.method == method and entry.regex.match(path):
            return entry.access
    return PUBLIC


DbDep = Annotated[Database, Depends(get_db)]
ReadSession = Annotated[Session, Depends(read_session, scope="function")]
WriteSession = Annotated[Session, Depends(write_session, scope="function")]
MetricsDep = Annotated[MetricStore, Depends(get_metric_store)]
SettingsDep = Annotated[Settings, Depends(app_service("settings"))]
EffectsDep = Annotated[Effects, Depends(app_service("effects"))]
EngineDep = Annotated[DetectionEngine, Depends(app_service("engine"))]
NotifierDep = Annotated[Notifier, Depends(app_service("notifier"))]
JanitorDep = Annotated[Janitor, Depends(app_service("janitor"))]
StreamsDep = Annotated[StreamHub, Depends(app_service("streams"))]
ControlWatcherDep = Annotated[ControlWatcher, Depends(app_service("control_watcher"))]
OpenModeDep = Annotated[OpenMode, Depends(app_service("open_mode"))]
DispatcherDep = Annotated[Dispatcher, Depends(app_service("dispatcher"))]
ResolverDep = Annotated[Resolver, Depends(app_service("resolver"))]
IngestDep = Annotated[Principal, Depends(require("ingest"))]
# Routes that take big bodies (a metric batch, a fingerprint of a 128k vocabulary).
INGEST_BULK = require("ingest", large_body=True)
IngestBulkDep = Annotated[Principal, Depends(INGEST_BULK)]
ReadDep = Annotated[Principal, Depends(require("read"))]
ReadOrIngestDep = Annotated[Principal, Depends(require("read", "ingest"))]
AdminDep = Annotated[Principal, Depends(require("admin"))]
