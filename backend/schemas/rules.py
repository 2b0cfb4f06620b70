"""Alert rules on metrics."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trainer_hooks import contract
from trainer_hooks.contract import (
    MAX_KEY_LENGTH,
    SEVERITIES,
)


class RuleIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str = Field(min_length=1, max_length=MAX_KEY_LENGTH)
    aggregate: Literal["last", "mean", "max", "min"] = "last"
    window: int = Field(default=1, ge=1, le=1_000_000)
    comparison: Literal[">", ">=", "<", "<="]
    threshold: float = Field(allow_inf_nan=False)
    consecutive: int = Field(default=1, ge=1, le=10_000)
    severity: Literal[SEVERITIES] = "warning"
    action: Literal["alert", "pause", "stop"] = "alert"
    enabled: bool = True
    keep_firing_for: int = Field(default=0, ge=0, le=10_000,
                                 description="Evaluations within the threshold before a firing alert resolves")
    kind: Literal[contract.RULE_KINDS] = Field(
        default="threshold", description="threshold: `aggregate` over `window` steps against `threshold`; trend: "
        "medians of blocks of `window` points, a step or drift scored against the noise, fires at a score >= "
        "`threshold` in the direction of `comparison` (> rises, < falls); baseline: the median of the series' "
        "first `window` points against `threshold` (what the run started with); sawtooth: medians of blocks of "
        "`window` points that climb and fall back at least twice, each move >= `threshold` x the noise")
    per_worker: bool = Field(default=False, description="also evaluate each worker's `<worker>/<key>` series, "
                                                        "each with its own alert")
    min_change: float = Field(default=0.0, ge=0, allow_inf_nan=False,
                              description="trend rules: the least change of the median worth an alert")

    @model_validator(mode="after")
    def _trend_needs_a_score(self) -> "RuleIn":
        if self.kind in contract.SCORED_RULE_KINDS and (self.threshold <= 0 or self.window < 2):
            raise ValueError(f"a {self.kind} rule needs a score threshold > 0 (8 is a good start) and a window >= 2 "
                             "points")
        return self


class RulePatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool | None = None
    threshold: float | None = Field(default=None, allow_inf_nan=False)
    consecutive: int | None = Field(default=None, ge=1, le=10_000)
    severity: Literal[SEVERITIES] | None = None
    action: Literal["alert", "pause", "stop"] | None = None
    keep_firing_for: int | None = Field(default=None, ge=0, le=10_000)
    min_change: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class RuleOut(RuleIn):
    model_config = ConfigDict(extra="ignore")
    id: int
    run_id: int | None
    project: str | None
    builtin: bool
    pack: str | None = Field(default=None, description="the framework pack that added it")


class RuleList(BaseModel):
    rules: list[RuleOut]
