"""Detection: evaluates the durable jobs every accepted fingerprint, attestation, audit and metric
batch writes with itself (backend/store/jobs.py), and sweeps attestations and heartbeats on a timer.

What each kind of job means is its detector's (backend/background/detectors/): processor mismatch ->
alert (and pause, per the run's on_mismatch); weights that differ from the trainer's -> alert (and
pause, likewise), stale or older weights -> alert; per-sample audits with a failing cause ->
sample_audit alerts; rule breaches -> alert and the rule's action. Silent processes -> lost and
heartbeat_lost (backend/control/run_state.py). Conditions that clear auto-resolve. The engine is the
table of detectors by job kind, when they run, the retry on a racing replica, and the sweeps.

Exactly once: the request that wrote a job evaluates it right after its commit; a job whose
evaluation failed (or whose process died) stays in the table, is evaluated when the client
retries the request (a duplicate batch), and otherwise by the background loop of any replica
after `detect_job_grace_s`. The evaluating transaction deletes the job, and a job is evaluated
under its run's row lock, so two evaluations of one run never interleave.
"""
from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Callable

from sqlalchemy.exc import IntegrityError

from paritywatch.backend.control import run_state
from paritywatch.backend.alerts.effects import Effects
from paritywatch.backend.alerts.hearing import HearingClock
from paritywatch.backend.db import Database
from paritywatch.backend.background.detectors import Detector
from paritywatch.backend.background.detectors.audits import AuditDetector
from paritywatch.backend.background.detectors.parity import ParityDetector
from paritywatch.backend.background.detectors.rules import RuleDetector
from paritywatch.backend.background.detectors.weights import WeightDetector
from paritywatch.backend.models import utcnow
from paritywatch.backend.settings import Settings
from paritywatch.backend.store import jobs as job_store
from paritywatch.backend.store.jobs import Job

log = logging.getLogger("paritywatch.detect")


class DetectionEngine:
    def __init__(self, db: Database, settings: Settings, effects: Effects):
        self.db = db
        self.settings = settings
        self.effects = effects
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rules = RuleDetector(db, settings, effects)
        self.weights = WeightDetector(db, settings, effects)
        self.detectors: dict[str, Detector] = {
            d.kind: d for d in (ParityDetector(db, settings, effects), AuditDetector(db, settings, effects),
                                self.weights, self.rules)}
        self.sweeps = 0  # completed heartbeat sweeps (tests wait on it instead of sleeping)
        self.hearing = HearingClock()  # the serving loop ticks it (the app's lifespan)
        # Tests inject a failure between a write and its evaluation: called with (kind, run_id).
        self.fault_hook: Callable[[str, int], None] | None = None

    # ------------------------------------------------------------ jobs
    def watched_keys(self, run_id: int, keys: set[str]) -> list[str]:
        """The keys of a batch some enabled rule of the run watches (cached lookup: the common
        case writes no job)."""
        return sorted(self.rules.watched(run_id).among(keys))

    def cached_watched_keys(self, run_id: int, keys: set[str]) -> list[str] | None:
        """`watched_keys` when the run's rules are cached (no query: safe on the event loop), else None."""
        watched = self.rules.cached(run_id)
        return None if watched is None else sorted(watched.among(keys))

    def forget_rules(self, run_id: int | None = None) -> None:
        self.rules.forget(run_id)

    def evaluate(self, job: Job) -> None:
        """Right after the commit of the request that wrote the job."""
        self._evaluate(job)

    def on_fingerprint(self, run_id: int) -> None:
        self._detect(self.detectors["fingerprint"], run_id)

    def on_audit(self, run_id: int) -> None:
        self._detect(self.detectors["audit"], run_id)

    def on_attestation(self, run_id: int) -> None:
        self._detect(self.detectors["attestation"], run_id)

    def process_pending(self, run_id: int | None = None, older_than_s: float | None = None) -> int:
        """Evaluate jobs nobody finished (this run's, or every run's older than the grace)."""
        created_before = utcnow() - timedelta(seconds=older_than_s) if older_than_s is not None else None
        with self.db.read() as s:
            jobs = job_store.pending(s, run_id=run_id, created_before=created_before, limit=500)
        done = 0
        for job in jobs:
            try:
                self._evaluate(job)
                done += 1
            except Exception:
                if run_id is not None:
                    raise  # the request answers 5xx; its retry comes back here
                log.warning("detection job %s of run %s failed; it stays queued", job.id, job.run_id, exc_info=True)
        return done

    def _evaluate(self, job: Job) -> None:
        # Kinds: metrics | fingerprint | attestation | audit; the metric write path names its
        # jobs in raw SQL, so anything else is read as a metrics job, as it always was.
        self._detect(self.detectors.get(job.kind, self.rules), job.run_id, job)

    def _detect(self, detector: Detector, run_id: int, job: Job | None = None) -> None:
        self._fault(detector.kind, run_id)
        if detector.prepare(run_id):
            self._retrying(lambda: detector.apply(run_id, job))

    def _fault(self, kind: str, run_id: int) -> None:
        if self.fault_hook is not None:
            self.fault_hook(kind, run_id)

    # ------------------------------------------------------------ sweeps
    def sweep_attestations(self, now=None) -> int:
        """Staleness is a matter of time: evaluate every live run that has attestations."""
        run_ids = self.weights.runs_to_sweep()
        for run_id in run_ids:
            try:
                self._retrying(lambda run_id=run_id: self.weights.sweep_run(run_id, now))
            except Exception:  # one run (deleted meanwhile, say) never stops the others' sweep
                log.warning("attestation sweep of run %s failed", run_id, exc_info=True)
        return len(run_ids)

    def sweep_heartbeats(self) -> bool:
        with self.effects.write(self.db) as s:
            run_state.sweep(s, self.settings.heartbeat_timeout_s, hearing=self.hearing)
        self.sweeps += 1
        return True

    # ------------------------------------------------------------ background loop
    def start(self) -> None:
        self._thread = threading.Thread(target=self._background_loop, name="paritywatch-heartbeats", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)

    def _background_loop(self) -> None:
        self._leftovers(0.0)  # after a restart: jobs of requests that died with the old process
        while not self._stop.wait(self.settings.heartbeat_check_interval_s):
            try:
                self._retrying(self.sweep_heartbeats)
            except Exception:
                log.warning("heartbeat sweep failed", exc_info=True)
            try:
                self.sweep_attestations()
            except Exception:
                log.warning("attestation sweep failed", exc_info=True)
            self._leftovers(self.settings.detect_job_grace_s)

    def _leftovers(self, older_than_s: float) -> None:
        try:
            self.process_pending(older_than_s=older_than_s)
        except Exception:
            log.warning("detection of leftover jobs failed", exc_info=True)

    def _retrying(self, fn: Callable[[], bool]) -> bool:
        """Another backend process may open the same alert at the same moment: the unique
        open_key makes one of us fail; the retry then sees the other's alert."""
        for attempt in range(3):
            try:
                return fn()
            except IntegrityError:
                if attempt == 2:
                    raise
        return False  # pragma: no cover
