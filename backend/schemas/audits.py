"""Per-sample audits (the bounds are the wire contract's, so hooks and server agree)."""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from paritywatch.backend.schemas.common import Page
from trainer_hooks import contract

Count = Annotated[int, Field(ge=0, le=2**31 - 1)]


Token = Annotated[str, StringConstraints(max_length=contract.AUDIT_MAX_TOKEN_CHARS)]


WINDOW_TOKENS = 2 * contract.AUDIT_MAX_WINDOW + 1  # both sides of the mismatch and the mismatch


class AuditWindow(BaseModel):
    """Tokens `start`, `start + 1`, ... of each side; `at` is the first mismatch (for `length`:
    the first id without a log-prob, or one past the ids when a log-prob has no id)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    kind: Literal[contract.AUDIT_WINDOW_KINDS]
    at: Count
    start: Count
    rollout: list[Token] = Field(max_length=WINDOW_TOKENS)
    trainer: list[Token] | None = Field(default=None, max_length=WINDOW_TOKENS)


class ImageSummary(BaseModel):
    """What a processor produced for a sample's images (`trainer_hooks.sample_identity.image_features`)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    images: Count
    grid: list[Annotated[list[Count], Field(max_length=contract.AUDIT_MAX_GRID_DIMS)]] = Field(default_factory=list,
                                                                    max_length=contract.AUDIT_MAX_IMAGES)
    image_tokens: Count | None = None


class AuditSample(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    index: Count = Field(description="the sample's position in its batch")
    finish: Literal[contract.FINISH_REASONS]
    finish_reason: str | None = Field(default=None, max_length=32, description="as the rollout engine said it")
    n_ids: Count
    n_rollout_logprobs: Count | None = None
    n_trainer_logprobs: Count | None = None
    length_mismatch: bool
    prompt_len: Count
    rendered_len: Count | None = None
    rerender_first_diff: Count | None = None
    n_trainer_ids: Count | None = Field(default=None, description="completion ids the trainer trains on")
    ids_mismatch: bool | None = Field(default=None, description="the trained ids differ from the sampled ones "
                                                                "(null: not checked)")
    ids_first_diff: Count | None = Field(default=None, description="where the trained ids leave the sampled ones")
    truncated: bool = Field(default=False, description="the trainer trains on a prefix of the sampled ids")
    finish_lost: bool = Field(default=False, description="no finish reason and no eos at the end: a cut nobody sees")
    eos_ignored_at: Count | None = Field(default=None, description="an eos id the rollout sampled another token after")
    images_mismatch: bool | None = Field(default=None, description="the two sides' image features differ "
                                                                   "(null: not checked)")
    rollout_images: ImageSummary | None = None
    trainer_images: ImageSummary | None = None
    windows: list[AuditWindow] = Field(default_factory=list, max_length=len(contract.AUDIT_WINDOW_KINDS))


class AuditCounts(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    samples: Count
    length_mismatch: Count = 0
    rerender_checked: Count = 0
    rerender_mismatch: Count = 0
    finish_eos: Count = 0
    finish_length: Count = 0
    finish_stop: Count = 0
    finish_unknown: Count = 0
    ids_checked: Count = 0
    ids_mismatch: Count = 0
    truncated: Count = 0
    finish_lost: Count = 0
    eos_ignored: Count = 0
    images_checked: Count = 0
    images_mismatch: Count = 0

    @model_validator(mode="after")
    def _within_the_batch(self) -> "AuditCounts":
        for name, value in self:
            if value > self.samples:
                raise ValueError(f"counts.{name} ({value}) exceeds counts.samples ({self.samples})")
        return self


class AuditBatch(BaseModel):
    """`POST /runs/{id}/audits`: one rollout batch's audit, idempotent by (client_id, seq)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    client_id: str = Field(min_length=1, max_length=contract.MAX_CLIENT_ID_LENGTH)
    seq: int = Field(ge=0, le=contract.MAX_SEQ)
    component_id: int | None = Field(default=None, ge=1)
    step: int | None = Field(default=None, ge=0, le=contract.MAX_STEP)
    counts: AuditCounts
    samples: list[AuditSample] = Field(default_factory=list, max_length=contract.AUDIT_MAX_SAMPLES)

    @model_validator(mode="after")
    def _samples_within_the_batch(self) -> "AuditBatch":
        if len(self.samples) > self.counts.samples:
            raise ValueError(f"{len(self.samples)} samples for a batch of {self.counts.samples}")
        return self


class AuditStored(BaseModel):
    id: int | None = Field(description="the stored audit; null for a duplicate")
    duplicate: bool


class AuditWindowOut(AuditWindow):
    model_config = ConfigDict(extra="ignore")
    rollout_shown: list[str] = Field(description="`rollout` with control characters and whitespace escaped for display")
    trainer_shown: list[str] | None = None


class AuditSampleOut(AuditSample):
    model_config = ConfigDict(extra="ignore")
    id: int
    audit_id: int
    step: int | None
    rank: int = Field(description="0 = the worst sample of its batch")
    windows: list[AuditWindowOut]


class AuditOut(BaseModel):
    id: int
    run_id: int
    component_id: int | None
    worker_id: str | None
    step: int | None
    received_at: datetime
    counts: dict[str, int]
    samples: list[AuditSampleOut]


class AuditList(Page):
    audits: list[AuditOut]


class AuditSampleList(Page):
    samples: list[AuditSampleOut]
