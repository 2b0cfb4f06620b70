"""Run control: pause / resume / stop, the control state and its audit trail."""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from paritywatch.backend.schemas.common import ControlStateName, Page
from trainer_hooks.contract import (
    MAX_NAME_LENGTH,
)


class ControlOut(BaseModel):
    state: ControlStateName
    version: int
    actor: str | None
    reason: str | None
    updated_at: datetime


class ControlAction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: Literal["pause", "resume", "stop"]
    reason: str = Field(default="", max_length=2000)
    actor: str | None = Field(default=None, max_length=MAX_NAME_LENGTH)


class StopAcknowledgement(BaseModel):
    model_config = ConfigDict(extra="forbid")
    component_id: int | None = Field(default=None, ge=1, le=2**62, description="The reporting component (names the actor)")
    reason: str = Field(default="", max_length=2000)


class ControlEventOut(BaseModel):
    version: int
    from_state: str
    to_state: str
    actor: str | None
    reason: str | None
    at: datetime


class ControlAudit(Page):
    events: list[ControlEventOut]
