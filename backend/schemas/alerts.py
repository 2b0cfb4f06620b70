"""Alerts, their notes and events."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from paritywatch.backend.schemas.common import Page


class AlertOut(BaseModel):
    id: int
    run_id: int
    kind: str
    severity: str
    status: str
    dedup_key: str
    title: str
    detail: dict[str, Any]
    step: int | None
    fired_at: datetime
    updated_at: datetime
    resolved_at: datetime | None
    silenced: bool = False
    silenced_by: list[int] = Field(default_factory=list, description="Ids of the active silences muting it")


class AlertList(Page):
    alerts: list[AlertOut]


class AlertNote(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: str | None = Field(default=None, max_length=2000)


class AlertEventOut(BaseModel):
    action: str
    actor: str | None
    note: str | None
    at: datetime


class AlertEvents(Page):
    events: list[AlertEventOut]
