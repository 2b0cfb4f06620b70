"""Silences: rows are never deleted; expiring one sets its end (who and when) to now."""
from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from paritywatch.backend.errors import Conflict
from paritywatch.backend.models import Run, Silence, utcnow
from paritywatch.backend.store.rows import get_or_404


def create(s: Session, *, run_id: int | None, project: str | None, kind: str | None, duration_s: float,
           created_by: str, reason: str) -> Silence:
    now = utcnow()
    silence = Silence(run_id=run_id, project=project, kind=kind, starts_at=now,
                      ends_at=now + timedelta(seconds=duration_s), created_by=created_by, reason=reason,
                      created_at=now)
    s.add(silence)
    s.flush()
    return silence


def get(s: Session, silence_id: int) -> Silence:
    return get_or_404(s, Silence, silence_id, "silence")


def expire(s: Session, silence_id: int, actor: str) -> Silence:
    silence = get(s, silence_id)
    now = utcnow()
    if silence.ends_at <= now:
        raise Conflict(f"silence {silence_id} already ended at {silence.ends_at.isoformat()}")
    silence.ends_at, silence.ended_by, silence.ended_at = now, actor, now
    return silence


def active(s: Session, now: datetime) -> list[Silence]:
    """Silences in force now (an index range on ends_at: ended ones are not read)."""
    return list(s.scalars(select(Silence).where(Silence.ends_at > now, Silence.starts_at <= now)
                          .order_by(Silence.id)))


def listing(s: Session, state: str, now: datetime, run: Run | None = None, limit: int = 500) -> list[Silence]:
    """Newest first; with `run`, the silences that can match its alerts (its own, its project's,
    and those of an alert kind alone)."""
    q = select(Silence).order_by(Silence.id.desc()).limit(limit)
    if state == "active":
        q = q.where(Silence.ends_at > now)
    elif state == "expired":
        q = q.where(Silence.ends_at <= now)
    if run is not None:
        q = q.where(or_(Silence.run_id == run.id,
                        Silence.run_id.is_(None) & (Silence.project.is_(None) | (Silence.project == run.project))))
    return list(s.scalars(q))
