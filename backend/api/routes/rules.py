from __future__ import annotations

from fastapi import APIRouter, Response

from paritywatch.backend.alerts import lifecycle
from paritywatch.backend.alerts.effects import after_commit
from paritywatch.backend.api.deps import AnswerRoute, AdminDep, EngineDep, ReadDep, ReadSession, WriteSession
from paritywatch.backend.models import Rule
from paritywatch.backend.schemas.rules import RuleIn, RuleList, RuleOut, RulePatch
from paritywatch.backend.store import rules as rule_store

router = APIRouter(tags=["rules"], route_class=AnswerRoute)


def _out(rule: Rule) -> RuleOut:
    return RuleOut.model_validate(rule, from_attributes=True)


@router.get("/runs/{run_id}/rules", response_model=RuleList, summary="A run's rules and its project's defaults")
def list_rules(run_id: int, s: ReadSession, _: ReadDep) -> RuleList:
    return RuleList(rules=[_out(r) for r in rule_store.rules_of_run(s, run_id)])


@router.post("/runs/{run_id}/rules", response_model=RuleOut, summary="Add a rule to a run")
def add_run_rule(run_id: int, body: RuleIn, s: WriteSession, engine: EngineDep, _: AdminDep) -> RuleOut:
    rule = rule_store.add_rule(s, body.model_dump(), run_id=run_id)
    after_commit(s, lambda: engine.forget_rules(run_id))
    return _out(rule)


@router.post("/projects/{project}/rules", response_model=RuleOut, summary="Add a rule for every run of a project")
def add_project_rule(project: str, body: RuleIn, s: WriteSession, engine: EngineDep, _: AdminDep) -> RuleOut:
    rule = rule_store.add_rule(s, body.model_dump(), project=project)
    after_commit(s, engine.forget_rules)
    return _out(rule)


@router.patch("/rules/{rule_id}", response_model=RuleOut, summary="Enable, disable or retune a rule")
def patch_rule(rule_id: int, body: RulePatch, s: WriteSession, engine: EngineDep, who: AdminDep) -> RuleOut:
    rule = rule_store.update_rule_in(s, rule_id, body.model_dump(exclude_none=True))
    if body.enabled is False:
        lifecycle.resolve_rule_alerts(s, [rule.id], who.name, "its rule was disabled")
    after_commit(s, engine.forget_rules)
    return _out(rule)


@router.delete("/rules/{rule_id}", status_code=204, summary="Delete a rule")
def delete_rule(rule_id: int, s: WriteSession, engine: EngineDep, who: AdminDep) -> Response:
    lifecycle.resolve_rule_alerts(s, [rule_id], who.name, "its rule was deleted")
    rule_store.delete_rule_in(s, rule_id)
    after_commit(s, engine.forget_rules)
    return Response(status_code=204)
