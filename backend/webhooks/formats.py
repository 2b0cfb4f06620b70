"""Event payloads: the generic signed JSON, and Slack's incoming-webhook format."""
from __future__ import annotations

import json

SEVERITY_EMOJI = {"error": ":rotating_light:", "warning": ":warning:", "info": ":information_source:"}


def render(fmt: str, payload: dict) -> bytes:
    if fmt == "slack":
        return json.dumps(slack_message(payload), separators=(",", ":")).encode()
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def slack_message(payload: dict) -> dict:
    data = payload.get("data", {})
    alert = data.get("alert") or {}
    run = data.get("run") or {}
    if payload.get("type") == "test":
        return {"text": "Paritywatch test event: this webhook works."}
    state = "RESOLVED" if payload.get("type") == "alert.resolved" else alert.get("severity", "").upper()
    emoji = ":white_check_mark:" if state == "RESOLVED" else SEVERITY_EMOJI.get(alert.get("severity"), "")
    text = f"{emoji} [{state}] {alert.get('title', '')} — run {run.get('project', '')}/{run.get('name', '')}"
    # Slack mrkdwn treats <...> and & specially: escape user-supplied text.
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return {"text": text}
