"""Silences: mute matching notifications for a while."""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trainer_hooks.contract import (
    ALERT_KINDS,
    MAX_NAME_LENGTH,
)


class SilenceIn(BaseModel):
    """Mute notifications of alerts matching every given field, for `duration_s` seconds."""

    model_config = ConfigDict(extra="forbid")
    run_id: int | None = Field(default=None, ge=1, le=2**62)
    project: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_LENGTH)
    kind: Literal[ALERT_KINDS] | None = None
    duration_s: float = Field(gt=0, le=30 * 86_400, allow_inf_nan=False)
    reason: str = Field(min_length=1, max_length=2000)

    @model_validator(mode="after")
    def _matches_something(self) -> "SilenceIn":
        if self.run_id is None and self.project is None and self.kind is None:
            raise ValueError("a silence needs at least one of run_id, project, kind")
        return self


class SilenceOut(BaseModel):
    id: int
    run_id: int | None
    project: str | None
    kind: str | None
    starts_at: datetime
    ends_at: datetime
    created_by: str
    reason: str
    created_at: datetime
    ended_by: str | None
    ended_at: datetime | None
    active: bool


class SilenceList(BaseModel):
    silences: list[SilenceOut]
