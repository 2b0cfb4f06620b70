"""Metric batches (the hooks' ingest) and series reads."""
from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator

from paritywatch.backend.schemas.common import Page
from trainer_hooks.contract import (
    MAX_CLIENT_ID_LENGTH,
    MAX_POINTS_PER_BATCH,
    MAX_SEQ,
    MAX_STEP,
)


class MetricBatch(BaseModel):
    """Columnar batch: every list in `series` is aligned with `steps`. Strict: "1" or true is
    not a step, "1.0" is not a value (JSON numbers only; NaN/Infinity are skipped)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    client_id: str = Field(min_length=1, max_length=MAX_CLIENT_ID_LENGTH)
    seq: int = Field(ge=0, le=MAX_SEQ)
    component_id: int | None = Field(default=None, ge=0, le=2**63 - 1)
    steps: list[int] = Field(max_length=MAX_POINTS_PER_BATCH)
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


class MetricKeyList(Page):
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


class SeriesTimesOut(BaseModel):
    key: str
    started_at: datetime = Field(description="the run's creation time; `seconds` count from it")
    steps: list[int] = Field(description="the last step of each batch that carried the key, ascending")
    seconds: list[float] = Field(description="when the server received that batch, in seconds since `started_at`")
