"""Pydantic request/response schemas of the REST API (separate from the SQL models)."""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from paritywatch.backend.models import ALERT_KINDS, PROCESS_STATES, RUN_STATES
from trainer_hooks import contract
from trainer_hooks.contract import (MAX_CLIENT_ID_LENGTH, MAX_KEY_LENGTH, MAX_NAME_LENGTH, MAX_POINTS_PER_BATCH,
                                    MAX_POLICY_VERSION, MAX_RATE_PER_S, MAX_SEQ, MAX_STEP, PACK_NAMES, SEVERITIES, SIDES, WEBHOOK_EVENT_TYPES)

Name = Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=r"^[^\x00-\x1f]+$")
ControlStateName = Literal[RUN_STATES]
TagName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME_LENGTH)]
TagValue = Annotated[str, StringConstraints(max_length=1000)]
PackName = Literal[PACK_NAMES]
PackNames = Annotated[list[PackName], Field(max_length=len(PACK_NAMES),
                                           description="framework metric packs (GET /packs lists them)")]


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


class ControlOut(BaseModel):
    state: ControlStateName
    version: int
    actor: str | None
    reason: str | None
    updated_at: datetime


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


class RunList(BaseModel):
    runs: list[RunOut]
    next_cursor: str | None = Field(default=None, description="pass as `cursor` for the next page; null on the last page")


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


class MetricKeyList(BaseModel):
    keys: list[MetricKeyOut]
    next_cursor: str | None = Field(default=None, description="pass as `cursor` for the next page; null on the last page")


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


class WorkerList(BaseModel):
    trainer_policy_version: int | None = Field(description="the highest version a trainer of the run reported")
    lagging_versions: int
    counts: dict[str, int] = Field(description="the run's processes by state, and total (unfiltered)")
    groups: list[WorkerGroupOut]
    workers: list[WorkerOut]
    next_cursor: str | None = Field(default=None, description="pass as `cursor` for the next page; null on the last page")


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


class ControlAction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: Literal["pause", "resume", "stop"]
    reason: str = Field(default="", max_length=2000)
    actor: str | None = Field(default=None, max_length=MAX_NAME_LENGTH)


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
    next_cursor: str | None = Field(default=None, description="pass as `cursor` for the next page; null on the last page")


class Health(BaseModel):
    status: str
    database: str
    schema_revision: str | None
    open_mode: bool


class ControlActionOut(BaseModel):
    """A control action: the run states it may be taken in, and the state it moves the run to."""
    allowed_from: list[str]
    target: str


class UiConfig(BaseModel):
    """What the dashboard takes from the server instead of copies of its own (trainer_hooks/contract.py)."""
    api_prefix: str
    version: str
    plotly_url: str
    severities: list[str]
    run_states: list[str]
    live_run_states: list[str]
    control_actions: dict[str, ControlActionOut]
    alert_kinds: list[str]
    fingerprint_component_order: list[str]
    webhook_events: list[EventTypeOut]


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
    silenced: bool = False
    silenced_by: list[int] = Field(default_factory=list, description="Ids of the active silences muting it")


class AlertList(BaseModel):
    alerts: list[AlertOut]
    next_cursor: str | None = Field(default=None, description="pass as `cursor` for the next page; null on the last page")


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
    next_cursor: str | None = Field(default=None, description="pass as `cursor` for the next page; null on the last page")


class RunSettings(BaseModel):
    """PUT: a field left out (or null) keeps its value; `packs` is the run's own packs, exactly."""

    model_config = ConfigDict(extra="forbid")
    on_mismatch: Literal["pause", "alert", "ignore"] | None = None
    packs: PackNames | None = None


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


class DeliveryList(BaseModel):
    deliveries: list[DeliveryOut]
    next_cursor: str | None = Field(default=None, description="pass as `cursor` for the next page; null on the last page")


class TestQueued(BaseModel):
    delivery_id: int


class WhoAmI(BaseModel):
    name: str
    scopes: list[str]
    open_mode: bool


class RunDeletionOut(BaseModel):
    run_id: int
    project: str
    name: str
    actor: str | None
    reason: str | None
    points: int = Field(description="metric points the run held when it was deleted")
    requested_at: datetime
    finished_at: datetime | None = Field(description="when its last row was removed; null while that goes on")


class RunDeletionList(BaseModel):
    deletions: list[RunDeletionOut]
    next_cursor: str | None = Field(default=None, description="pass as `cursor` for the next page; null on the last page")
class ComponentClose(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str | None = Field(default=None, max_length=2000)


class SilenceIn(BaseModel):
    """Mute notifications of alerts matching every given field, for `duration_s` seconds."""

    model_config = ConfigDict(extra="forbid")
    run_id: int | None = Field(default=None, ge=1, le=2**62)
    project: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_LENGTH)
    kind: Literal[ALERT_KINDS] | None = None
    duration_s: float = Field(gt=0, le=30 * 86_400, allow_inf_nan=False)
    reason: str = Field(min_length=1, max_length=2000)

    @model_validator(mode="after")
    def _matches_something(self) -> "SilenceIn":
        if self.run_id is None and self.project is None and self.kind is None:
            raise ValueError("a silence needs at least one of run_id, project, kind")
        return self


class SilenceOut(BaseModel):
    id: int
    run_id: int | None
    project: str | None
    kind: str | None
    starts_at: datetime
    ends_at: datetime
    created_by: str
    reason: str
    created_at: datetime
    ended_by: str | None
    ended_at: datetime | None
    active: bool


class SilenceList(BaseModel):
    silences: list[SilenceOut]


class EventTypeOut(BaseModel):
    type: str
    description: str


class EventTypeList(BaseModel):
    events: list[EventTypeOut]


# ------------------------------------------------------------------ per-sample audits
# (backend/api/routes/audits.py; the bounds are the wire contract's, so hooks and server agree)

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


class AuditList(BaseModel):
    audits: list[AuditOut]
    next_cursor: str | None = Field(default=None, description="pass as `cursor` for the next page; null on the last page")


class AuditSampleList(BaseModel):
    samples: list[AuditSampleOut]
    next_cursor: str | None = Field(default=None, description="pass as `cursor` for the next page; null on the last page")

# --------------------------------------------------------------------------- weight attestations

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


class AttestationList(BaseModel):
    attestations: list[AttestationOut]
    next_cursor: str | None = Field(default=None, description="pass as `cursor` for the next page; null on the last page")


class WorkerVerdict(AttestationOut):
    verdict: Literal["same", "differs", "incomparable", "pending"] = Field(
        description="against the trainer's attestation of the version (pending: the trainer has not attested it)")
    tensors: dict[str, Any] | None = Field(default=None, description="which tensors differ (verdict differs only)")


class VersionComparison(BaseModel):
    version: int
    trainer: AttestationOut | None
    workers: list[WorkerVerdict]


class VersionComparisonList(BaseModel):
    versions: list[VersionComparison]
    next_cursor: str | None = Field(default=None, description="pass as `cursor` for the next page; null on the last page")
