"""The detectors the engine runs (backend/background/engine.py; docs/design.md, "Detection and
alerts"), one per kind of detection job:

| job kind      | detector                  | its verdicts and alert texts (pure, backend/detect/) |
| ------------- | ------------------------- | ---------------------------------------------------- |
| `fingerprint` | parity.ParityDetector     | parity.py                                          |
| `audit`       | audits.AuditDetector      | audits.py                                          |
| `attestation` | weights.WeightDetector    | attest.py                                          |
| `metrics`     | rules.RuleDetector        | rules.py, trend.py, sawtooth.py, packs.py          |

A detector reads the store, asks its pure module what the rows mean, and fires and resolves
alerts under the run's row lock. When it runs (after the request's commit, on the client's retry,
from the background loop), the fault hook, the retry on a racing replica and the sweeps' timing
are the engine's.
"""
from __future__ import annotations

from typing import ClassVar

from paritywatch.backend.alerts.effects import Effects
from paritywatch.backend.db import Database
from paritywatch.backend.settings import Settings
from paritywatch.backend.store.jobs import Job


class Detector:
    kind: ClassVar[str]  # the detect_jobs kind it evaluates; also what the engine's fault hook hears

    def __init__(self, db: Database, settings: Settings, effects: Effects):
        self.db = db
        self.settings = settings
        self.effects = effects

    def prepare(self, run_id: int) -> bool:
        """Work done outside any lock before `apply` (a slow diff, say); False: nothing is left to
        evaluate, `apply` is skipped."""
        return True

    def apply(self, run_id: int, job: Job | None = None) -> bool:
        """One transaction under the run's row lock that deletes the job(s) it answers and fires or
        resolves their alerts: a run-wide detector takes every job of its kind of the run (`job` is
        None when a request asks for it), the rules detector the one job. True once done; the
        engine calls it again when another replica's alert made it fail (IntegrityError)."""
        raise NotImplementedError
