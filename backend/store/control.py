"""Run state rows: the state column with a version, and its audit log (`control_events`).
Which changes are allowed, and what each one sets off, is backend/control/run_state.py."""
from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from paritywatch.backend.models import ControlEvent, Run, utcnow
from paritywatch.backend.store.paging import PageRequest, keyset, split_page
from paritywatch.backend.store.runs import get_run


def control_of(run: Run) -> dict:
    return {
        "state": run.control_state,
        "version": run.control_version,
        "actor": run.control_actor,
        "reason": run.control_reason,
        "updated_at": run.control_updated_at,
    }


def set_state(s: Session, run: Run, target: str, actor: str | None, reason: str) -> None:
    s.add(
        ControlEvent(
            run_id=run.id,
            version=run.control_version + 1,
            from_state=run.control_state,
            to_state=target,
            actor=actor,
            reason=reason,
        )
    )
    run.control_state = target
    run.control_version += 1
    run.control_actor = actor
    run.control_reason = reason
    run.control_updated_at = utcnow()


def state_before(s: Session, run_id: int, state: str) -> str | None:
    """The state the run left when it last entered `state` (what a crashed run goes back to)."""
    return s.scalar(select(ControlEvent.from_state).where(ControlEvent.run_id == run_id, ControlEvent.to_state == state)
                    .order_by(ControlEvent.id.desc()).limit(1))


def versions(s: Session, run_ids: list[int]) -> dict[int, int]:
    rows = s.execute(select(Run.id, Run.control_version).where(Run.id.in_(run_ids)))
    return {rid: v for rid, v in rows}


def audit(s: Session, run_id: int, page: PageRequest = PageRequest(limit=100)) -> tuple[list[ControlEvent], int | None]:
    """One page of the run's control changes, oldest first, and the next page's position."""
    get_run(s, run_id)
    q = keyset(select(ControlEvent).where(ControlEvent.run_id == run_id), ControlEvent.id, page, newest_first=False)
    return split_page(s.scalars(q), page, lambda e: e.id)
