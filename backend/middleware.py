"""ASGI middleware: request-size cap with a JSON text guard, and security headers."""
from __future__ import annotations

import json
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

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
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)  # unrolled: C speed on long strings
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_SUSPECT_TEXT = re.compile(rb"\\u(?:0000|d[89a-f])", re.I)


def json_body_problem(body: bytes) -> tuple[int, str] | None:
    """(status, message) when a JSON body holds what no store can take; None when it is fine.

    Cheap on the common path (C-speed byte scans); the careful check runs only on suspicion.
    Malformed JSON is left to the app's parser and its own 4xx."""
    if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH:
        nest = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
        for _ in range(MAX_JSON_DEPTH):  # each round strips the innermost layer of pairs
            shorter = nest.replace(b"[]", b"").replace(b"{}", b"")
            if shorter == nest:
                break
            nest = shorter
        else:
            if nest:
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


def _bad_text(value) -> str | None:  # noqa: ANN001
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


async def _send_error(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": {"status": status, "code": code, "message": message}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            # This middleware wraps SecurityHeaders, so its own answers carry the headers themselves.
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                        *SECURITY_HEADERS],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _is_json(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            return b"json" in value.lower()
    return False


class BodySizeLimit:
    """Refuse bodies over `limit` bytes (by Content-Length up front, or while streaming), and JSON
    bodies no store can take (too deep, NUL, lone surrogates) with a clear 4xx before any route runs."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await _send_error(send, 413, "payload_too_large", f"request body over {self.limit} bytes")
                return
        if scope.get("method") in ("POST", "PUT", "PATCH") and _is_json(scope):
            await self._buffered_json(scope, receive, send)
        else:
            await self._streamed(scope, receive, send)

    async def _buffered_json(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await _send_error(send, 413, "payload_too_large", f"request body over {self.limit} bytes")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        problem = json_body_problem(body)
        if problem is not None:
            status, message = problem
            await _send_error(send, status, "bad_request" if status == 400 else "validation_error", message)
            return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect like a live stream

        await self.app(scope, replay, send)

    async def _streamed(self, scope: Scope, receive: Receive, send: Send) -> None:
        received = 0
        too_large = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    too_large = True
                    raise _BodyTooLarge()
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if too_large and not started:
                return  # the app's answer to a cut-off body (FastAPI says 400): ours is the 413
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except Exception:
            if not (too_large and not started):
                raise
        if too_large and not started:
            await _send_error(send, 413, "payload_too_large", f"request body over {self.limit} bytes")


class _BodyTooLarge(Exception):
    pass


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
