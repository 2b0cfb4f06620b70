"""Processor parity: every fingerprint job of a run is answered by one evaluation of the run's
current fingerprints (verdicts and alert texts: backend/detect/parity.py)."""
from __future__ import annotations

from paritywatch.backend.alerts import lifecycle
from paritywatch.backend.control import run_state
from paritywatch.backend.background.detectors import Detector
from paritywatch.backend.detect.parity import (MATCH_AGAIN, bounded_diff, compute_parity, diff_cached,
                                               diff_is_cached, differing_components, evidence_of_findings, mismatch_alerts,
                                               mismatch_pause_reason, mismatch_title)
from paritywatch.backend.store import fingerprints as fp_store
from paritywatch.backend.store import jobs as job_store
from paritywatch.backend.store.jobs import Job
from paritywatch.backend.store.runs import lock_run


class ParityDetector(Detector):
    kind = "fingerprint"

    def prepare(self, run_id: int) -> bool:
        """Diff the run's processors outside any lock first (the first diff of a new pair can
        take a while; diffs are cached by digest pair), then `apply` evaluates the run's current
        fingerprints under its row lock, where the same diffs are cache hits."""
        with self.db.read() as s:
            if not job_store.pending(s, run_id=run_id, kind="fingerprint", limit=1):
                return False  # a concurrent evaluation took this post's job with its own: nothing left
        self._warm_diffs(run_id)
        return True

    def _warm_diffs(self, run_id: int) -> None:
        """Diff every trainer processor of the run against every other one it has (a few
        distinct digests, cached by pair): what the evaluation under the lock will ask for."""
        with self.db.read() as s:  # closed before the diffing: no snapshot held through CPU work
            pairs = fp_store.digests_of_run(s, run_id)
            trainers = {d for side, d in pairs if side == "trainer"}
            others = {d for _, d in pairs} - trainers
            todo = [(a, b) for a in trainers for b in others if not diff_is_cached(a, b)]
            bodies = fp_store.bodies_of(s, trainers | others) if todo else {}
        for a, b in todo:
            if a in bodies and b in bodies:
                diff_cached(a, bodies[a], b, bodies[b])

    def apply(self, run_id: int, job: Job | None = None) -> bool:
        return self._apply_parity(run_id)

    def _apply_parity(self, run_id: int) -> bool:
        with self.effects.write(self.db) as s:
            run = lock_run(s, run_id)
            # Take the jobs first: every job this deletes committed with a fingerprint that the
            # read below sees. None left: another evaluation, which saw at least this, took them.
            if job_store.take_all(s, run_id, "fingerprint") == 0:
                return True
            parity = compute_parity(fp_store.fingerprint_rows(s, run_id, light=True))
            current: set[str] = set()
            for key, groups in mismatch_alerts(parity) if run.on_mismatch != "ignore" else []:
                current.add(key)
                group, members = groups[0], [c for g in groups for c in g.components]
                names = differing_components(group.diff, group.verdict)
                ref = parity.reference
                title = mismatch_title(members, ref, group.diff, group.verdict)
                detail = {
                    "trainer_digest": parity.reference_digest, "rollout_digest": group.digest,
                    "reference_component_id": ref.id,
                    "component_ids": [c.id for c in members],
                    "worker_ids": [c.worker_id for c in members],
                    "components": names, "evidence": evidence_of_findings(group.diff, group.verdict),
                    "diff": bounded_diff(group.diff, self.settings.max_alert_detail_bytes),
                }
                before = lifecycle.open_alert(s, run_id, key)
                escalates = before is None or before.severity != "error"  # new, or a warning that became an error
                lifecycle.fire(s, run, "processor_mismatch", group.verdict, key, title, detail,
                               step=run.last_step)  # when it was found: a marker on every chart
                if escalates and group.verdict == "error":
                    run_state.pause_on_mismatch(s, run, mismatch_pause_reason(group.diff, group.verdict))
            for alert in lifecycle.open_alerts(s, run_id, "processor_mismatch"):
                if alert.dedup_key not in current:
                    lifecycle.resolve(s, run, alert, run_state.ACTOR, MATCH_AGAIN, auto=True)
            return True
