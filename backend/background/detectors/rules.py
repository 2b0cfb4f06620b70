"""Rules: a metrics job names the watched keys one batch brought (and what it brought for each);
the rules of the run on those keys are measured and stepped through their streaks (threshold,
trend, baseline and saw-tooth verdicts: backend/detect/rules.py, trend.py, sawtooth.py; pack
rules' reasons: packs.py). Also the brief cache of which keys a run's rules watch, which decides
whether a batch writes a job at all."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from paritywatch.backend.alerts import lifecycle
from paritywatch.backend.control import run_state
from paritywatch.backend.alerts.effects import Effects
from paritywatch.backend.db import Database
from paritywatch.backend.detect import packs as pack_catalog
from paritywatch.backend.detect import rules as rule_logic
from paritywatch.backend.detect import sawtooth, trend
from paritywatch.backend.background.detectors import Detector
from paritywatch.backend.models import Rule, Run
from paritywatch.backend.settings import Settings
from paritywatch.backend.store import jobs as job_store
from paritywatch.backend.store import rules as rule_store
from paritywatch.backend.store.jobs import BatchSpan, Job
from paritywatch.backend.store.metric_reads import metric_key, read_raw  # raw points are packed chunks: decoded here
from paritywatch.backend.store.runs import lock_run
from trainer_hooks.contract import split_worker_key

RULE_CACHE_TTL_S = 2.0


class RuleDetector(Detector):
    kind = "metrics"

    def __init__(self, db: Database, settings: Settings, effects: Effects):
        super().__init__(db, settings, effects)
        self._rule_keys_cache: dict[int, tuple[float, WatchedKeys]] = {}
        # One query refreshes an expired entry: the batches that found it expired meanwhile (a
        # 256-worker run posts hundreds a second) wait for it instead of each running its own.
        self._refresh = threading.Lock()

    # ------------------------------------------------------------ which keys the rules watch
    def watched(self, run_id: int) -> WatchedKeys:
        """Keys the enabled rules of this run watch; cached briefly (rules change rarely)."""
        with self._refresh:
            hit = self.cached(run_id)
            if hit is not None:
                return hit
            now = time.monotonic()
            with self.db.read() as s:
                watched = WatchedKeys(*rule_store.watched_keys(s, run_id))
            self._rule_keys_cache[run_id] = (now, watched)
            return watched

    def cached(self, run_id: int) -> WatchedKeys | None:
        """`watched` when it is cached (no query), else None."""
        hit = self._rule_keys_cache.get(run_id)
        if hit is None or time.monotonic() - hit[0] >= RULE_CACHE_TTL_S:
            return None
        return hit[1]

    def forget(self, run_id: int | None = None) -> None:
        if run_id is None:
            self._rule_keys_cache.clear()
        else:
            self._rule_keys_cache.pop(run_id, None)

    # ------------------------------------------------------------ evaluation
    def apply(self, run_id: int, job: Job | None = None) -> bool:
        """The batch's job: each rule on its keys (each worker's series of a per-worker rule) takes
        one step of its streak."""
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

    def _apply_rule(self, s, run: Run, rule: Rule, series_key: str,
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


def _measure(s, run_id: int, rule: Rule, series_key: str, firing: bool,
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


def _measure_trend(s, run_id: int, rule: Rule, series_key: str, firing: bool) -> Measured:
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


def _measure_baseline(s, run_id: int, rule: Rule, series_key: str) -> Measured:
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


def _measure_sawtooth(s, run_id: int, rule: Rule, series_key: str) -> Measured:
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


def _newest_points(s, mk, wanted: int):
    return _newest_series(s, mk, wanted)[1]


def _newest_series(s, mk, wanted: int):
    """About the newest `wanted` points of a series (steps, values): a step range sized from the
    series' mean spacing (twice over, for gaps), so the read stays bounded however long it is."""
    lo = max(mk.first_step or 0, int(mk.last_step - 2 * wanted * _spacing(mk)))
    steps, values = read_raw(s, mk.id, lo, None)
    return steps[-wanted:], values[-wanted:]


def _first_points(s, mk, wanted: int):
    """The oldest `wanted` points of a series (steps, values), read in widening step ranges."""
    first = mk.first_step or 0
    width = 2 * wanted * _spacing(mk)
    while True:
        hi = int(first + width)
        steps, values = read_raw(s, mk.id, first, hi + 1)
        if len(values) >= wanted or hi >= mk.last_step:
            return steps[:wanted], values[:wanted]
        width *= 4


def _spacing(mk) -> float:
    return max(1.0, (mk.last_step - (mk.first_step or 0)) / max(1, (mk.count or 1) - 1))


def _aggregate(s, run_id: int, rule: Rule, series_key: str) -> tuple[float | None, int | None]:
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
