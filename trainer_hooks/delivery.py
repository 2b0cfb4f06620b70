"""Metric batches to the server, each exactly once: send now, or spool and replay in order.

Runs on the worker thread. What becomes of a batch that was not delivered depends on why
(`health.keeps_batches`): while the backend is away or busy, or refuses this process's token, the
batch waits in the spool — nothing overtakes what is already spooled — and is replayed oldest first
once the backend takes it, by this process or by a later one with the same PARITYWATCH_URL (and a
token that may write it). A batch no attempt can deliver is dropped: the URL does not serve the
Paritywatch API (the spool is per URL: nobody would replay it), the server refused to register its
run, or refused the batch itself (a 4xx other than the retryable ones). So is a batch the spool has
no room for.

Every lost point is counted by reason (`Losses`) and reported to the server under this process's
own key (`contract.dropped_points_key`), in a record of its own that meets the same fate as any
batch, so each process's losses show on the run exactly as its `stats()` count them.
"""
from __future__ import annotations

import itertools
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from . import contract
from .batch import ColumnBatch
from .health import keeps_batches, problem_of
from .logs import LogOnce
from .records import make_record, record_points, wire_batch
from .registry import ComponentKey, Registry, RunKey
from .spool import Spool
from .transport import FOREIGN, Backoff, Transport, TransportError


@dataclass
class DeliveryStats:
    sent_points: int = 0
    sent_batches: int = 0
    duplicate_batches: int = 0
    spooled_batches: int = 0
    replayed_batches: int = 0


class Losses:
    """Points this process lost, by reason; `report_due` says when the server's figure is behind."""

    def __init__(self) -> None:
        self.queue_full = 0  # points log() could not queue (written by producer threads)
        self.spool_full = 0  # points of batches neither delivered nor spooled (no room, or no spool)
        self.rejected = 0  # points of batches refused by the server, or undeliverable at this URL
        self.batches = 0  # batches dropped (spool_full + rejected)
        self._lock = threading.Lock()
        self._reported = 0  # the total the last report carried; -1: send it again

    @property
    def points(self) -> int:
        return self.queue_full + self.spool_full + self.rejected

    def count_queue_full(self, points: int) -> None:
        with self._lock:
            self.queue_full += points

    def count_batch(self, points: int, *, refused: bool) -> None:
        with self._lock:
            self.batches += 1
            if refused:
                self.rejected += points
            else:
                self.spool_full += points

    def report_due(self) -> int | None:
        """The total to report now, or None when the server has (or is being sent) it."""
        total = self.points
        if total == self._reported:
            return None
        self._reported = total
        return total

    def report_pending(self) -> bool:
        return self.points != self._reported

    def report_lost(self) -> None:
        self._reported = -1


class MetricDelivery:
    def __init__(self, *, backend: str, registry: Registry, backoff: Backoff, losses: Losses,
                 timeout: Callable[[], float | None], log_once: LogOnce,
                 drops_batches: Callable[[], bool] = lambda: False) -> None:
        self.backend = backend
        self.registry = registry
        self.backoff = backoff
        self.losses = losses
        self.stats = DeliveryStats()
        self.waiting = 0  # this process's batches in the spool, not delivered (nor dropped) yet
        self.client_id = uuid.uuid4().hex
        self.spool: Spool | None = None
        self._seq = itertools.count()
        self._timeout = timeout
        self._log_once = log_once
        self._report_key = contract.dropped_points_key(registry.component.worker_id)
        self._report_step = 0  # the highest step the server took from this process: reports go there
        self._refusal: TransportError | None = None  # why new batches are dropped, while that lasts
        self._drops_batches = drops_batches  # BackendHealth.drops_batches: what any request of the process met

    def record(self, batch: ColumnBatch) -> dict[str, Any]:
        """The batch as sent and spooled: tagged with this process's (client_id, next seq)."""
        steps, series = batch.columns()
        return self._record(steps, series)

    def _record(self, steps: list[int], series: dict[str, list[float | None]]) -> dict[str, Any]:
        return make_record(backend=self.backend, run=self.registry.run.as_record(),
                           component=self.registry.component.as_record(), ids=self.registry.own_ids(),
                           client_id=self.client_id, seq=next(self._seq), steps=steps, series=series)

    def report_losses(self, transport: Transport, *, offline: bool) -> None:
        """Send this process's lost-point total if the server's is behind. At the highest step the
        server took from it, so a later report is never hidden behind an earlier one (the server
        shows a key's value at its last step) and never meets the step-ahead limit."""
        total = self.losses.report_due()
        if total is not None:
            self.deliver(transport, self._record([self._report_step], {self._report_key: [float(total)]}),
                         offline=offline)

    def deliver(self, transport: Transport, record: dict[str, Any], *, offline: bool) -> None:
        if offline and self._undeliverable():
            self._lose(record, refused=True)  # closing: no later process could deliver it either (said by health.py)
            return
        spool_waiting = self.spool is not None and not self.spool.is_empty()
        if offline or not self.backoff.ready() or spool_waiting:
            self.to_spool(record)  # keep order: nothing overtakes what is already spooled
            return
        try:
            self._post(transport, record)
            self.backoff.succeeded()
        except TransportError as exc:
            if keeps_batches(exc):
                self.backoff.failed(exc.retry_after)
                self.to_spool(record)
            else:
                self._refusal = exc if problem_of(exc) is not None else None
                self._drop(record, exc)

    def _undeliverable(self) -> bool:
        """A refusal no later attempt gets past: met by a batch, or by another request of this process
        (the registration at start-up may find a wrong URL before the first batch is sent)."""
        return self._refusal is not None or self._drops_batches()

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
                if keeps_batches(exc):  # a leftover of a run this token may not write is not kept (FOREIGN)
                    self.backoff.failed(exc.retry_after)
                    return
                self._drop(record, exc)
            else:
                self.backoff.succeeded()
                self.stats.replayed_batches += 1
            spool.pop()
            if self._counts_as_waiting(record):
                self.waiting -= 1

    def to_spool(self, record: dict[str, Any]) -> None:
        try:
            stored = self.spool is not None and self.spool.append(record)
        except (OSError, ValueError) as exc:
            stored = False
            self._log_once.warning(("spool-write", type(exc)), "paritywatch: spool write failed: %s", exc)
        if stored:
            self.stats.spooled_batches += 1
            self.waiting += self._counts_as_waiting(record)
            return
        if self._lose(record, refused=False):
            self._log_once.warning("spool-full", "paritywatch: batches the backend did not take found no room in the "
                                   "spool: dropped (counted in stats()['spool_dropped_points'])")

    def _post(self, transport: Transport, record: dict[str, Any]) -> None:
        run_id, component_id = self._ids_for(transport, record)
        own = record["client_id"] == self.client_id
        foreign = RunKey.from_record(record["run"]) != self.registry.run  # a leftover of another run
        answer = transport.request("POST", contract.run_path(run_id, "metrics"), json=wire_batch(record, component_id),
                                   timeout=self._timeout(), purpose=FOREIGN if foreign else None)
        self.stats.sent_batches += 1
        self._refusal = None
        if own:
            self._report_step = max(self._report_step, *record["steps"])
        if answer.get("duplicate"):
            self.stats.duplicate_batches += 1
        elif not self._is_report(record):
            self.stats.sent_points += record_points(record)

    def _ids_for(self, transport: Transport, record: dict[str, Any]) -> tuple[int, int]:
        """A replayed batch of another (dead) process registers that process's run and component."""
        if record.get("run_id") is not None and record.get("component_id") is not None:
            return record["run_id"], record["component_id"]
        run = RunKey.from_record(record["run"])
        component = ComponentKey(**record["component"])
        return self.registry.ids(transport, run, component, timeout=self._timeout())

    def _drop(self, record: dict[str, Any], exc: TransportError) -> None:
        if not self._lose(record, refused=True) or problem_of(exc) is not None:  # a problem is said by health.py
            return
        if record["client_id"] == self.client_id:
            self._log_once.warning(("reject", exc.status, exc.code), "paritywatch: the server refused a metric "
                                   "batch (%s): dropped, not retried (counted in stats()['dropped_points'])", exc)
        else:
            run = RunKey.from_record(record["run"])
            self._log_once.warning(("reject-leftover", exc.status, exc.code), "paritywatch: the server refused a "
                                   "batch an earlier process left in the spool for run %r of project %r (%s): "
                                   "dropped (counted in stats()['dropped_points'])", run.name or run.run_id,
                                   run.project, exc)

    def _lose(self, record: dict[str, Any], *, refused: bool) -> bool:
        """Count a batch that will never be delivered; False for a loss report (one with no room
        in the spool is sent again; a refused one waits for the next change)."""
        if self._is_report(record):
            if record["client_id"] == self.client_id and not refused:
                self.losses.report_lost()
            return False
        self.losses.count_batch(record_points(record), refused=refused)
        return True

    def _counts_as_waiting(self, record: dict[str, Any]) -> bool:
        return record["client_id"] == self.client_id and not self._is_report(record)

    @staticmethod
    def _is_report(record: dict[str, Any]) -> bool:
        return all(contract.is_dropped_points_key(key) for key in record["series"])
