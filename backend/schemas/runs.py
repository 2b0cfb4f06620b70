"""Runs: create, read, list, delete, settings, and what a run trained on (taint)."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from paritywatch.backend.schemas.common import ControlStateName, Name, PackNames, Page, TagName, TagValue
from paritywatch.backend.schemas.components import ComponentOut
from paritywatch.backend.schemas.control import ControlOut
from trainer_hooks import contract
from trainer_hooks.contract import (
    MAX_NAME_LENGTH,
)


class RunCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Name
    project: str = Field(default="default", min_length=1, max_length=MAX_NAME_LENGTH, pattern=r"^[^\x00-\x1f]+$")
    tags: dict[TagName, TagValue] = Field(default_factory=dict, max_length=100)
    config: dict[str, Any] = Field(default_factory=dict)
    packs: PackNames = Field(default_factory=list, description="framework packs to enable for the run (added to "
                                                              "the ones it has)")

    @field_validator("config")
    @classmethod
    def _nonfinite_as_strings(cls, config: dict[str, Any]) -> dict[str, Any]:
        return contract.config_value(config)  # NaN -> "NaN" on every database (docs/api.md, Runs)


class PackSuggestion(BaseModel):
    pack: str
    keys: list[str] = Field(description="the run's metric keys that belong to the pack")
    message: str


class TaintRangeOut(BaseModel):
    cause: str = Field(description='ranges merge per cause, e.g. "processor:chat_template", "weights", '
                                   '"metric:align/prompt_rerender_mismatch_frac", "sample_audit:rerender"')
    kind: str = Field(description="the alert kind that stood for it")
    what: str = Field(description='e.g. "chat_template differs"')
    first_step: int
    last_step: int = Field(description="inclusive; for an open range, the run's last step now")
    open: bool = Field(description="the divergence is still open: the range grows with the run")
    workers: int = Field(description="rollout workers it was seen on (0: not about workers, e.g. the trainer's metric)")
    worker_ids: list[str] = Field(description="the first 20 of them")
    rollout_workers: int = Field(description="live rollout processes of the run while it was open (the most seen)")
    alert_ids: list[int]
    summary: str = Field(description='e.g. "steps 212–251: chat_template differs on 1 of 3 rollout workers"')


class TaintOut(BaseModel):
    """What a run trained on: the steps it trained while a divergence was open (docs/design.md)."""

    tainted: bool = False
    first_step: int | None = Field(default=None, description="the earliest tainted step: a checkpoint saved before it is clean")
    steps: int = Field(default=0, description="how many distinct steps are tainted")
    ranges: list[TaintRangeOut] = Field(default=[], description="earliest first, at most 100")
    ranges_total: int = 0


class CheckpointTaintOut(BaseModel):
    step: int
    tainted: bool = Field(description="a checkpoint saved at this step was trained on at least one tainted step")
    ranges: list[TaintRangeOut] = Field(description="the ranges that begin at or before the step")


class RunTaintOut(TaintOut):
    run_id: int
    state: ControlStateName
    last_step: int | None
    checkpoint: CheckpointTaintOut | None = Field(default=None, description="with `?step=`: the verdict on that checkpoint")


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
    silenced_alerts: int = Field(default=0, description="open alerts an active silence mutes now (counted in firing_alerts too)")
    taint: TaintOut = Field(default_factory=TaintOut, description="what the run trained on: its tainted step ranges")
    ended_at: datetime | None = Field(default=None, description="When it became stopped, finished or crashed")
    packs: list[str] = Field(default=[], description="framework packs that apply to the run (its own and its project's)")
    suggested_packs: list[PackSuggestion] = Field(
        default=[], description="packs whose metrics the run posts but which are not enabled (GET /runs/{id} only)")


class RunList(Page):
    runs: list[RunOut]


class RunSettings(BaseModel):
    """PUT: a field left out (or null) keeps its value; `packs` is the run's own packs, exactly."""

    model_config = ConfigDict(extra="forbid")
    on_mismatch: Literal["pause", "alert", "ignore"] | None = None
    packs: PackNames | None = None


class RunDeletionOut(BaseModel):
    run_id: int
    project: str
    name: str
    actor: str | None
    reason: str | None
    points: int = Field(description="metric points the run held when it was deleted")
    requested_at: datetime
    finished_at: datetime | None = Field(description="when its last row was removed; null while that goes on")


class RunDeletionList(Page):
    deletions: list[RunDeletionOut]
