"""The FastAPI application: `create_app(settings)` wires store, API, watchers and dashboard."""
from __future__ import annotations

import asyncio
import functools
import gc
import logging
from contextlib import asynccontextmanager, suppress
from html import escape as html_escape
from pathlib import Path

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from starlette.routing import BaseRoute

from paritywatch.backend import migrate
from paritywatch.backend.api.deps import RunProjects, route_access_table
from paritywatch.backend.api.errors import error_response, install_error_handlers
from paritywatch.backend.api.fast_ingest import MetricBatchFastPath
from paritywatch.backend.api.ingest import IngestServices
from paritywatch.backend.alerts.effects import Effects
from paritywatch.backend.alerts.notifier import Notifier
from paritywatch.backend.api.query import reject_unknown_query
from paritywatch.backend.api.routes import (alerts, attestations, audits, components, control, meta, metrics, packs,
                                           parity, rules, runs, silences, webhooks, workers)
from paritywatch.backend.api.routes.meta import add_prometheus, make_registry
from paritywatch.backend.auth import OpenMode, TokenCache
from paritywatch.backend.control.watch import ControlWatcher
from paritywatch.backend.background.engine import DetectionEngine
from paritywatch.backend.db import Database
from paritywatch.backend.background.janitor import Janitor
from paritywatch.backend.background.live import StreamHub
from paritywatch.backend.middleware import RequestGuard, SecurityHeaders
from paritywatch.backend.models import ALERT_KINDS, RUN_STATES
from paritywatch.backend.schemas.common import ErrorResponse
from paritywatch.backend.schemas.meta import ControlActionOut, EventTypeOut, Health, UiConfig
from paritywatch.backend.serving import redact_logs
from paritywatch.backend.settings import Settings, get_settings
from paritywatch.backend.store.metrics import MetricStore
from paritywatch.backend.webhooks.dispatcher import Dispatcher
from paritywatch.backend.webhooks.secrets import reseal_all
from paritywatch.backend.webhooks.ssrf import Resolver, system_resolver
from trainer_hooks import contract
from trainer_hooks.contract import API_PREFIX

log = logging.getLogger("paritywatch")
FRONTEND_DIR = Path(__file__).resolve().parent.parent / "frontend"


def _operation_id(route: APIRoute) -> str:
    return f"{route.tags[0] if route.tags else 'api'}-{route.name}"


def create_app(settings: Settings | None = None, *, upgrade_schema: bool = True,
               resolver: Resolver = system_resolver) -> FastAPI:
    """`resolver` resolves webhook hosts (tests pass a stub so nothing is ever sent to them)."""
    settings = settings or get_settings()
    redact_logs()
    db = Database(settings.database_url)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if upgrade_schema:
            migrate.upgrade(settings.database_url)
        app.state.schema_revision = migrate.current_revision(settings.database_url)
        resealed = reseal_all(db, app.state.dispatcher.box, legacy_only=True)
        if resealed:
            log.info("encrypted %d webhook secret(s) stored before encryption at rest", resealed)
        app.state.control_watcher.start()
        if settings.run_background_workers:
            # The sweep counts a process's silence only while this loop ran (backend/alerts/hearing.py).
            hearing = asyncio.create_task(app.state.engine.hearing.listen())
            app.state.dispatcher.start()
            app.state.engine.start()
            app.state.janitor.start()
            app.state.notifier.start()
        if app.state.open_mode.is_open():
            log.warning(
                "\n%s\n  PARITYWATCH IS RUNNING OPEN: no API token exists, so callers on this machine are admin\n"
                "  (requests from other machines, other Host names and other sites' pages are refused).\n"
                "  Create a token with `paritywatch token create --scope admin` to require tokens.\n%s",
                "!" * 78, "!" * 78,
            )
        # The heap built so far (the frameworks, the app, its caches) lives as long as the server:
        # frozen, the cycle collector no longer walks it. Each full collection walked it with the
        # event loop stopped (load bench: up to 228 ms each).
        if settings.freeze_startup_heap:
            gc.freeze()
        yield
        if settings.freeze_startup_heap:
            gc.unfreeze()
        app.state.streams.close_all()
        await app.state.control_watcher.stop()
        if settings.run_background_workers:
            hearing.cancel()
            with suppress(asyncio.CancelledError):
                await hearing
            app.state.janitor.stop()
            app.state.engine.stop()
            app.state.notifier.stop()
            app.state.dispatcher.stop()
        db.dispose()

    app = FastAPI(
        title="Paritywatch",
        version="0.1.0",
        description="Trainer / rollout processor parity for async RL runs.",
        lifespan=lifespan,
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url=None,  # _add_api_docs: Swagger UI from installed assets, under the CSP
        redoc_url=None,
        generate_unique_id_function=_operation_id,
        responses=ERROR_RESPONSES,
    )
    app.state.settings = settings
    app.state.db = db
    app.state.metrics = MetricStore(db, max_step_ahead=settings.max_step_ahead,
                                    max_new_keys_per_batch=settings.max_new_keys_per_batch,
                                    max_keys_per_run=settings.max_keys_per_run)
    app.state.tokens = TokenCache(db)
    app.state.open_mode = OpenMode(db, settings.open_mode)
    app.state.run_projects = RunProjects(db)
    app.state.control_watcher = ControlWatcher(db, settings.control_poll_interval_s)
    app.state.registry, app.state.counters = make_registry(db, app.state.control_watcher)
    app.state.streams = StreamHub(db, app.state.tokens, app.state.open_mode, settings)
    app.state.resolver = resolver
    app.state.dispatcher = Dispatcher(db, settings, resolver=resolver)
    app.state.effects = Effects(
        public_url=settings.public_url or f"http://{settings.host}:{settings.port}",
        default_group_by=tuple(settings.webhook_group_by),
        on_control_change=app.state.control_watcher.notify,
        on_notify=lambda: app.state.notifier.wake(),
        on_outbox=app.state.dispatcher.wake,
    )
    app.state.notifier = Notifier(db, settings, app.state.effects)
    app.state.engine = DetectionEngine(db, settings, app.state.effects)
    app.state.janitor = Janitor(db, app.state.metrics, settings)
    app.state.ingest = IngestServices(app.state.metrics, settings, app.state.engine, app.state.counters)
    app.state.schema_revision = None

    install_error_handlers(app)
    app.router.routes.extend(_api_routes())
    _add_health(app)
    _add_api_docs(app)
    _add_bearer_security(app)
    add_prometheus(app)
    if settings.serve_dashboard:
        _add_dashboard_routes(app)
    _add_api_fallback(app)  # after every API route, before the static mount
    if settings.serve_dashboard:
        _mount_static(app)
    # Innermost first: the fast path runs after the guard's checks, its answers get the headers.
    app.add_middleware(MetricBatchFastPath, services=app.state.ingest, projects=app.state.run_projects)
    app.add_middleware(SecurityHeaders)
    app.add_middleware(RequestGuard, tokens=app.state.tokens, open_mode=app.state.open_mode,
                       small_limit=settings.max_small_body_bytes, large_limit=settings.max_body_bytes,
                       max_points=settings.max_points_per_batch, body_timeout_s=settings.body_timeout_s)
    return app


ERROR_RESPONSES = {code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 413, 422)}  # every operation's


@functools.cache
def _api_routes() -> tuple[BaseRoute, ...]:
    """The API's routes, built once per process, as `app.include_router` would build them on the
    app's router (its default responses and operation ids). FastAPI analyses every endpoint's
    parameters each time a router is included (~10 ms a route, 0.6 s an app); the routes keep no
    state of an app (handlers reach it through `request.app`, and nothing here overrides
    dependencies), so every app of a process shares them: the test suite builds ~1,000 apps."""
    api = APIRouter(prefix=API_PREFIX, dependencies=[Depends(reject_unknown_query)])
    for module in (runs, components, attestations, metrics, audits, control, parity, workers, alerts, silences, rules,
                   packs, webhooks, meta):
        api.include_router(module.router)
    api.include_router(runs.deletions)
    api.include_router(webhooks.events_router)
    built = APIRouter(responses=ERROR_RESPONSES, generate_unique_id_function=_operation_id)
    built.include_router(api)
    return tuple(built.routes)


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


IMMUTABLE = "public, max-age=31536000, immutable"  # versioned URLs: a new version is a new URL


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header admits gzip (by name or `*`, with a q-value above 0)."""
    for part in accept_encoding.lower().split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip() not in ("gzip", "*"):
            continue
        q = params.strip()
        if not q.startswith("q="):
            return True
        try:
            return float(q[2:]) > 0
        except ValueError:
            return False
    return False


def plotly_bundle() -> tuple[str, Path, Path | None]:
    """(URL, file, gzipped file or None) of the plotly.js the dashboard loads: the partial bundle
    scripts/fetch_plotly_bundle.sh put in frontend/vendor/ (about a quarter of the full bundle,
    gzipped once), else the full bundle inside the Python plotly package."""
    import plotly
    import plotly.offline

    version = plotly.offline.get_plotlyjs_version()
    partial = FRONTEND_DIR / "vendor" / f"plotly-basic-{version}.min.js"
    gzipped = partial.with_name(partial.name + ".gz")
    if partial.is_file() and gzipped.is_file():
        return f"/vendor/{partial.name}", partial, gzipped
    full = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    log.info("plotly.js: serving the full bundle (%s); `make install` fetches the smaller partial one", full)
    return f"/vendor/plotly-{version}.min.js", full, None


def static_asset(path: Path, gzipped: Path | None, request: Request, media_type: str) -> FileResponse:
    """A versioned asset, immutable; its precompressed copy when the client accepts gzip."""
    headers = {"Cache-Control": IMMUTABLE}
    if gzipped is not None:
        headers["Vary"] = "Accept-Encoding"
        if accepts_gzip(request.headers.get("accept-encoding", "")):
            return FileResponse(gzipped, media_type=media_type, headers={**headers, "Content-Encoding": "gzip"})
    return FileResponse(path, media_type=media_type, headers=headers)


def _add_api_docs(app: FastAPI) -> None:
    """Interactive API docs at /api/docs: Swagger UI from the assets the `fastapi-offline` package
    ships (FastAPI's default page loads them from a CDN, which the CSP blocks and an air-gapped
    cluster cannot reach), started by a script file (the CSP runs no inline script)."""
    from importlib import metadata, resources

    page_file, init_file = FRONTEND_DIR / "api-docs.html", FRONTEND_DIR / "api-docs.js"
    if not page_file.is_file():  # pragma: no cover - an installed wheel without frontend/
        return
    assets = Path(str(resources.files("fastapi_offline"))) / "static"
    base = f"/vendor/swagger-ui-{metadata.version('fastapi-offline')}"  # versioned: immutable
    media_types = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css", "favicon.png": "image/png"}
    page = page_file.read_text().replace("%SWAGGER_UI%", base).replace("%OPENAPI_URL%", app.openapi_url)

    @app.get("/api/docs", include_in_schema=False)
    def api_docs() -> HTMLResponse:
        return HTMLResponse(page, headers={"Cache-Control": "no-cache"})

    @app.get("/api/docs/init.js", include_in_schema=False)
    def api_docs_init() -> FileResponse:
        return FileResponse(init_file, media_type="text/javascript", headers={"Cache-Control": "no-cache"})

    @app.get(base + "/{name}", include_in_schema=False)
    def swagger_ui_asset(name: str, request: Request):
        if name not in media_types:
            return error_response(404, f"no Swagger UI asset {name}")
        return static_asset(assets / name, None, request, media_types[name])


BEARER_SCHEME = "bearerAuth"


def _add_bearer_security(app: FastAPI) -> None:
    """The token as OpenAPI says it: a bearer security scheme, required by every operation whose
    route declares a scope (the declarations the request guard enforces, deps.route_access_table),
    by no public one. Swagger UI then has an Authorize button and sends the token with "Try it out"
    (OpenAPI ignores a header parameter named Authorization, which is all the schema had)."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = build()
            schema.setdefault("components", {}).setdefault("securitySchemes", {})[BEARER_SCHEME] = {
                "type": "http", "scheme": "bearer",
                "description": "A token from `paritywatch token create` (scopes: ingest, read, admin). Not needed in "
                               "open mode, for callers on the server's machine."}
            for entry in route_access_table(app):
                operation = schema["paths"].get(entry.path, {}).get(entry.method.lower())
                if operation is not None and entry.access.scopes:
                    operation["security"] = [{BEARER_SCHEME: []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def ui_config_for(version: str, plotly_url: str) -> UiConfig:
    return UiConfig(
        api_prefix=API_PREFIX, version=version, plotly_url=plotly_url, severities=list(contract.SEVERITIES),
        run_states=list(RUN_STATES), live_run_states=list(contract.LIVE_RUN_STATES),
        control_actions={action: ControlActionOut(allowed_from=list(allowed_from), target=target)
                         for action, (allowed_from, target) in contract.RUN_CONTROL_ACTIONS.items()},
        alert_kinds=list(ALERT_KINDS), fingerprint_component_order=list(contract.FINGERPRINT_COMPONENT_ORDER),
        webhook_events=[EventTypeOut(type=name, description=text)
                        for name, text in contract.WEBHOOK_EVENT_DESCRIPTIONS.items()])


def _add_dashboard_routes(app: FastAPI) -> None:
    plotly_url, plotly_js, plotly_gz = plotly_bundle()

    @app.get(plotly_url, include_in_schema=False)
    def plotly_js_bundle(request: Request) -> FileResponse:
        return static_asset(plotly_js, plotly_gz, request, "text/javascript")

    config = ui_config_for(app.version, plotly_url)

    @app.get(API_PREFIX + "/ui-config", response_model=UiConfig, tags=["meta"], operation_id="meta-ui_config",
             summary="What the dashboard needs from the wire contract (public)")
    def ui_config() -> UiConfig:
        return config

    index = FRONTEND_DIR / "index.html"
    if index.is_file():
        # The page names the versioned plotly URL so the browser preloads it during HTML parsing,
        # and carries the ui-config document so the first paint waits for no request.
        embedded = html_escape(config.model_dump_json(), quote=True)
        html = index.read_text().replace("%PLOTLY_URL%", plotly_url).replace("%UI_CONFIG%", embedded)

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
