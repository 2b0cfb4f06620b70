"""Alertmanager-style grouping, as pure functions with time passed in.

Alerts stay per cause; notifications are per group (by default one run and one alert kind).
`decide()` says whether a group's notification goes out now, and why, from the last notification
sent for it, its current firing and resolved alerts, and the time:

- a group's first notification waits `group_wait` after its first alert (so 200 workers that
  register one after another are one message);
- after that, changes (new firing alerts, announced ones resolved) go out at most once per
  `group_interval`;
- a group whose firing alerts have not changed is repeated every `repeat_interval`;
- alerts that fired and resolved before anything was sent are never announced.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Iterable, Mapping

GROUP_LABELS = ("run", "kind", "project", "severity")
LABEL_FIELDS = {"run": "run_id", "kind": "kind", "project": "project", "severity": "severity"}
FIRST_WORKERS = 5  # how many worker ids a message names before "and N more"
MESSAGE_ALERTS = 20  # alerts listed in full in a payload (the counts cover all)


@dataclass(frozen=True)
class Timing:
    group_wait_s: float
    group_interval_s: float
    repeat_interval_s: float


@dataclass(frozen=True)
class LastSent:
    at: datetime
    firing: frozenset[int]  # alert ids the receiver was told are firing


@dataclass(frozen=True)
class Decision:
    send: bool
    reason: str
    next_check_at: datetime | None  # when to look at the group again (None: when it changes)


def labels_of(group_by: Iterable[str], run_id: int, project: str, kind: str, severity: str) -> dict:
    """The alert's values of the labels its webhook groups by, e.g. {"run_id": 3, "kind": "..."}."""
    values = {"run_id": run_id, "project": project, "kind": kind, "severity": severity}
    return {LABEL_FIELDS[g]: values[LABEL_FIELDS[g]] for g in GROUP_LABELS if g in group_by}


def key_of(labels: Mapping[str, object]) -> str:
    return ",".join(f"{k}={labels[k]}" for k in sorted(labels))[:300]


def _s(seconds: float) -> str:
    return f"{seconds:g} s"


def decide(last: LastSent | None, firing: Mapping[int, datetime], resolved: Iterable[int], now: datetime,
           timing: Timing) -> Decision:
    """Notify or not, and why. `firing`: the group's firing (unsilenced) alerts and when each
    fired; `resolved`: ids of the group's alerts that have resolved."""
    told = last.firing if last is not None else frozenset()
    new = set(firing) - told
    gone = told & set(resolved)
    if not firing and not gone:
        return Decision(False, "nothing to tell: no firing alert, none announced has resolved", None)
    if last is None or not told:  # the first notification of an episode
        due = min(firing.values()) + timedelta(seconds=timing.group_wait_s)
        if now < due:
            return Decision(False, f"group wait ({_s(timing.group_wait_s)}): collecting the group's alerts", due)
        return Decision(True, f"{len(firing)} alert(s) firing", _after_send(now, firing, timing))
    if new or gone:
        due = last.at + timedelta(seconds=timing.group_interval_s)
        if now < due:
            return Decision(False, f"group interval ({_s(timing.group_interval_s)}) since the last notification", due)
        parts = [f"{len(new)} new alert(s) firing"] if new else []
        parts += [f"{len(gone)} resolved"] if gone else []
        if not firing:
            parts = [f"all {len(gone)} resolved"]
        return Decision(True, ", ".join(parts), _after_send(now, firing, timing))
    due = last.at + timedelta(seconds=timing.repeat_interval_s)
    if now < due:
        return Decision(False, "unchanged since the last notification", due)
    return Decision(True, f"still firing after the repeat interval ({_s(timing.repeat_interval_s)})",
                    _after_send(now, firing, timing))


def _after_send(now: datetime, firing: Mapping[int, datetime], timing: Timing) -> datetime | None:
    return now + timedelta(seconds=timing.repeat_interval_s) if firing else None


# ------------------------------------------------------------------ the message

def workers_of(alerts: list[dict]) -> list[str]:
    """Worker ids an alert group is about, in order, without repeats."""
    seen: dict[str, None] = {}
    for a in alerts:
        detail = a.get("detail") or {}
        for w in ([detail["worker_id"]] if detail.get("worker_id") else []) + list(detail.get("worker_ids") or []):
            seen.setdefault(str(w), None)
    return list(seen)


def components_of(alerts: list[dict]) -> list[str]:
    """What the group's alerts say differs: processor components (chat_template, vocab, ...) or
    weight tensors (a weights_mismatch names the first ones)."""
    seen: dict[str, None] = {}
    for a in alerts:
        detail = a.get("detail") or {}
        for c in (detail.get("components") or []) + (detail.get("differing_tensors") or []):
            seen.setdefault(str(c), None)
    return list(seen)


def summary(status: str, kind: str | None, firing: list[dict], resolved: list[dict], where: str) -> str:
    """One line a person reads first, e.g. "[FIRING] 100 heartbeat_lost alerts in grpo/r1: workers
    w1, w2, w3, w4, w5 and 95 more". A kind is a name: the noun after it takes the plural, never
    the kind ("processor_mismatchs")."""
    shown = firing if status == "firing" else resolved
    what = f"{kind} alert" if kind else "alert"
    line = f"[{status.upper()}] {len(shown)} {what}{'' if len(shown) == 1 else 's'} in {where}"
    workers = workers_of(shown)
    if workers:
        more = len(workers) - FIRST_WORKERS
        line += f": workers {', '.join(workers[:FIRST_WORKERS])}" + (f" and {more} more" if more > 0 else "")
    components = components_of(shown)
    if components:
        line += f"; differ in {', '.join(components)}"
    if status == "firing" and resolved:
        line += f" ({len(resolved)} resolved)"
    return line
