"""How `paritywatch serve` runs uvicorn beyond its own options: a deadline on each request's head
(uvicorn has only the keep-alive timeout, which stops counting at a request's first byte, so a
client trickling header lines held its connection for good), and no secret in any log line."""
from __future__ import annotations

import asyncio
import logging
import re

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from paritywatch.backend.auth import TOKEN_PREFIX
from paritywatch.backend.settings import get_settings

log = logging.getLogger("paritywatch.serving")


class HeadDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing a connection whose request head is not complete
    within `header_timeout_s`: from the connection's start, then from the first byte of each
    later request (between requests the keep-alive timeout applies). The body has its own
    deadline in the request guard (backend/middleware.py), which answers 408."""

    header_timeout_s: float | None = None  # None: the settings' (PARITYWATCH_HEADER_TIMEOUT_S)
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.header_timeout_s is None:
            self.header_timeout_s = get_settings().header_timeout_s
        self._arm_head_deadline()

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm_head_deadline()  # a new request's first bytes
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._disarm_head_deadline()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_deadline()
        super().connection_lost(exc)

    def _arm_head_deadline(self) -> None:
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

    def _disarm_head_deadline(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            log.info("closed a connection from %s: no complete request head within %g s",
                     self.client[0] if self.client else "?", self.header_timeout_s)
            self.transport.close()


def http_protocol(header_timeout_s: float) -> type[HeadDeadlineProtocol]:
    """The protocol class to give an in-process uvicorn (`http=`), with this deadline (`serve`
    gives HeadDeadlineProtocol itself: its worker processes import it by name)."""
    return type("HeadDeadlineProtocol", (HeadDeadlineProtocol,), {"header_timeout_s": header_timeout_s})


# --- secrets out of logs ---

# A query parameter whose name says it carries a credential, and a Paritywatch token anywhere.
_SECRET_PARAM = re.compile(r"(?i)([?&;](?:[^=&;#\s]*(?:token|secret|password|passwd|api[_-]?key|auth)[^=&;#\s]*)=)"
                           r"[^&;#\s\"]*")
_TOKEN = re.compile(re.escape(TOKEN_PREFIX) + r"[A-Za-z0-9_\-]{8,}")
REDACTED = "[redacted]"


def redact(text: str) -> str:
    return _TOKEN.sub(TOKEN_PREFIX + REDACTED, _SECRET_PARAM.sub(r"\1" + REDACTED, text))


def _redacted(value):
    return redact(value) if isinstance(value, str) else value


def redact_logs() -> None:
    """Every log record of this process is made with its credentials redacted: its message and
    its arguments (uvicorn's access line carries each request's path and query string, refused
    requests' included). A record factory, not a filter: filters apply to one logger or handler,
    and uvicorn configures its handlers after the app may be created. Idempotent."""
    make = logging.getLogRecordFactory()
    if getattr(make, "redacts", False):
        return

    def make_redacted(name, level, fn, lno, msg, args, *rest, **kwargs):
        if isinstance(args, tuple):
            args = tuple(_redacted(a) for a in args)
        elif isinstance(args, dict):
            args = {k: _redacted(v) for k, v in args.items()}
        return make(name, level, fn, lno, _redacted(msg), args, *rest, **kwargs)

    make_redacted.redacts = True
    logging.setLogRecordFactory(make_redacted)
