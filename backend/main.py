"""The FastAPI application: `create_app(settings)` wires store, API, watchers and dashboard."""
from __future__ import annotations

import ipaddress
import logging
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles

from backend import migrate
from backend.api.errors import error_response, install_error_handlers
from backend.api.routes import alerts, components, control, meta, metrics, parity, rules, runs, webhooks
from backend.api.routes.meta import add_prometheus
from backend.auth import TokenCache, has_active_tokens
from backend.control_watch import ControlWatcher
from backend.detect.engine import DetectionEngine
from backend.db import Database
from backend.middleware import BodySizeLimit, SecurityHeaders
from backend.schemas import ErrorResponse, Health
from backend.settings import Settings, get_settings
from backend.store.metrics import MetricStore
from backend.webhooks.dispatcher import Dispatcher

log = logging.getLogger("paritywatch")
FRONTEND_DIR = Path(__file__).resolve().parent.parent / "frontend"
API_PREFIX = "/api/v1"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class OpenMode:
    """No tokens + loopback bind = open server. Creating a token closes it within seconds."""

    def __init__(self, db: Database, loopback: bool, ttl_s: float = 2.0):
        self.db, self.loopback, self.ttl_s = db, loopback, ttl_s
        self._checked_at = -1e9
        self._open = False

    def is_open(self) -> bool:
        if not self.loopback:
            return False
        now = time.monotonic()
        if now - self._checked_at > self.ttl_s:
            self._open = not has_active_tokens(self.db)
            self._checked_at = now
        return self._open


class Counters:
    """Process-local counters for /metrics."""

    def __init__(self):
        self._lock = threading.Lock()
        self.points = 0
        self.batches = 0
        self.duplicates = 0

    def record_ingest(self, points: int, duplicate: bool) -> None:
        with self._lock:
            self.batches += 1
            self.points += points
            self.duplicates += int(duplicate)


def _operation_id(route: APIRoute) -> str:
    return f"{route.tags[0] if route.tags else 'api'}-{route.name}"


def create_app(settings: Settings | None = None, *, upgrade_schema: bool = True) -> FastAPI:
    settings = settings or get_settings()
    db = Database(settings.database_url)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if upgrade_schema:
            migrate.upgrade(settings.database_url)
        app.state.schema_revision = migrate.current_revision(settings.database_url)
        app.state.control_watcher.start()
        if settings.run_background_workers:
            app.state.dispatcher.start()
            app.state.engine.start()
        if app.state.open_mode.is_open():
            log.warning(
                "\n%s\n  PARITYWATCH IS RUNNING OPEN: no API tokens exist, so every local caller is admin.\n"
                "  Create one with `paritywatch token create --scope admin` to require tokens.\n%s",
                "!" * 78, "!" * 78,
            )
        yield
        await app.state.control_watcher.stop()
        if settings.run_background_workers:
            app.state.engine.stop()
            app.state.dispatcher.stop()
        db.dispose()

    app = FastAPI(
        title="Paritywatch",
        version="0.1.0",
        description="Trainer / rollout processor parity for async RL runs.",
        lifespan=lifespan,
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url="/api/docs",
        redoc_url=None,
        generate_unique_id_function=_operation_id,
        responses={code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 413, 422)},
    )
    app.state.settings = settings
    app.state.db = db
    app.state.metrics = MetricStore(db)
    app.state.tokens = TokenCache(db)
    app.state.open_mode = OpenMode(db, is_loopback(settings.host))
    app.state.counters = Counters()
    app.state.control_watcher = ControlWatcher(db, settings.control_poll_interval_s)
    app.state.dispatcher = Dispatcher(db, settings)
    app.state.dispatcher_wake = app.state.dispatcher.wake
    app.state.engine = DetectionEngine(
        db, settings, on_control_change=app.state.control_watcher.notify, on_outbox=app.state.dispatcher.wake
    )
    app.state.schema_revision = None

    install_error_handlers(app)
    api = APIRouter(prefix=API_PREFIX)
    for module in (runs, components, metrics, control, parity, alerts, rules, webhooks, meta):
        api.include_router(module.router)
    app.include_router(api)
    _add_health(app)
    add_prometheus(app)
    if settings.serve_dashboard:
        _add_dashboard_routes(app)
    _add_api_fallback(app)  # after every API route, before the static mount
    if settings.serve_dashboard:
        _mount_static(app)
    app.add_middleware(SecurityHeaders)
    app.add_middleware(BodySizeLimit, limit=settings.max_body_bytes)
    return app


def _add_api_fallback(app: FastAPI) -> None:
    """Unknown API paths and wrong methods get the JSON error shape (404 / 405 with Allow)
    instead of falling through to the dashboard's static files."""
    methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]

    @app.api_route("/api/{rest:path}", methods=methods, include_in_schema=False)
    def api_fallback(request: Request):
        allowed = [m for m in methods if _matches_fully(app, {**request.scope, "method": m})]
        if allowed:
            return error_response(405, f"{request.method} is not allowed here", headers={"Allow": ", ".join(allowed)})
        return error_response(404, f"no API endpoint {request.url.path}")


def _matches_fully(app: FastAPI, scope: dict) -> bool:
    from starlette.routing import Match, Mount

    for route in app.router.routes:
        if isinstance(route, Mount) or getattr(route, "path", None) == "/api/{rest:path}":
            continue
        if route.matches(scope)[0] == Match.FULL:
            return True
    return False


def _add_health(app: FastAPI) -> None:
    @app.get("/healthz", response_model=Health, tags=["health"], operation_id="health-healthz")
    def healthz() -> Health:
        st = app.state
        return Health(
            status="ok",
            database=st.db.dialect,
            schema_revision=st.schema_revision,
            open_mode=st.open_mode.is_open(),
        )


def _add_dashboard_routes(app: FastAPI) -> None:
    import plotly

    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"

    @app.get(f"/vendor/plotly-{plotly.__version__}.min.js", include_in_schema=False)
    def plotly_bundle() -> FileResponse:
        return FileResponse(plotly_js, media_type="text/javascript", headers={"Cache-Control": "max-age=31536000, immutable"})

    plotly_url = f"/vendor/plotly-{plotly.__version__}.min.js"

    @app.get("/api/v1/ui-config", include_in_schema=False)
    def ui_config() -> dict:
        return {"plotly_url": plotly_url, "version": app.version}

    index = FRONTEND_DIR / "index.html"
    if index.is_file():
        # The page names the versioned plotly URL so the browser preloads it during HTML parsing.
        html = index.read_text().replace("%PLOTLY_URL%", plotly_url)

        @app.get("/", include_in_schema=False)
        @app.get("/index.html", include_in_schema=False)
        def dashboard_page() -> HTMLResponse:
            return HTMLResponse(html, headers={"Cache-Control": "no-cache"})


def _mount_static(app: FastAPI) -> None:
    if FRONTEND_DIR.is_dir():
        app.mount("/", StaticFiles(directory=FRONTEND_DIR, html=True), name="dashboard")
    else:  # pragma: no cover - an installed wheel without the dashboard
        @app.get("/", include_in_schema=False)
        def no_dashboard():
            return error_response(404, "dashboard files are not installed")
