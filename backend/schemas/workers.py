"""The workers view: per-process state and outlier series."""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from paritywatch.backend.schemas.common import Page
from trainer_hooks.contract import (
    PROCESS_STATES,
)


class WorkerAlertOut(BaseModel):
    id: int
    kind: str
    severity: str
    title: str


class WorkerOut(BaseModel):
    component_id: int
    side: str
    worker_id: str
    host: str
    pid: int
    state: Literal[PROCESS_STATES] = Field(description="as a Component's `status`")
    started_at: datetime
    last_heartbeat: datetime
    policy_version: int | None = Field(description="from its last heartbeat that carried one")
    lag: int | None = Field(description="versions behind the trainer (rollout workers; null when either is unknown)")
    lagging: bool = Field(description="lag >= the view's threshold (`lagging_versions`)")
    samples_per_s: float | None
    points_per_s: float | None
    fingerprint_digest: str | None
    group: str | None = Field(description="label of its fingerprint group (see `groups`); null without a fingerprint")
    alerts: list[WorkerAlertOut] = Field(description="open alerts that concern this process")


class WorkerGroupOut(BaseModel):
    label: str
    digest: str
    side: str = Field(description="side of its first process")
    processes: int
    same_as_trainer: bool | None = Field(description="null when the run has no trainer fingerprint")


class WorkerList(Page):
    trainer_policy_version: int | None = Field(description="the highest version a trainer of the run reported")
    lagging_versions: int
    counts: dict[str, int] = Field(description="the run's processes by state, and total (unfiltered)")
    groups: list[WorkerGroupOut]
    workers: list[WorkerOut]


class BucketMeans(BaseModel):
    step: list[int]
    mean: list[float]
    min: list[float]
    max: list[float]
    count: list[int]


class WorkerSeriesLine(BaseModel):
    component_id: int
    worker_id: str
    side: str
    score: float = Field(description="robust z-score of its mean against the other workers' means")
    mean: float
    points: int
    buckets: BucketMeans


class WorkerSeriesOut(BaseModel):
    key: str
    step_min: int | None
    step_max: int | None
    bucket_width: int
    aggregate: BucketMeans = Field(description="every point of the series in the range, whoever posted it")
    workers_median: float | None = Field(description="median of the workers' means")
    workers_with_points: int
    unattributed_points: int = Field(description="points of batches that named no process")
    workers: list[WorkerSeriesLine] = Field(description="the `top` workers furthest from the median, furthest first")
