"""Event payloads: the generic signed JSON, and Slack's incoming-webhook format."""
from __future__ import annotations

import json
from trainer_hooks import contract

SEVERITY_EMOJI = {"error": ":rotating_light:", "warning": ":warning:", "info": ":information_source:"}


def render(fmt: str, payload: dict) -> bytes:
    if fmt == "slack":
        return json.dumps(slack_message(payload), separators=(",", ":")).encode()
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def _escape(text: str) -> str:
    # Slack mrkdwn treats <...> and & specially: escape user-supplied text.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _link(url: str | None, label: str) -> str:
    return f" <{url}|{label}>" if url else ""


def tainted_steps(taint: dict, shown: int = 3) -> str:
    """"; steps 212–251: chat_template differs on 1 of 3 rollout workers; checkpoints from step
    212 on were trained on them" (the first few ranges)."""
    ranges = taint.get("ranges") or []
    if not ranges:
        return ""
    more = taint.get("ranges_total", len(ranges)) - shown
    text = "; " + "; ".join(r.get("summary", "") for r in ranges[:shown]) + (f"; and {more} more" if more > 0 else "")
    return text + f"; checkpoints from step {taint.get('first_step')} on were trained on them"


def slack_message(payload: dict) -> dict:
    data = payload.get("data", {})
    kind = payload.get("type")
    run = data.get("run") or {}
    where = f"run {run.get('project', '')}/{run.get('name', '')}"
    if kind == contract.EVENT_TEST:
        return {"text": "Paritywatch test event: this webhook works." + _link(data.get("url"), "dashboard")}
    if kind in (contract.EVENT_RUN_CONTROL, contract.EVENT_RUN_ENDED_TAINTED):
        control = data.get("control") or {}
        why = f": {control['reason']}" if control.get("reason") else ""
        state = control.get('state', run.get('state', '?'))
        text = f"{where} is now {state} (by {control.get('actor') or 'paritywatch'}{why})"
        taint = data.get("taint") or {}
        if kind == contract.EVENT_RUN_ENDED_TAINTED or taint.get("tainted"):
            text = f"{where} {state} having trained on tainted steps" if kind == contract.EVENT_RUN_ENDED_TAINTED else text
            text += tainted_steps(taint)
        emoji = ":biohazard_sign: " if kind == contract.EVENT_RUN_ENDED_TAINTED else ""
        return {"text": emoji + _escape(text) + _link(run.get("url"), "open run")}
    alert = data.get("alert") or {}
    if kind == contract.EVENT_ALERT_ACKNOWLEDGED:
        text = f":eyes: {data.get('actor', 'someone')} acknowledged {alert.get('title', '')} — {where}"
        return {"text": _escape(text) + _link(run.get("url"), "open run")}
    resolved = kind == contract.EVENT_ALERT_RESOLVED
    emoji = ":white_check_mark:" if resolved else SEVERITY_EMOJI.get(alert.get("severity"), "")
    text = data.get("summary") or f"[{'RESOLVED' if resolved else alert.get('severity', '').upper()}] {alert.get('title', '')} — {where}"
    if data.get("reason"):
        text += f" (why now: {data['reason']})"
    return {"text": f"{emoji} {_escape(text)}" + _link(run.get("url"), "open run")}
