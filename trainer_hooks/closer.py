"""How a monitor ends: the close protocol, and the finalizers that run it at exit.

`Closer.close` stops the control poll, sends what is queued while the backend takes this
process's requests (else spools it at once), then says goodbye in the last quarter of the time (at
most 1 s): the trainer acknowledges a `stopping` run, every process reports it closed. What was not
delivered is said once on stderr. Monitors still open at interpreter exit (atexit) or at the end of
a multiprocessing fork child (which leaves through os._exit: only its finalizers run) are closed
with their `atexit_timeout_s`.
"""
from __future__ import annotations

import atexit
import os
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Mapping

from . import contract
from .control import ControlPoller, ControlState
from .health import BackendHealth
from .logs import log
from .registry import Registry
from .transport import Transport, TransportError
from .worker import Worker

if TYPE_CHECKING:
    from .monitor import ParityMonitor

_GOODBYE_S = 1.0  # of close()'s time, kept for telling the backend this process ended
_LIVE: "weakref.WeakSet[ParityMonitor]" = weakref.WeakSet()


class Closer:
    """The close protocol over the monitor's worker, poller, health, registry and control state."""

    def __init__(self, *, side: str, url: str, spool_dir: Any, worker: Worker, poller: ControlPoller,
                 health: BackendHealth, registry: Registry, control: ControlState,
                 new_transport: Callable[[], Transport]) -> None:
        self._side, self._url, self._spool_dir = side, url, spool_dir
        self._worker, self._poller, self._health = worker, poller, health
        self._registry, self._control = registry, control
        self._new_transport = new_transport

    def close(self, timeout: float) -> bool:
        """True when everything logged reached the backend."""
        self._poller.stop()
        deadline = time.monotonic() + timeout
        goodbye_s = min(_GOODBYE_S, timeout / 4)
        delivered = self._worker.close(timeout - goodbye_s, give_up=lambda: self._health.problem is not None)
        if self._health.problem is None:
            self._acknowledge_stop(max(goodbye_s / 2, deadline - time.monotonic()))
            self._report_closed(max(goodbye_s / 2, deadline - time.monotonic()))
        self._say_undelivered()
        return delivered

    def _say_undelivered(self) -> None:
        undelivered = self._worker.undelivered()
        if undelivered.batches or undelivered.dropped_points:
            later = (f"; the spool is replayed by the next process that uses {self._url}" if undelivered.waiting
                     else "")
            log.warning("paritywatch: closed. %s%s.", undelivered.describe(self._spool_dir), later)

    def _acknowledge_stop(self, timeout: float) -> None:
        """Only the trainer answers for the run: rollout workers end when it does."""
        ids = self._registry.own_ids()
        if self._side != "trainer" or self._control.state != "stopping" or ids is None:
            return
        run_id, component_id = ids
        transport = self._new_transport()
        try:
            control = transport.request("POST", contract.run_path(run_id, "control/stopped"),
                                        json={"component_id": component_id}, timeout=timeout)
            self._control.observe(control)
        except TransportError as exc:
            log.warning("paritywatch: could not report that the run stopped (the server marks it stopped once "
                        "the run's heartbeats cease): %s", exc)
        finally:
            transport.close()

    def _report_closed(self, timeout: float) -> None:
        ids = self._registry.own_ids()
        if ids is None:
            return  # never registered: the server knows nothing to close
        run_id, component_id = ids
        transport = self._new_transport()
        try:
            control = transport.request("POST", contract.component_path(run_id, component_id, "close"),
                                        json={"reason": "ParityMonitor.close()"}, timeout=timeout)
            if isinstance(control.get("control"), Mapping):
                self._control.observe(control["control"])
        except TransportError as exc:
            log.warning("paritywatch: could not report that this process closed (the server will count it as "
                        "lost once its heartbeats stop): %s", exc)
        finally:
            transport.close()


# ------------------------------------------------------------ closing at exit


def close_at_exit(monitor: "ParityMonitor") -> None:
    """Close `monitor` when the interpreter exits, unless it was closed before."""
    _LIVE.add(monitor)


def skip_at_exit(monitor: "ParityMonitor") -> None:
    """`monitor` closed: nothing left to do at exit."""
    _LIVE.discard(monitor)


def register_fork_finalizer(monitor: "ParityMonitor") -> None:
    """multiprocessing's fork children leave through os._exit (no atexit); its finalizers run."""
    import multiprocessing.util

    multiprocessing.util.Finalize(None, _close_if_ours, args=(weakref.ref(monitor),), exitpriority=100)


def _close_if_ours(ref: "weakref.ref[ParityMonitor]") -> None:
    monitor = ref()
    if monitor is not None and monitor._pid == os.getpid():  # a fork child's copy it never used is the parent's
        monitor.close(monitor.atexit_timeout_s)


@atexit.register
def _close_all_at_exit() -> None:
    for monitor in list(_LIVE):
        _close_if_ours(weakref.ref(monitor))
