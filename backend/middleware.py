"""ASGI middleware: the request guard (who, from where, how much) and security headers.

`RequestGuard` does all of its work before the app reads a single byte of the body:
1. who is calling: a bearer token (cached lookups), or, in open mode, a local caller: loopback
   peer, a Host naming loopback (no DNS rebinding), no foreign Origin / cross-site fetch on a
   state-changing request (no drive-by POST from a page in the same browser);
2. may they call this route (its scope dependency, read from the app): 401 / 403 otherwise;
3. the body: JSON content type required, the route's size limit (large only for metric batches
   and fingerprints), then a linear-time nesting check, off the event loop for big bodies.
"""
from __future__ import annotations

import functools
import ipaddress
import json
import re
import time
from typing import Callable
from urllib.parse import urlsplit

import anyio
import numpy as np
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from paritywatch.backend.api.deps import PRINCIPAL_KEY, access_for
from paritywatch.backend.api.errors import DATABASE_ERRORS, handler_response
from paritywatch.backend.auth import OPEN_PRINCIPAL, Principal, TokenCache
from trainer_hooks.contract import API_PREFIX, error_envelope, run_path

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'self'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
]
# Deeper JSON than this is refused up front: it parses, but pydantic cannot serialise it back
# (a 500 after the write), and nothing Paritywatch stores nests beyond a dozen levels.
MAX_JSON_DEPTH = 100
_SUSPECT_TEXT = re.compile(rb"\\u(?:0000|d[89a-f])", re.I)
INLINE_CHECK_BYTES = 64 * 1024  # bodies above this are measured as they arrive, checked in a worker thread
BODY_SHAPE_KEY = "paritywatch.body_shape"  # where the guard leaves a measured body's JsonShape, in the ASGI scope
METRIC_BATCH_DEPTH = 3
# The metric batch route (its fast path, backend/api/fast_ingest.py, answers the same requests).
# The contract's path, its run id a pattern of up to 18 digits: always a 64-bit id; longer ones take
# the route (and its own answer).
_BATCH_TEMPLATE = API_PREFIX + run_path("{run_id}", "metrics")  # type: ignore[arg-type]
BATCH_PATH = re.compile(re.escape(_BATCH_TEMPLATE).replace(re.escape("{run_id}"), "([0-9]{1,18})"))
SCAN_CHUNK = 1 << 20
_BRACKET_DELTA = np.zeros(256, np.int8)
_BRACKET_DELTA[[ord("["), ord("{")]] = 1
_BRACKET_DELTA[[ord("]"), ord("}")]] = -1
UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
CLOSE = [(b"connection", b"close")]  # on an answer sent before the whole body was read


# --- the body: nesting and text checks ---


class JsonShape:
    """The shape of a JSON body measured as it arrives, in O(size) numpy steps (bounded memory,
    the GIL released inside each): how deep brackets outside strings nest, and how many commas
    and colons lie outside strings at each of the first levels. That is enough to refuse, before
    any parse, a body that cannot be valid (too deep; more keys or values than a metric batch may
    carry). A quote is a string delimiter unless an odd run of backslashes precedes it."""

    COUNTED_LEVELS = 4  # commas and colons counted at depths 0..3

    def __init__(self) -> None:
        self.depth = self.deepest = 0
        self._in_string = self._backslashes = 0  # carried from chunk to chunk
        self.commas = [0] * self.COUNTED_LEVELS
        self.colons = [0] * self.COUNTED_LEVELS

    def feed(self, data: bytes) -> None:
        for start in range(0, len(data), SCAN_CHUNK):
            self._scan(np.frombuffer(data, np.uint8, count=min(SCAN_CHUNK, len(data) - start), offset=start))

    def _scan(self, a: np.ndarray) -> None:
        index = np.arange(a.size)
        # index of the last byte that is not a backslash, at or before each position (-1: none yet)
        last_plain = np.maximum.accumulate(np.where(a == 92, -1, index))
        quotes = np.flatnonzero(a == 34)
        before = quotes - 1
        run = np.where(before >= 0, before - last_plain[np.maximum(before, 0)], 0)
        run += np.where((before < 0) | (last_plain[np.maximum(before, 0)] < 0), self._backslashes, 0)
        toggles = np.zeros(a.size, np.int8)
        toggles[quotes[run % 2 == 0]] = 1
        inside = (np.cumsum(toggles, dtype=np.int64) + self._in_string) & 1
        delta = _BRACKET_DELTA[a]
        delta[inside == 1] = 0
        levels = np.cumsum(delta, dtype=np.int64) + self.depth
        self.deepest = max(self.deepest, int(levels.max()))
        for counts, byte in ((self.commas, 44), (self.colons, 58)):
            at = levels[(a == byte) & (inside == 0)]
            at = at[(at >= 0) & (at < self.COUNTED_LEVELS)]
            for level, n in enumerate(np.bincount(at, minlength=self.COUNTED_LEVELS)):
                counts[level] += int(n)
        self.depth, self._in_string = int(levels[-1]), int(inside[-1])
        tail = a.size - 1 - int(last_plain[-1])
        self._backslashes = tail + (self._backslashes if last_plain[-1] < 0 else 0)


def json_too_deep(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether brackets outside strings nest deeper than `limit`."""
    shape = JsonShape()
    shape.feed(body)
    return shape.deepest > limit


def general_shape_problem(shape: JsonShape) -> tuple[int, str] | None:
    if shape.deepest > MAX_JSON_DEPTH:
        return 400, f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
    return None


def metric_batch_shape_problem(shape: JsonShape, max_points: int) -> tuple[int, str] | None:
    """What no metric batch can be, seen from its shape alone (its parse would only confirm it).
    A batch nests three levels: {"series": {key: [values]}}. In one that parses, the colons one
    level down are its series keys (each counts as at least one point: check_batch), the commas
    two levels down separate values, and the commas one level down separate steps or keys."""
    if shape.deepest > METRIC_BATCH_DEPTH:
        return 422, (f"a metric batch nests {METRIC_BATCH_DEPTH} levels deep ({{\"series\": {{key: [values]}}}}); "
                     f"this body nests deeper")
    if shape.colons[2] > max_points:
        return 413, f"batch has more than {max_points} keys; the limit is {max_points} points a batch"
    if shape.commas[3] >= max_points or shape.commas[2] > 2 * max_points:
        return 413, f"batch has more than {max_points} points; the limit is {max_points} points a batch"
    return None


def metric_batch_series_keys(shape: JsonShape | None) -> int | None:
    """How many series keys a metric batch of this shape names: the colons one level down (a name
    sent twice counts twice; the hooks never do that). None for a body too small to be measured."""
    return None if shape is None else shape.colons[2]


def json_body_problem(body: bytes, check_depth: bool = True) -> tuple[int, str] | None:
    """(status, message) when a JSON body holds what no store can take; None when it is fine.
    Malformed JSON is left to the app's parser and its own 4xx. `check_depth=False`: the body's
    shape was measured as it arrived."""
    if check_depth and body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH and json_too_deep(body):
        return 400, f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
    if _SUSPECT_TEXT.search(body):  # only escapes can carry NUL or a lone surrogate into JSON text
        try:
            value = json.loads(body)
        except (ValueError, RecursionError):
            return None
        bad = _bad_text(value)
        if bad:
            return 422, f"JSON strings must not contain {bad}"
    return None


def _bad_text(value) -> str | None:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, str):
            if "\x00" in v:
                return "NUL characters (\\u0000): PostgreSQL cannot store them"
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return "unpaired UTF-16 surrogates (\\ud800-\\udfff): they are not Unicode text"
    return None


# --- headers ---


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


def is_json_type(content_type: str | None) -> bool:
    """application/json or application/<anything>+json, parameters (charset) allowed."""
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _has_body(scope: Scope) -> bool:
    length = header(scope, b"content-length")
    if length is not None:
        return length.strip() not in ("", "0")
    return header(scope, b"transfer-encoding") is not None


# Two calls a request in open mode; parsing an address costs more than the rest of the check.
@functools.lru_cache(maxsize=1024)
def is_loopback(host: str) -> bool:
    """`localhost` or a loopback address (IPv6 with or without brackets)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@functools.lru_cache(maxsize=1024)
def _host_name(host_header: str) -> str:
    return (urlsplit("//" + host_header).hostname or "").lower()


def local_caller_problem(scope: Scope) -> str | None:
    """Why this request may not use open mode (None: it may). Open mode is for the person at this
    machine: the peer must be loopback, the Host must name loopback (a DNS-rebinding page sends
    its own name), and a state-changing request must not come from another site's page."""
    client = scope.get("client")
    if not client or not is_loopback(client[0]):
        return "open mode answers only callers on this machine; use a bearer token"
    host = header(scope, b"host")
    if not host or not is_loopback(_host_name(host)):
        return f"open mode answers only requests addressed to localhost (Host: {host!r}); use a bearer token"
    if scope.get("method") in UNSAFE_METHODS:
        origin = header(scope, b"origin")
        if origin is not None and (origin == "null" or urlsplit(origin).netloc.lower() != host.lower()):
            return f"open mode refuses cross-origin requests (Origin: {origin}); use a bearer token"
        if (header(scope, b"sec-fetch-site") or "").lower() in ("cross-site", "same-site"):
            return "open mode refuses requests from other sites' pages; use a bearer token"
    return None


# --- the guard ---


async def send_error(send: Send, status: int, message: str, headers: list | None = None) -> None:
    """An error answer in the contract's envelope, with the status's own code."""
    body = json.dumps(error_envelope(status, message)).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        # This middleware wraps SecurityHeaders, so its own answers carry the headers themselves.
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                    *(headers or []), *SECURITY_HEADERS],
    })
    await send({"type": "http.response.body", "body": body})


class RequestGuard:
    def __init__(self, app: ASGIApp, *, tokens: TokenCache, open_mode, small_limit: int, large_limit: int,
                 max_points: int, body_timeout_s: float):
        self.app = app
        self.tokens = tokens
        self.open_mode = open_mode
        self.small_limit, self.large_limit = small_limit, large_limit
        self.max_points, self.body_timeout_s = max_points, body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        access = access_for(scope["app"], scope["method"], scope["path"])
        try:
            principal, refusal = await self._identify(scope)
        except DATABASE_ERRORS as exc:  # the token or open-mode lookup runs outside the app's handlers
            await SecurityHeaders(await handler_response(scope, exc))(scope, receive, send)
            return
        if access.scopes:
            if principal is None:
                status, message = refusal
                await send_error(send, status, message, [(b"www-authenticate", b"Bearer")] if status == 401 else None)
                return
            if not any(principal.has(s) for s in access.scopes):
                await send_error(send, 403, f"this needs the {' or '.join(access.scopes)} scope")
                return
        scope[PRINCIPAL_KEY] = principal
        if not _has_body(scope):
            await self.app(scope, receive, send)
            return
        limit = self.large_limit if access.large_body else self.small_limit
        length = header(scope, b"content-length")
        if length is not None and length.strip().isdigit() and int(length) > limit:
            await send_error(send, 413, f"request body over {limit} bytes", CLOSE)
            return
        if not is_json_type(header(scope, b"content-type")):
            await send_error(send, 415, "send the body as JSON with Content-Type: application/json", CLOSE)
            return
        if scope["method"] == "POST" and BATCH_PATH.fullmatch(scope["path"]):
            shape_rule = functools.partial(metric_batch_shape_problem, max_points=self.max_points)
        else:
            shape_rule = general_shape_problem
        read = await self._read(receive, send, limit, shape_rule)
        if read is None:
            return
        body, shape = read
        if len(body) > INLINE_CHECK_BYTES:  # its shape was checked as it arrived
            problem = await anyio.to_thread.run_sync(json_body_problem, body, False)
        else:
            problem = json_body_problem(body)
        if problem is not None:
            status, message = problem
            await send_error(send, status, message)
            return
        if shape is not None:
            scope[BODY_SHAPE_KEY] = shape
        await self.app(scope, _replay(body, receive), send)

    async def _identify(self, scope: Scope) -> tuple[Principal | None, tuple[int, str] | None]:
        """(principal, None) or (None, (status, why)) for when the route needs a caller."""
        authorization = header(scope, b"authorization")
        if authorization:
            scheme, _, secret = authorization.partition(" ")
            secret = secret.strip()
            if scheme.lower() != "bearer" or not secret:
                return None, (401, "Authorization must be 'Bearer <token>'")
            hit, principal = self.tokens.cached(secret, time.monotonic())
            if not hit:
                principal = await anyio.to_thread.run_sync(self.tokens.lookup, secret)
            return (principal, None) if principal else (None, (401, "unknown or revoked token"))
        is_open = self.open_mode.cached()
        if is_open is None:
            is_open = await anyio.to_thread.run_sync(self.open_mode.is_open)
        if is_open:
            problem = local_caller_problem(scope)
            return (OPEN_PRINCIPAL, None) if problem is None else (None, (403, problem))
        return None, (401, "a bearer token is required")

    async def _read(self, receive: Receive, send: Send, limit: int,
                    shape_rule: Callable[[JsonShape], tuple[int, str] | None]) -> tuple[bytes, JsonShape | None] | None:
        """The body and, past INLINE_CHECK_BYTES, its shape; None once answered (or the client left). Refused while it arrives: over
        `limit` bytes, not all in within body_timeout_s (a trickle holds a connection and its
        buffer), or, past INLINE_CHECK_BYTES, a shape `shape_rule` refuses (no parse of a body
        that cannot be valid). Those answers close the connection: the rest is never read."""
        chunks, size, shape = [], 0, None
        deadline = anyio.current_time() + self.body_timeout_s
        while True:
            with anyio.move_on_after(deadline - anyio.current_time()) as waited:
                message = await receive()
            if waited.cancelled_caught:
                await send_error(send, 408, f"request body not received within {self.body_timeout_s:g} s",
                                 CLOSE)
                return None
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await send_error(send, 413, f"request body over {limit} bytes", CLOSE)
                return None
            chunks.append(chunk)
            if size > INLINE_CHECK_BYTES:
                if shape is None:
                    shape = JsonShape()
                    for earlier in chunks:
                        shape.feed(earlier)
                else:
                    shape.feed(chunk)
                problem = shape_rule(shape)
                if problem is not None:
                    await send_error(send, *problem, CLOSE)
                    return None
            if not message.get("more_body", False):
                return b"".join(chunks), shape


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: wait for the disconnect like a live stream

    return replay


class SecurityHeaders:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                present = {k.lower() for k, _ in message["headers"]}
                message["headers"] = list(message["headers"]) + [
                    (k, v) for k, v in SECURITY_HEADERS if k not in present
                ]
            await send(message)

        await self.app(scope, receive, with_headers)
