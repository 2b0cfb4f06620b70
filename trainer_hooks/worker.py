"""The background worker: turns queued `log()` points into columnar, idempotent batches.

One daemon thread per process. It drains the in-memory queue into batches tagged with this
process's `client_id` and an increasing `seq` (docs/api.md, "Metrics"), posts them, and when the
backend cannot be reached appends them to the spool and replays the spool in order once it can.
It also registers the run and component, sends heartbeats and posts fingerprints.
"""
from __future__ import annotations

import itertools
import logging
import math
import operator
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .spool import Spool
from .transport import Backoff, LogOnce, Transport, TransportError

log = logging.getLogger("paritywatch")

MAX_STEP = 2**53
MAX_KEY_LEN = 200
MAX_CELLS = 100_000  # the server's per-batch limit, counted on the wire (nulls included)
DROPPED_KEY = "paritywatch/dropped_points"


# ---------------------------------------------------------------- batch building (pure)

class ColumnBatch:
    """Rows of (step, {key: value}) kept column by column, as the API wants them.

    Consecutive points at the same step with disjoint keys share a row; anything else opens a new
    row (the same key twice at one step stays two points, as it was logged twice).
    """

    def __init__(self, max_points: int, max_cells: int = MAX_CELLS) -> None:
        self.max_points = max_points
        self.max_cells = max_cells
        self.steps: list[int] = []
        self.series: dict[str, list[float | None]] = {}
        self.points = 0
        self._row_keys: set[str] = set()

    def add(self, step: int, values: Mapping[str, float | None]) -> bool:
        """Add one logged entry; False (nothing added) when it would exceed the batch limits."""
        merge = bool(self.steps) and self.steps[-1] == step and self._row_keys.isdisjoint(values)
        rows = len(self.steps) + (0 if merge else 1)
        keys = len(self.series) + sum(1 for k in values if k not in self.series)
        if self.steps and (self.points + len(values) > self.max_points or rows * keys > self.max_cells):
            return False
        if not merge:
            self.steps.append(step)
            self._row_keys = set()
        row = len(self.steps) - 1
        for key, value in values.items():
            column = self.series.setdefault(key, [])
            column.extend([None] * (row - len(column)))
            column.append(value)
        self._row_keys.update(values)
        self.points += len(values)
        return True

    def columns(self) -> tuple[list[int], dict[str, list[float | None]]]:
        rows = len(self.steps)
        for column in self.series.values():
            column.extend([None] * (rows - len(column)))
        return self.steps, self.series


def clean_value(value: Any) -> float | None:
    """A finite float, or None for NaN/inf/None (the server would skip and count them anyway;
    strict JSON has no NaN). Raises for values that are not numbers."""
    if value is None:
        return None
    number = float(value)  # Python, numpy and 0-d torch numbers all convert
    return number if math.isfinite(number) else None


# ---------------------------------------------------------------- run / component identity

@dataclass(frozen=True)
class RunKey:
    name: str | None = None
    project: str = "default"
    run_id: int | None = None  # a run given by id needs no lookup

    def as_record(self) -> dict[str, Any]:
        return {"name": self.name, "project": self.project, "id": self.run_id}

    @classmethod
    def from_record(cls, data: Mapping[str, Any]) -> "RunKey":
        return cls(name=data.get("name"), project=data.get("project") or "default", run_id=data.get("id"))


@dataclass(frozen=True)
class ComponentKey:
    side: str
    worker_id: str
    host: str
    pid: int

    def as_record(self) -> dict[str, Any]:
        return {"side": self.side, "worker_id": self.worker_id, "host": self.host, "pid": self.pid}


@dataclass
class Registry:
    """Resolves (run, component) keys to server ids, once per key per process."""

    run: RunKey
    component: ComponentKey
    tags: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    _runs: dict[RunKey, int] = field(default_factory=dict)
    _components: dict[tuple[int, str, str], int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ids(self, transport: Transport, run: RunKey | None = None, component: ComponentKey | None = None,
            timeout: float | None = None) -> tuple[int, int]:
        """Server ids for a run and component (this monitor's by default). Raises TransportError."""
        run, component = run or self.run, component or self.component
        with self._lock:
            run_id = self._run_id(transport, run, timeout)
            key = (run_id, component.side, component.worker_id)
            if key not in self._components:
                body = transport.request("POST", f"/runs/{run_id}/components", json=component.as_record(),
                                         timeout=timeout)
                self._components[key] = int(body["id"])
            return run_id, self._components[key]

    def after_fork(self, component: ComponentKey) -> None:
        """In a forked child: a fresh lock (the parent's may be held) and a re-registration."""
        self._lock = threading.Lock()
        self.component = component
        self._components = {}

    def own_ids(self) -> tuple[int, int] | None:
        """This monitor's ids if already known (no network)."""
        run_id = self.run.run_id or self._runs.get(self.run)
        if run_id is None:
            return None
        cid = self._components.get((run_id, self.component.side, self.component.worker_id))
        return None if cid is None else (run_id, cid)

    def _run_id(self, transport: Transport, run: RunKey, timeout: float | None) -> int:
        if run.run_id is not None:
            return run.run_id
        if run not in self._runs:
            payload: dict[str, Any] = {"name": run.name, "project": run.project}
            if run == self.run:  # leftovers of other runs are replayed without touching their tags
                payload.update(tags=self.tags, config=self.config)
            self._runs[run] = int(transport.request("POST", "/runs", json=payload, timeout=timeout)["id"])
        return self._runs[run]


# ---------------------------------------------------------------- the worker thread

@dataclass
class WorkerStats:
    sent_points: int = 0
    sent_batches: int = 0
    duplicate_batches: int = 0
    spooled_batches: int = 0
    replayed_batches: int = 0
    spool_dropped_points: int = 0
    rejected_points: int = 0
    invalid_values: int = 0
    fingerprints_posted: int = 0
    heartbeats: int = 0
    internal_errors: int = 0


class Worker:
    """Owns the queue's consumer side, the spool, heartbeats and fingerprint posting."""

    def __init__(
        self,
        *,
        transport_factory: Callable[[], Transport],
        registry: Registry,
        spool_factory: Callable[[str], Spool | None],
        max_queue: int = 100_000,
        flush_interval_s: float = 1.0,
        max_batch_points: int = 10_000,
        heartbeat_interval_s: float = 10.0,
        max_backoff_s: float = 10.0,
        on_control: Callable[[Mapping[str, Any]], None] = lambda control: None,
    ) -> None:
        self.queue: deque[tuple[Any, Mapping[str, Any]]] = deque()
        self.max_queue = max_queue
        self.queue_dropped_points = 0  # written only by producer threads
        self.stats = WorkerStats()
        self.registry = registry
        self.flush_interval_s = flush_interval_s
        self.max_batch_points = max_batch_points
        self.heartbeat_interval_s = heartbeat_interval_s
        self.max_backoff_s = max_backoff_s
        self._transport_factory = transport_factory
        self._spool_factory = spool_factory
        self._on_control = on_control
        self._log_once = LogOnce()
        self._reset_process_state()

    def _reset_process_state(self) -> None:
        """Everything that belongs to one process: identity, thread, sockets, spool file."""
        self.client_id = uuid.uuid4().hex
        self._seq = itertools.count()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._transport: Transport | None = None
        self._spool: Spool | None = None
        self._spool_ready = False
        self._backoff = Backoff(cap=self.max_backoff_s)
        self._fingerprints: list[dict[str, Any]] = []
        self._busy = False
        self._closing = False
        self._deadline: float | None = None  # set by flush/close: finish network work by then
        self._next_heartbeat = 0.0
        self._last_step = 0
        self._reported_drops = 0

    def reset_after_fork(self) -> None:
        """In a forked child: forget the parent's queue, thread, sockets and spool file."""
        if self._spool is not None:
            self._spool.abandon_after_fork()
        self.queue = deque()
        self.queue_dropped_points = 0
        self.stats = WorkerStats()
        self._reset_process_state()

    # -- producer side (caller threads)

    def submit(self, step: Any, metrics: Mapping[str, Any]) -> bool:
        if len(self.queue) >= self.max_queue:
            self.queue_dropped_points += len(metrics)
            return False
        self.queue.append((step, dict(metrics)))  # a copy: callers reuse their dicts
        if self._thread is None:
            self.start()
        return True

    def submit_fingerprint(self, fingerprint: dict[str, Any]) -> None:
        with self._lock:
            self._fingerprints.append(fingerprint)
        self.start()
        self._wake.set()

    def dropped_points(self) -> int:
        return self.queue_dropped_points + self.stats.spool_dropped_points

    def start(self) -> None:
        with self._lock:
            if self._thread is None and not self._closing:
                self._thread = threading.Thread(target=self._run, name="paritywatch-worker", daemon=True)
                self._thread.start()

    def kick(self) -> None:
        """Run a tick now instead of at the next flush interval."""
        self._wake.set()

    def flush(self, timeout: float) -> bool:
        """Wait until everything queued so far reached the server; False at the deadline."""
        deadline = time.monotonic() + timeout
        self._deadline = deadline
        self._wake.set()
        try:
            while not self._idle():
                if time.monotonic() >= deadline or self._thread is None or not self._thread.is_alive():
                    return False
                time.sleep(0.005)
            return True
        finally:
            self._deadline = None

    def close(self, timeout: float) -> bool:
        """Flush until the deadline; what is left goes to the spool for a later process."""
        start = time.monotonic()
        delivered = self.flush(timeout) if self._thread is not None else self._idle()
        self._closing = True
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(max(0.1, timeout - (time.monotonic() - start)) + 1.0)
        if self._spool is not None:
            self._spool.close()
        if self._transport is not None:
            self._transport.close()
        return delivered

    def _idle(self) -> bool:
        # Order matters: the worker sets _busy before it pops, so "queue empty, then not busy"
        # cannot miss an entry that is being processed.
        if self.queue or self._busy or self._fingerprints:
            return False
        return self._spool is None or self._spool.is_empty()

    # -- consumer side (the worker thread)

    def _run(self) -> None:
        while True:
            self._wake.wait(self._sleep_time())
            self._wake.clear()
            closing = self._closing
            try:
                self._tick(closing)
            except Exception:  # never let one bad batch kill the thread
                self.stats.internal_errors += 1
                log.debug("paritywatch worker error", exc_info=True)
            if closing:
                return

    def _sleep_time(self) -> float:
        if self._deadline is not None:
            return 0.01 if self._backoff.ready() else min(0.05, self._backoff.remaining())
        if self._spool is not None and self._spool_ready and not self._spool.is_empty():
            return max(0.01, min(self.flush_interval_s, self._backoff.remaining()))
        return self.flush_interval_s

    def _tick(self, closing: bool) -> None:
        self._busy = True
        try:
            transport = self._transport or self._new_transport()
            self._ensure_spool()
            if not closing:
                self._post_fingerprints(transport)
            self._drain_queue(transport, offline=closing)
            if not closing:
                self._replay(transport)
                self._heartbeat(transport)
        finally:
            self._busy = False

    def _new_transport(self) -> Transport:
        self._transport = self._transport_factory()
        return self._transport

    def _ensure_spool(self) -> None:
        if not self._spool_ready:
            self._spool_ready = True
            try:
                self._spool = self._spool_factory(self.client_id)
            except OSError as exc:
                self._log_once.warning("spool", "paritywatch: spool disabled (%s); unsent points will be dropped", exc)

    def _timeout(self) -> float | None:
        return None if self._deadline is None else max(0.05, self._deadline - time.monotonic())

    # -- metrics

    def _drain_queue(self, transport: Transport, offline: bool) -> None:
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            record = self._record(batch)
            if offline or not self._backoff.ready() or (self._spool is not None and not self._spool.is_empty()):
                self._to_spool(record)  # keep order: nothing overtakes what is already spooled
            else:
                self._send_or_spool(transport, record)

    def _take_batch(self) -> ColumnBatch | None:
        batch = ColumnBatch(self.max_batch_points)
        self._add_drop_report(batch)
        queue = self.queue
        while queue:
            step, metrics = queue[0]
            entry = self._clean(step, metrics)
            if entry is not None and not batch.add(*entry):
                break  # full: this entry opens the next batch
            queue.popleft()
        return batch if batch.points else None

    def _add_drop_report(self, batch: ColumnBatch) -> None:
        """Report drops as a metric, so a gap in a chart is explained on the chart."""
        dropped = self.dropped_points()
        if dropped != self._reported_drops:
            batch.add(self._last_step, {DROPPED_KEY: float(dropped)})
            self._reported_drops = dropped

    def _clean(self, step: Any, metrics: Mapping[str, Any]) -> tuple[int, dict[str, float | None]] | None:
        try:
            step = operator.index(step)
        except TypeError:
            step = -1
        if not 0 <= step <= MAX_STEP:
            self.stats.invalid_values += len(metrics)
            self._log_once.warning("step", "paritywatch: dropped points with step %r (need an int in [0, 2**53])", step)
            return None
        values: dict[str, float | None] = {}
        for key, value in metrics.items():
            try:
                if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_LEN:
                    raise ValueError("metric keys are strings of 1..200 characters")
                cleaned = clean_value(value)
            except (TypeError, ValueError) as exc:
                self.stats.invalid_values += 1
                self._log_once.warning(("value", key), "paritywatch: dropped metric %r: %s", key, exc)
                continue
            if cleaned is not None:
                values[key] = cleaned
        self._last_step = step
        return (step, values) if values else None

    def _record(self, batch: ColumnBatch) -> dict[str, Any]:
        steps, series = batch.columns()
        ids = self.registry.own_ids()
        return {
            "v": 1,
            "run": self.registry.run.as_record(),
            "component": self.registry.component.as_record(),
            "run_id": ids[0] if ids else None,
            "component_id": ids[1] if ids else None,
            "client_id": self.client_id,
            "seq": next(self._seq),
            "steps": steps,
            "series": series,
        }

    def _send_or_spool(self, transport: Transport, record: dict[str, Any]) -> None:
        try:
            self._post(transport, record)
            self._backoff.succeeded()
        except TransportError as exc:
            if exc.retryable:
                self._backoff.failed(exc.retry_after)
                self._to_spool(record)
            else:
                self._reject(record, exc)

    def _post(self, transport: Transport, record: dict[str, Any]) -> None:
        run_id, component_id = self._ids_for(transport, record)
        payload = {k: record[k] for k in ("client_id", "seq", "steps", "series")}
        payload["component_id"] = component_id
        answer = transport.request("POST", f"/runs/{run_id}/metrics", json=payload, timeout=self._timeout())
        self.stats.sent_batches += 1
        if answer.get("duplicate"):
            self.stats.duplicate_batches += 1
        else:
            self.stats.sent_points += _points(record)

    def _ids_for(self, transport: Transport, record: dict[str, Any]) -> tuple[int, int]:
        if record.get("run_id") is not None and record.get("component_id") is not None:
            return record["run_id"], record["component_id"]
        run = RunKey.from_record(record["run"])
        component = ComponentKey(**record["component"])
        return self.registry.ids(transport, run, component, timeout=self._timeout())

    def _to_spool(self, record: dict[str, Any]) -> None:
        try:
            stored = self._spool is not None and self._spool.append(record)
        except OSError as exc:
            stored = False
            self._log_once.warning(("spool-write", type(exc)), "paritywatch: spool write failed: %s", exc)
        if stored:
            self.stats.spooled_batches += 1
        else:
            self._lost(record)
            self.stats.spool_dropped_points += _points(record, count_report=False)
            self._log_once.warning("spool-full", "paritywatch: backend unreachable and spool full: dropping points")

    def _replay(self, transport: Transport) -> None:
        spool = self._spool
        while spool is not None and self._backoff.ready():
            record = spool.peek()
            if record is None:
                return
            try:
                self._post(transport, record)
            except TransportError as exc:
                if exc.retryable:
                    self._backoff.failed(exc.retry_after)
                    return
                self._reject(record, exc)
            else:
                self._backoff.succeeded()
                self.stats.replayed_batches += 1
            spool.pop()

    def _reject(self, record: dict[str, Any], exc: TransportError) -> None:
        self._lost(record)
        self.stats.rejected_points += _points(record, count_report=False)
        self._log_once.warning(("reject", exc.status, exc.code),
                               "paritywatch: server rejected a metric batch, not retrying: %s", exc)

    # -- heartbeat and fingerprints

    def _heartbeat(self, transport: Transport) -> None:
        now = time.monotonic()
        if now < self._next_heartbeat or not self._backoff.ready():
            return
        self._next_heartbeat = now + self.heartbeat_interval_s
        try:
            run_id, component_id = self.registry.ids(transport)
            answer = transport.request("POST", f"/runs/{run_id}/components/{component_id}/heartbeat")
        except TransportError as exc:
            self._on_transport_failure(exc, "heartbeat")
            return
        self.stats.heartbeats += 1
        if isinstance(answer.get("control"), Mapping):
            self._on_control(answer["control"])

    def _post_fingerprints(self, transport: Transport) -> None:
        while self._fingerprints and self._backoff.ready():
            fingerprint = self._fingerprints[0]
            try:
                self._post_fingerprint(transport, fingerprint)
            except TransportError as exc:
                if exc.retryable:
                    self._on_transport_failure(exc, "fingerprint")
                    return
                self._log_once.warning(("fingerprint", exc.status, exc.code),
                                       "paritywatch: server rejected the fingerprint: %s", exc)
            with self._lock:
                self._fingerprints.pop(0)

    def _post_fingerprint(self, transport: Transport, fingerprint: dict[str, Any]) -> None:
        """Content-addressed: the digest alone is enough when the server already stores it."""
        run_id, component_id = self.registry.ids(transport, timeout=self._timeout())
        path = f"/runs/{run_id}/components/{component_id}/fingerprint"
        try:
            transport.request("POST", path, json={"digest": fingerprint["digest"]}, timeout=self._timeout())
        except TransportError as exc:
            if exc.status != 404 or exc.code != "fingerprint_unknown":
                raise
            transport.request("POST", path, json=fingerprint, timeout=self._timeout())
        self.stats.fingerprints_posted += 1

    def _on_transport_failure(self, exc: TransportError, what: str) -> None:
        if exc.retryable:
            self._backoff.failed(exc.retry_after)
        else:
            self._log_once.warning((what, exc.status, exc.code), "paritywatch: %s failed: %s", what, exc)


    def _lost(self, record: Mapping[str, Any]) -> None:
        if DROPPED_KEY in record["series"]:
            self._reported_drops = -1  # the report itself was lost: send the total again


def _points(record: Mapping[str, Any], count_report: bool = True) -> int:
    return sum(
        1
        for key, column in record["series"].items()
        if count_report or key != DROPPED_KEY
        for value in column
        if value is not None
    )
