"""Detection: runs after every fingerprint and metric batch commits, and on a heartbeat timer.

Processor mismatch -> alert (and pause, per the run's on_mismatch); rule breaches -> alert and
the rule's action; silent components -> heartbeat_lost. Conditions that clear auto-resolve.
"""
from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import Callable

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from backend.alerts import lifecycle
from backend.db import Database
from backend.detect import rules as rule_logic
from backend.detect.parity import compute_parity, differing_components
from backend.models import Component, MetricKey, Rule, RuleState, Run, utcnow
from backend.settings import Settings
from backend.store import control as control_store
from backend.store import fingerprints as fp_store
from backend.store.runs import get_run

log = logging.getLogger("paritywatch.detect")
ACTOR = "paritywatch"
RULE_CACHE_TTL_S = 2.0


class DetectionEngine:
    def __init__(self, db: Database, settings: Settings, on_control_change: Callable[[int], None],
                 on_outbox: Callable[[], None]):
        self.db = db
        self.settings = settings
        self.on_control_change = on_control_change
        self.on_outbox = on_outbox
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rule_keys_cache: dict[int, tuple[float, set[str]]] = {}

    # ------------------------------------------------------------ processors
    def on_fingerprint(self, run_id: int) -> None:
        rows = fp_store.fingerprints_of_run(self.db, run_id)
        parity = compute_parity(rows)
        self._retrying(lambda: self._apply_parity(run_id, parity))

    def _apply_parity(self, run_id: int, parity) -> None:  # noqa: ANN001
        paused = False
        with self.db.write() as s:
            run = get_run(s, run_id)
            current: set[str] = set()
            for group in parity.groups:
                if group.verdict not in ("error", "warning") or run.on_mismatch == "ignore":
                    continue
                key = f"processor_mismatch:{parity.reference_digest}:{group.digest}"
                current.add(key)
                names = differing_components(group.diff, group.verdict)
                ref = parity.reference
                title = (f"{len(group.components)} {group.components[0].side} worker(s) differ from the "
                         f"{ref.side} in {', '.join(names) or 'fingerprint'}")
                detail = {
                    "trainer_digest": parity.reference_digest, "rollout_digest": group.digest,
                    "reference_component_id": ref.id,
                    "component_ids": [c.id for c in group.components],
                    "worker_ids": [c.worker_id for c in group.components],
                    "components": names, "diff": group.diff,
                }
                _, new = lifecycle.fire(s, run, "processor_mismatch", group.verdict, key, title, detail)
                if new and group.verdict == "error" and run.on_mismatch == "pause" and run.control_state == "running":
                    control_store.set_state(s, run, "paused", ACTOR, f"processor mismatch: {', '.join(names)}")
                    paused = True
            for alert in lifecycle.open_alerts(s, run_id, "processor_mismatch"):
                if alert.dedup_key not in current:
                    lifecycle.resolve(s, run, alert, ACTOR, "processors match again", auto=True)
        self.on_outbox()
        if paused:
            self.on_control_change(run_id)

    # --------------------------------------------------------------- metrics
    def on_metrics(self, run_id: int, keys: set[str]) -> None:
        if not keys & self._rule_keys(run_id):
            return  # the common case: one cached lookup, no query
        with self.db.read() as s:
            run = get_run(s, run_id)
            candidates = list(s.scalars(
                select(Rule).where(
                    Rule.enabled.is_(True),
                    Rule.key.in_(keys),
                    (Rule.run_id == run_id) | ((Rule.run_id.is_(None)) & (Rule.project == run.project)),
                )
            ))
        if candidates:
            self._retrying(lambda: self._evaluate_rules(run_id, candidates))

    def _rule_keys(self, run_id: int) -> set[str]:
        """Keys any enabled rule of this run watches; cached briefly (rules change rarely)."""
        now = time.monotonic()
        hit = self._rule_keys_cache.get(run_id)
        if hit and now - hit[0] < RULE_CACHE_TTL_S:
            return hit[1]
        with self.db.read() as s:
            project = s.scalar(select(Run.project).where(Run.id == run_id))
            keys = set(s.scalars(select(Rule.key).where(
                Rule.enabled.is_(True),
                (Rule.run_id == run_id) | ((Rule.run_id.is_(None)) & (Rule.project == project)),
            )))
        self._rule_keys_cache[run_id] = (now, keys)
        return keys

    def forget_rules(self, run_id: int | None = None) -> None:
        if run_id is None:
            self._rule_keys_cache.clear()
        else:
            self._rule_keys_cache.pop(run_id, None)

    def _evaluate_rules(self, run_id: int, candidates: list[Rule]) -> None:
        control_changed = False
        with self.db.write() as s:
            run = get_run(s, run_id)
            for rule in candidates:
                value, step = _aggregate(s, run_id, rule)
                state = s.get(RuleState, (rule.id, run_id)) or RuleState(rule_id=rule.id, run_id=run_id, streak=0)
                s.add(state)
                state.streak = rule_logic.next_streak(state.streak, rule_logic.breached(value, rule.comparison, rule.threshold))
                state.last_value = value
                key = f"rule:{rule.id}"
                if rule_logic.should_fire(state.streak, rule.consecutive):
                    title = f"{rule.key} {rule.aggregate}={value:.4g} {rule.comparison} {rule.threshold:g}"
                    detail = {"rule_id": rule.id, "key": rule.key, "value": value, "threshold": rule.threshold,
                              "comparison": rule.comparison, "aggregate": rule.aggregate, "window": rule.window,
                              "consecutive": rule.consecutive}
                    _, new = lifecycle.fire(s, run, "metric_threshold", rule.severity, key, title, detail, step)
                    if new and rule.action in ("pause", "stop"):
                        control_changed |= _act(s, run, rule.action, f"rule: {title}")
                elif state.streak == 0:
                    alert = lifecycle.open_alert(s, run_id, key)
                    if alert is not None:
                        lifecycle.resolve(s, run, alert, ACTOR, f"{rule.key} back within threshold", auto=True)
        self.on_outbox()
        if control_changed:
            self.on_control_change(run_id)

    # ------------------------------------------------------------ heartbeats
    def start(self) -> None:
        self._thread = threading.Thread(target=self._heartbeat_loop, name="paritywatch-heartbeats", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.settings.heartbeat_check_interval_s):
            try:
                self._retrying(self.sweep_heartbeats)
            except Exception:
                log.warning("heartbeat sweep failed", exc_info=True)

    def sweep_heartbeats(self) -> None:
        cutoff = utcnow() - timedelta(seconds=self.settings.heartbeat_timeout_s)
        with self.db.write() as s:
            rows = s.execute(
                select(Component, Run).join(Run, Run.id == Component.run_id).where(Run.control_state != "stopped")
            ).all()
            for comp, run in rows:
                key = f"heartbeat:{comp.id}"
                if comp.last_heartbeat < cutoff:
                    age = (utcnow() - comp.last_heartbeat).total_seconds()
                    title = f"{comp.side} {comp.worker_id} on {comp.host or '?'} silent for {age:.0f} s"
                    lifecycle.fire(s, run, "heartbeat_lost", "warning", key, title,
                                   {"component_id": comp.id, "side": comp.side, "worker_id": comp.worker_id,
                                    "last_heartbeat": comp.last_heartbeat.isoformat()})
                else:
                    alert = lifecycle.open_alert(s, run.id, key)
                    if alert is not None:
                        lifecycle.resolve(s, run, alert, ACTOR, "heartbeat resumed", auto=True)
            stopped = self._finish_abandoned_stops(s, cutoff)
        self.on_outbox()
        for run_id in stopped:
            self.on_control_change(run_id)

    def _finish_abandoned_stops(self, s, cutoff) -> list[int]:  # noqa: ANN001
        """A stop is complete when the trainer reports its loop ended (POST .../control/stopped);
        a trainer that died instead never will. A run still `stopping` with no heartbeat from any
        of its processes for the heartbeat timeout since the stop is `stopped`."""
        done = []
        for run in s.scalars(select(Run).where(Run.control_state == "stopping", Run.control_updated_at < cutoff)):
            alive = s.scalar(select(Component.id).where(Component.run_id == run.id, Component.last_heartbeat >= cutoff)
                             .limit(1))
            if alive is None:
                timeout = self.settings.heartbeat_timeout_s
                control_store.set_state(s, run, "stopped", ACTOR,
                                        f"no process of the run sent a heartbeat for {timeout:g} s after the stop")
                done.append(run.id)
        return done

    def _retrying(self, fn: Callable[[], None]) -> None:
        """Another backend process may open the same alert at the same moment: the unique
        open_key makes one of us fail; the retry then sees the other's alert."""
        for attempt in range(3):
            try:
                fn()
                return
            except IntegrityError:
                if attempt == 2:
                    raise


def _aggregate(s, run_id: int, rule: Rule) -> tuple[float | None, int | None]:  # noqa: ANN001
    mk = s.scalar(select(MetricKey).where(MetricKey.run_id == run_id, MetricKey.key == rule.key))
    if mk is None or mk.last_step is None:
        return None, None
    if rule.aggregate == "last":
        return mk.last_value, mk.last_step
    lo = mk.last_step - max(1, rule.window) + 1
    from backend.store.metrics import read_raw  # raw points are packed chunks: decode the window's

    _, values = read_raw(s, mk.id, lo, None)
    if not len(values):
        return None, mk.last_step
    value = {"mean": values.mean, "max": values.max, "min": values.min}[rule.aggregate]()
    return float(value), mk.last_step


def _act(s, run: Run, action: str, reason: str) -> bool:  # noqa: ANN001
    target = "paused" if action == "pause" else "stopping"
    allowed = control_store.TRANSITIONS[action][0]
    if run.control_state not in allowed or run.control_state == target:
        return False
    control_store.set_state(s, run, target, ACTOR, reason)
    return True
