from __future__ import annotations

from fastapi import APIRouter, Request, Response
from sqlalchemy import select

from backend.api.deps import AdminDep, DbDep, ReadDep
from backend.errors import NotFound
from backend.models import Rule
from backend.schemas import RuleIn, RuleList, RuleOut, RulePatch
from backend.store.runs import get_run

router = APIRouter(tags=["rules"])


def _out(rule: Rule) -> RuleOut:
    return RuleOut.model_validate(rule, from_attributes=True)


@router.get("/runs/{run_id}/rules", response_model=RuleList, summary="A run's rules and its project's defaults")
def list_rules(run_id: int, db: DbDep, _: ReadDep) -> RuleList:
    with db.read() as s:
        run = get_run(s, run_id)
        q = select(Rule).where((Rule.run_id == run_id) | ((Rule.run_id.is_(None)) & (Rule.project == run.project)))
        return RuleList(rules=[_out(r) for r in s.scalars(q.order_by(Rule.id))])


@router.post("/runs/{run_id}/rules", response_model=RuleOut, summary="Add a rule to a run")
def add_run_rule(run_id: int, body: RuleIn, request: Request, db: DbDep, _: AdminDep) -> RuleOut:
    with db.write() as s:
        get_run(s, run_id)
        rule = Rule(run_id=run_id, **body.model_dump())
        s.add(rule)
        s.flush()
    request.app.state.engine.forget_rules(run_id)
    return _out(rule)


@router.post("/projects/{project}/rules", response_model=RuleOut, summary="Add a rule for every run of a project")
def add_project_rule(project: str, body: RuleIn, request: Request, db: DbDep, _: AdminDep) -> RuleOut:
    with db.write() as s:
        rule = Rule(project=project, **body.model_dump())
        s.add(rule)
        s.flush()
    request.app.state.engine.forget_rules()
    return _out(rule)


@router.patch("/rules/{rule_id}", response_model=RuleOut, summary="Enable, disable or retune a rule")
def patch_rule(rule_id: int, body: RulePatch, request: Request, db: DbDep, _: AdminDep) -> RuleOut:
    with db.write() as s:
        rule = _get(s, rule_id)
        for field, value in body.model_dump(exclude_none=True).items():
            setattr(rule, field, value)
    request.app.state.engine.forget_rules()
    return _out(rule)


@router.delete("/rules/{rule_id}", status_code=204, summary="Delete a rule")
def delete_rule(rule_id: int, request: Request, db: DbDep, _: AdminDep) -> Response:
    with db.write() as s:
        s.delete(_get(s, rule_id))
    request.app.state.engine.forget_rules()
    return Response(status_code=204)


def _get(s, rule_id: int) -> Rule:  # noqa: ANN001
    rule = s.get(Rule, rule_id)
    if rule is None:
        raise NotFound(f"rule {rule_id} does not exist")
    return rule
