"""The notification stage: looks at due alert groups, asks `grouping.decide` whether to notify,
and writes the group's message to the outbox in the same transaction as its notification log.

Silences mute an alert's notifications whole: while one matches, the receiver is told neither
that the alert fires nor that it resolved (as in Alertmanager). What it was told stays in the log:
an alert announced as firing that resolved during the silence is announced as resolved once the
silence ends, so an incident the firing message opened is closed; an alert that fired and resolved
inside the silence is never announced (docs/design.md, "Silences").

Any number of backend processes may run one: a group row is locked for its evaluation
(PostgreSQL SKIP LOCKED; SQLite's write lock), so each notification is written once. Only groups
that are due are read (an index on next_check_at): the cost follows what changes, not history.
"""
from __future__ import annotations

import logging
import threading
from datetime import datetime

from sqlalchemy.orm import Session

from paritywatch.backend.alerts import grouping
from paritywatch.backend.alerts.effects import Effects, wakeups
from paritywatch.backend.alerts.lifecycle import alert_json
from paritywatch.backend.alerts.silences import matches
from paritywatch.backend.db import Database
from paritywatch.backend.models import NotificationGroup, Run, Silence, Webhook, utcnow
from paritywatch.backend.settings import Settings
from paritywatch.backend.store import alerts as alert_store
from paritywatch.backend.store import notifications as store
from paritywatch.backend.store import silences as silence_store
from paritywatch.backend.webhooks.outbox import enqueue_for, run_ref, wants
from trainer_hooks import contract

log = logging.getLogger("paritywatch.notify")
BATCH = 200


def timing_of(hook: Webhook, settings: Settings) -> grouping.Timing:
    def pick(value: float | None, default: float) -> float:
        return default if value is None else value

    return grouping.Timing(pick(hook.group_wait_s, settings.webhook_group_wait_s),
                           pick(hook.group_interval_s, settings.webhook_group_interval_s),
                           pick(hook.repeat_interval_s, settings.webhook_repeat_interval_s))


def grouping_of(hook: Webhook, settings: Settings) -> dict:
    t = timing_of(hook, settings)
    return {"group_by": list(hook.group_by or settings.webhook_group_by), "group_wait_s": t.group_wait_s,
            "group_interval_s": t.group_interval_s, "repeat_interval_s": t.repeat_interval_s}


class Notifier:
    def __init__(self, db: Database, settings: Settings, effects: Effects):
        self.db = db
        self.settings = settings
        self.effects = effects
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="paritywatch-notify", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread:
            self._thread.join(timeout=5)

    def wake(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.settings.notify_interval_s)
            self._wake.clear()
            try:
                self.run_once()
            except Exception:  # database away: keep the thread, try again next tick
                log.warning("notification pass failed", exc_info=True)

    def run_once(self, now: datetime | None = None) -> int:
        """Evaluate every due group; returns how many notifications were written."""
        now = now or utcnow()
        with self.db.read() as s:
            due = store.due_groups(s, now, BATCH)
            silences = silence_store.active(s, now)
        sent = 0
        for group_id in due:
            with self.effects.write(self.db) as s:
                sent += self._evaluate(s, group_id, now, silences)
        return sent

    def _evaluate(self, s: Session, group_id: int, now: datetime, silences: list[Silence]) -> int:
        group = store.lock_group(s, group_id)
        if group is None or group.next_check_at is None or group.next_check_at > now:
            return 0  # another replica has it, or took care of it
        hook = store.get_webhook(s, group.webhook_id)
        if hook is None or not hook.enabled:
            group.next_check_at = None
            return 0
        labels = {k: getattr(group, k) for k in ("run_id", "project", "kind", "severity") if getattr(group, k) is not None}
        told = frozenset(group.last_firing or [])
        members = alert_store.group_members(s, labels, hook.project, sorted(told))
        firing, resolved, silenced_until, muted_told = {}, [], [], []
        for alert, run in members:
            muted = [x for x in silences if matches(x, run.id, run.project, alert.kind)]
            if muted:  # neither its firing nor its resolution is told while the silence lasts
                if alert.status != "resolved" or alert.id in told:  # something to tell when it ends
                    silenced_until.append(min(x.ends_at for x in muted))
                if alert.id in told:
                    muted_told.append(alert.id)  # the receiver still believes it fires
            elif alert.status == "resolved":
                resolved.append((alert, run))
            else:
                firing[alert.id] = (alert, run)
        last = grouping.LastSent(group.last_sent_at, told) if group.last_sent_at is not None else None
        decision = grouping.decide(last, {k: a.fired_at for k, (a, _) in firing.items()},
                                   [a.id for a, _ in resolved], now, timing_of(hook, self.settings))
        group.next_check_at = min([t for t in [decision.next_check_at, *silenced_until] if t is not None], default=None)
        if not decision.send:
            return 0
        newly_resolved = [(a, r) for a, r in resolved if a.id in told]
        status = "firing" if firing else "resolved"
        group.last_sent_at, group.last_firing, group.last_reason = now, sorted({*firing, *muted_told}), decision.reason
        event_type = contract.EVENT_ALERT_FIRING if firing else contract.EVENT_ALERT_RESOLVED
        if not wants(hook, event_type):
            return 0  # the log moves on; this webhook does not want this kind of news
        payload = self._message(s, group, labels, status, decision.reason, list(firing.values()), newly_resolved,
                                len(silenced_until))
        enqueue_for(s, hook, event_type, payload)
        wakeups(s).outbox = True
        return 1

    def _message(self, s: Session, group: NotificationGroup, labels: dict, status: str, reason: str,
                 firing: list[tuple], resolved: list[tuple], silenced: int) -> dict:
        firing_json = [alert_json(a) for a, _ in firing]
        resolved_json = [alert_json(a) for a, _ in resolved]
        runs: dict[int, Run] = {r.id: r for _, r in firing + resolved}
        first_run = (firing + resolved)[0][1]
        where = f"{first_run.project}/{first_run.name}" if len(runs) == 1 else f"{len(runs)} runs"
        shown = firing_json if status == "firing" else resolved_json
        return {
            "status": status,
            "summary": grouping.summary(status, labels.get("kind"), firing_json, resolved_json, where),
            "reason": reason,
            "group": {"key": group.group_key, "labels": labels},
            "counts": {"firing": len(firing_json), "resolved": len(resolved_json), "silenced": silenced},
            "workers": grouping.workers_of(shown)[:grouping.FIRST_WORKERS * 4],
            "workers_total": len(grouping.workers_of(shown)),
            "components": grouping.components_of(shown),
            "alerts": firing_json[:grouping.MESSAGE_ALERTS],
            "resolved": resolved_json[:grouping.MESSAGE_ALERTS],
            "alert": shown[0],  # the first one, as events carried before grouping
            "run": run_ref(s, first_run),
            "runs": [run_ref(s, r) for r in list(runs.values())[:grouping.MESSAGE_ALERTS]],
            "url": run_ref(s, first_run)["url"],
        }
