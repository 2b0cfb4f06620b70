"""SQLAlchemy 2 models: the whole schema. Alembic (migrations/) owns how it gets created."""
from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false as sa_false,
    true as sa_true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

# The run state machine, process statuses and alert kinds are the wire contract's (one column each:
# Run.control_state, Component.status, Alert.kind); re-exported for the backend's modules.
from trainer_hooks.contract import (  # noqa: F401
    ALERT_KINDS, COMPONENT_STATUSES, ENDED_PROCESS, ENDED_RUN_STATES, LIVE_RUN_STATES, PROCESS_STATES, RUN_STATES,
)

# SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
BigId = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator):
    """Aware UTC datetimes on every engine: SQLite stores no zone, so normalise both ways
    (and stored strings then compare in time order)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(timezone.utc)
            if dialect.name == "sqlite":
                value = value.replace(tzinfo=None)
        return value

    def process_result_value(self, value, dialect):
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value


class Base(DeclarativeBase):
    pass




class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        UniqueConstraint("project", "name", name="uq_runs_project_name"),
        Index("ix_runs_control_state", "control_state"),  # the sweep finds live runs without a scan
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project: Mapped[str] = mapped_column(String(200), index=True)
    name: Mapped[str] = mapped_column(String(200))
    tags: Mapped[dict] = mapped_column(JSON, default=dict)
    config: Mapped[dict] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # Control state lives on the run row so a read of the run sees it without a join.
    control_state: Mapped[str] = mapped_column(String(16), default="running")
    control_version: Mapped[int] = mapped_column(Integer, default=1)
    control_actor: Mapped[str | None] = mapped_column(String(200), nullable=True)
    control_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    control_updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # What a processor mismatch does to this run: pause | alert | ignore.
    on_mismatch: Mapped[str] = mapped_column(String(8), default="pause")
    # Set when an admin deletes the run: from then on the API treats it as gone while its rows
    # are removed in the background (a `run_deletions` row records it and survives it).
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class ControlEvent(Base):
    """Audit trail of every control change: who, what, why, when."""

    __tablename__ = "control_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    from_state: Mapped[str] = mapped_column(String(16))
    to_state: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str | None] = mapped_column(String(200), nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Fingerprint(Base):
    """Content-addressed: 256 workers with the same processor store it once."""

    __tablename__ = "fingerprints"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    body: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Component(Base):
    """One process of a run: the trainer or a rollout worker."""

    __tablename__ = "components"
    __table_args__ = (UniqueConstraint("run_id", "side", "worker_id", name="uq_components_identity"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    side: Mapped[str] = mapped_column(String(16))
    worker_id: Mapped[str] = mapped_column(String(200))
    host: Mapped[str] = mapped_column(String(255), default="")
    pid: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_heartbeat: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    fingerprint_digest: Mapped[str | None] = mapped_column(
        ForeignKey("fingerprints.digest"), nullable=True
    )
    # live -> closed (it said goodbye: POST .../close) or lost (silent for the heartbeat timeout).
    status: Mapped[str] = mapped_column(String(8), default="live", server_default="live")
    closed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    lost_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    close_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # What its last heartbeat reported (migration 0010): the weights version it published
    # (trainer) or serves (rollout), and its throughput over its last heartbeat interval.
    policy_version: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    samples_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    points_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)


class MetricKey(Base):
    """One series of a run, with running stats so listings never scan points."""

    __tablename__ = "metric_keys"
    __table_args__ = (UniqueConstraint("run_id", "key", name="uq_metric_keys_run_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    key: Mapped[str] = mapped_column(String(200))
    count: Mapped[int] = mapped_column(BigInteger, default=0)
    first_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_value: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Retention dropped the raw points of steps below this one (NULL: none dropped); reads of
    # that range come from the roll-ups alone.
    raw_floor: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class MetricChunk(Base):
    """Raw points of one series from one batch, packed: `steps` (int64, little-endian) and `vals`
    (float64, little-endian), sorted by step, all inside one window of 2**12 steps (so a read of
    [a, b) only looks at chunks with step_min in [a rounded down to the window, b)). One row per
    series per batch instead of one per point. (Not WITHOUT ROWID on SQLite: rows of ~1 KB make
    that B-tree split often; a rowid table appends and the primary-key index stays small.)"""

    __tablename__ = "metric_chunks"

    series_id: Mapped[int] = mapped_column(
        ForeignKey("metric_keys.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
    )
    step_min: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    batch_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    step_max: Mapped[int] = mapped_column(BigInteger)
    count: Mapped[int] = mapped_column(Integer)
    steps: Mapped[bytes] = mapped_column(LargeBinary)
    vals: Mapped[bytes] = mapped_column(LargeBinary)
    # True: the points are folded into the level-1 roll-ups; false: a dense chunk, which level-1
    # reads bucket raw (backend/store/metric_packing.py). Stored, not derived from `count`.
    in_level1: Mapped[bool] = mapped_column(Boolean, server_default=sa_true())


class MetricRollup(Base):
    """Pre-aggregated min/max/last/count per bucket of 16**level steps: reads of long
    series group a few thousand roll-up rows instead of a million points."""

    __tablename__ = "metric_rollups"
    # Room on each page for the updates every batch makes (migration 0017: HOT updates).
    __table_args__ = {"postgresql_with": {"fillfactor": 70}}

    series_id: Mapped[int] = mapped_column(
        ForeignKey("metric_keys.id", ondelete="CASCADE"), primary_key=True
    )
    level: Mapped[int] = mapped_column(Integer, primary_key=True)
    bucket: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    min: Mapped[float] = mapped_column(Float)
    max: Mapped[float] = mapped_column(Float)
    last_step: Mapped[int] = mapped_column(BigInteger)
    last_value: Mapped[float] = mapped_column(Float)
    count: Mapped[int] = mapped_column(BigInteger)


class IngestBatch(Base):
    """Idempotency ledger: (run_id, client_id, seq) of every accepted metric batch, with its
    content digest (a replay with other content is refused; NULL for rows from before 0016)."""

    __tablename__ = "ingest_batches"
    __table_args__ = (UniqueConstraint("run_id", "client_id", "seq", name="uq_ingest_batches_run_client_seq"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    client_id: Mapped[str] = mapped_column(String(64))
    seq: Mapped[int] = mapped_column(BigInteger)
    points: Mapped[int] = mapped_column(Integer)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # The process that posted it (the batch's component_id; NULL when it named none): a series'
    # chunks split per worker through their batch_id (migration 0010).
    component_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    digest: Mapped[str | None] = mapped_column(String(32), nullable=True)


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    # sha256 of the secret: a leaked database does not leak usable tokens.
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    scopes: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    # An ingest token bound to one project writes only to its runs; NULL = every project.
    project: Mapped[str | None] = mapped_column(String(200), nullable=True)


class Alert(Base):
    """firing -> acknowledged -> resolved; one open alert per (run, dedup_key)."""

    __tablename__ = "alerts"
    __table_args__ = (Index("ix_alerts_run_status", "run_id", "status"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(64))
    severity: Mapped[str] = mapped_column(String(16))
    dedup_key: Mapped[str] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(16), default="firing")
    # = dedup_key while open, NULL once resolved: the unique index allows one open alert per
    # key even with several backend processes detecting at once.
    open_key: Mapped[str | None] = mapped_column(String(300), unique=True, nullable=True)
    title: Mapped[str] = mapped_column(Text)
    detail: Mapped[dict] = mapped_column(JSON, default=dict)
    step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    fired_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class TaintSpan(Base):
    """What a run trained on (docs/design.md, "What a run trained on"): the steps it trained while
    one alert that means misaligned training (backend/detect/taint.py says which) was open. Written
    in the transaction that fires, refreshes or resolves that alert, and kept after it resolves:
    the alert says what is wrong now, the span what the run's weights went through."""

    __tablename__ = "taint_spans"
    __table_args__ = (Index("ix_taint_spans_run_id", "run_id"), Index("ix_taint_spans_alert_id", "alert_id"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    # No foreign key: the span outlives nothing but its run, and the janitor deletes a run's alerts
    # in steps before the run row (whose cascade then takes the spans).
    alert_id: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(64))  # the alert's kind
    cause: Mapped[str] = mapped_column(String(300))  # ranges merge per cause, e.g. "processor:chat_template"
    what: Mapped[str] = mapped_column(Text)  # e.g. "chat_template differs"
    first_step: Mapped[int] = mapped_column(BigInteger)  # the first step trained while it was open
    # The run's last step when it closed (NULL while open: it reaches the run's last step). Lower
    # than first_step when no step was trained while it was open (caught and fixed in a pause).
    last_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    worker_ids: Mapped[list] = mapped_column(JSON, default=list)  # the workers the alert names (bounded)
    workers: Mapped[int] = mapped_column(Integer, default=0)  # how many it names (0: not about workers)
    rollout_workers: Mapped[int] = mapped_column(Integer, default=0)  # live rollout processes, the most seen
    opened_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    closed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class AlertEvent(Base):
    """Audit trail of an alert: fired, acknowledged, resolved, by whom."""

    __tablename__ = "alert_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    alert_id: Mapped[int] = mapped_column(ForeignKey("alerts.id", ondelete="CASCADE"), index=True)
    action: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str | None] = mapped_column(String(200), nullable=True)
    note: Mapped[str | None] = mapped_column(Text, nullable=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Rule(Base):
    """A rule on a metric (a threshold, or a trend: backend/detect/trend.py); run_id NULL = a
    project default; `pack` names the framework pack that added it (backend/detect/packs.py)."""

    __tablename__ = "rules"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int | None] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), nullable=True, index=True
    )
    project: Mapped[str | None] = mapped_column(String(200), nullable=True)
    key: Mapped[str] = mapped_column(String(200))
    aggregate: Mapped[str] = mapped_column(String(8), default="last")
    window: Mapped[int] = mapped_column(Integer, default=1)
    comparison: Mapped[str] = mapped_column(String(4))
    threshold: Mapped[float] = mapped_column(Float)
    consecutive: Mapped[int] = mapped_column(Integer, default=1)
    severity: Mapped[str] = mapped_column(String(16), default="warning")
    action: Mapped[str] = mapped_column(String(8), default="alert")
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    builtin: Mapped[bool] = mapped_column(Boolean, default=False)
    # Evaluations within the threshold before a firing alert resolves (flapping guard).
    keep_firing_for: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    kind: Mapped[str] = mapped_column(String(16), default="threshold", server_default="threshold")
    # Also evaluate each worker's own series of the key (`worker3/<key>`), each with its own alert.
    per_worker: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false())
    # Trend rules: the least change of the median (in the metric's units) worth an alert.
    min_change: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    pack: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)


class RuleSeriesState(Base):
    """Streaks of a per-worker rule for one series of a run (`worker3/<key>`, or the key itself)."""

    __tablename__ = "rule_series_states"

    rule_id: Mapped[int] = mapped_column(ForeignKey("rules.id", ondelete="CASCADE"), primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    series_key: Mapped[str] = mapped_column(String(200), primary_key=True)
    streak: Mapped[int] = mapped_column(Integer, default=0)
    clear_streak: Mapped[int] = mapped_column(Integer, default=0)
    last_value: Mapped[float | None] = mapped_column(Float, nullable=True)


class RuleState(Base):
    """How many consecutive evaluations of a rule have breached, per run."""

    __tablename__ = "rule_states"

    rule_id: Mapped[int] = mapped_column(ForeignKey("rules.id", ondelete="CASCADE"), primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    streak: Mapped[int] = mapped_column(Integer, default=0)
    last_value: Mapped[float | None] = mapped_column(Float, nullable=True)
    clear_streak: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class Webhook(Base):
    __tablename__ = "webhooks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    url: Mapped[str] = mapped_column(Text)
    format: Mapped[str] = mapped_column(String(16), default="standard")
    # Standard Webhooks needs the raw secret to sign; it is shown once, never returned, and stored
    # encrypted ("enc:" + Fernet token, backend/webhooks/secrets.py): TEXT on PostgreSQL since
    # migration 0004; SQLite keeps 0001's VARCHAR(128), whose length it never enforces.
    secret: Mapped[str] = mapped_column(Text().with_variant(String(128), "sqlite"))
    events: Mapped[list] = mapped_column(JSON, default=list)
    project: Mapped[str | None] = mapped_column(String(200), nullable=True)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # Notification grouping; NULL = the server's default (Settings.webhook_group_*).
    group_by: Mapped[list | None] = mapped_column(JSON, nullable=True)
    group_wait_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    group_interval_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    repeat_interval_s: Mapped[float | None] = mapped_column(Float, nullable=True)


class WebhookDelivery(Base):
    """Transactional outbox row: written with the alert, claimed by one dispatcher."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    webhook_id: Mapped[int] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"), index=True)
    event_id: Mapped[str] = mapped_column(String(64), unique=True)
    event_type: Mapped[str] = mapped_column(String(64))
    payload: Mapped[dict] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    claimed_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)


class DeliveryAttempt(Base):
    __tablename__ = "delivery_attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    delivery_id: Mapped[int] = mapped_column(
        ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), index=True
    )
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    duration_ms: Mapped[float] = mapped_column(Float, default=0.0)


class RunDeletion(Base):
    """Audit of a run deletion: who, why, when, what the run was. No foreign key: it outlives the
    run. `finished_at` is set once every row of the run is gone."""

    __tablename__ = "run_deletions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(Integer, index=True)
    project: Mapped[str] = mapped_column(String(200))
    name: Mapped[str] = mapped_column(String(200))
    actor: Mapped[str | None] = mapped_column(String(200), nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    points: Mapped[int] = mapped_column(BigInteger, default=0)
    requested_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
class Silence(Base):
    """Mutes notifications of matching alerts (a run, a project, an alert kind, or a mix) until
    `ends_at`. Rows are never deleted: with who made and who ended each, they are its audit log."""

    __tablename__ = "silences"
    __table_args__ = (Index("ix_silences_ends_at", "ends_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), nullable=True)
    project: Mapped[str | None] = mapped_column(String(200), nullable=True)
    kind: Mapped[str | None] = mapped_column(String(64), nullable=True)
    starts_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    ends_at: Mapped[datetime] = mapped_column(UTCDateTime())
    created_by: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    ended_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class NotificationGroup(Base):
    """The notification log of one alert group of one webhook (Alertmanager's nflog entry): what
    was last sent and when, and when the group needs looking at again."""

    __tablename__ = "notification_groups"
    __table_args__ = (
        UniqueConstraint("webhook_id", "group_key", name="uq_notification_groups_key"),
        Index("ix_notification_groups_due", "next_check_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    webhook_id: Mapped[int] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"))
    group_key: Mapped[str] = mapped_column(String(300))
    # The group's label values (NULL: not grouped by that label).
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), nullable=True)
    project: Mapped[str | None] = mapped_column(String(200), nullable=True)
    kind: Mapped[str | None] = mapped_column(String(64), nullable=True)
    severity: Mapped[str | None] = mapped_column(String(16), nullable=True)
    last_sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_firing: Mapped[list] = mapped_column(JSON, default=list)  # alert ids told as firing
    last_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    next_check_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class DetectJob(Base):
    """A durable detection job, written in the transaction that stored its input (a metric batch,
    a fingerprint) and deleted in the transaction that evaluates it: every accepted input is
    evaluated exactly once, whatever fails in between and however many replicas run."""

    __tablename__ = "detect_jobs"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # metrics | fingerprint | attestation | audit
    payload: Mapped[str] = mapped_column(Text, default="")  # metrics: the watched keys and batch spans, JSON (store/jobs.py)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class WeightAttestation(Base):
    """The digests of the weights one process held for one version (docs/design.md, "Weight-sync
    attestation"): one row per (process, version), the latest attestation of a version wins.
    `backwards_from`: the highest version this process had attested before, when this one is
    lower (a worker that went back to older weights)."""

    __tablename__ = "weight_attestations"
    __table_args__ = (
        UniqueConstraint("component_id", "version", name="uq_weight_attestations_component_version"),
        Index("ix_weight_attestations_run_version", "run_id", "version"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    component_id: Mapped[int] = mapped_column(ForeignKey("components.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(BigInteger)
    algo: Mapped[str] = mapped_column(String(16))
    mode: Mapped[str] = mapped_column(String(8))
    block_bytes: Mapped[int] = mapped_column(BigInteger)
    sample: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    digest: Mapped[str] = mapped_column(String(64))
    tensor_count: Mapped[int] = mapped_column(Integer)
    bytes_total: Mapped[int] = mapped_column(BigInteger)
    bytes_hashed: Mapped[int] = mapped_column(BigInteger)
    seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    backwards_from: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    tensors: Mapped[list] = mapped_column(JSON)  # [{"name", "dtype", "shape", "bytes", "digest"}] as sent
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class SampleAudit(Base):
    """The per-sample audit of one rollout batch (trainer_hooks/audit.py): its counts; its worst
    samples are `SampleAuditSample` rows. Idempotent by (run_id, client_id, seq), like metric
    batches, with a content digest (NULL for rows from before 0016)."""

    __tablename__ = "sample_audits"
    __table_args__ = (
        UniqueConstraint("run_id", "client_id", "seq", name="uq_sample_audits_run_client_seq"),
        Index("ix_sample_audits_run_id_id", "run_id", "id"),  # a run's latest batches, newest first
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    # No foreign key: deleting a run drops its processes at once, and SET NULL would rewrite every
    # audit of the run in that request; a reader finds no process for the id and shows none.
    component_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    client_id: Mapped[str] = mapped_column(String(64))
    seq: Mapped[int] = mapped_column(BigInteger)
    step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    samples: Mapped[int] = mapped_column(Integer)
    length_mismatches: Mapped[int] = mapped_column(Integer)
    rerender_mismatches: Mapped[int] = mapped_column(Integer)
    truncated: Mapped[int] = mapped_column(Integer)
    counts: Mapped[dict] = mapped_column(JSON, default=dict)  # every count the hooks sent
    # At least as many samples as any one cause holds (0: a clean batch): `GET .../audits?failing=true`.
    failing: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    digest: Mapped[str | None] = mapped_column(String(32), nullable=True)


class SampleAuditSample(Base):
    """One of the worst samples of an audited batch, with the token windows around its first
    mismatch (token strings as the trainer's tokenizer decoded them: text, never markup)."""

    __tablename__ = "sample_audit_samples"
    __table_args__ = (Index("ix_sample_audit_samples_run_id_id", "run_id", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    audit_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("sample_audits.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)  # 0 = the batch's worst
    sample_index: Mapped[int] = mapped_column(Integer)
    finish: Mapped[str] = mapped_column(String(16))
    finish_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    n_ids: Mapped[int] = mapped_column(Integer)
    n_rollout_logprobs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    n_trainer_logprobs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    length_mismatch: Mapped[bool] = mapped_column(Boolean)
    prompt_len: Mapped[int] = mapped_column(Integer)
    rendered_len: Mapped[int | None] = mapped_column(Integer, nullable=True)
    rerender_first_diff: Mapped[int | None] = mapped_column(Integer, nullable=True)
    windows: Mapped[list] = mapped_column(JSON, default=list)
    # Token identity, truncation, eos and image features (migration 0015; null/false before it).
    n_trainer_ids: Mapped[int | None] = mapped_column(Integer, nullable=True)
    ids_mismatch: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    ids_first_diff: Mapped[int | None] = mapped_column(Integer, nullable=True)
    truncated: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false())
    finish_lost: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false())
    eos_ignored_at: Mapped[int | None] = mapped_column(Integer, nullable=True)
    images_mismatch: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    rollout_images: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    trainer_images: Mapped[dict | None] = mapped_column(JSON, nullable=True)
