"""Per-sample audits: every audit job of a run is answered by one evaluation of its latest audited
batches (causes, titles and details: backend/detect/audits.py)."""
from __future__ import annotations

from paritywatch.backend.alerts import lifecycle
from paritywatch.backend.detect import audits as audit_logic
from paritywatch.backend.background.detectors import Detector
from paritywatch.backend.store import audits as audit_store
from paritywatch.backend.store import jobs as job_store
from paritywatch.backend.store.jobs import Job
from paritywatch.backend.store.runs import lock_run


class AuditDetector(Detector):
    kind = "audit"

    def apply(self, run_id: int, job: Job | None = None) -> bool:
        """One evaluation of the run's latest audited batches answers every audit job it takes:
        per cause, fire (or refresh the open alert: no new notification) while a batch of the
        window fails, resolve once the whole window is clean."""
        with self.effects.write(self.db) as s:
            run = lock_run(s, run_id)
            if job_store.take_all(s, run_id, "audit") == 0:
                return True  # another evaluation, which saw at least these audits, took them
            window = self.settings.audit_clear_batches
            recent = audit_store.recent_audits(s, run_id, window)
            samples: dict[int, list] = {}  # per failing batch, read once for all its causes
            for cause, finding in audit_logic.findings(recent).items():
                key = f"sample_audit:{cause}"
                if finding is None:
                    lifecycle.resolve_key(s, run, key, f"{window} audited batches in a row without this failure")
                    continue
                if finding.audit_id not in samples:
                    samples[finding.audit_id] = audit_store.batch_samples(s, finding.audit_id)
                example = audit_logic.example_of(samples[finding.audit_id], cause)
                lifecycle.fire(s, run, "sample_audit", audit_logic.CAUSES[cause].severity, key,
                               audit_logic.title_of(finding, example), audit_logic.detail_of(finding, example, window),
                               finding.step)
            return True
