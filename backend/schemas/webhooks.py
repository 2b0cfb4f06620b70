"""Webhooks, their grouping, deliveries and attempts."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from paritywatch.backend.schemas.common import Page
from trainer_hooks.contract import (
    MAX_NAME_LENGTH,
    WEBHOOK_EVENT_TYPES,
)

WebhookEvent = Literal[WEBHOOK_EVENT_TYPES]


GroupLabel = Literal["run", "kind", "project", "severity"]


class Grouping(BaseModel):
    """How a webhook's alert notifications are grouped and timed (None: the server's default)."""

    model_config = ConfigDict(extra="forbid")
    group_by: list[GroupLabel] | None = Field(default=None, min_length=1, max_length=4)
    group_wait_s: float | None = Field(default=None, ge=0, le=3600, allow_inf_nan=False)
    group_interval_s: float | None = Field(default=None, ge=0, le=86_400, allow_inf_nan=False)
    repeat_interval_s: float | None = Field(default=None, ge=1, le=30 * 86_400, allow_inf_nan=False)


class WebhookIn(Grouping):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(min_length=8, max_length=2000)
    format: Literal["standard", "slack"] = "standard"
    events: list[WebhookEvent] = Field(default_factory=list, max_length=10)
    project: str | None = Field(default=None, max_length=MAX_NAME_LENGTH)


class WebhookPatch(Grouping):
    """Enable or disable; change grouping (send a field as null to go back to the default)."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool | None = None


class WebhookOut(BaseModel):
    id: int
    url: str
    format: str
    events: list[str]
    project: str | None
    enabled: bool
    created_at: datetime
    group_by: list[str] | None = None
    group_wait_s: float | None = None
    group_interval_s: float | None = None
    repeat_interval_s: float | None = None
    grouping: dict[str, Any] = Field(default_factory=dict, description="The grouping in effect, defaults filled in")


class WebhookCreated(WebhookOut):
    secret: str


class WebhookList(BaseModel):
    webhooks: list[WebhookOut]


class AttemptOut(BaseModel):
    at: datetime
    status_code: int | None
    error: str | None
    duration_ms: float


class DeliveryOut(BaseModel):
    id: int
    event_id: str
    event_type: str
    status: str
    attempts: int
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None
    next_attempt_at: datetime
    attempt_log: list[AttemptOut] = []


class DeliveryList(Page):
    deliveries: list[DeliveryOut]


class TestQueued(BaseModel):
    delivery_id: int
