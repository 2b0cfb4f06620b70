"""Compare every rollout fingerprint of a run with its trainer's (or, with no trainer yet, the
rollout workers among themselves). Workers with the same digest are compared once."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from threading import Lock

from backend.models import Component

_DIFF_CACHE: "OrderedDict[tuple[str, str], dict]" = OrderedDict()
_DIFF_LOCK = Lock()
_DIFF_CACHE_SIZE = 256


def diff_cached(a_digest: str, a: dict, b_digest: str, b: dict) -> dict:
    """diff_fingerprints is pure in (a, b): cache by digest pair, 256 workers cost one diff."""
    from trainer_hooks.fingerprint import diff_fingerprints

    key = (a_digest, b_digest)
    with _DIFF_LOCK:
        hit = _DIFF_CACHE.get(key)
        if hit is not None:
            _DIFF_CACHE.move_to_end(key)
            return hit
    result = diff_fingerprints(a, b)
    with _DIFF_LOCK:
        _DIFF_CACHE[key] = result
        while len(_DIFF_CACHE) > _DIFF_CACHE_SIZE:
            _DIFF_CACHE.popitem(last=False)
    return result


@dataclass
class Group:
    digest: str
    components: list[Component] = field(default_factory=list)
    verdict: str = "same"
    diff: dict | None = None


@dataclass
class Parity:
    reference: Component | None
    reference_digest: str | None
    groups: list[Group]
    missing: list[Component]


def compute_parity(rows: list[tuple[Component, dict | None]]) -> Parity:
    with_fp = [(c, body) for c, body in rows if body is not None]
    missing = [c for c, body in rows if body is None]
    trainers = [(c, b) for c, b in with_fp if c.side == "trainer"]
    ref_comp, ref_body = (trainers or with_fp or [(None, None)])[0]
    if ref_comp is None:
        return Parity(None, None, [], missing)
    groups: "OrderedDict[str, Group]" = OrderedDict()
    bodies: dict[str, dict] = {}
    for comp, body in with_fp:
        if comp is ref_comp:
            continue
        digest = comp.fingerprint_digest
        groups.setdefault(digest, Group(digest)).components.append(comp)
        bodies[digest] = body
    for digest, group in groups.items():
        if digest == ref_comp.fingerprint_digest:
            group.verdict, group.diff = "same", {"verdict": "same", "components": []}
        else:
            group.diff = diff_cached(ref_comp.fingerprint_digest, ref_body, digest, bodies[digest])
            group.verdict = group.diff.get("verdict", "error")
    return Parity(ref_comp, ref_comp.fingerprint_digest, list(groups.values()), missing)


def differing_components(diff: dict, severity: str = "error") -> list[str]:
    return [c["name"] for c in diff.get("components", []) if c.get("severity") == severity]
