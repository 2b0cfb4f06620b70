"""Notify or not, and why: `grouping.decide` as a table (time injected), and the message text."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from paritywatch.backend.alerts import grouping
from paritywatch.backend.alerts.grouping import Decision, LastSent, Timing, decide
from paritywatch.backend.alerts.silences import muting
from paritywatch.backend.detect.rules import evaluate

T0 = datetime(2026, 12, 1, 9, 0, 0, tzinfo=timezone.utc)
TIMING = Timing(group_wait_s=5, group_interval_s=60, repeat_interval_s=3600)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# (name, last sent (seconds, ids) or None, firing {id: fired at s}, resolved ids, now s, expected send,
#  expected next check s or None, a word the reason must contain)
CASES = [
    ("nothing at all", None, {}, [], 10, False, None, "nothing"),
    ("fired and resolved inside the wait: never announced", None, {}, [1], 10, False, None, "nothing"),
    ("first alert waits the group wait", None, {1: 0}, [], 2, False, 5, "group wait"),
    ("200 workers within the wait: one message at its end", None, {i: i * 0.01 for i in range(200)}, [], 5, True,
     3605, "200 alert"),
    ("the wait counts from the group's first alert", None, {1: 0, 2: 4}, [], 5, True, 3605, "firing"),
    ("unchanged group: quiet until the repeat interval", (10, {1}), {1: 0}, [], 100, False, 3610, "unchanged"),
    ("unchanged group: repeated after the repeat interval", (10, {1}), {1: 0}, [], 3610, True, 7210, "repeat"),
    ("a new alert waits for the group interval", (10, {1}), {1: 0, 2: 30}, [], 40, False, 70, "group interval"),
    ("a new alert after the group interval", (10, {1}), {1: 0, 2: 30}, [], 70, True, 3670, "1 new"),
    ("an announced alert resolved, others firing", (10, {1, 2}), {2: 0}, [1], 70, True, 3670, "1 resolved"),
    ("all announced resolved: one resolved message", (10, {1, 2}), {}, [1, 2], 70, True, None, "all 2 resolved"),
    ("all resolved, but inside the group interval", (10, {1, 2}), {}, [1, 2], 20, False, 70, "group interval"),
    ("resolved alerts nobody was told about stay quiet", (10, {1}), {1: 0}, [7], 100, False, 3610, "unchanged"),
    ("after an all-resolved message a new episode waits again", (10, set()), {3: 100}, [], 102, False, 105, "group wait"),
    ("a flapping alert kept firing is no news", (10, {1}), {1: 0}, [], 11, False, 3610, "unchanged"),
]


@pytest.mark.parametrize("name,last,firing,resolved,now,send,next_s,why", CASES, ids=[c[0] for c in CASES])
def test_decide(name, last, firing, resolved, now, send, next_s, why):
    last_sent = LastSent(at(last[0]), frozenset(last[1])) if last is not None else None
    d = decide(last_sent, {k: at(v) for k, v in firing.items()}, resolved, at(now), TIMING)
    assert isinstance(d, Decision)
    assert d.send is send, d.reason
    assert d.next_check_at == (at(next_s) if next_s is not None else None), d.reason
    assert why in d.reason


def test_a_zero_group_wait_sends_at_once():
    d = decide(None, {1: T0}, [], T0, Timing(0, 0, 60))
    assert d.send and d.next_check_at == at(60)


def test_group_labels_and_keys():
    labels = grouping.labels_of(["run", "kind"], 7, "proj", "heartbeat_lost", "warning")
    assert labels == {"run_id": 7, "kind": "heartbeat_lost"}
    assert grouping.key_of(labels) == "kind=heartbeat_lost,run_id=7"
    assert grouping.labels_of(["project"], 7, "proj", "heartbeat_lost", "warning") == {"project": "proj"}


def test_summary_names_the_first_workers_and_the_components():
    firing = [{"detail": {"worker_id": f"w{i}"}} for i in range(100)]
    line = grouping.summary("firing", "heartbeat_lost", firing, [], "grpo/r1")
    assert line == "[FIRING] 100 heartbeat_lost alerts in grpo/r1: workers w0, w1, w2, w3, w4 and 95 more"
    mismatch = [{"detail": {"worker_ids": ["a", "b"], "components": ["chat_template"]}},
                {"detail": {"worker_ids": ["c"], "components": ["chat_template", "generation_eos"]}}]
    line = grouping.summary("firing", "processor_mismatch", mismatch, [], "p/r")
    assert "workers a, b, c" in line and "differ in chat_template, generation_eos" in line
    assert line.startswith("[FIRING] 2 processor_mismatch alerts in p/r")  # the noun takes the plural, not the kind
    assert grouping.summary("resolved", "heartbeat_lost", [], firing[:1], "p/r").startswith("[RESOLVED] 1 heartbeat_lost alert in ")


class S:
    def __init__(self, id, run_id=None, project=None, kind=None):
        self.id, self.run_id, self.project, self.kind = id, run_id, project, kind


def test_silence_matching_needs_every_field_it_sets():
    silences = [S(1, run_id=3), S(2, project="p"), S(3, kind="heartbeat_lost"), S(4, project="p", kind="metric_threshold")]
    assert muting(silences, 3, "q", "processor_mismatch") == [1]
    assert muting(silences, 9, "p", "heartbeat_lost") == [2, 3]
    assert muting(silences, 9, "p", "metric_threshold") == [2, 4]
    assert muting(silences, 9, "q", "metric_threshold") == []


# (streak, clear streak, breached, consecutive, keep_firing_for, firing) -> (streak, clear, action)
RULE_STEPS = [
    ((0, 0, True, 1, 0, False), (1, 0, "fire")),
    ((0, 3, True, 3, 0, False), (1, 0, None)),  # "for": 3 breaches in a row before firing
    ((2, 0, True, 3, 0, False), (3, 0, "fire")),
    ((1, 0, False, 1, 0, True), (0, 1, "resolve")),  # keep_firing_for 0: the first clear evaluation resolves
    ((1, 0, False, 1, 2, True), (0, 1, None)),  # kept firing ...
    ((0, 2, False, 1, 2, True), (0, 3, "resolve")),  # ... until more than 2 clear evaluations
    ((0, 1, True, 3, 2, True), (1, 0, "fire")),  # a breach while kept firing refreshes it
    ((0, 5, False, 1, 0, False), (0, 6, None)),
]


@pytest.mark.parametrize("given,expected", RULE_STEPS)
def test_rule_evaluation_steps(given, expected):
    step = evaluate(*given)
    assert (step.streak, step.clear_streak, step.action) == expected


def test_a_rule_flapping_50_times_with_keep_firing_for_is_one_alert():
    streak = clear = 0
    firing = False
    fired = resolved = 0
    for i in range(100):  # breach, clear, breach, clear ...
        step = evaluate(streak, clear, i % 2 == 0, 1, 2, firing)
        streak, clear = step.streak, step.clear_streak
        if step.action == "fire" and not firing:
            fired, firing = fired + 1, True
        elif step.action == "resolve":
            resolved, firing = resolved + 1, False
    assert (fired, resolved, firing) == (1, 0, True)
