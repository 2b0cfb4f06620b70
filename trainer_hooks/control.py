"""Run control for the hooks: long-poll the run's control state, block the loop while paused.

A daemon thread long-polls `GET /runs/{id}/control/wait` (the server answers at once when the
version moved, so a pause reaches the loop within one round trip). Heartbeat answers carry the
control state too and feed the same `observe()`. While the backend cannot be reached the loop
keeps training (fail-open) unless the monitor was built with `fail_closed=True`.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Mapping

from . import contract
from .health import problem_of
from .logs import LogOnce, log
from .transport import Backoff, Transport, TransportError

STOP_STATES = frozenset(contract.STOP_STATES)


class ControlState:
    """The last control state seen, and a condition the training loop can wait on."""

    def __init__(self, *, fail_closed: bool = False, startup_grace_s: float = 2.0) -> None:
        self.fail_closed = fail_closed
        # A run paused before this process started must hold its very first step too: until the
        # server's first answer, "unknown" counts as blocked. Fail-open ends that at the first
        # failure to reach the backend, or when the grace runs out (a backend that hangs).
        self._grace_until = time.monotonic() + startup_grace_s
        self.state = "unknown"
        self.version = 0
        self.reason: str | None = None
        self.reachable = False
        self._cond = threading.Condition()

    def reset_after_fork(self) -> None:
        self._cond = threading.Condition()  # the parent's may have been held at fork time

    @property
    def should_stop(self) -> bool:
        return self.state in STOP_STATES

    def observe(self, control: Mapping[str, Any]) -> None:
        """Apply a control object from the server unless it is older than what we have."""
        version = int(control.get("version", 0))
        with self._cond:
            if version < self.version:
                return  # a heartbeat answer that raced a newer long-poll answer
            if self.state != control.get("state"):
                log.info("paritywatch: run is now %s (%s)", control.get("state"), control.get("reason") or "no reason")
            self.version = version
            self.state = str(control.get("state", self.state))
            self.reason = control.get("reason")
            self.reachable = True
            self._cond.notify_all()

    def set_reachable(self, reachable: bool) -> None:
        with self._cond:
            if not reachable:
                self._grace_until = 0.0  # the backend is down: fail-open now, not after the grace
            self.reachable = reachable
            self._cond.notify_all()  # always: the grace ending releases a waiter even if nothing else changed

    def blocked(self) -> bool:
        if self.state == "unknown" and not self.fail_closed and time.monotonic() < self._grace_until:
            return True
        return self.state == "paused" or (self.fail_closed and not self.reachable)

    def wait_if_paused(self, timeout: float | None = None) -> bool:
        """Block while paused (or, fail-closed, while the backend is unreachable).
        True once released (resumed, stopping, or never paused); False if `timeout` ran out."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self.blocked():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                if self.state == "unknown":  # re-check when the start-up grace ends
                    grace_left = max(0.0, self._grace_until - time.monotonic())
                    remaining = grace_left if remaining is None else min(remaining, grace_left)
                self._cond.wait(remaining)
            return True


class ControlPoller:
    """The long-poll thread. `resolve_run_id` may raise TransportError while the backend is down."""

    def __init__(
        self,
        state: ControlState,
        *,
        transport_factory: Callable[[], Transport],
        resolve_run_id: Callable[[Transport], int],
        poll_timeout_s: float = 25.0,
        max_backoff_s: float = 10.0,
    ) -> None:
        self.state = state
        self.poll_timeout_s = poll_timeout_s
        self.max_backoff_s = max_backoff_s
        self._transport_factory = transport_factory
        self._resolve_run_id = resolve_run_id
        self._log_once = LogOnce()
        self.internal_errors = 0
        self.reset_after_fork()

    def reset_after_fork(self) -> None:
        self._thread: threading.Thread | None = None
        self._transport: Transport | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._backoff = Backoff(cap=self.max_backoff_s)

    def start(self) -> None:
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="paritywatch-control", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        """End the thread, aborting its open long-poll so the server does not hold a request
        for a closed monitor (the thread is a daemon: nobody joins it)."""
        self._stop.set()
        transport = self._transport
        if transport is not None:
            try:
                transport.abort()
            except Exception:  # best effort: the daemon thread ends after its poll anyway
                pass

    def _run(self) -> None:
        transport = self._transport = self._transport_factory()
        try:
            while not self._stop.is_set():
                if not self._backoff.ready():
                    self._stop.wait(self._backoff.remaining())
                    continue
                try:
                    self._poll_once(transport)
                except Exception:  # a guard: the control thread must outlive any surprise
                    self.internal_errors += 1
                    log.debug("paritywatch control error", exc_info=True)
                    self._backoff.failed()
        finally:
            transport.close()

    def _poll_once(self, transport: Transport) -> None:
        try:
            run_id = self._resolve_run_id(transport)
            control = transport.request(
                "GET",
                contract.run_path(run_id, "control/wait"),
                params={"after_version": self.state.version, "timeout": self.poll_timeout_s},
                timeout=self.poll_timeout_s + 10.0,
            )
        except TransportError as exc:
            self.state.set_reachable(False)
            if not exc.retryable and problem_of(exc) is None:  # a problem (a refused token...) is said by health.py
                self._log_once.warning(("control", exc.status, exc.code), "paritywatch: control poll failed: %s", exc)
            self._backoff.failed(exc.retry_after)
            return
        self._backoff.succeeded()
        if not self._stop.is_set():
            self.state.observe(control)
