"""Durable detection jobs (`detect_jobs`): written in the transaction that stores the input,
deleted in the transaction that evaluates it. The metric write path inserts its job with raw SQL
beside the batch (backend/store/metrics.py); everything else is here."""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import astuple, dataclass, field
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from paritywatch.backend.models import DetectJob


@dataclass(frozen=True)
class BatchSpan:
    """What one metric batch brought for one key: its steps and the extremes of its values, so a
    rule judges every point of the batch, not only the newest (a mismatch at step 12 of a batch
    of steps 10-20 must not hide behind a clean step 20)."""
    first_step: int
    last_step: int
    min: float
    max: float


@dataclass(frozen=True)
class Job:
    id: int
    run_id: int
    kind: str
    keys: tuple[str, ...] = ()
    spans: Mapping[str, BatchSpan] = field(default_factory=dict)  # metrics jobs: per watched key


def encode_keys(keys: list[str], spans: Mapping[str, BatchSpan] | None = None) -> str:
    """A metrics job's payload: the watched keys, and what the batch brought for each. (Jobs
    written before spans existed hold the sorted key list alone; `decode` reads both.)"""
    if not spans:
        return json.dumps(sorted(keys))
    return json.dumps({"keys": sorted(keys), "spans": {k: astuple(spans[k]) for k in sorted(keys) if k in spans}})


def decode(payload: str | None) -> tuple[tuple[str, ...], dict[str, BatchSpan]]:
    data = json.loads(payload or "[]")
    if isinstance(data, list):
        return tuple(data), {}
    return tuple(data["keys"]), {k: BatchSpan(*v) for k, v in data.get("spans", {}).items()}


def add(s: Session, run_id: int, kind: str, keys: list[str] | None = None) -> None:
    s.add(DetectJob(run_id=run_id, kind=kind, payload=encode_keys(keys or [])))


def pending(s: Session, *, run_id: int | None = None, kind: str | None = None, created_before: datetime | None = None,
            limit: int = 100) -> list[Job]:
    q = select(DetectJob).order_by(DetectJob.id).limit(limit)
    if run_id is not None:
        q = q.where(DetectJob.run_id == run_id)
    if kind is not None:
        q = q.where(DetectJob.kind == kind)
    if created_before is not None:
        q = q.where(DetectJob.created_at < created_before)
    return [Job(j.id, j.run_id, j.kind, *decode(j.payload)) for j in s.scalars(q)]


def take(s: Session, job_id: int) -> bool:
    """Delete the job in the evaluating transaction: True for exactly one transaction (a second
    one, on any replica, waits for the first to commit on PostgreSQL, then finds nothing)."""
    return s.execute(delete(DetectJob).where(DetectJob.id == job_id)).rowcount == 1


def take_all(s: Session, run_id: int, kind: str) -> int:
    """Delete every job of this kind of the run: one evaluation of the run's current state
    (made under the run's lock) answers all of them."""
    return s.execute(delete(DetectJob).where(DetectJob.run_id == run_id, DetectJob.kind == kind)).rowcount
