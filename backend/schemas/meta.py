"""Health, who am I, the dashboard's ui-config, webhook event types."""
from __future__ import annotations

from pydantic import BaseModel


class Health(BaseModel):
    status: str
    database: str
    schema_revision: str | None
    open_mode: bool


class ControlActionOut(BaseModel):
    """A control action: the run states it may be taken in, and the state it moves the run to."""
    allowed_from: list[str]
    target: str


class UiConfig(BaseModel):
    """What the dashboard takes from the server instead of copies of its own (trainer_hooks/contract.py)."""
    api_prefix: str
    version: str
    plotly_url: str
    severities: list[str]
    run_states: list[str]
    live_run_states: list[str]
    control_actions: dict[str, ControlActionOut]
    alert_kinds: list[str]
    fingerprint_component_order: list[str]
    webhook_events: list[EventTypeOut]


class WhoAmI(BaseModel):
    name: str
    scopes: list[str]
    open_mode: bool


class EventTypeOut(BaseModel):
    type: str
    description: str


class EventTypeList(BaseModel):
    events: list[EventTypeOut]
