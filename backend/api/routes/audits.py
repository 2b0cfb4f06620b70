"""Per-sample audits of rollout batches: the hooks post one per batch, the dashboard reads the
worst samples (docs/design.md, "Per-sample audit")."""
from __future__ import annotations

import unicodedata
from typing import Annotated

from fastapi import APIRouter, Query

from paritywatch.backend.alerts.effects import after_commit
from paritywatch.backend.api.deps import AnswerRoute, EngineDep, IngestBulkDep, ReadDep, ReadSession, WriteSession
from paritywatch.backend.api.query import AuditSamplesPage, AuditsPage, encode_cursor
from paritywatch.backend.schemas.audits import AuditBatch, AuditList, AuditOut, AuditSampleList, AuditSampleOut, AuditStored, AuditWindowOut
from paritywatch.backend.schemas.common import CONFLICT_RESPONSE
from paritywatch.backend.store import audits as audit_store

router = APIRouter(prefix="/runs/{run_id}/audits", tags=["audits"], route_class=AnswerRoute)
_VISIBLE = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", " ": "␣"}


def shown(token: str) -> str:
    """A token string as the dashboard shows it: whitespace and invisible characters (controls,
    zero-width and bidi marks) escaped, so two renders that differ only there look different."""
    return "".join(_VISIBLE.get(ch) or (f"\\u{ord(ch):04x}" if unicodedata.category(ch) in ("Cc", "Cf") else ch)
                   for ch in token)


@router.post("", response_model=AuditStored, responses=CONFLICT_RESPONSE, summary="Post one rollout batch's per-sample audit (idempotent)")
def post_audit(run_id: int, body: AuditBatch, s: WriteSession, engine: EngineDep, _: IngestBulkDep) -> AuditStored:
    audit_id = audit_store.store_audit(s, run_id, body.model_dump())
    if audit_id is None:
        # A retry: if the first attempt's evaluation failed, its job is still queued. Do it now.
        after_commit(s, lambda: engine.process_pending(run_id=run_id))
        return AuditStored(id=None, duplicate=True)
    after_commit(s, lambda: engine.on_audit(run_id))  # its job was written with the audit: evaluated exactly once
    return AuditStored(id=audit_id, duplicate=False)


@router.get("", response_model=AuditList, summary="The run's audited batches, newest first, with their worst samples")
def list_audits(run_id: int, s: ReadSession, _: ReadDep, page: AuditsPage,
                failing: Annotated[bool, Query(description="only batches with a failure of any cause (length "
                                                            "parity, re-render, token identity, truncation, lost "
                                                            "finish reason, eos sampled past, image features)")] = False,
                ) -> AuditList:
    audits, after = audit_store.list_audits(s, run_id, page, failing)
    return AuditList(audits=[_audit_out(a) for a in audits], next_cursor=encode_cursor(after))


@router.get("/samples", response_model=AuditSampleList,
            summary="The worst samples of the run, or of one audited batch: newest batch first, worst first")
def list_samples(run_id: int, s: ReadSession, _: ReadDep, page: AuditSamplesPage,
                 audit_id: Annotated[int | None, Query(ge=1, le=2**63 - 1, description="only this batch")] = None,
                 ) -> AuditSampleList:
    rows, after = audit_store.list_samples(s, run_id, page, audit_id)
    return AuditSampleList(samples=[_sample_out(sample, step) for sample, step in rows], next_cursor=encode_cursor(after))


def _audit_out(read: audit_store.AuditRead) -> AuditOut:
    a = read.audit
    return AuditOut(id=a.id, run_id=a.run_id, component_id=a.component_id, worker_id=read.worker_id, step=a.step,
                    received_at=a.received_at, counts=a.counts or {},
                    samples=[_sample_out(s, a.step) for s in read.samples])


def _sample_out(sample, step: int | None) -> AuditSampleOut:
    return AuditSampleOut(
        id=sample.id, audit_id=sample.audit_id, step=step, rank=sample.rank, index=sample.sample_index,
        **{name: getattr(sample, name) for name in audit_store.SAMPLE_FIELDS if name != "windows"},
        windows=[_window_out(w) for w in sample.windows or []])


def _window_out(window: dict) -> AuditWindowOut:
    trainer = window.get("trainer")
    return AuditWindowOut(**window, rollout_shown=[shown(t) for t in window["rollout"]],
                          trainer_shown=None if trainer is None else [shown(t) for t in trainer])
