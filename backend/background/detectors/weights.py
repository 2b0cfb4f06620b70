"""Weight attestation: every attestation job of a run is answered by one judgement of the run's
latest attestations, and the engine's sweep judges live runs again as time makes workers stale
(verdicts and alert texts: backend/detect/attest.py)."""
from __future__ import annotations

from datetime import datetime

from paritywatch.backend.alerts import lifecycle
from paritywatch.backend.control import run_state
from paritywatch.backend.detect import attest as attest_logic
from paritywatch.backend.detect.attest import WEIGHT_ALERTS, alert_key
from paritywatch.backend.background.detectors import Detector
from paritywatch.backend.models import Run, utcnow
from paritywatch.backend.store import attestations as att_store
from paritywatch.backend.store import jobs as job_store
from paritywatch.backend.store import runs as run_store
from paritywatch.backend.store.jobs import Job
from paritywatch.backend.store.runs import lock_run
from trainer_hooks import contract


class WeightDetector(Detector):
    kind = "attestation"

    def apply(self, run_id: int, job: Job | None = None) -> bool:
        with self.effects.write(self.db) as s:
            run = lock_run(s, run_id)
            if job_store.take_all(s, run_id, "attestation") == 0:
                return True  # another evaluation, which saw at least this attestation, took it
            self._judge_weights(s, run, utcnow())
            return True

    def runs_to_sweep(self) -> list[int]:
        """Live runs that have attestations: staleness is a matter of time."""
        with self.db.read() as s:
            return att_store.runs_with_attestations(s, run_store.live_run_ids(s))

    def sweep_run(self, run_id: int, now: datetime | None) -> bool:
        """Look first (a read); lock and write only when an alert is to open or resolve. The posts
        keep open alerts' details current; the sweep is for what time alone changes."""
        now = now or utcnow()
        with self.db.read() as s:
            run = run_store.get_run(s, run_id)
            firing = {alert_key(f) for f in self._weight_findings(s, run, now)} \
                if run.control_state in contract.ACTIVE_RUN_STATES else set()
            unchanged = firing == {a.dedup_key for a in _open_weight_alerts(s, run_id)}
        if not unchanged:
            with self.effects.write(self.db) as s:
                self._judge_weights(s, lock_run(s, run_id), now)
        return True

    def _weight_findings(self, s, run: Run, now: datetime) -> list:
        """What the run's attestations show now (tensor names not yet filled in)."""
        policy = attest_logic.AttestPolicy(self.settings.attest_grace_s, self.settings.attest_max_lag)
        trainers = att_store.trainer_attestations(s, run.id)
        return [f for worker in att_store.latest_rollout_attestations(s, run.id)
                for f in attest_logic.check_worker(trainers, worker, now, policy)
                if not (f.kind == "weights_mismatch" and run.on_mismatch == "ignore")]

    def _judge_weights(self, s, run: Run, now: datetime) -> None:
        """Fire what the run's attestations show now; resolve what they no longer show."""
        findings = self._weight_findings(s, run, now)
        _describe_mismatches(s, [f for f in findings if f.kind == "weights_mismatch" and f.severity == "error"])
        current = {alert_key(f) for f in findings}
        if run.control_state in contract.ACTIVE_RUN_STATES:  # a run that ended or is stopping has nothing to act on
            for finding in findings:
                _fire_weights(s, run, finding)
        for alert in _open_weight_alerts(s, run.id):
            if alert.dedup_key not in current:
                lifecycle.resolve(s, run, alert, run_state.ACTOR, WEIGHT_ALERTS[alert.kind], auto=True)


def _describe_mismatches(s, findings: list) -> None:
    """Name the tensors that differ (the tensor lists are read only for mismatching workers)."""
    tensors = att_store.tensors_of(s, {f.worker.id for f in findings} | {f.reference.id for f in findings})
    for f in findings:
        attest_logic.describe_mismatch(f, tensors[f.reference.id], tensors[f.worker.id])


def _fire_weights(s, run: Run, f) -> None:
    detail = {"component_id": f.worker.component_id, "worker_id": f.worker.worker_id, **f.detail}
    before = lifecycle.open_alert(s, run.id, alert_key(f))
    escalated = before is not None and before.severity != "error"  # e.g. incomparable, then differing
    _, new = lifecycle.fire(s, run, f.kind, f.severity, alert_key(f), f.title, detail)
    if (new or escalated) and f.kind == "weights_mismatch" and f.severity == "error":
        run_state.pause_on_mismatch(s, run, attest_logic.pause_reason(f))


def _open_weight_alerts(s, run_id: int) -> list:
    return [a for kind in WEIGHT_ALERTS for a in lifecycle.open_alerts(s, run_id, kind)]
