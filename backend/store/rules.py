"""Threshold rules of runs and projects: the SQL. What a rule means is backend/detect/rules.py."""
from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from paritywatch.backend.errors import Invalid
from paritywatch.backend.models import Rule, RuleSeriesState, RuleState, Run
from paritywatch.backend.store.rows import get_or_404
from paritywatch.backend.store.runs import get_run
from trainer_hooks.contract import SCORED_RULE_KINDS


def _applies_to(run_id: int, project: str | None):
    """A rule of this run, or of its project."""
    return (Rule.run_id == run_id) | ((Rule.run_id.is_(None)) & (Rule.project == project))


def rules_of_run(s: Session, run_id: int) -> list[Rule]:
    """The run's own rules and its project's, oldest first."""
    run = get_run(s, run_id)
    return list(s.scalars(select(Rule).where(_applies_to(run_id, run.project)).order_by(Rule.id)))


def watched_keys(s: Session, run_id: int) -> tuple[set[str], set[str]]:
    """Metric keys the enabled rules of the run (or of its project) watch: (as they are, base keys
    of per-worker rules, whose `<worker>/<key>` series they watch too)."""
    exact: set[str] = set()
    per_worker: set[str] = set()
    project = s.scalar(select(Run.project).where(Run.id == run_id))
    for key, worker_rule in s.execute(select(Rule.key, Rule.per_worker).where(
            Rule.enabled.is_(True), _applies_to(run_id, project))):
        (per_worker if worker_rule else exact).add(key)
    return exact, per_worker


def enabled_rules_on(s: Session, run: Run, keys: tuple[str, ...], base_keys: set[str] = frozenset()) -> list[Rule]:
    """The run's enabled rules on any of `keys`, and its per-worker rules on any of `base_keys`, oldest first."""
    on_keys = Rule.key.in_(keys) | (Rule.per_worker.is_(True) & Rule.key.in_(base_keys))
    return list(s.scalars(select(Rule).where(Rule.enabled.is_(True), on_keys,
                                             _applies_to(run.id, run.project)).order_by(Rule.id)))


def rule_state(s: Session, rule_id: int, run_id: int, series_key: str | None = None) -> RuleState | RuleSeriesState:
    """The rule's evaluation state on the run (on one worker's series of it for a per-worker
    rule), a fresh one (added to the session) the first time."""
    if series_key is None:
        state = s.get(RuleState, (rule_id, run_id)) or RuleState(rule_id=rule_id, run_id=run_id, streak=0, clear_streak=0)
    else:
        state = (s.get(RuleSeriesState, (rule_id, run_id, series_key))
                 or RuleSeriesState(rule_id=rule_id, run_id=run_id, series_key=series_key, streak=0, clear_streak=0))
    s.add(state)
    return state


def add_rule(s: Session, fields: dict, *, run_id: int | None = None, project: str | None = None) -> Rule:
    """A rule of one run (`run_id`, which must exist) or of every run of `project`."""
    if run_id is not None:
        get_run(s, run_id)
    rule = Rule(run_id=run_id, **fields) if run_id is not None else Rule(project=project, **fields)
    s.add(rule)
    s.flush()
    return rule


def update_rule_in(s: Session, rule_id: int, fields: dict) -> Rule:
    rule = _get(s, rule_id)
    for field, value in fields.items():
        setattr(rule, field, value)
    if rule.kind in SCORED_RULE_KINDS and rule.threshold <= 0:
        raise Invalid(f"a {rule.kind} rule's threshold is a score and must stay > 0")
    s.flush()
    return rule


def delete_rule_in(s: Session, rule_id: int) -> None:
    s.delete(_get(s, rule_id))


def _get(s: Session, rule_id: int) -> Rule:
    return get_or_404(s, Rule, rule_id, "rule")
