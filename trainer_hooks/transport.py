"""HTTP transport for the hooks: one attempt classified, or several with backoff.

Every failure becomes a `TransportError` that says whether retrying can help and, when the
server said so (429/503 Retry-After), how long to wait. Nothing here touches the training loop:
callers are the worker and control threads.
"""
from __future__ import annotations

import email.utils
import logging
import random
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import httpx

log = logging.getLogger("paritywatch")

API_PREFIX = "/api/v1"
# Client errors that describe a transient server-side condition, so a retry can succeed.
RETRYABLE_4XX = frozenset({408, 409, 425, 429})
# A server asking for more than this is treated as asking for this: the spool keeps the data.
MAX_RETRY_AFTER_S = 300.0


class TransportError(Exception):
    """A request that did not succeed, classified for the caller."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        status: int | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status
        self.code = code
        self.retry_after = retry_after


def is_retryable_status(status: int) -> bool:
    return status >= 500 or status in RETRYABLE_4XX


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date), clamped."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value).timestamp()
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        seconds = when - (time.time() if now is None else now)
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def backoff_delay(
    attempt: int, *, base: float = 0.5, cap: float = 10.0, rng: Callable[[], float] = random.random
) -> float:
    """Exponential backoff with equal jitter: half fixed, half random, so delays stay spread
    across hundreds of workers yet never collapse to zero."""
    ceiling = min(cap, base * (2 ** min(attempt, 32)))
    return ceiling / 2 + rng() * ceiling / 2


class Backoff:
    """Pacing state for one retried activity: when may the next attempt start."""

    def __init__(self, *, base: float = 0.5, cap: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.base = base
        self.cap = cap
        self._clock = clock
        self.failures = 0
        self.not_before = 0.0

    def ready(self) -> bool:
        return self._clock() >= self.not_before

    def remaining(self) -> float:
        return max(0.0, self.not_before - self._clock())

    def failed(self, retry_after: float | None = None) -> float:
        """Record a failure; returns the delay chosen (the server's Retry-After wins when longer)."""
        delay = backoff_delay(self.failures, base=self.base, cap=self.cap)
        if retry_after is not None:
            delay = max(delay, retry_after)
        self.failures += 1
        self.not_before = self._clock() + delay
        return delay

    def succeeded(self) -> None:
        self.failures = 0
        self.not_before = 0.0


class LogOnce:
    """Logs each distinct problem once per process: a broken config must not flood the host's logs."""

    def __init__(self) -> None:
        self._seen: set[Any] = set()
        self._lock = threading.Lock()

    def warning(self, key: Any, message: str, *args: Any) -> None:
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
        log.warning(message, *args)


@dataclass(frozen=True)
class TransportConfig:
    url: str
    token: str | None = None
    connect_timeout_s: float = 3.0
    timeout_s: float = 10.0


def _error_from_response(response: httpx.Response) -> TransportError:
    code = message = None
    try:
        err = response.json().get("error") or {}
        code, message = err.get("code"), err.get("message")
    except Exception:  # a proxy's HTML error page is still an error; its body just isn't ours
        pass
    retry_after = None
    if response.status_code in (429, 503):
        retry_after = parse_retry_after(response.headers.get("retry-after"))
    return TransportError(
        f"HTTP {response.status_code} {code or ''}: {message or response.reason_phrase}",
        retryable=is_retryable_status(response.status_code),
        status=response.status_code,
        code=code,
        retry_after=retry_after,
    )


class Transport:
    """One httpx client for one thread (sockets are per-thread and never shared across a fork)."""

    def __init__(self, config: TransportConfig, *, sleep: Callable[[float], None] = time.sleep):
        self.config = config
        self._sleep = sleep
        headers = {"User-Agent": "paritywatch-hooks/0.1"}
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        self._client = httpx.Client(
            base_url=config.url.rstrip("/") + API_PREFIX,
            headers=headers,
            timeout=httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s),
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """One attempt. Returns the decoded JSON body of a 2xx answer or raises TransportError."""
        kwargs: dict[str, Any] = {"json": json, "params": params}
        if timeout is not None:
            kwargs["timeout"] = httpx.Timeout(timeout, connect=min(timeout, self.config.connect_timeout_s))
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:  # refused, reset, timed out, DNS: the server may come back
            raise TransportError(f"{type(exc).__name__}: {exc}", retryable=True) from exc
        if response.is_success:
            try:
                return response.json()
            except ValueError as exc:
                raise TransportError("2xx answer is not JSON", retryable=False, status=response.status_code) from exc
        raise _error_from_response(response)

    def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        attempts: int = 3,
        deadline: float | None = None,
        backoff_base: float = 0.25,
    ) -> Any:
        """Up to `attempts` tries with jittered exponential backoff, never sleeping past `deadline`
        (a time.monotonic value). The last failure is raised."""
        attempt = 0
        while True:
            timeout = None if deadline is None else max(0.05, deadline - time.monotonic())
            try:
                return self.request(method, path, json=json, params=params, timeout=timeout)
            except TransportError as exc:
                attempt += 1
                if not exc.retryable or attempt >= attempts:
                    raise
                delay = backoff_delay(attempt - 1, base=backoff_base)
                if exc.retry_after is not None:
                    delay = max(delay, exc.retry_after)
                if deadline is not None and time.monotonic() + delay >= deadline:
                    raise
                self._sleep(delay)

    def abort(self) -> None:
        """Wake a request blocked in another thread (a long-poll) by shutting its sockets down:
        on Linux closing a socket does not wake a blocked recv. Best effort over httpcore's
        internals; when they move, the blocked thread simply finishes its poll."""
        pool = getattr(getattr(self._client, "_transport", None), "_pool", None)
        for connection in list(getattr(pool, "connections", ())):
            stream = getattr(getattr(connection, "_connection", None), "_network_stream", None)
            sock = getattr(stream, "_sock", None)
            if isinstance(sock, socket.socket):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._client.close()
