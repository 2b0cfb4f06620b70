"""Every endpoint x every scope, secrets never leak, signed and replay-protected
webhooks, the SSRF guard, CORS off by default, security headers on every kind of response."""
from __future__ import annotations

import hashlib
import itertools
import json
import time
import uuid

import httpx
import pytest
from starlette.routing import Mount, Route

from paritywatch.backend.alerts import lifecycle
from paritywatch.backend.models import Run
from paritywatch.backend.webhooks import signing
from paritywatch.backend.webhooks.ssrf import AddressPolicy, UnsafeURL, check_url
from tests.support.live import WebhookReceiver, local_client, wait_for
from trainer_hooks.fingerprint.core import assemble

# Who may call each route of the app: "public" (no token), one scope, or "read|ingest".
# Keyed by (method, route.path) exactly as FastAPI declares them; a new route with no entry
# here fails test_every_route_has_an_access_entry.
ACCESS: dict[tuple[str, str], str] = {
    ("GET", "/api/v1/openapi.json"): "public",
    ("GET", "/api/docs"): "public",
    ("GET", "/api/docs/init.js"): "public",
    ("GET", "/vendor/swagger-ui-{version}/{name}"): "public",
    ("GET", "/api/v1/ui-config"): "public",
    ("GET", "/"): "public",  # the dashboard page (its data needs a token)
    ("GET", "/index.html"): "public",
    ("GET", "/vendor/plotly-{version}.min.js"): "public",
    ("GET", "/healthz"): "public",
    ("GET", "/metrics"): "read",
    ("POST", "/api/v1/runs"): "ingest",
    ("GET", "/api/v1/runs"): "read",
    ("GET", "/api/v1/runs/{run_id}"): "read",
    ("DELETE", "/api/v1/runs/{run_id}"): "admin",
    ("GET", "/api/v1/run-deletions"): "read",
    ("POST", "/api/v1/runs/{run_id}/components"): "ingest",
    ("POST", "/api/v1/runs/{run_id}/components/{component_id}/heartbeat"): "ingest",
    ("POST", "/api/v1/runs/{run_id}/components/{component_id}/fingerprint"): "ingest",
    ("GET", "/api/v1/fingerprints/{digest}"): "read",
    ("POST", "/api/v1/runs/{run_id}/metrics"): "ingest",
    ("GET", "/api/v1/runs/{run_id}/metrics"): "read",
    ("GET", "/api/v1/runs/{run_id}/series"): "read",
    ("GET", "/api/v1/runs/{run_id}/series/times"): "read",
    ("POST", "/api/v1/runs/{run_id}/components/{component_id}/attestations"): "ingest",
    ("GET", "/api/v1/runs/{run_id}/attestations"): "read",
    ("GET", "/api/v1/runs/{run_id}/attestations/versions"): "read",
    ("POST", "/api/v1/runs/{run_id}/audits"): "ingest",
    ("GET", "/api/v1/runs/{run_id}/audits"): "read",
    ("GET", "/api/v1/runs/{run_id}/audits/samples"): "read",
    ("GET", "/api/v1/runs/{run_id}/control"): "read|ingest",
    ("GET", "/api/v1/runs/{run_id}/control/wait"): "read|ingest",
    ("POST", "/api/v1/runs/{run_id}/control"): "admin",
    ("POST", "/api/v1/runs/{run_id}/control/stopped"): "ingest",
    ("GET", "/api/v1/runs/{run_id}/control/audit"): "read",
    ("GET", "/api/v1/runs/{run_id}/parity"): "read",
    ("GET", "/api/v1/runs/{run_id}/taint"): "read",
    ("GET", "/api/v1/runs/{run_id}/workers"): "read",
    ("GET", "/api/v1/runs/{run_id}/workers/series"): "read",
    ("GET", "/api/v1/runs/{run_id}/alerts"): "read",
    ("GET", "/api/v1/alerts"): "read",
    ("POST", "/api/v1/alerts/{alert_id}/acknowledge"): "admin",
    ("POST", "/api/v1/alerts/{alert_id}/resolve"): "admin",
    ("GET", "/api/v1/alerts/{alert_id}/events"): "read",
    ("GET", "/api/v1/runs/{run_id}/settings"): "read",
    ("PUT", "/api/v1/runs/{run_id}/settings"): "admin",
    ("GET", "/api/v1/runs/{run_id}/rules"): "read",
    ("POST", "/api/v1/runs/{run_id}/rules"): "admin",
    ("POST", "/api/v1/projects/{project}/rules"): "admin",
    ("GET", "/api/v1/packs"): "read",
    ("GET", "/api/v1/projects/{project}/settings"): "read",
    ("PUT", "/api/v1/projects/{project}/settings"): "admin",
    ("PATCH", "/api/v1/rules/{rule_id}"): "admin",
    ("DELETE", "/api/v1/rules/{rule_id}"): "admin",
    ("GET", "/api/v1/webhooks"): "admin",
    ("POST", "/api/v1/webhooks"): "admin",
    ("PATCH", "/api/v1/webhooks/{hook_id}"): "admin",
    ("DELETE", "/api/v1/webhooks/{hook_id}"): "admin",
    ("POST", "/api/v1/webhooks/{hook_id}/test"): "admin",
    ("GET", "/api/v1/webhooks/{hook_id}/deliveries"): "admin",
    ("GET", "/api/v1/whoami"): "read|ingest",
    ("GET", "/api/v1/runs/{run_id}/stream"): "read",
    ("POST", "/api/v1/runs/{run_id}/components/{component_id}/close"): "ingest",
    ("POST", "/api/v1/silences"): "admin",
    ("GET", "/api/v1/silences"): "read",
    ("POST", "/api/v1/silences/{silence_id}/expire"): "admin",
    ("GET", "/api/v1/webhook-events"): "read",
}
SCOPES = (None, "ingest", "read", "admin")
FINGERPRINT = assemble("tokenizer", {"vocab": "x"}, {})  # hashed as the hooks hash: the server recomputes it
RULE = {"key": "loss", "comparison": ">", "threshold": 10.0}
SILENCE = {"project": "sec", "duration_s": 60, "reason": "sec"}


def _routes(app) -> set[tuple[str, str]]:
    """Every (method, path) the app answers, walking into included routers (FastAPI nests them)."""
    out: set[tuple[str, str]] = set()

    def walk(routes, prefix: str) -> None:
        for route in routes:
            if isinstance(route, Route) and route.path == "/api/{rest:path}":
                continue  # the 404/405 fallback for unknown API paths: no endpoint of its own
            if isinstance(route, Route):  # APIRoute and the plain routes (openapi, docs)
                path = _versionless(prefix + route.path)
                out.update((m, path) for m in route.methods or () if m != "HEAD")
            elif hasattr(route, "original_router"):  # fastapi's included router
                walk(route.original_router.routes, prefix + route.include_context.prefix)
            elif isinstance(route, Mount) and route.path == "":
                continue  # the static dashboard at "/": public, checked by the header test
            else:
                raise AssertionError(f"route of unknown kind {route!r}: teach _routes about it")

    walk(app.routes, "")
    return out


def _versionless(path: str) -> str:
    """The vendored assets' routes carry their version (and plotly's its bundle): one key each."""
    if path.startswith("/vendor/plotly-"):
        return "/vendor/plotly-{version}.min.js"
    if path.startswith("/vendor/swagger-ui-"):
        return "/vendor/swagger-ui-{version}/{name}"
    return path


def _vendored_url(path: str) -> str:
    from importlib import metadata

    from paritywatch.backend.main import plotly_bundle

    if path == "/vendor/plotly-{version}.min.js":
        return plotly_bundle()[0]
    return path.format(version=metadata.version("fastapi-offline"), name="swagger-ui.css")


def _allowed(rule: str, scope: str | None) -> bool:
    if rule == "public":
        return True
    if scope is None:
        return False
    return scope == "admin" or scope in rule.split("|")


class Fixtures:
    """Makes the objects a call needs, fresh for every call (some calls consume them)."""

    def __init__(self, server, admin: str):
        self.server = server
        self.api = httpx.Client(base_url=server.url + "/api/v1", headers={"Authorization": f"Bearer {admin}"},
                                timeout=10)

    def run(self) -> int:
        return self._ok(self.api.post("/runs", json={"name": f"sec-{uuid.uuid4().hex[:8]}"}))["id"]

    def component(self, run_id: int) -> int:
        return self._ok(self.api.post(f"/runs/{run_id}/components", json={"side": "rollout", "worker_id": "w"}))["id"]

    def alert(self, run_id: int) -> int:
        db = self.server.app.state.db
        with db.write() as s:
            alert, _ = lifecycle.fire(s, s.get(Run, run_id), "metric_threshold", "warning",
                                      f"k-{uuid.uuid4().hex}", "t", {})
            return alert.id

    def rule(self, run_id: int) -> int:
        return self._ok(self.api.post(f"/runs/{run_id}/rules", json=RULE))["id"]

    def webhook(self) -> int:
        return self._ok(self.api.post("/webhooks", json={"url": "http://127.0.0.1:9/h"}))["id"]

    @staticmethod
    def _ok(r: httpx.Response) -> dict:
        assert r.status_code == 200, r.text
        return r.json()

    def request_for(self, method: str, path: str) -> tuple[str, dict | None, int]:
        """(concrete URL, JSON body, expected success status)."""
        if path.startswith("/vendor/"):
            return _vendored_url(path), None, 200
        run_id = self.run()
        values = {"run_id": run_id, "project": "sec", "digest": FINGERPRINT["digest"]}
        if "{component_id}" in path:
            values["component_id"] = self.component(run_id)
        if "{alert_id}" in path:
            values["alert_id"] = self.alert(run_id)
        if "{rule_id}" in path:
            values["rule_id"] = self.rule(run_id)
        if "{hook_id}" in path:
            values["hook_id"] = self.webhook()
        if "{silence_id}" in path:
            values["silence_id"] = self._ok(self.api.post("/silences", json=SILENCE))["id"]
        if "{digest}" in path:
            comp = self.component(run_id)
            self._ok(self.api.post(f"/runs/{run_id}/components/{comp}/fingerprint", json=FINGERPRINT))
        url = path.format(**values)
        body: dict | None = None
        if method in ("POST", "PUT", "PATCH"):
            body = {
                "/api/v1/runs": {"name": f"sec-{uuid.uuid4().hex[:8]}"},
                "/api/v1/runs/{run_id}/components": {"side": "trainer"},
                "/api/v1/runs/{run_id}/components/{component_id}/fingerprint": FINGERPRINT,
                "/api/v1/runs/{run_id}/metrics": {"client_id": uuid.uuid4().hex, "seq": 0, "steps": [1],
                                                  "series": {"loss": [1.0]}},
                "/api/v1/runs/{run_id}/components/{component_id}/attestations": _attestation(),
                "/api/v1/runs/{run_id}/audits": {"client_id": uuid.uuid4().hex, "seq": 0, "counts": {"samples": 1}},
                "/api/v1/runs/{run_id}/control": {"action": "pause", "reason": "sec"},
                "/api/v1/runs/{run_id}/settings": {"on_mismatch": "alert"},
                "/api/v1/runs/{run_id}/rules": RULE,
                "/api/v1/projects/{project}/rules": RULE,
                "/api/v1/projects/{project}/settings": {"packs": ["trl"]},
                "/api/v1/rules/{rule_id}": {"enabled": False},
                "/api/v1/webhooks": {"url": "http://127.0.0.1:9/h"},
                "/api/v1/webhooks/{hook_id}": {"enabled": False},
                "/api/v1/silences": SILENCE,
            }.get(path, {})
        if path.endswith("/control/wait"):
            url += "?timeout=0"
        if path.endswith("/control/stopped"):  # only a stopping run has a stop to acknowledge
            self._ok(self.api.post(f"/runs/{run_id}/control", json={"action": "stop", "reason": "sec"}))
        if path.endswith(("/series", "/series/times")):
            self._ok(self.api.post(f"/runs/{run_id}/metrics", json={
                "client_id": uuid.uuid4().hex, "seq": 0, "steps": [1], "series": {"loss": [1.0]}}))
            url += "?key=loss"
        return url, body, 204 if method == "DELETE" else 200


def _attestation() -> dict:
    """What `ParityMonitor.attest_weights` posts, for a one-tensor model."""
    import numpy as np

    from trainer_hooks.attest import digest_weights

    return digest_weights({"w": np.ones((2, 2), dtype=np.float32)}, 1)


def _call(server, method: str, url: str, body, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    full = url if url.startswith("http") else server.url + url
    with httpx.stream(method, full, json=body, headers=headers, timeout=10) as r:
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            return r  # an endless stream: the status is what we need
        r.read()
        return r


def test_every_route_has_an_access_entry(secured_server) -> None:
    server, _ = secured_server
    routes = _routes(server.app)
    assert routes - ACCESS.keys() == set(), "new endpoint(s) without an entry in ACCESS"
    assert ACCESS.keys() - routes == set(), "ACCESS lists endpoints the app no longer has"


def test_every_route_times_every_scope(secured_server) -> None:
    server, tokens = secured_server
    fx = Fixtures(server, tokens["admin"])
    wrong = []
    for (method, path), scope in itertools.product(sorted(_routes(server.app)), SCOPES):
        rule = ACCESS[(method, path)]
        url, body, ok = fx.request_for(method, path)
        r = _call(server, method, url, body, tokens.get(scope) if scope else None)
        if _allowed(rule, scope):
            expected = ok
        else:
            expected = 401 if scope is None else 403
        if r.status_code != expected:
            wrong.append(f"{method} {path} as {scope or 'anonymous'}: {r.status_code}, expected {expected}")
        elif expected in (401, 403):
            err = r.json()["error"]
            assert err["status"] == expected and err["message"], (method, path, err)
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("header", ["Bearer pw_not-a-real-token", "Basic dXNlcjpwYXNz", "bearer", "Token abc"])
def test_bad_credentials_are_401(secured_server, header: str) -> None:
    server, _ = secured_server
    r = httpx.get(server.url + "/api/v1/runs", headers={"Authorization": header})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert r.headers.get("www-authenticate") == "Bearer"


def test_tokens_never_logged_or_returned(secured_server, debug_logs) -> None:
    """Hit every route with every token (and bad ones) at DEBUG; no secret or hash shows up anywhere."""
    server, tokens = secured_server
    fx = Fixtures(server, tokens["admin"])
    bodies = []
    for (method, path), scope in itertools.product(sorted(_routes(server.app)), SCOPES[1:]):
        url, body, _ = fx.request_for(method, path)
        r = _call(server, method, url, body, tokens[scope])
        if not r.headers.get("content-type", "").startswith("text/event-stream"):
            bodies.append(r.text + json.dumps(dict(r.headers)))
    for bad in ("pw_leaky-secret-value-1234567890", "Basic pw_leaky-secret-value-1234567890"):
        httpx.get(server.url + "/api/v1/runs", headers={"Authorization": bad})
    secrets = list(tokens.values()) + ["pw_leaky-secret-value-1234567890"]
    needles = secrets + [hashlib.sha256(s.encode()).hexdigest() for s in secrets] + [s[3:] for s in secrets]
    assert debug_logs.lines, "the log capture saw nothing: the test would prove nothing"
    for needle in needles:
        assert needle not in debug_logs.text, "a token (or its hash) reached the logs"
        for text in bodies:
            assert needle not in text, "a token (or its hash) was returned by the API"


def test_webhook_signature_verifies_and_replays_are_refused(secured_server) -> None:
    server, tokens = secured_server
    api = httpx.Client(base_url=server.url + "/api/v1", headers={"Authorization": f"Bearer {tokens['admin']}"})
    with WebhookReceiver() as receiver:
        hook = api.post("/webhooks", json={"url": receiver.url}).json()
        assert hook["secret"].startswith("whsec_")
        assert "secret" not in json.dumps(api.get("/webhooks").json())  # shown once only
        api.post(f"/webhooks/{hook['id']}/test")
        [got] = wait_for(receiver.accepted, 10)
    now = time.time()
    signing.verify(hook["secret"], got.headers, got.body, now)  # genuine: passes
    sent = int(got.headers["webhook-timestamp"])
    assert abs(sent - now) < 30
    with pytest.raises(signing.SignatureError, match="replay"):  # the same delivery, replayed later
        signing.verify(hook["secret"], got.headers, got.body, sent + signing.DEFAULT_TOLERANCE_S + 1)
    with pytest.raises(signing.SignatureError, match="replay"):  # or stamped in the future
        signing.verify(hook["secret"], got.headers, got.body, sent - signing.DEFAULT_TOLERANCE_S - 1)
    with pytest.raises(signing.SignatureError):  # tampered body
        signing.verify(hook["secret"], got.headers, got.body + b" ", now)
    with pytest.raises(signing.SignatureError):  # another webhook's secret
        signing.verify(signing.new_secret(), got.headers, got.body, now)
    moved = dict(got.headers, **{"webhook-timestamp": str(int(got.headers["webhook-timestamp"]) + 7)})  # fresh stamp, old signature
    with pytest.raises(signing.SignatureError):
        signing.verify(hook["secret"], moved, got.body, now + 7)
    for missing in ("webhook-id", "webhook-timestamp", "webhook-signature"):
        with pytest.raises(signing.SignatureError):
            signing.verify(hook["secret"], {k: v for k, v in got.headers.items() if k != missing}, got.body, now)
    # Key rotation: several space-separated signatures, one of them valid.
    rotated = dict(got.headers, **{"webhook-signature": "v1,AAAA " + got.headers["webhook-signature"]})
    signing.verify(hook["secret"], rotated, got.body, now)


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/",
    "http://[fd00:ec2::254]/",
    "http://[::ffff:169.254.169.254]/",
    "http://127.0.0.1:8321/api/v1/runs",
    "http://[::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://localhost/",
    "http://0.0.0.0/",
    "http://224.0.0.1/",
    "http://169.254.1.1/",
    "http://2130706433/",  # 127.0.0.1 as one integer
    "http://0x7f.1/",
    "http://user:pass@example.com/",
    "file:///etc/passwd",
    "gopher://example.com/",
    "ftp://example.com/",
    "http:///nohost",
])
def test_ssrf_guard_refuses(url: str) -> None:
    with pytest.raises(UnsafeURL):
        check_url(url, AddressPolicy(), resolver=lambda host, port: ["127.0.0.1"])  # "localhost"


def test_ssrf_guard_allows_public_and_opted_in_loopback() -> None:
    check_url("https://93.184.216.34/hook", AddressPolicy())
    check_url("http://127.0.0.1:9000/hook", AddressPolicy(allow_loopback=True))
    with pytest.raises(UnsafeURL):  # metadata stays refused even with loopback allowed
        check_url("http://169.254.169.254/", AddressPolicy(allow_loopback=True))


def test_ssrf_refused_through_the_api(tmp_path) -> None:
    from paritywatch.backend import migrate
    from paritywatch.backend.main import create_app
    from paritywatch.backend.settings import Settings

    url = f"sqlite:///{tmp_path / 'ssrf.db'}"
    migrate.upgrade(url)
    with local_client(create_app(Settings(database_url=url, open_mode=True), upgrade_schema=False)) as client:
        for target in ("http://169.254.169.254/", "http://127.0.0.1:8321/", "http://[::1]:80/"):
            r = client.post("/api/v1/webhooks", json={"url": target})
            assert r.status_code == 422 and "refused" in r.json()["error"]["message"], (target, r.text)
        assert client.get("/api/v1/webhooks").json()["webhooks"] == []


def test_cors_off_by_default(secured_server) -> None:
    server, tokens = secured_server
    evil = {"Origin": "https://evil.example"}
    r = httpx.get(server.url + "/api/v1/runs", headers={**evil, "Authorization": f"Bearer {tokens['read']}"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    pre = httpx.options(server.url + "/api/v1/runs/1/control", headers={
        **evil, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"})
    assert "access-control-allow-origin" not in pre.headers
    assert "access-control-allow-headers" not in pre.headers


def _assert_security_headers(r: httpx.Response, where: str) -> None:
    h = r.headers
    csp = h.get("content-security-policy", "")
    directives = {d.strip().split(" ")[0]: d.strip() for d in csp.split(";") if d.strip()}
    script = directives.get("script-src", directives.get("default-src", ""))
    assert script and "'unsafe-inline'" not in script and "'unsafe-eval'" not in script, (where, csp)
    assert "frame-ancestors 'none'" in csp or h.get("x-frame-options", "").upper() == "DENY", (where, csp)
    assert h.get("x-frame-options", "").upper() == "DENY", where
    assert h.get("x-content-type-options") == "nosniff", where


def test_security_headers_everywhere(secured_server) -> None:
    server, tokens = secured_server
    read = {"Authorization": f"Bearer {tokens['read']}"}
    cases = {
        "dashboard": httpx.get(server.url + "/"),
        "static file": httpx.get(server.url + "/index.html"),
        "api 200": httpx.get(server.url + "/api/v1/runs", headers=read),
        "api 401": httpx.get(server.url + "/api/v1/runs"),
        "api 404": httpx.get(server.url + "/api/v1/runs/999999", headers=read),
        "api 422": httpx.post(server.url + "/api/v1/runs", json={}, headers={"Authorization": f"Bearer {tokens['ingest']}"}),
        "api 413": httpx.post(server.url + "/api/v1/runs", content=b"x" * (33 * 1024 * 1024),
                              headers={"Authorization": f"Bearer {tokens['ingest']}", "content-type": "application/json"}),
        "missing page": httpx.get(server.url + "/no-such-page"),
        "healthz": httpx.get(server.url + "/healthz"),
        "openapi": httpx.get(server.url + "/api/v1/openapi.json"),
    }
    assert cases["dashboard"].status_code == 200 and cases["api 413"].status_code == 413
    for where, r in cases.items():
        _assert_security_headers(r, where)
