"""Framework metric packs and the project settings that enable them."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from paritywatch.backend.schemas.common import PackNames


class ProjectSettings(BaseModel):
    """Defaults for every run of a project: `packs` is the project's packs, exactly."""

    model_config = ConfigDict(extra="forbid")
    packs: PackNames


class PackRuleOut(BaseModel):
    key: str
    comparison: str
    threshold: float
    severity: str
    consecutive: int
    kind: str = Field(default="threshold", description="threshold, or baseline (the median of the run's first "
                                                       "`window` points)")
    window: int = 1
    why: str = Field(description="the framework's documented level, or why this value where it documents none")


class PackOut(BaseModel):
    name: str
    framework: str
    source: str
    rules: list[PackRuleOut]


class PackCatalog(BaseModel):
    packs: list[PackOut]
