"""Taint spans (what a run trained on): the SQL behind backend/alerts/taint.py and the reads of
the runs routes. The logic (which alerts count, how spans merge) is backend/detect/taint.py."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from paritywatch.backend.models import Component, TaintSpan


def open_span_of(s: Session, alert_id: int) -> TaintSpan | None:
    """The alert's span that is still open (at most one: it closes before another opens)."""
    return s.scalar(select(TaintSpan).where(TaintSpan.alert_id == alert_id, TaintSpan.last_step.is_(None))
                    .order_by(TaintSpan.id.desc()).limit(1))


def add_span(s: Session, span: TaintSpan) -> TaintSpan:
    s.add(span)
    s.flush()
    return span


def close_span(span: TaintSpan, last_step: int, now: datetime) -> None:
    span.last_step, span.closed_at = last_step, now


def live_rollout_workers(s: Session, run_id: int) -> int:
    return s.scalar(select(func.count()).select_from(Component)
                    .where(Component.run_id == run_id, Component.side == "rollout", Component.status == "live")) or 0


def spans_of(s: Session, run_ids: list[int]) -> dict[int, list[TaintSpan]]:
    """Every span of these runs, oldest first (a run has a few: one per alert episode)."""
    out: dict[int, list[TaintSpan]] = {rid: [] for rid in run_ids}
    if run_ids:
        for span in s.scalars(select(TaintSpan).where(TaintSpan.run_id.in_(run_ids)).order_by(TaintSpan.id)):
            out[span.run_id].append(span)
    return out
