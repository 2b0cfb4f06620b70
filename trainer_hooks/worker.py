"""The background worker: one daemon thread per process that turns queued `log()` points into
batches and runs everything that talks to the backend on the worker's side.

Each tick: open the spool (adopting leftovers of crashed processes), post pending fingerprints, weight
attestations and per-sample audits (bounded in memory, never spooled),
drain the queue into batches (`batch.py`) and deliver them (`delivery.py`: send, spool or drop),
report the points this process lost if the server's figure is behind, replay the spool; heartbeats
(`heartbeat.py`) have a thread of their own. One `Backoff` paces all of it: when the backend is
away nothing is attempted before the backoff allows, and new batches go straight to the spool.
`flush()` waits, on a condition the thread signals after every tick, until the queue, the
fingerprints, the attestations, the audits and the spool (adopted leftovers included) are all empty.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable, Mapping

from .batch import ColumnBatch, clean_entry
from .delivery import Losses, MetricDelivery
from .health import Undelivered
from .heartbeat import Heartbeat
from .logs import LogOnce, log
from .registry import Registry
from .spool import Spool
from .transport import Backoff, Transport
from .uploads import AttestationUploads, AuditUploads, FingerprintUploads

# Audits waiting while the backend is away; beyond this the oldest go (each is up to ~100 KB).
MAX_PENDING_AUDITS = 32

# A flush re-checks at least this often even if no tick signals (a thread that died, say).
_FLUSH_RECHECK_S = 0.5
_HEARTBEAT_RECHECK_S = 1.0  # the heartbeat thread re-reads its schedule at least this often (a backoff may end early)


class Worker:
    """Owns the queue's consumer side and the thread; the delivery, heartbeat and fingerprint
    uploads do the talking."""

    def __init__(
        self,
        *,
        backend: str,
        transport_factory: Callable[[], Transport],
        registry: Registry,
        spool_factory: Callable[[str], Spool | None],
        max_queue: int = 100_000,
        flush_interval_s: float = 1.0,
        max_batch_points: int = 10_000,
        heartbeat_interval_s: float = 10.0,
        max_backoff_s: float = 10.0,
        on_control: Callable[[Mapping[str, Any]], None] = lambda control: None,
        on_tick: Callable[[], None] = lambda: None,
        drops_batches: Callable[[], bool] = lambda: False,
    ) -> None:
        self.queue: deque[tuple[Any, Mapping[str, Any]]] = deque()
        self.max_queue = max_queue
        self.registry = registry
        self.flush_interval_s = flush_interval_s
        self.max_batch_points = max_batch_points
        self.heartbeat_interval_s = heartbeat_interval_s
        self.max_backoff_s = max_backoff_s
        self.internal_errors = 0
        self.invalid_values = 0
        self._backend = backend
        self._transport_factory = transport_factory
        self._spool_factory = spool_factory
        self._on_control = on_control
        self._on_tick = on_tick
        self._drops_batches = drops_batches
        self._reset_process_state()

    def _reset_process_state(self) -> None:
        """Everything that belongs to one process: identity, thread, sockets, spool file, counters."""
        self._log_once = LogOnce()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._tick_done = threading.Condition()
        self._thread: threading.Thread | None = None
        self._heartbeat_thread: threading.Thread | None = None
        self._heartbeat_wake = threading.Event()
        self._transport: Transport | None = None
        self._spool_ready = False
        self._busy = False
        self._closing = False
        self._deadline: float | None = None  # set by flush/close: finish network work by then
        self.backoff = Backoff(cap=self.max_backoff_s)
        self.losses = Losses()
        self.delivery = MetricDelivery(backend=self._backend, registry=self.registry, backoff=self.backoff,
                                       losses=self.losses, timeout=self._timeout, log_once=self._log_once,
                                       drops_batches=self._drops_batches)
        self.heartbeat = Heartbeat(registry=self.registry, backoff=self.backoff, interval_s=self.heartbeat_interval_s,
                                   on_control=self._on_control, log_once=self._log_once,
                                   delivered_points=lambda: self.delivery.stats.sent_points)
        self.fingerprints = FingerprintUploads(registry=self.registry, backoff=self.backoff, timeout=self._timeout,
                                               log_once=self._log_once)
        self.audits = AuditUploads(registry=self.registry, backoff=self.backoff, timeout=self._timeout,
                                   log_once=self._log_once, max_pending=MAX_PENDING_AUDITS)
        self.attestations = AttestationUploads(registry=self.registry, backoff=self.backoff, timeout=self._timeout,
                                               log_once=self._log_once)

    @property
    def client_id(self) -> str:
        return self.delivery.client_id

    def reset_after_fork(self) -> None:
        """In a forked child: forget the parent's queue, thread, sockets and spool file."""
        if self.delivery.spool is not None:
            self.delivery.spool.abandon_after_fork()
        self.queue = deque()
        self.internal_errors = self.invalid_values = 0
        self._reset_process_state()

    def undelivered(self) -> Undelivered:
        return Undelivered(waiting=self.delivery.waiting, dropped=self.losses.batches, dropped_points=self.losses.points)

    def stats(self) -> dict[str, Any]:
        spool = self.delivery.spool
        return {
            **vars(self.delivery.stats),
            "queued": len(self.queue),
            "spool_waiting_batches": self.delivery.waiting,
            "dropped_batches": self.losses.batches,
            "dropped_points": self.losses.points,
            "queue_dropped_points": self.losses.queue_full,
            "spool_dropped_points": self.losses.spool_full,
            "rejected_points": self.losses.rejected,
            "spool_skipped_lines": 0 if spool is None else spool.skipped_lines,
            "invalid_values": self.invalid_values,
            "fingerprints_posted": self.fingerprints.posted,
            "fingerprints_dropped": self.fingerprints.dropped,
            "audits_posted": self.audits.posted,
            "audits_dropped": self.audits.dropped,
            "attestations_posted": self.attestations.posted,
            "attestations_dropped": self.attestations.dropped,
            "heartbeats": self.heartbeat.sent,
            "internal_errors": self.internal_errors,
            "client_id": self.client_id,
        }

    # -- producer side (caller threads)

    def submit(self, step: Any, metrics: Mapping[str, Any]) -> bool:
        if len(self.queue) >= self.max_queue:
            self.losses.count_queue_full(len(metrics))
            return False
        self.queue.append((step, dict(metrics)))  # a copy: callers reuse their dicts
        if self._thread is None:
            self.start()
        return True

    def submit_fingerprint(self, fingerprint: dict[str, Any]) -> None:
        self.fingerprints.submit(fingerprint)
        self.start()
        self._wake.set()

    def submit_audit(self, audit: dict[str, Any]) -> None:
        self.audits.submit(audit)
        self.start()
        self._wake.set()

    def submit_attestation(self, attestation: dict[str, Any]) -> None:
        self.attestations.submit(attestation)
        self.start()
        self._wake.set()

    def start(self) -> None:
        with self._lock:
            if self._thread is None and not self._closing:
                self._thread = threading.Thread(target=self._run, name="paritywatch-worker", daemon=True)
                self._thread.start()
                self._heartbeat_thread = threading.Thread(target=self._run_heartbeats, name="paritywatch-heartbeat",
                                                          daemon=True)
                self._heartbeat_thread.start()

    def set_policy_version(self, version: Any) -> None:
        """Carried on the next heartbeat; a new version makes that one come early."""
        if self.heartbeat.progress.set_policy_version(version):
            self.heartbeat.beat_soon()
            self._heartbeat_wake.set()

    def add_samples(self, n: int) -> None:
        self.heartbeat.progress.add_samples(n)

    def kick(self) -> None:
        """Run a tick now instead of at the next flush interval."""
        self._wake.set()

    def flush(self, timeout: float, give_up: Callable[[], bool] = lambda: False) -> bool:
        """Wait until everything queued so far, and the leftovers adopted from crashed processes,
        reached the server; False at the deadline, or as soon as `give_up()` says waiting is vain."""
        deadline = time.monotonic() + timeout
        self._deadline = deadline
        self._wake.set()
        try:
            with self._tick_done:
                while not self._idle():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self._thread is None or not self._thread.is_alive() or give_up():
                        return False
                    self._tick_done.wait(min(remaining, _FLUSH_RECHECK_S))
                return True
        finally:
            self._deadline = None

    def close(self, timeout: float, give_up: Callable[[], bool] = lambda: False) -> bool:
        """Flush until the deadline (or until `give_up()`); what is left goes to the spool for a
        later process. Returns within `timeout` plus at most ~1 s for the threads to end."""
        start = time.monotonic()
        if self._thread is not None:
            delivered = self.flush(timeout, give_up)
        else:  # never started in this process: nothing was sent, nothing adopted
            delivered = not self.queue and not self._uploads_pending()
        self._closing = True
        self._wake.set()
        self._heartbeat_wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(max(0.1, timeout - (time.monotonic() - start)) + 1.0)
        if self._heartbeat_thread is not None:  # at most one beat in flight; a daemon if it hangs
            self._heartbeat_thread.join(max(0.1, timeout - (time.monotonic() - start)))
        if self.delivery.spool is not None:
            self.delivery.spool.close()
        if self._transport is not None:
            self._transport.close()
        return delivered

    def _idle(self) -> bool:
        # Order matters: the worker sets _busy before it pops, so "queue empty, then not busy"
        # cannot miss an entry that is being processed. Until the first tick opened the spool,
        # leftovers it will adopt are unknown: not idle.
        if self.queue or self._busy or self._uploads_pending() or not self._spool_ready or self.losses.report_pending():
            return False
        spool = self.delivery.spool
        return spool is None or spool.is_empty()

    def _uploads_pending(self) -> bool:
        return self.fingerprints.pending() or self.attestations.pending() or self.audits.pending()

    # -- consumer side (the worker thread)

    def _run(self) -> None:
        try:
            while True:
                self._wake.wait(self._sleep_time())
                self._wake.clear()
                closing = self._closing
                try:
                    self._tick(closing)
                    self._on_tick()
                except Exception:  # never let one bad batch kill the thread
                    self.internal_errors += 1
                    log.debug("paritywatch worker error", exc_info=True)
                with self._tick_done:
                    self._tick_done.notify_all()
                if closing:
                    return
        finally:
            with self._tick_done:
                self._tick_done.notify_all()

    def _sleep_time(self) -> float:
        if self._deadline is not None:
            return 0.01 if self.backoff.ready() else min(0.05, self.backoff.remaining())
        spool = self.delivery.spool
        if spool is not None and not spool.is_empty():
            return max(0.01, min(self.flush_interval_s, self.backoff.remaining()))
        return self.flush_interval_s

    def _tick(self, closing: bool) -> None:
        self._busy = True
        try:
            transport = self._transport or self._new_transport()
            self._ensure_spool()
            if not closing:
                self.fingerprints.post_pending(transport)
                self.attestations.post_pending(transport)
            self._drain_queue(transport, offline=closing)
            if not closing:
                self.audits.post_pending(transport)  # after the batch's metrics: they explain its alerts
                self.delivery.replay(transport)
            self.delivery.report_losses(transport, offline=closing)  # last: what this tick lost counts
        finally:
            self._busy = False

    def _run_heartbeats(self) -> None:
        """The heartbeat thread. Its own thread and connection: a delivery the server is slow to
        answer (up to the transport's timeout) must not silence the process, or a live process
        would be reported lost. It shares the backoff: a backend that is down is not hammered."""
        transport = self._transport_factory()
        try:
            while not self._closing:
                self._heartbeat_wake.wait(min(self.heartbeat.seconds_to_next(), _HEARTBEAT_RECHECK_S))
                self._heartbeat_wake.clear()
                if self._closing:
                    return
                try:
                    self.heartbeat.beat_if_due(transport)
                except Exception:  # never let one bad beat kill the thread
                    self.internal_errors += 1
                    log.debug("paritywatch heartbeat error", exc_info=True)
        finally:
            transport.close()

    def _new_transport(self) -> Transport:
        self._transport = self._transport_factory()
        return self._transport

    def _ensure_spool(self) -> None:
        if not self._spool_ready:
            try:
                self.delivery.spool = self._spool_factory(self.client_id)
            except OSError as exc:
                self._log_once.warning("spool", "paritywatch: spool disabled (%s); unsent points will be dropped", exc)
            self._spool_ready = True

    def _timeout(self) -> float | None:
        return None if self._deadline is None else max(0.05, self._deadline - time.monotonic())

    # -- metrics

    def _drain_queue(self, transport: Transport, offline: bool) -> None:
        while (batch := self._take_batch()) is not None:
            self.delivery.deliver(transport, self.delivery.record(batch), offline=offline)
        if self.losses.queue_full:  # said here, not by log() on the training thread
            self._log_once.warning("queue-full", "paritywatch: log() was called faster than the points could be "
                                   "sent: the queue (max_queue=%d) was full and dropped points (counted in "
                                   "stats()['queue_dropped_points'])", self.max_queue)

    def _take_batch(self) -> ColumnBatch | None:
        batch = ColumnBatch(self.max_batch_points)
        queue = self.queue
        while queue:
            step, metrics = queue[0]
            entry = self._clean(step, metrics)
            if entry is not None and not batch.add(*entry):
                break  # full: this entry opens the next batch
            queue.popleft()
        return batch if batch.points else None

    def _clean(self, step: Any, metrics: Mapping[str, Any]) -> tuple[int, dict[str, float]] | None:
        entry = clean_entry(step, metrics)
        for key, problem in entry.problems:
            self.invalid_values += 1
            if entry.step is None:
                self._log_once.warning("step", "paritywatch: dropped points: %s", problem)
            else:
                self._log_once.warning(("value", key), "paritywatch: dropped metric %r: %s", key, problem)
        if entry.step is None:
            return None
        return (entry.step, entry.values) if entry.values else None
