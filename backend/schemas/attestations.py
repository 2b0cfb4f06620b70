"""Weight-sync attestations and the per-version comparison."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from paritywatch.backend.schemas.common import Page


class AttestationStored(BaseModel):
    id: int
    version: int
    digest: str
    tensor_count: int
    backwards_from: int | None = Field(description="the highest version this process attested before, when it is higher")


class AttestationOut(BaseModel):
    id: int
    component_id: int
    side: str
    worker_id: str
    version: int
    digest: str = Field(description="sha256 of the sorted (tensor name, tensor digest) lines")
    settings: dict[str, Any] = Field(description="algo, mode, block_bytes, sample: equal on both sides to compare")
    tensor_count: int
    backwards_from: int | None
    created_at: datetime


class AttestationList(Page):
    attestations: list[AttestationOut]


class WorkerVerdict(AttestationOut):
    verdict: Literal["same", "differs", "incomparable", "pending"] = Field(
        description="against the trainer's attestation of the version (pending: the trainer has not attested it)")
    tensors: dict[str, Any] | None = Field(default=None, description="which tensors differ (verdict differs only)")


class VersionComparison(BaseModel):
    version: int
    trainer: AttestationOut | None
    workers: list[WorkerVerdict]


class VersionComparisonList(Page):
    versions: list[VersionComparison]
