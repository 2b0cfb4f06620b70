"""HTTP for the hooks: one request, its failure classified; and the pacing of retries.

Every failure becomes a `TransportError` that says whether retrying can help (the rule is the wire
contract's, `contract.is_retryable_status`) and, when the server said so (429/503 Retry-After), how
long to wait. Retries are paced, never slept: `Backoff` says when the next attempt may start, so
the worker keeps draining the queue into the spool meanwhile. The schedule and the Retry-After
parsing are urllib3's `Retry` (docs/design.md, "Libraries and why"), as in the webhook dispatcher.
Nothing here touches the training loop: callers are the worker and control threads.
"""
from __future__ import annotations

import math
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import httpx
from urllib3.exceptions import InvalidHeader
from urllib3.util.retry import Retry

from . import contract

# A server asking for more than this is treated as asking for this: the spool keeps the data.
MAX_RETRY_AFTER_S = 300.0
_RETRY_AFTER = Retry(total=None)

# What a request is for, when that changes what its failure means (health.problem_of):
PROBE = "probe"  # GET /whoami before the first registration: is this the Paritywatch API, does it take the token?
REGISTRATION = "registration"  # POST /runs, POST /runs/{id}/components for this process's own run
FOREIGN = "foreign"  # registering or posting a batch an earlier process spooled for another run


class TransportError(Exception):
    """A request that did not succeed, classified for the caller.

    `status` is None when no answer came (refused, reset, timed out); `code` and `detail` are the
    server's error code and message when it sent them (`code` is None for an answer that is not
    Paritywatch's error envelope); `purpose` is the request's (PROBE, REGISTRATION, FOREIGN or None);
    `problem` is set by a caller that judged an answer itself (health.problem_of reads it first)."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        status: int | None = None,
        code: str | None = None,
        detail: str | None = None,
        retry_after: float | None = None,
        purpose: str | None = None,
        problem: str | None = None,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status
        self.code = code
        self.detail = detail
        self.retry_after = retry_after
        self.purpose = purpose
        self.problem = problem


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date), clamped to
    [0, MAX_RETRY_AFTER_S]; None when absent or unreadable."""
    if not value:
        return None
    try:
        seconds = _RETRY_AFTER.parse_retry_after(value)
    except InvalidHeader:
        return None
    return min(float(seconds), MAX_RETRY_AFTER_S)


class Backoff:
    """Pacing of one retried activity: when may its next attempt start.

    urllib3's schedule: after the first failure retry at once, then `base * 2**n` plus up to
    `base` of random jitter (so hundreds of workers do not come back in step), capped at `cap`.
    A longer Retry-After from the server wins."""

    def __init__(self, *, base: float = 0.5, cap: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self._fresh = Retry(total=None, backoff_factor=base, backoff_max=cap, backoff_jitter=base)
        self._policy = self._fresh
        # Past this many failures the delay is at the cap: stop growing urllib3's history.
        self._max_history = 2 + math.ceil(math.log2(max(cap / base, 1.0))) if base > 0 else 1
        self._clock = clock
        self.not_before = 0.0

    @property
    def failures(self) -> int:
        return len(self._policy.history)

    def ready(self) -> bool:
        return self._clock() >= self.not_before

    def remaining(self) -> float:
        return max(0.0, self.not_before - self._clock())

    def failed(self, retry_after: float | None = None) -> float:
        """Record a failure; returns the delay chosen."""
        if len(self._policy.history) < self._max_history:
            self._policy = self._policy.increment()
        delay = self._policy.get_backoff_time()
        if retry_after is not None:
            delay = max(delay, retry_after)
        self.not_before = self._clock() + delay
        return delay

    def succeeded(self) -> None:
        self._policy = self._fresh
        self.not_before = 0.0


@dataclass(frozen=True)
class TransportConfig:
    url: str
    token: str | None = None
    # Paths are relative to url + prefix; "" for a server that is not Paritywatch (the vLLM check).
    prefix: str = contract.API_PREFIX
    headers: Mapping[str, str] = field(default_factory=dict)
    connect_timeout_s: float = 3.0
    timeout_s: float = 10.0


def _server_message(response: httpx.Response) -> tuple[str | None, str]:
    """(code, message) of an error answer: our envelope, another server's JSON, or its text."""
    try:
        body = response.json()
    except ValueError:  # a proxy's HTML error page is still an error; its body just isn't ours
        return None, response.text[:200] or response.reason_phrase
    code, message = contract.error_code_and_message(body)
    if message is None and isinstance(body, dict):
        other = body.get("error", body)
        other = other if isinstance(other, dict) else {"message": other}
        message = str(other.get("message") or other.get("detail") or other)
    return code, (message or response.reason_phrase)[:500]


def _error_from_response(response: httpx.Response) -> TransportError:
    status = response.status_code
    code, message = _server_message(response)
    retry_after = None
    if status in contract.RETRY_AFTER_STATUSES:
        retry_after = parse_retry_after(response.headers.get("retry-after"))
    return TransportError(f"HTTP {status} {code or ''}: {message}", retryable=contract.is_retryable_status(status),
                          status=status, code=code, detail=message, retry_after=retry_after)


# Hears (the error or None for an answer, the request's purpose) of every request.
Observer = Callable[["TransportError | None", "str | None"], None]


class Transport:
    """One httpx client for one thread (sockets are per-thread and never shared across a fork).

    `observer` hears the outcome of every request (None for an answer, the error otherwise): the
    monitor's health tracker, so reachability is judged from all traffic, not one channel."""

    def __init__(self, config: TransportConfig, *, observer: Observer | None = None):
        self.config = config
        self._observer = observer
        self._aborted = False
        headers = {"User-Agent": "paritywatch-hooks/0.1", **config.headers}
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        self._client = httpx.Client(
            base_url=config.url.rstrip("/") + config.prefix,
            headers=headers,
            timeout=httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s),
            # One thread's client has one request in flight: a small pool is plenty. The expiry
            # is the contract's (shorter than the server's, so the hook drops an idle one first).
            limits=httpx.Limits(max_connections=10, max_keepalive_connections=10,
                                keepalive_expiry=contract.HOOK_KEEPALIVE_S),
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
        purpose: str | None = None,
    ) -> Any:
        """One attempt. Returns the decoded JSON body of a 2xx answer or raises TransportError."""
        try:
            body = self._attempt(method, path, json=json, params=params, timeout=timeout)
        except TransportError as exc:
            exc.purpose = purpose
            self.report(exc, purpose)
            raise
        self.report(None, purpose)
        return body

    def _attempt(self, method: str, path: str, *, json: Any, params: dict[str, Any] | None,
                 timeout: float | None) -> Any:
        kwargs: dict[str, Any] = {"json": json, "params": params}
        if timeout is not None:
            kwargs["timeout"] = httpx.Timeout(timeout, connect=min(timeout, self.config.connect_timeout_s))
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:  # refused, reset, timed out, DNS: the server may come back
            raise TransportError(f"{type(exc).__name__}: {exc}", retryable=True) from exc
        if not response.is_success:
            raise _error_from_response(response)
        try:
            return response.json()
        except ValueError as exc:
            raise TransportError("2xx answer is not JSON", retryable=False, status=response.status_code) from exc

    def report(self, error: TransportError | None, purpose: str | None = None) -> None:
        """Tell the observer an outcome: every request's, and a caller's own verdict on an answer."""
        if self._observer is None or (error is not None and self._aborted):
            return  # the error of a request we aborted ourselves says nothing about the server
        try:
            self._observer(error, purpose)
        except Exception:  # an observer never turns a request into a failure
            pass

    def abort(self) -> None:
        """Wake a request blocked in another thread (a long-poll) by shutting its sockets down:
        on Linux closing a socket does not wake a blocked recv. Best effort over httpcore's
        internals; when they move, the blocked thread simply finishes its poll."""
        self._aborted = True
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
