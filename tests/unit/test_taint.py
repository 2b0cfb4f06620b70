"""The pure rules of a run's record of what it trained on (backend/detect/taint.py): which alerts
count, where a divergence starts, how spans merge per cause, what a checkpoint's verdict is."""
from __future__ import annotations

import pytest

from paritywatch.backend.detect.taint import Span, cause_of, checkpoint, first_step, merge, record


@pytest.mark.parametrize("kind,severity,detail,step,expected", [
    ("processor_mismatch", "error", {"components": ["chat_template"], "worker_ids": ["w2", "w2", "w5"]}, 7,
     ("processor:chat_template", "chat_template differs", ("w2", "w5"), None)),
    ("processor_mismatch", "error", {"components": ["vocab", "chat_template"]}, None,
     ("processor:chat_template,vocab", "vocab, chat_template differ", (), None)),
    ("processor_mismatch", "warning", {"components": ["chat_template"]}, 7, None),  # renders alike: no misaligned token
    ("weights_mismatch", "error", {"worker_id": "w3"}, None, ("weights", "weights differ from the trainer's", ("w3",), None)),
    ("weights_stale", "error", {"worker_id": "w3"}, None, None),  # behind on weights: off-policy, not misaligned
    ("weights_backwards", "error", {"worker_id": "w3"}, None, None),
    ("heartbeat_lost", "warning", {"worker_id": "w3"}, None, None),
    ("sample_audit", "error", {"cause": "rerender", "step": 41}, 41,
     ("sample_audit:rerender", "prompts re-render differently on the trainer (per-sample audit)", (), 41)),
    ("metric_threshold", "error", {"rule_key": "align/decode_mismatch_frac", "comparison": ">", "threshold": 0.0,
                                   "steps": [10, 14], "worker_id": "worker3"}, 14,
     ("metric:align/decode_mismatch_frac", "align/decode_mismatch_frac > 0", ("worker3",), 10)),
    ("metric_threshold", "warning", {"rule_key": "align/kl_k3", "threshold": 0.01}, 3, None),
    ("metric_threshold", "error", {"rule_key": "loss", "threshold": 9.0}, 3, None),  # a user's own metric
    ("metric_trend", "error", {"rule_key": "align/kl_k3"}, 3, None),
])
def test_which_alerts_mean_misaligned_training(kind, severity, detail, step, expected):
    cause = cause_of(kind, severity, detail, step)
    assert (cause if cause is None else (cause.key, cause.what, cause.worker_ids, cause.measured_step)) == expected


def test_a_divergence_starts_after_the_last_logged_step_or_at_the_step_it_measured():
    found = cause_of("processor_mismatch", "error", {"components": ["vocab"]}, 211)
    assert first_step(found, 211) == 212  # step 211 was trained before it was seen
    assert first_step(found, None) == 0  # nothing logged yet: from the first step
    measured = cause_of("sample_audit", "error", {"cause": "length_parity", "step": 40}, 40)
    assert first_step(measured, 45) == 40


def span(first, last, cause="processor:chat_template", alert=1, workers=(), rollout=3):
    return Span(alert, "processor_mismatch", cause, "chat_template differs", first, last, tuple(workers), len(workers), rollout)


def test_spans_of_one_cause_merge_when_they_overlap_or_touch_and_stay_apart_otherwise():
    ranges = merge([span(10, 20, alert=1, workers=["w1"]), span(21, 30, alert=2, workers=["w2"], rollout=4),
                    span(15, 18, alert=3, workers=["w1"]), span(40, 45, alert=4),
                    span(12, 13, cause="weights", alert=5, workers=["w9"])], run_last_step=100)
    assert [(r.cause, r.first_step, r.last_step, r.alert_ids, r.workers, r.rollout_workers) for r in ranges] == [
        ("processor:chat_template", 10, 30, [1, 3, 2], 2, 4),
        ("weights", 12, 13, [5], 1, 3),
        ("processor:chat_template", 40, 45, [4], 0, 3)]
    assert ranges[0].summary == "steps 10–30: chat_template differs on 2 of 4 rollout workers"
    assert ranges[2].summary == "steps 40–45: chat_template differs"


def test_an_open_span_reaches_the_runs_last_step_and_an_empty_one_covers_nothing():
    [r] = merge([span(50, None), span(30, 29, alert=2)], run_last_step=80)  # 30..29: fixed during a pause
    assert (r.first_step, r.last_step, r.open) == (50, 80, True)
    assert r.summary == "steps 50–80 (still open): chat_template differs"
    assert merge([span(81, None)], run_last_step=80) == []  # opened, nothing trained since
    assert merge([span(0, None)], run_last_step=None) == []
    one = merge([span(7, 7, workers=["w1"], rollout=1)], run_last_step=9)[0]
    assert one.summary == "step 7: chat_template differs on 1 of 1 rollout worker"


def test_the_record_counts_distinct_steps_and_judges_a_checkpoint():
    taint = record([span(10, 20), span(15, 25, cause="weights", alert=2), span(40, 40, alert=3)], run_last_step=50)
    assert (taint["tainted"], taint["first_step"], taint["steps"], taint["ranges_total"]) == (True, 10, 17, 3)
    assert checkpoint(taint, 9) == {"step": 9, "tainted": False, "ranges": []}
    verdict = checkpoint(taint, 15)
    assert verdict["tainted"] and [r["cause"] for r in verdict["ranges"]] == ["processor:chat_template", "weights"]
    clean = record([], run_last_step=50)
    assert clean == {"tainted": False, "first_step": None, "steps": 0, "ranges": [], "ranges_total": 0}
    assert checkpoint(clean, 50)["tainted"] is False
