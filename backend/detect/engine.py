"""Detection: evaluates the durable jobs every accepted fingerprint and metric batch writes with
itself (backend/store/jobs.py), and sweeps heartbeats on a timer.

Processor mismatch -> alert (and pause, per the run's on_mismatch); weights that differ from the
trainer's -> alert (and pause, likewise), stale or older weights -> alert (backend/detect/attest.py);
rule breaches -> alert and the rule's action; per-sample audits with a failing cause (length parity,
re-render, token identity, truncation, eos, image features) -> sample_audit alerts; silent processes -> lost and heartbeat_lost
(backend/alerts/run_state.py).
Conditions that clear auto-resolve.

Exactly once: the request that wrote a job evaluates it right after its commit; a job whose
evaluation failed (or whose process died) stays in the table, is evaluated when the client
retries the request (a duplicate batch), and otherwise by the background loop of any replica
after `detect_job_grace_s`. The evaluating transaction deletes the job, and a job is evaluated
under its run's row lock, so two evaluations of one run never interleave.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable

from sqlalchemy.exc import IntegrityError

from paritywatch.backend.alerts import lifecycle, run_state
from paritywatch.backend.alerts.effects import Effects
from paritywatch.backend.alerts.hearing import HearingClock
from paritywatch.backend.db import Database
from paritywatch.backend.detect import audits as audit_logic
from paritywatch.backend.detect import attest as attest_logic
from paritywatch.backend.detect import packs as pack_catalog
from paritywatch.backend.detect import rules as rule_logic
from paritywatch.backend.detect import sawtooth, trend
from paritywatch.backend.detect.parity import (bounded_diff, compute_parity, diff_cached, diff_is_cached,
                                               differing_components, evidence_of_findings, mismatch_alerts,
                                               sampling_why)
from paritywatch.backend.models import Rule, Run, utcnow
from paritywatch.backend.settings import Settings
from paritywatch.backend.store import audits as audit_store
from paritywatch.backend.store import attestations as att_store
from paritywatch.backend.store import fingerprints as fp_store
from paritywatch.backend.store import jobs as job_store
from paritywatch.backend.store import rules as rule_store
from paritywatch.backend.store import runs as run_store
from paritywatch.backend.store.jobs import BatchSpan, Job
from paritywatch.backend.store.metric_reads import metric_key, read_raw  # raw points are packed chunks: decoded here
from paritywatch.backend.store.runs import lock_run
from trainer_hooks.contract import split_worker_key
from trainer_hooks import contract
from trainer_hooks.fingerprint.diff import findings_text

log = logging.getLogger("paritywatch.detect")
ACTOR = run_state.ACTOR
RULE_CACHE_TTL_S = 2.0
# Alert kinds of weight attestation, and what resolves them when their condition is gone.
WEIGHT_ALERTS = {
    "weights_mismatch": "the worker attested the trainer's weights again (or it closed)",
    "weights_stale": "the worker caught up with the trainer's weights (or it closed)",
    "weights_backwards": "the worker is back on current weights (or it closed)",
}


class DetectionEngine:
    def __init__(self, db: Database, settings: Settings, effects: Effects):
        self.db = db
        self.settings = settings
        self.effects = effects
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rule_keys_cache: dict[int, tuple[float, WatchedKeys]] = {}
        self.sweeps = 0  # completed heartbeat sweeps (tests wait on it instead of sleeping)
        self.hearing = HearingClock()  # the serving loop ticks it (the app's lifespan)
        # Tests inject a failure between a write and its evaluation: called with (kind, run_id).
        self.fault_hook: Callable[[str, int], None] | None = None

    # ------------------------------------------------------------ jobs
    def watched_keys(self, run_id: int, keys: set[str]) -> list[str]:
        """The keys of a batch some enabled rule of the run watches (cached lookup: the common
        case writes no job)."""
        return sorted(self._rule_keys(run_id).among(keys))

    def cached_watched_keys(self, run_id: int, keys: set[str]) -> list[str] | None:
        """`watched_keys` when the run's rules are cached (no query: safe on the event loop), else None."""
        hit = self._rule_keys_cache.get(run_id)
        if hit is None or time.monotonic() - hit[0] >= RULE_CACHE_TTL_S:
            return None
        return sorted(hit[1].among(keys))

    def evaluate(self, job: Job) -> None:
        """Right after the commit of the request that wrote the job."""
        self._evaluate(job)

    def on_fingerprint(self, run_id: int) -> None:
        self._fault("fingerprint", run_id)
        self._evaluate_parity(run_id)

    def on_audit(self, run_id: int) -> None:
        self._fault("audit", run_id)
        self._retrying(lambda: self._apply_audits(run_id))

    def on_attestation(self, run_id: int) -> None:
        self._fault("attestation", run_id)
        self._retrying(lambda: self._apply_attestations(run_id, take_jobs=True))

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
        if job.kind == "fingerprint":
            self._fault("fingerprint", job.run_id)
            self._evaluate_parity(job.run_id)
        elif job.kind == "audit":
            self.on_audit(job.run_id)
        elif job.kind == "attestation":
            self.on_attestation(job.run_id)
        else:
            self._fault("metrics", job.run_id)
            self._evaluate_rules(job)

    def _fault(self, kind: str, run_id: int) -> None:
        if self.fault_hook is not None:
            self.fault_hook(kind, run_id)

    # ------------------------------------------------------------ processors
    def _evaluate_parity(self, run_id: int) -> None:
        """Diff the run's processors outside any lock first (the first diff of a new pair can
        take a while; diffs are cached by digest pair), then evaluate the run's current
        fingerprints under its row lock, where the same diffs are cache hits."""
        with self.db.read() as s:
            if not job_store.pending(s, run_id=run_id, kind="fingerprint", limit=1):
                return  # a concurrent evaluation took this post's job with its own: nothing left
        self._warm_diffs(run_id)
        self._retrying(lambda: self._apply_parity(run_id))

    def _warm_diffs(self, run_id: int) -> None:
        """Diff every trainer processor of the run against every other one it has (a few
        distinct digests, cached by pair): what the evaluation under the lock will ask for."""
        pairs = fp_store.digests_of_run(self.db, run_id)
        trainers = {d for side, d in pairs if side == "trainer"}
        others = {d for _, d in pairs} - trainers
        todo = [(a, b) for a in trainers for b in others if not diff_is_cached(a, b)]
        if todo:
            bodies = fp_store.bodies_of(self.db, trainers | others)
            for a, b in todo:
                if a in bodies and b in bodies:
                    diff_cached(a, bodies[a], b, bodies[b])

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
                named = findings_text(group.diff, group.verdict) or "fingerprint"  # names, with the probes' evidence
                ref = parity.reference
                title = (f"{len(members)} {members[0].side} worker(s) differ from the "
                         f"{ref.side} in {named}{sampling_why(group.diff, names)}")
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
                    run_state.pause_on_mismatch(s, run, f"processor mismatch: {named}")
            for alert in lifecycle.open_alerts(s, run_id, "processor_mismatch"):
                if alert.dedup_key not in current:
                    lifecycle.resolve(s, run, alert, ACTOR, "processors match again", auto=True)
            return True

    # ------------------------------------------------------------ per-sample audits
    def _apply_audits(self, run_id: int) -> bool:
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

    # ------------------------------------------------------------ weights
    def _apply_attestations(self, run_id: int, take_jobs: bool) -> bool:
        with self.effects.write(self.db) as s:
            run = lock_run(s, run_id)
            if take_jobs and job_store.take_all(s, run_id, "attestation") == 0:
                return True  # another evaluation, which saw at least this attestation, took it
            self._judge_weights(s, run, utcnow())
            return True

    def _weight_findings(self, s, run: Run, now) -> list:  # noqa: ANN001
        """What the run's attestations show now (tensor names not yet filled in)."""
        policy = attest_logic.AttestPolicy(self.settings.attest_grace_s, self.settings.attest_max_lag)
        trainers = att_store.trainer_attestations(s, run.id)
        return [f for worker in att_store.latest_rollout_attestations(s, run.id)
                for f in attest_logic.check_worker(trainers, worker, now, policy)
                if not (f.kind == "weights_mismatch" and run.on_mismatch == "ignore")]

    def _judge_weights(self, s, run: Run, now) -> None:  # noqa: ANN001
        """Fire what the run's attestations show now; resolve what they no longer show."""
        findings = self._weight_findings(s, run, now)
        self._describe_mismatches(s, [f for f in findings if f.kind == "weights_mismatch" and f.severity == "error"])
        current = {_weight_key(f) for f in findings}
        if run.control_state in contract.ACTIVE_RUN_STATES:  # a run that ended or is stopping has nothing to act on
            for finding in findings:
                self._fire_weights(s, run, finding)
        for alert in _open_weight_alerts(s, run.id):
            if alert.dedup_key not in current:
                lifecycle.resolve(s, run, alert, ACTOR, WEIGHT_ALERTS[alert.kind], auto=True)

    def _describe_mismatches(self, s, findings: list) -> None:  # noqa: ANN001
        """Name the tensors that differ (the tensor lists are read only for mismatching workers)."""
        tensors = att_store.tensors_of(s, {f.worker.id for f in findings} | {f.reference.id for f in findings})
        for f in findings:
            diff = attest_logic.compare_tensors(tensors[f.reference.id], tensors[f.worker.id])
            f.title = attest_logic.mismatch_title(f.worker, diff)
            f.detail = {
                "why": "the rollout worker generates with other weights than the trainer computes log-probs with: "
                       "the importance ratios and the policy gradient are silently wrong",
                "version": f.worker.version, "trainer_digest": f.reference.digest, "worker_digest": f.worker.digest,
                "trainer_component_id": f.reference.component_id,
                "trainer_attestation_id": f.reference.id, "worker_attestation_id": f.worker.id,
                "differing_tensors": diff["differing"] + diff["missing"][: max(0, 10 - len(diff["differing"]))],
                "tensors": diff,
            }

    def _fire_weights(self, s, run: Run, f) -> None:  # noqa: ANN001
        detail = {"component_id": f.worker.component_id, "worker_id": f.worker.worker_id, **f.detail}
        before = lifecycle.open_alert(s, run.id, _weight_key(f))
        escalated = before is not None and before.severity != "error"  # e.g. incomparable, then differing
        _, new = lifecycle.fire(s, run, f.kind, f.severity, _weight_key(f), f.title, detail)
        if (new or escalated) and f.kind == "weights_mismatch" and f.severity == "error":
            run_state.pause_on_mismatch(s, run, f"weights mismatch: {f.title}")

    def sweep_attestations(self, now=None) -> int:  # noqa: ANN001
        """Staleness is a matter of time: evaluate every live run that has attestations."""
        with self.db.read() as s:
            run_ids = att_store.runs_with_attestations(s, run_store.live_run_ids(s))
        for run_id in run_ids:
            try:
                self._retrying(lambda: self._sweep_run(run_id, now))
            except Exception:  # one run (deleted meanwhile, say) never stops the others' sweep
                log.warning("attestation sweep of run %s failed", run_id, exc_info=True)
        return len(run_ids)

    def _sweep_run(self, run_id: int, now) -> bool:  # noqa: ANN001
        """Look first (a read); lock and write only when an alert is to open or resolve. The posts
        keep open alerts' details current; the sweep is for what time alone changes."""
        now = now or utcnow()
        with self.db.read() as s:
            run = run_store.get_run(s, run_id)
            firing = {_weight_key(f) for f in self._weight_findings(s, run, now)} \
                if run.control_state in contract.ACTIVE_RUN_STATES else set()
            unchanged = firing == {a.dedup_key for a in _open_weight_alerts(s, run_id)}
        if not unchanged:
            with self.effects.write(self.db) as s:
                self._judge_weights(s, lock_run(s, run_id), now)
        return True

    # --------------------------------------------------------------- metrics
    def _rule_keys(self, run_id: int) -> WatchedKeys:
        """Keys the enabled rules of this run watch; cached briefly (rules change rarely)."""
        now = time.monotonic()
        hit = self._rule_keys_cache.get(run_id)
        if hit and now - hit[0] < RULE_CACHE_TTL_S:
            return hit[1]
        watched = WatchedKeys(*rule_store.watched_keys(self.db, run_id))
        self._rule_keys_cache[run_id] = (now, watched)
        return watched

    def forget_rules(self, run_id: int | None = None) -> None:
        if run_id is None:
            self._rule_keys_cache.clear()
        else:
            self._rule_keys_cache.pop(run_id, None)

    def _evaluate_rules(self, job: Job) -> None:
        self._retrying(lambda: self._apply_rules(job))

    def _apply_rules(self, job: Job) -> bool:
        with self.effects.write(self.db) as s:
            run = lock_run(s, job.run_id)
            if not job_store.take(s, job.id):
                return True  # evaluated already (another replica, or an earlier retry)
            bases = {split_worker_key(k)[1] for k in job.keys}
            rules = rule_store.enabled_rules_on(s, run, job.keys, bases)
            stepped_aside = {r.id for r in rule_logic.superseded(rules)}
            for rule in rules:
                for series_key in _series_of(rule, job.keys):
                    if rule.id in stepped_aside:  # an enabled pack judges this key at its own level
                        lifecycle.resolve_key(s, run, rule_alert_key(rule, series_key),
                                              "a pack of the run judges this key at its own level")
                    else:
                        self._apply_rule(s, run, rule, series_key, job.spans.get(series_key))
            return True

    def _apply_rule(self, s, run: Run, rule: Rule, series_key: str,  # noqa: ANN001
                    span: BatchSpan | None = None) -> None:
        key = rule_alert_key(rule, series_key)
        firing = lifecycle.open_alert(s, run.id, key) is not None
        measured = _measure(s, run.id, rule, series_key, firing, span)
        state = rule_store.rule_state(s, rule.id, run.id, None if series_key == rule.key else series_key)
        step_result = rule_logic.evaluate(state.streak or 0, state.clear_streak or 0, measured.breached,
                                          rule.consecutive, rule.keep_firing_for or 0, firing)
        state.streak, state.clear_streak, state.last_value = step_result.streak, step_result.clear_streak, measured.value
        if step_result.action == "fire":
            detail = {"rule_id": rule.id, "key": series_key, "rule_key": rule.key, "kind": rule.kind,
                      "value": measured.value, "threshold": rule.threshold, "comparison": rule.comparison,
                      "aggregate": rule.aggregate, "window": rule.window, "consecutive": rule.consecutive,
                      "keep_firing_for": rule.keep_firing_for, "pack": rule.pack,
                      "worker_id": split_worker_key(series_key)[0] if series_key != rule.key else None,
                      **measured.detail}
            why = _why(rule)
            if why:
                detail["why"] = why
            # Trend, baseline and saw-tooth rules judge how a series moves, not one level.
            kind = "metric_threshold" if rule.kind == "threshold" else "metric_trend"
            _, new = lifecycle.fire(s, run, kind, rule.severity, key, measured.title, detail, measured.step)
            if new and rule.action in ("pause", "stop"):
                run_state.act_on_rule(s, run, rule.action, f"rule: {measured.title}")
        elif step_result.action == "resolve":
            back = "back within threshold" if rule.kind == "threshold" else "steady again"
            lifecycle.resolve_key(s, run, key, f"{series_key} {back}")

    # ------------------------------------------------------------ heartbeats
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

    def sweep_heartbeats(self) -> bool:
        run_state.sweep(self.effects, self.db, self.settings.heartbeat_timeout_s, hearing=self.hearing)
        self.sweeps += 1
        return True

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


def _weight_key(finding) -> str:  # noqa: ANN001
    """One open alert per rollout process and kind."""
    return f"{finding.kind}:{finding.worker.component_id}"


def _open_weight_alerts(s, run_id: int) -> list:  # noqa: ANN001
    return [a for kind in WEIGHT_ALERTS for a in lifecycle.open_alerts(s, run_id, kind)]


@dataclass(frozen=True)
class WatchedKeys:
    exact: set[str]  # keys some rule watches as they are
    per_worker: set[str]  # base keys some per-worker rule watches (`<worker>/<key>` too)

    def among(self, keys: set[str]) -> set[str]:
        return {k for k in keys if k in self.exact or (self.per_worker and split_worker_key(k)[1] in self.per_worker)}


@dataclass(frozen=True)
class Measured:
    value: float | None  # the aggregate (threshold rules) or the score (trend rules)
    step: int | None
    breached: bool
    title: str = ""
    detail: dict = field(default_factory=dict)


def _series_of(rule: Rule, keys: tuple[str, ...]) -> list[str]:
    """The series of a batch a rule evaluates: its key, and for a per-worker rule each worker's."""
    def worker_series(key: str) -> bool:
        worker, base = split_worker_key(key)
        return rule.per_worker and worker is not None and base == rule.key

    return [k for k in keys if k == rule.key or worker_series(k)]


def rule_alert_key(rule: Rule, series_key: str) -> str:
    """One alert per rule, and per worker for a per-worker rule's worker series."""
    return f"rule:{rule.id}" if series_key == rule.key else f"rule:{rule.id}:{series_key}"


def _why(rule: Rule) -> str | None:
    """Why the rule's level means something to act on: a built-in's or its pack's source."""
    if rule.pack in pack_catalog.PACKS:
        return next((r.why for r in pack_catalog.PACKS[rule.pack].rules
                     if (r.key, r.kind, r.comparison) == (rule.key, rule.kind, rule.comparison)), None)
    return rule_logic.builtin_why(rule.key, rule.kind, rule.comparison) if rule.builtin else None


def _measure(s, run_id: int, rule: Rule, series_key: str, firing: bool,  # noqa: ANN001
             span: BatchSpan | None = None) -> Measured:
    if rule.kind == "trend":
        return _measure_trend(s, run_id, rule, series_key, firing)
    if rule.kind == "baseline":
        return _measure_baseline(s, run_id, rule, series_key)
    if rule.kind == "sawtooth":
        return _measure_sawtooth(s, run_id, rule, series_key)
    if rule.aggregate == "last" and span is not None:
        return _measure_batch(rule, series_key, span)
    value, step = _aggregate(s, run_id, rule, series_key)
    title = f"{series_key} {rule.aggregate}={value:.4g} {rule.comparison} {rule.threshold:g}" if value is not None else ""
    return Measured(value, step, rule_logic.breached(value, rule.comparison, rule.threshold), title)


def _measure_batch(rule: Rule, series_key: str, span: BatchSpan) -> Measured:
    """A `last` rule judges every point the batch brought (its worst), not only its newest: hooks
    send several steps per batch, and a mismatch mid-batch followed by a clean step is still one."""
    value = rule_logic.worst(span.min, span.max, rule.comparison)
    if span.first_step == span.last_step:
        title = f"{series_key} last={value:.4g} {rule.comparison} {rule.threshold:g}"
    else:
        extreme = "max" if rule.comparison.startswith(">") else "min"
        title = (f"{series_key} {extreme} of steps {span.first_step}-{span.last_step}={value:.4g} "
                 f"{rule.comparison} {rule.threshold:g}")
    return Measured(value, span.last_step, rule_logic.breached(value, rule.comparison, rule.threshold), title,
                    {"steps": [span.first_step, span.last_step]})


def _measure_trend(s, run_id: int, rule: Rule, series_key: str, firing: bool) -> Measured:  # noqa: ANN001
    mk = metric_key(s, run_id, series_key)
    if mk is None or mk.last_step is None:
        return Measured(None, None, False)
    values = _newest_points(s, mk, trend.points_needed(rule.window))
    result = trend.assess(values, rule.window, direction="up" if rule.comparison.startswith(">") else "down")
    if result is None:
        return Measured(None, mk.last_step, False)
    reason = result.reason(series_key, rule.window)
    detail = {"test": result.test, "score": result.score, "change": result.change, "recent_median": result.recent,
              "reference_median": result.reference, "noise": result.noise, "points": result.points,
              "min_change": rule.min_change, "reason": reason}
    # Hysteresis: a firing trend alert holds until the score falls under half the threshold, so a
    # score hovering at the threshold is one alert, not one per batch.
    min_score = rule.threshold * (trend.HOLD_FRACTION if firing else 1.0)
    return Measured(result.score, mk.last_step, result.breaches(min_score, rule.min_change or 0.0), reason, detail)


def _measure_baseline(s, run_id: int, rule: Rule, series_key: str) -> Measured:  # noqa: ANN001
    """The median of the series' first `window` points against the level: what the run started
    with, before any weight update could move it."""
    mk = metric_key(s, run_id, series_key)
    if mk is None or mk.last_step is None or (mk.count or 0) < rule.window:
        return Measured(None, None, False)
    steps, values = _first_points(s, mk, rule.window)
    value = rule_logic.baseline(values, rule.window)
    if value is None:
        return Measured(None, mk.last_step, False)
    span = f"steps {int(steps[0])}-{int(steps[rule.window - 1])}"
    title = (f"{series_key} started at {value:.4g} (median of its first {rule.window} points, {span}) "
             f"{rule.comparison} {rule.threshold:g}: high from the start")
    return Measured(value, mk.last_step, rule_logic.breached(value, rule.comparison, rule.threshold), title,
                    {"baseline_steps": [int(steps[0]), int(steps[rule.window - 1])]})


def _measure_sawtooth(s, run_id: int, rule: Rule, series_key: str) -> Measured:  # noqa: ANN001
    mk = metric_key(s, run_id, series_key)
    if mk is None or mk.last_step is None:
        return Measured(None, None, False)
    steps, values = _newest_series(s, mk, sawtooth.points_needed(rule.window))
    result = sawtooth.assess(values, rule.window, rule.threshold)
    if result is None or not result.teeth:
        return Measured(result.score if result else None, mk.last_step, False)
    reason = result.reason(series_key, steps)  # the teeth index the points read: steps[i] is point i's
    detail = {"score": result.score, "teeth": len(result.teeth), "noise": result.noise, "points": result.points,
              "resets_at_steps": [int(steps[t.reset_at]) for t in result.teeth], "reason": reason}
    return Measured(result.score, mk.last_step, result.breaches(rule.threshold), reason, detail)


def _newest_points(s, mk, wanted: int):  # noqa: ANN001, ANN202
    return _newest_series(s, mk, wanted)[1]


def _newest_series(s, mk, wanted: int):  # noqa: ANN001, ANN202
    """About the newest `wanted` points of a series (steps, values): a step range sized from the
    series' mean spacing (twice over, for gaps), so the read stays bounded however long it is."""
    lo = max(mk.first_step or 0, int(mk.last_step - 2 * wanted * _spacing(mk)))
    steps, values = read_raw(s, mk.id, lo, None)
    return steps[-wanted:], values[-wanted:]


def _first_points(s, mk, wanted: int):  # noqa: ANN001, ANN202
    """The oldest `wanted` points of a series (steps, values), read in widening step ranges."""
    first = mk.first_step or 0
    width = 2 * wanted * _spacing(mk)
    while True:
        hi = int(first + width)
        steps, values = read_raw(s, mk.id, first, hi + 1)
        if len(values) >= wanted or hi >= mk.last_step:
            return steps[:wanted], values[:wanted]
        width *= 4


def _spacing(mk) -> float:  # noqa: ANN001
    return max(1.0, (mk.last_step - (mk.first_step or 0)) / max(1, (mk.count or 1) - 1))


def _aggregate(s, run_id: int, rule: Rule, series_key: str) -> tuple[float | None, int | None]:  # noqa: ANN001
    mk = metric_key(s, run_id, series_key)
    if mk is None or mk.last_step is None:
        return None, None
    if rule.aggregate == "last":
        return mk.last_value, mk.last_step
    lo = mk.last_step - max(1, rule.window) + 1
    _, values = read_raw(s, mk.id, lo, None)
    if not len(values):
        return None, mk.last_step
    value = {"mean": values.mean, "max": values.max, "min": values.min}[rule.aggregate]()
    return float(value), mk.last_step
