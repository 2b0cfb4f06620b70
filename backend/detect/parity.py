"""Compare every rollout fingerprint of a run with its trainer's (or, with no trainer yet, the
rollout workers among themselves). Workers with the same digest are compared once."""
from __future__ import annotations

import copy
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from threading import Lock

from paritywatch.backend.models import Component
from trainer_hooks.contract import LATE_FINGERPRINT_COMPONENTS, SAMPLING_PARAMS_COMPONENT
from trainer_hooks.fingerprint.diff import RANK, findings, findings_text

_DIFF_CACHE: "OrderedDict[tuple[str, str], dict]" = OrderedDict()
_DIFF_LOCK = Lock()
_DIFF_CACHE_SIZE = 256


def diff_is_cached(a_digest: str, b_digest: str) -> bool:
    with _DIFF_LOCK:
        return (a_digest, b_digest) in _DIFF_CACHE


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


MIN_KEPT_CHARS = 256  # a cut string keeps at least this much of its start
MAX_KEPT_ITEMS = 20  # and a cut list its first items
CUT_MARK = "\n… [cut: the alert keeps a bounded diff; GET /runs/{run_id}/parity has all of it]"


def bounded_diff(diff: dict, max_bytes: int) -> dict:
    """The diff as an alert stores it: at most about `max_bytes` of JSON. A chat template can be
    any size, and its unified diff with it; the alert keeps the start of the longest strings (then
    of the longest lists) and says `truncated`, while the parity endpoint recomputes the whole."""
    if _json_size(diff) <= max_bytes:
        return diff
    out = copy.deepcopy(diff)
    while _json_size(out) > max_bytes:
        slot = _longest(out, str, MIN_KEPT_CHARS)
        if slot is None:
            break
        container, key = slot
        text = container[key]
        container[key] = text[: max(MIN_KEPT_CHARS, len(text) // 2)] + CUT_MARK
    while _json_size(out) > max_bytes:
        slot = _longest(out, list, MAX_KEPT_ITEMS)
        if slot is None:
            break
        container, key = slot
        container[key] = container[key][:MAX_KEPT_ITEMS]
    out["truncated"] = True
    return out


def _json_size(value) -> int:
    return len(json.dumps(value, ensure_ascii=False, default=str).encode())


def _longest(value, kind: type, floor: int):
    """(container, key) of the longest value of `kind` still longer than `floor` (a cut string
    ends with CUT_MARK and counts by what is left of it), or None."""
    best, best_len = None, floor
    stack = [value]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in items:
            if isinstance(child, (dict, list)):
                stack.append(child)
            if isinstance(child, kind):
                length = len(child.removesuffix(CUT_MARK)) if isinstance(child, str) else len(child)
                if length > best_len:
                    best, best_len = (node, key), length
    return best


@dataclass
class Group:
    digest: str
    components: list[Component] = field(default_factory=list)
    verdict: str = "same"
    diff: dict | None = None
    processor_digest: str = ""  # the digest less the late components (see processor_digest)


@dataclass
class Parity:
    reference: Component | None
    reference_digest: str | None
    groups: list[Group]
    missing: list[Component]
    reference_processor_digest: str = ""


def processor_digest(body: dict) -> str:
    """The fingerprint's digest without the components a process reports late (sampling_params,
    lora_adapter, engine_config): the identity of a processor mismatch alert. A rollout reports its
    sampling and the adapter its requests carry with its first request, the prefix-cache reset after
    its first sync: that re-post must refresh an open alert, not resolve it and fire a copy."""
    from trainer_hooks.fingerprint.canonical import digest

    comps = body.get("components") or {}
    return digest({n: c.get("digest") for n, c in comps.items() if n not in LATE_FINGERPRINT_COMPONENTS})


def mismatch_alerts(parity: Parity) -> list[tuple[str, list[Group]]]:
    """(dedup key, groups) of every alert the parity asks for: the groups at warning or error,
    keyed by the processor digests. Workers that share a processor but sample differently are
    several groups under one key, worst first (its diff is the one the alert shows)."""
    keyed: "OrderedDict[str, list[Group]]" = OrderedDict()
    for group in parity.groups:
        if RANK.get(group.verdict, 3) >= RANK["warning"]:
            key = mismatch_key(parity.reference_processor_digest, group.processor_digest)
            keyed.setdefault(key, []).append(group)
    return [(key, sorted(groups, key=lambda g: -RANK.get(g.verdict, 3))) for key, groups in keyed.items()]


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
        groups.setdefault(digest, Group(digest, processor_digest=processor_digest(body))).components.append(comp)
        bodies[digest] = body
    for digest, group in groups.items():
        if digest == ref_comp.fingerprint_digest:
            group.verdict, group.diff = "same", {"verdict": "same", "components": []}
        else:
            group.diff = diff_cached(ref_comp.fingerprint_digest, ref_body, digest, bodies[digest])
            group.verdict = group.diff.get("verdict", "error")
    return Parity(ref_comp, ref_comp.fingerprint_digest, list(groups.values()), missing, processor_digest(ref_body))


def mismatch_key(reference_digest: str, digest: str) -> str:
    """The dedup key of a processor_mismatch alert: one per (trainer, workers) pair of processor
    digests (fingerprint digests less the late components: see processor_digest)."""
    return f"processor_mismatch:{reference_digest}:{digest}"


def mismatch_digest(dedup_key: str) -> str | None:
    """The workers' processor digest a processor_mismatch key names (None for any other key); it
    equals their fingerprint digest until they report sampling_params."""
    kind, _, rest = dedup_key.partition(":")
    return rest.rpartition(":")[2] or None if kind == "processor_mismatch" else None


def differing_components(diff: dict, severity: str = "error") -> list[str]:
    """The components that differ at `severity`: behaviour probes that only demonstrate another
    component's difference are its evidence, not a name of their own (diff.findings)."""
    return [name for name, _ in findings(diff, severity)]


def evidence_of_findings(diff: dict, severity: str = "error") -> dict[str, str]:
    """{component: what the probes show of it}, e.g. {"chat_template": "rendered differently in 3 of
    18 probe conversations"}, for the components at `severity` that have such evidence."""
    return {name: why for name, why in findings(diff, severity) if why}


def sampling_why(diff: dict, names: list[str]) -> str:
    """": <what differs and why it matters>" when sampling parameters are among the alert's
    components: a temperature mismatch is only actionable with its consequence in the title."""
    if SAMPLING_PARAMS_COMPONENT not in names:
        return ""
    row = next((c for c in diff.get("components", []) if c.get("name") == SAMPLING_PARAMS_COMPONENT), {})
    return f": {row['summary']}" if row.get("summary") else ""


MATCH_AGAIN = "processors match again"  # the note of a processor_mismatch alert that resolved itself


def mismatch_title(members: list[Component], reference: Component, diff: dict, verdict: str) -> str:
    """A processor_mismatch alert's title: how many workers differ from the reference, in which
    components (with sampling parameters, what differs and why it matters)."""
    names = differing_components(diff, verdict)
    named = findings_text(diff, verdict) or "fingerprint"  # the names, with what the probes show of each
    return (f"{len(members)} {members[0].side} worker(s) differ from the "
            f"{reference.side} in {named}{sampling_why(diff, names)}")


def mismatch_pause_reason(diff: dict, verdict: str) -> str:
    """Why the run was paused, as its control state shows it."""
    return f"processor mismatch: {findings_text(diff, verdict)}"
