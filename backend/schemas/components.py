"""A run's processes: registration, heartbeats, fingerprints, close."""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from paritywatch.backend.schemas.control import ControlOut
from trainer_hooks.contract import (
    MAX_NAME_LENGTH,
    MAX_POLICY_VERSION,
    MAX_RATE_PER_S,
    PROCESS_STATES,
    SIDES,
)


class ComponentCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    side: Literal[SIDES]
    worker_id: str = Field(default="0", min_length=1, max_length=MAX_NAME_LENGTH)
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
    status: Literal[PROCESS_STATES] = Field(
        default="live", description="`ended`: a live process of an ended run, silent for the heartbeat timeout (never stored)")
    closed_at: datetime | None = None
    lost_at: datetime | None = None
    close_reason: str | None = None


class HeartbeatIn(BaseModel):
    """How far along the process is (trainer_hooks/contract.py, "heartbeats"); every field optional."""

    model_config = ConfigDict(extra="forbid")
    policy_version: int | None = Field(default=None, ge=0, le=MAX_POLICY_VERSION, strict=True, description=(
        "the trainer: the weights version it last published; a rollout worker: the version it serves"))
    samples_per_s: float | None = Field(default=None, ge=0, le=MAX_RATE_PER_S,
                                        description="samples produced per second over the last heartbeat interval")
    points_per_s: float | None = Field(default=None, ge=0, le=MAX_RATE_PER_S,
                                       description="metric points delivered per second over the last heartbeat interval")


class HeartbeatOut(BaseModel):
    ok: bool = True
    control: ControlOut


class FingerprintStored(BaseModel):
    digest: str
    stored: bool


class ComponentClose(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str | None = Field(default=None, max_length=2000)
