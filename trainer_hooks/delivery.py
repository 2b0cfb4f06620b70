"""Metric batches to the server, each exactly once: send now, or spool and replay in order.

Runs on the worker thread. A batch that cannot be sent (the backend is away, or paced by the
backoff) goes to the spool, and nothing overtakes what is already spooled; the spool is replayed
oldest first once the backend answers. A batch the server refuses (4xx other than the retryable
ones) is dropped, counted and logged once: repeating it cannot help.
"""
from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from . import contract
from .batch import ColumnBatch
from .logs import LogOnce
from .records import make_record, record_points, wire_batch
from .registry import ComponentKey, Registry, RunKey
from .spool import Spool
from .transport import Backoff, Transport, TransportError


@dataclass
class DeliveryStats:
    sent_points: int = 0
    sent_batches: int = 0
    duplicate_batches: int = 0
    spooled_batches: int = 0
    replayed_batches: int = 0
    rejected_points: int = 0


class DropReport:
    """Lost points reported as a metric (`contract.DROPPED_POINTS_KEY`), so a gap in a chart is
    explained on the chart. `queue_dropped` is written only by producer threads."""

    def __init__(self) -> None:
        self.queue_dropped = 0
        self.spool_dropped = 0
        self._reported = 0

    @property
    def total(self) -> int:
        return self.queue_dropped + self.spool_dropped

    def add_to(self, batch: ColumnBatch, step: int) -> None:
        total = self.total
        if total != self._reported:
            batch.add(step, {contract.DROPPED_POINTS_KEY: float(total)})
            self._reported = total

    def lost(self, record: dict[str, Any]) -> None:
        if contract.DROPPED_POINTS_KEY in record["series"]:
            self._reported = -1  # the report itself was lost: send the total again


class MetricDelivery:
    def __init__(self, *, backend: str, registry: Registry, backoff: Backoff, drops: DropReport,
                 timeout: Callable[[], float | None], log_once: LogOnce) -> None:
        self.backend = backend
        self.registry = registry
        self.backoff = backoff
        self.drops = drops
        self.stats = DeliveryStats()
        self.client_id = uuid.uuid4().hex
        self.spool: Spool | None = None
        self._seq = itertools.count()
        self._timeout = timeout
        self._log_once = log_once

    def record(self, batch: ColumnBatch) -> dict[str, Any]:
        """The batch as sent and spooled: tagged with this process's (client_id, next seq)."""
        steps, series = batch.columns()
        return make_record(backend=self.backend, run=self.registry.run.as_record(),
                           component=self.registry.component.as_record(), ids=self.registry.own_ids(),
                           client_id=self.client_id, seq=next(self._seq), steps=steps, series=series)

    def deliver(self, transport: Transport, record: dict[str, Any], *, offline: bool) -> None:
        spool_waiting = self.spool is not None and not self.spool.is_empty()
        if offline or not self.backoff.ready() or spool_waiting:
            self.to_spool(record)  # keep order: nothing overtakes what is already spooled
            return
        try:
            self._post(transport, record)
            self.backoff.succeeded()
        except TransportError as exc:
            if exc.retryable:
                self.backoff.failed(exc.retry_after)
                self.to_spool(record)
            else:
                self._reject(record, exc)

    def replay(self, transport: Transport) -> None:
        """Send spooled batches oldest first until the spool is empty or a send fails."""
        spool = self.spool
        while spool is not None and self.backoff.ready():
            record = spool.peek()
            if record is None:
                return
            try:
                self._post(transport, record)
            except TransportError as exc:
                if exc.retryable:
                    self.backoff.failed(exc.retry_after)
                    return
                self._reject(record, exc)
            else:
                self.backoff.succeeded()
                self.stats.replayed_batches += 1
            spool.pop()

    def to_spool(self, record: dict[str, Any]) -> None:
        try:
            stored = self.spool is not None and self.spool.append(record)
        except (OSError, ValueError) as exc:
            stored = False
            self._log_once.warning(("spool-write", type(exc)), "paritywatch: spool write failed: %s", exc)
        if stored:
            self.stats.spooled_batches += 1
            return
        self.drops.lost(record)
        self.drops.spool_dropped += record_points(record, count_report=False)
        self._log_once.warning("spool-full", "paritywatch: backend unreachable and spool full: dropping points")

    def _post(self, transport: Transport, record: dict[str, Any]) -> None:
        run_id, component_id = self._ids_for(transport, record)
        answer = transport.request("POST", f"/runs/{run_id}/metrics", json=wire_batch(record, component_id),
                                   timeout=self._timeout())
        self.stats.sent_batches += 1
        if answer.get("duplicate"):
            self.stats.duplicate_batches += 1
        else:
            self.stats.sent_points += record_points(record)

    def _ids_for(self, transport: Transport, record: dict[str, Any]) -> tuple[int, int]:
        """A replayed batch of another (dead) process registers that process's run and component."""
        if record.get("run_id") is not None and record.get("component_id") is not None:
            return record["run_id"], record["component_id"]
        run = RunKey.from_record(record["run"])
        component = ComponentKey(**record["component"])
        return self.registry.ids(transport, run, component, timeout=self._timeout())

    def _reject(self, record: dict[str, Any], exc: TransportError) -> None:
        self.drops.lost(record)
        self.stats.rejected_points += record_points(record, count_report=False)
        self._log_once.warning(("reject", exc.status, exc.code),
                               "paritywatch: server rejected a metric batch, not retrying: %s", exc)
