"""Per-sample audits of rollout batches (`sample_audits`, `sample_audit_samples`): the SQL.

An audit is stored with a detection job in one transaction (backend/store/jobs.py), like a metric
batch, so its alert cannot be skipped. A batch's samples are inserted worst last: in id order,
newest first, a run's samples then read newest batch first and, within a batch, worst first, and
one keyset (the sample id) pages through them.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from paritywatch.backend.models import Component, SampleAudit, SampleAuditSample
from paritywatch.backend.store import jobs
from paritywatch.backend.store.metrics import check_replay
from paritywatch.backend.store.paging import PageRequest, keyset, split_page
from paritywatch.backend.store.runs import get_component, get_run

SAMPLE_FIELDS = ("finish", "finish_reason", "n_ids", "n_rollout_logprobs", "n_trainer_logprobs", "length_mismatch",
                 "prompt_len", "rendered_len", "rerender_first_diff", "windows", "n_trainer_ids", "ids_mismatch",
                 "ids_first_diff", "truncated", "finish_lost", "eos_ignored_at", "images_mismatch", "rollout_images",
                 "trainer_images")
# Counts of a batch that are failures (the hooks' names, trainer_hooks/audit.py); `failing` is their largest.
FAILURE_COUNTS = ("length_mismatch", "rerender_mismatch", "ids_mismatch", "truncated", "finish_lost", "eos_ignored",
                  "images_mismatch")


def store_audit(s: Session, run_id: int, body: dict[str, Any]) -> int | None:
    """Store one batch's audit (a validated `AuditBatch` as a dict) with its detection job; the
    new audit's id, or None when the run has (client_id, seq) stored already with the same
    content (a retry). Conflict when it has them with other content."""
    digest = audit_digest(body)
    try:
        with s.begin_nested():  # a concurrent retry's insert undoes only this
            get_run(s, run_id)  # 404 for a run that does not exist or is being deleted
            if _stored_already(s, run_id, body, digest):
                return None
            if body.get("component_id") is not None:
                get_component(s, run_id, body["component_id"])
            audit = _audit_row(run_id, body, digest)
            s.add(audit)
            s.flush()
            for rank, sample in reversed(list(enumerate(body["samples"]))):
                s.add(_sample_row(audit.id, run_id, rank, sample))
            jobs.add(s, run_id, "audit")  # evaluated exactly once (backend/background/engine.py)
            s.flush()
            return audit.id
    except IntegrityError:  # a concurrent retry of the same audit stored it first
        if _stored_already(s, run_id, body, digest):
            return None
        raise


def audit_digest(body: dict[str, Any]) -> str:
    """The audit's content as the ledger keeps it (its JSON, keys sorted)."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _stored_already(s: Session, run_id: int, body: dict[str, Any], digest: str) -> bool:
    """Whether the run has this (client_id, seq); Conflict when with other content."""
    row = s.execute(select(SampleAudit.id, SampleAudit.digest).where(
        SampleAudit.run_id == run_id, SampleAudit.client_id == body["client_id"], SampleAudit.seq == body["seq"])).first()
    if row is None:
        return False
    check_replay(row.digest, digest, f"audit seq {body['seq']} of client {body['client_id']!r}")
    return True


def _audit_row(run_id: int, body: dict[str, Any], digest: str) -> SampleAudit:
    counts = body["counts"]
    return SampleAudit(run_id=run_id, component_id=body.get("component_id"), client_id=body["client_id"],
                       seq=body["seq"], step=body.get("step"), samples=counts["samples"],
                       length_mismatches=counts["length_mismatch"], rerender_mismatches=counts["rerender_mismatch"],
                       truncated=counts["finish_length"], counts=counts,
                       failing=max(counts.get(name, 0) for name in FAILURE_COUNTS), digest=digest)


def _sample_row(audit_id: int, run_id: int, rank: int, sample: dict[str, Any]) -> SampleAuditSample:
    return SampleAuditSample(audit_id=audit_id, run_id=run_id, rank=rank, sample_index=sample["index"],
                             **{name: sample.get(name) for name in SAMPLE_FIELDS})


# ------------------------------------------------------------------ reads


@dataclass(frozen=True)
class AuditRead:
    audit: SampleAudit
    worker_id: str | None
    samples: list[SampleAuditSample]


def list_audits(s: Session, run_id: int, page: PageRequest, failing: bool = False) -> tuple[list[AuditRead], int | None]:
    """A page of the run's audited batches, newest first, each with its samples worst first.
    `failing`: only batches with a failure of any cause."""
    get_run(s, run_id)
    q = select(SampleAudit).where(SampleAudit.run_id == run_id)
    if failing:
        q = q.where(SampleAudit.failing > 0)
    audits, after = split_page(s.scalars(keyset(q, SampleAudit.id, page)), page, lambda a: a.id)
    samples = _samples_of(s, [a.id for a in audits])
    workers = _worker_ids(s, {a.component_id for a in audits if a.component_id is not None})
    return [AuditRead(a, workers.get(a.component_id), samples.get(a.id, [])) for a in audits], after


def list_samples(s: Session, run_id: int, page: PageRequest,
                 audit_id: int | None = None) -> tuple[list[tuple[SampleAuditSample, int | None]], int | None]:
    """A page of the run's (or one batch's) worst samples with their batch's step: newest batch
    first, worst first within a batch."""
    get_run(s, run_id)
    q = (select(SampleAuditSample, SampleAudit.step).join(SampleAudit, SampleAudit.id == SampleAuditSample.audit_id)
         .where(SampleAuditSample.run_id == run_id))
    if audit_id is not None:
        q = q.where(SampleAuditSample.audit_id == audit_id)
    rows = [tuple(r) for r in s.execute(keyset(q, SampleAuditSample.id, page))]
    return split_page(rows, page, lambda r: r[0].id)


def _samples_of(s: Session, audit_ids: list[int]) -> dict[int, list[SampleAuditSample]]:
    out: dict[int, list[SampleAuditSample]] = {}
    if audit_ids:
        q = select(SampleAuditSample).where(SampleAuditSample.audit_id.in_(audit_ids)).order_by(SampleAuditSample.rank)
        for sample in s.scalars(q):
            out.setdefault(sample.audit_id, []).append(sample)
    return out


def _worker_ids(s: Session, component_ids: set[int]) -> dict[int, str]:
    if not component_ids:
        return {}
    return dict(s.execute(select(Component.id, Component.worker_id).where(Component.id.in_(component_ids))).all())


def recent_audits(s: Session, run_id: int, limit: int) -> list[SampleAudit]:
    """The run's latest `limit` audited batches, newest first (detection's window)."""
    return list(s.scalars(select(SampleAudit).where(SampleAudit.run_id == run_id)
                          .order_by(SampleAudit.id.desc()).limit(limit)))


def batch_samples(s: Session, audit_id: int) -> list[SampleAuditSample]:
    """The samples a batch sent (at most `contract.AUDIT_MAX_SAMPLES`), worst first."""
    q = select(SampleAuditSample).where(SampleAuditSample.audit_id == audit_id).order_by(SampleAuditSample.rank)
    return list(s.scalars(q))
