from __future__ import annotations

from fastapi import APIRouter

from paritywatch.backend.api.deps import AnswerRoute, ReadDep, ReadSession
from paritywatch.backend.detect.parity import compute_parity
from paritywatch.backend.store import fingerprints as fp_store
from paritywatch.backend.store.runs import get_run

router = APIRouter(tags=["parity"], route_class=AnswerRoute)


def _comp(c) -> dict:
    return {"component_id": c.id, "side": c.side, "worker_id": c.worker_id, "host": c.host,
            "last_heartbeat": c.last_heartbeat, "digest": c.fingerprint_digest}


@router.get("/runs/{run_id}/parity", summary="Trainer vs rollout processors, grouped by fingerprint")
def parity(run_id: int, s: ReadSession, _: ReadDep) -> dict:
    get_run(s, run_id)
    p = compute_parity(fp_store.fingerprint_rows(s, run_id))
    return {
        "trainer": _comp(p.reference) if p.reference is not None else None,
        "groups": [
            {"digest": g.digest, "side": g.components[0].side, "components": [_comp(c) for c in g.components],
             "verdict": g.verdict, "diff": g.diff}
            for g in p.groups
        ],
        "missing_fingerprint": [_comp(c) for c in p.missing],
    }
