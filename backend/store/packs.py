"""Framework packs as rows: a pack is enabled in a scope (a run, or a project's runs) when that
scope has rules marked with its name. The rules themselves come from the caller
(backend/detect/packs.py): the store knows rows, not frameworks."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from paritywatch.backend.models import MetricKey, Rule


def _scope(run_id: int | None, project: str | None):
    if run_id is not None:
        return Rule.run_id == run_id
    return (Rule.run_id.is_(None)) & (Rule.project == project)


def enabled(s: Session, run_id: int | None = None, project: str | None = None) -> list[str]:
    """Packs enabled in exactly this scope (a run's own, or a project's)."""
    q = select(Rule.pack).where(_scope(run_id, project), Rule.pack.is_not(None)).distinct()
    return sorted(s.scalars(q))


def enabled_for_runs(s: Session, runs: Iterable[tuple[int, str]]) -> dict[int, list[str]]:
    """Per run: the packs that apply to it (its own and its project's)."""
    runs = list(runs)
    out: dict[int, set[str]] = {rid: set() for rid, _ in runs}
    if not runs:
        return {}
    ids, projects = [rid for rid, _ in runs], {p for _, p in runs}
    q = select(Rule.run_id, Rule.project, Rule.pack).where(
        Rule.pack.is_not(None), (Rule.run_id.in_(ids)) | ((Rule.run_id.is_(None)) & (Rule.project.in_(projects))),
    ).distinct()
    by_project: dict[str, set[str]] = {}
    for run_id, project, pack in s.execute(q):
        if run_id is not None:
            out[run_id].add(pack)
        else:
            by_project.setdefault(project, set()).add(pack)
    return {rid: sorted(out[rid] | by_project.get(project, set())) for rid, project in runs}


@dataclass(frozen=True)
class PackChange:
    packs: list[str]  # the scope's packs after
    removed_rule_ids: list[int]  # rules of packs that went away (their open alerts need resolving)


def set_packs(s: Session, wanted: Iterable[str], rules_of: Callable[[str], list[dict]],
              run_id: int | None = None, project: str | None = None, remove_others: bool = True) -> PackChange:
    """Make the scope's packs `wanted` (plus the ones it has, unless `remove_others`): adds the
    rules of newly enabled packs, deletes those of removed ones; rules of a pack that stays keep
    whatever retuning they had."""
    have, wanted = set(enabled(s, run_id, project)), set(wanted)
    for name in sorted(wanted - have):
        s.add_all(Rule(run_id=run_id, project=project if run_id is None else None, **row) for row in rules_of(name))
    gone = sorted(have - wanted) if remove_others else []
    removed = list(s.scalars(select(Rule.id).where(_scope(run_id, project), Rule.pack.in_(gone)))) if gone else []
    if removed:
        s.execute(delete(Rule).where(Rule.id.in_(removed)))
    s.flush()
    return PackChange(sorted(wanted | (set() if remove_others else have)), removed)


def keys_present(s: Session, run_id: int, keys: Iterable[str]) -> set[str]:
    """Which of `keys` the run has posted."""
    keys = list(keys)
    if not keys:
        return set()
    return set(s.scalars(select(MetricKey.key).where(MetricKey.run_id == run_id, MetricKey.key.in_(keys))))
