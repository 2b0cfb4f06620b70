"""Framework metric packs: the catalogue, and a project's packs (a run's are in its settings)."""
from __future__ import annotations

from fastapi import APIRouter

from paritywatch.backend.alerts import lifecycle
from paritywatch.backend.alerts.effects import after_commit
from paritywatch.backend.api.deps import AnswerRoute, AdminDep, EngineDep, ReadDep, ReadSession, WriteSession
from paritywatch.backend.detect import packs as pack_catalog
from paritywatch.backend.schemas.packs import PackCatalog, PackOut, PackRuleOut, ProjectSettings
from paritywatch.backend.store import packs as pack_store

router = APIRouter(tags=["rules"], route_class=AnswerRoute)


@router.get("/packs", response_model=PackCatalog, summary="The framework metric packs, their rules and sources")
def list_packs(_: ReadDep) -> PackCatalog:
    return PackCatalog(packs=[
        PackOut(name=p.name, framework=p.framework, source=p.source,
                rules=[PackRuleOut(key=r.key, comparison=r.comparison, threshold=r.threshold, severity=r.severity,
                                   consecutive=r.consecutive, kind=r.kind, window=r.window, why=r.why)
                       for r in p.rules])
        for p in pack_catalog.PACKS.values()
    ])


@router.get("/projects/{project}/settings", response_model=ProjectSettings,
            summary="A project's defaults for its runs (framework packs)")
def get_project_settings(project: str, s: ReadSession, _: ReadDep) -> ProjectSettings:
    return ProjectSettings(packs=pack_store.enabled(s, project=project))


@router.put("/projects/{project}/settings", response_model=ProjectSettings,
            summary="Set a project's framework packs (every run of the project gets their rules)")
def put_project_settings(project: str, body: ProjectSettings, s: WriteSession, engine: EngineDep,
                         who: AdminDep) -> ProjectSettings:
    change = pack_store.set_packs(s, body.packs, pack_catalog.rules_of, project=project)
    lifecycle.resolve_rule_alerts(s, change.removed_rule_ids, who.name, "its framework pack was turned off")
    after_commit(s, engine.forget_rules)
    return ProjectSettings(packs=change.packs)
