"""Pydantic request/response schemas of the REST API (separate from the SQL models)."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Name = Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f]+$")
ControlStateName = Literal["running", "paused", "stopping", "stopped"]


class RunCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Name
    project: str = Field(default="default", min_length=1, max_length=200, pattern=r"^[^\x00-\x1f]+$")
    tags: dict[str, str] = Field(default_factory=dict, max_length=100)
    config: dict[str, Any] = Field(default_factory=dict)


class ControlOut(BaseModel):
    state: ControlStateName
    version: int
    actor: str | None
    reason: str | None
    updated_at: datetime


class ComponentCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    side: Literal["trainer", "rollout"]
    worker_id: str = Field(default="0", min_length=1, max_length=200)
    host: str = Field(default="", max_length=255)
    pid: int = Field(default=0, ge=0, le=2**31 - 1)


class ComponentOut(BaseModel):
    id: int
    run_id: int
    side: str
    worker_id: str
    host: str
    pid: int
    started_at: datetime
    last_heartbeat: datetime
    fingerprint_digest: str | None


class RunOut(BaseModel):
    id: int
    name: str
    project: str
    tags: dict[str, str]
    config: dict[str, Any]
    created_at: datetime
    last_step: int | None
    control: ControlOut
    components: list[ComponentOut] = []
    firing_alerts: dict[str, int] = {}


class RunList(BaseModel):
    runs: list[RunOut]


class HeartbeatOut(BaseModel):
    ok: bool = True
    control: ControlOut


class FingerprintStored(BaseModel):
    digest: str
    stored: bool


MAX_STEP = 2**53


class MetricBatch(BaseModel):
    """Columnar batch: every list in `series` is aligned with `steps`. Strict: "1" or true is
    not a step, "1.0" is not a value (JSON numbers only; NaN/Infinity are skipped)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    client_id: str = Field(min_length=1, max_length=64)
    seq: int = Field(ge=0, le=2**62)
    component_id: int | None = None
    steps: list[int] = Field(max_length=100_000)
    series: dict[str, list[float | None]]

    @field_validator("steps")
    @classmethod
    def _steps_in_range(cls, steps: list[int]) -> list[int]:
        for s in steps:
            if s < 0 or s > MAX_STEP:
                raise ValueError(f"step {s} is outside [0, 2**53]")
        return steps


class MetricBatchResult(BaseModel):
    accepted: int
    skipped_nonfinite: int
    duplicate: bool


class MetricKeyOut(BaseModel):
    key: str
    count: int
    first_step: int | None
    last_step: int | None
    last_value: float | None


class MetricKeyList(BaseModel):
    keys: list[MetricKeyOut]


class Buckets(BaseModel):
    step: list[int]
    min: list[float]
    max: list[float]
    last: list[float]
    count: list[int]


class SeriesOut(BaseModel):
    key: str
    points: int
    bucket_width: int
    origin: int
    step_min: int | None
    step_max: int | None
    buckets: Buckets


class ControlAction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: Literal["pause", "resume", "stop"]
    reason: str = Field(default="", max_length=2000)
    actor: str | None = Field(default=None, max_length=200)


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


class ControlAudit(BaseModel):
    events: list[ControlEventOut]


class Health(BaseModel):
    status: str
    database: str
    schema_revision: str | None
    open_mode: bool


class ErrorBody(BaseModel):
    status: int
    code: str
    message: str
    details: list[Any] | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


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


class AlertList(BaseModel):
    alerts: list[AlertOut]


class AlertNote(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: str | None = Field(default=None, max_length=2000)


class AlertEventOut(BaseModel):
    action: str
    actor: str | None
    note: str | None
    at: datetime


class AlertEvents(BaseModel):
    events: list[AlertEventOut]


class RunSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    on_mismatch: Literal["pause", "alert", "ignore"]


class RuleIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str = Field(min_length=1, max_length=200)
    aggregate: Literal["last", "mean", "max", "min"] = "last"
    window: int = Field(default=1, ge=1, le=1_000_000)
    comparison: Literal[">", ">=", "<", "<="]
    threshold: float = Field(allow_inf_nan=False)
    consecutive: int = Field(default=1, ge=1, le=10_000)
    severity: Literal["error", "warning", "info"] = "warning"
    action: Literal["alert", "pause", "stop"] = "alert"
    enabled: bool = True


class RulePatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool | None = None
    threshold: float | None = Field(default=None, allow_inf_nan=False)
    consecutive: int | None = Field(default=None, ge=1, le=10_000)
    severity: Literal["error", "warning", "info"] | None = None
    action: Literal["alert", "pause", "stop"] | None = None


class RuleOut(RuleIn):
    model_config = ConfigDict(extra="ignore")
    id: int
    run_id: int | None
    project: str | None
    builtin: bool


class RuleList(BaseModel):
    rules: list[RuleOut]


WebhookEvent = Literal["alert.firing", "alert.resolved", "alert.acknowledged", "run.control", "test"]


class WebhookIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(min_length=8, max_length=2000)
    format: Literal["standard", "slack"] = "standard"
    events: list[WebhookEvent] = Field(default_factory=list, max_length=10)
    project: str | None = Field(default=None, max_length=200)


class WebhookPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool


class WebhookOut(BaseModel):
    id: int
    url: str
    format: str
    events: list[str]
    project: str | None
    enabled: bool
    created_at: datetime


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


class DeliveryList(BaseModel):
    deliveries: list[DeliveryOut]


class TestQueued(BaseModel):
    delivery_id: int


class WhoAmI(BaseModel):
    name: str
    scopes: list[str]
    open_mode: bool
