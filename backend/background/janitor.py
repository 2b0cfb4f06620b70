"""Background row removal: finishes run deletions (also ones a restart interrupted) and applies
raw-point retention (`PARITYWATCH_RETENTION_RAW_DAYS`).

The steps are small (backend/store/retention.py) and paced: each starts when no metric batch
is waiting for the writer, is sized to take about STEP_TARGET_S, and after a step that took t the
janitor waits PAUSE_FACTOR × t, so it does database work at most a quarter of the time and a metric
batch waits behind one step at most.
"""
from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

from paritywatch.backend.db import Database
from paritywatch.backend.models import utcnow
from paritywatch.backend.settings import Settings
from paritywatch.backend.store import retention
from paritywatch.backend.store.metrics import MetricStore

log = logging.getLogger("paritywatch.janitor")
STEP_TARGET_S = 0.01
PAUSE_FACTOR = 3.0
MAX_GROWTH = 4  # a step may grow to this many times its table's starting batch
YIELD_MAX_S = 1.0  # a step waits at most this long for metric batches queued for the writer
MIN_PAUSE_S = 0.005
DELETION_RECHECK_S = 60.0  # deletions another process requested are picked up this often


class Janitor:
    def __init__(self, db: Database, metrics: MetricStore, settings: Settings):
        self.db = db
        self.remover = retention.RowRemover(db, metrics)
        self.retention_days = settings.retention_raw_days
        self.retention_every_s = settings.retention_check_interval_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pruned_upto = 0  # retention has pruned every batch up to this id
        self._retention_due = 0.0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="paritywatch-janitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def wake(self) -> None:
        """A deletion was requested: start on it now."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.run_once()
            except Exception:  # the database may be away: try again on the next round
                log.warning("janitor round failed", exc_info=True)
            wait = DELETION_RECHECK_S
            if self.retention_days:  # (at least a second: a failing round must not spin)
                wait = min(wait, max(1.0, self._retention_due - time.monotonic()))
            self._wake.wait(wait)

    def run_once(self) -> None:
        """Finish every pending deletion; apply retention when it is due."""
        with self.db.read() as s:
            pending = retention.pending_deletions(s)
        for run_id in pending:
            if not self.purge_run(run_id):
                return
        if self.retention_days and time.monotonic() >= self._retention_due:
            if self.apply_retention():
                self._retention_due = time.monotonic() + self.retention_every_s

    def purge_run(self, run_id: int) -> bool:
        """Delete a deleted run's rows, table by table, then the run. False if stopped midway."""
        for step in self.remover.steps:
            if not self._paced(lambda limit, step=step: self.remover.delete_some(step, run_id, limit), step.batch):
                return False
        self.remover.finish_deletion(run_id)
        log.info("run %s deleted", run_id)
        return True

    def apply_retention(self) -> bool:
        """Drop per-sample audits and raw points of batches older than the retention period.
        False if stopped midway."""
        cutoff = utcnow() - timedelta(days=self.retention_days)
        if not self._paced(lambda limit: self.remover.prune_audits_some(cutoff, limit), 100):
            return False
        upto = self.remover.retention_watermark(cutoff)
        if upto is None or upto <= self._pruned_upto:
            return True
        for series_id in self.remover.series_with_batches_between(self._pruned_upto, upto):
            if not self._paced(lambda limit, sid=series_id: self.remover.prune_some(sid, upto, limit), 200):
                return False
        self._pruned_upto = upto
        return True

    def _yield_to_ingest(self) -> None:
        """Start a step when no metric batch is waiting for the writer (or after YIELD_MAX_S:
        a purge must finish even under steady ingest)."""
        deadline = time.monotonic() + YIELD_MAX_S
        while self.db.writer_backlog() and time.monotonic() < deadline and not self._stop.is_set():
            self._stop.wait(MIN_PAUSE_S)

    def _paced(self, step, limit: int) -> bool:
        """Call `step(limit)` -> (rows removed, seconds the step held the database, commit
        included) until it removes fewer rows than asked, resizing the limit toward STEP_TARGET_S
        and pausing PAUSE_FACTOR times as long between steps. False if stopped."""
        floor, ceiling = max(1, limit // 10), limit * MAX_GROWTH
        while not self._stop.is_set():
            self._yield_to_ingest()
            removed, took = step(limit)
            if removed < limit:
                return True
            factor = min(2.0, max(0.5, STEP_TARGET_S / max(took, 1e-4)))
            limit = max(floor, min(ceiling, int(limit * factor)))
            self._stop.wait(max(MIN_PAUSE_S, PAUSE_FACTOR * took))
        return False
