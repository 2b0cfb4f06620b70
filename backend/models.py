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
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

# SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
BigId = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator):
    """Aware UTC datetimes on every engine: SQLite stores no zone, so normalise both ways
    (and stored strings then compare in time order)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):  # noqa: ANN001
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(timezone.utc)
            if dialect.name == "sqlite":
                value = value.replace(tzinfo=None)
        return value

    def process_result_value(self, value, dialect):  # noqa: ANN001
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value


class Base(DeclarativeBase):
    pass


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (UniqueConstraint("project", "name", name="uq_runs_project_name"),)

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


class MetricRollup(Base):
    """Pre-aggregated min/max/last/count per bucket of 16**level steps: reads of long
    series group a few thousand roll-up rows instead of a million points."""

    __tablename__ = "metric_rollups"

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
    """Idempotency ledger: (client_id, seq) of every accepted metric batch."""

    __tablename__ = "ingest_batches"
    __table_args__ = (UniqueConstraint("client_id", "seq", name="uq_ingest_batches_client_seq"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    client_id: Mapped[str] = mapped_column(String(64))
    seq: Mapped[int] = mapped_column(BigInteger)
    points: Mapped[int] = mapped_column(Integer)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


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
    """Threshold rule on a metric; run_id NULL = a project default."""

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


class RuleState(Base):
    """How many consecutive evaluations of a rule have breached, per run."""

    __tablename__ = "rule_states"

    rule_id: Mapped[int] = mapped_column(ForeignKey("rules.id", ondelete="CASCADE"), primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    streak: Mapped[int] = mapped_column(Integer, default=0)
    last_value: Mapped[float | None] = mapped_column(Float, nullable=True)


class Webhook(Base):
    __tablename__ = "webhooks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    url: Mapped[str] = mapped_column(Text)
    format: Mapped[str] = mapped_column(String(16), default="standard")
    # Standard Webhooks needs the raw secret to sign; it is shown once and never returned.
    secret: Mapped[str] = mapped_column(String(128))
    events: Mapped[list] = mapped_column(JSON, default=list)
    project: Mapped[str | None] = mapped_column(String(200), nullable=True)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


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
