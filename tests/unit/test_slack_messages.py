"""Slack messages for every event type: what a person reads first, with user text escaped."""
from __future__ import annotations

import json

from paritywatch.backend.webhooks.formats import render, slack_message

RUN = {"id": 3, "name": "grpo<&>", "project": "p", "state": "paused", "url": "https://pw.example/#/runs/3"}


def test_a_grouped_alert_message_is_its_summary_and_its_reason():
    payload = {"type": "alert.firing", "data": {
        "summary": "[FIRING] 100 heartbeat_lost alerts in p/grpo: workers w1, w2 and 98 more", "reason": "100 alert(s) firing",
        "alert": {"severity": "warning", "title": "x"}, "run": RUN}}
    text = slack_message(payload)["text"]
    assert text.startswith(":warning: [FIRING] 100 heartbeat_lost alerts")
    assert "(why now: 100 alert(s) firing)" in text and text.endswith("<https://pw.example/#/runs/3|open run>")


def test_run_control_acknowledged_and_resolved_messages():
    control = slack_message({"type": "run.control", "data": {"run": RUN, "control": {
        "state": "paused", "actor": "paritywatch", "reason": "processor mismatch: chat_template"}}})["text"]
    assert control.startswith("run p/grpo&lt;&amp;&gt; is now paused (by paritywatch: processor mismatch")
    ack = slack_message({"type": "alert.acknowledged", "data": {"run": RUN, "actor": "ana", "alert": {"title": "<b>"}}})
    assert "ana acknowledged &lt;b&gt;" in ack["text"]
    resolved = slack_message({"type": "alert.resolved", "data": {"run": RUN, "summary": "[RESOLVED] 2 x", "alert": {}}})
    assert resolved["text"].startswith(":white_check_mark: [RESOLVED] 2 x")
    assert json.loads(render("slack", {"type": "test", "data": {"url": "https://pw.example/"}}))["text"].startswith(
        "Paritywatch test event")


def test_a_tainted_end_says_which_steps_and_from_which_checkpoint_on():
    taint = {"tainted": True, "first_step": 212, "ranges_total": 4, "ranges": [
        {"summary": f"steps {a}–{b}: chat_template differs on 1 of 3 rollout workers"}
        for a, b in ((212, 251), (300, 310), (400, 401), (500, 501))]}
    data = {"run": RUN, "control": {"state": "finished", "actor": "trainer t0"}, "taint": taint}
    text = slack_message({"type": "run.ended_tainted", "data": data})["text"]
    assert text.startswith(":biohazard_sign: run p/grpo&lt;&amp;&gt; finished having trained on tainted steps; "
                           "steps 212–251: chat_template differs on 1 of 3 rollout workers; steps 300–310")
    assert "; and 1 more; checkpoints from step 212 on were trained on them" in text and "500–501" not in text
    paused = slack_message({"type": "run.control", "data": {**data, "control": {"state": "paused"}}})["text"]
    assert paused.startswith("run p/grpo&lt;&amp;&gt; is now paused (by paritywatch); steps 212–251")
    clean = slack_message({"type": "run.control", "data": {**data, "taint": {"tainted": False, "ranges": []}}})["text"]
    assert "tainted" not in clean and "checkpoints" not in clean
