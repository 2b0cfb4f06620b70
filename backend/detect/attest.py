"""Weight-sync attestation, pure: compare each rollout worker's latest attestation with the
trainer's of the same version, and say which workers are stale or went back to older weights
(docs/design.md, "Weight-sync attestation"). Time is passed in; nothing here reads a clock or a
database."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Iterable

from paritywatch.backend.store.attestations import Attested

FIRST_TENSORS = 10  # tensor names an alert lists (the counts cover all)
# Alert kinds of weight attestation, and what resolves them when their condition is gone.
WEIGHT_ALERTS = {
    "weights_mismatch": "the worker attested the trainer's weights again (or it closed)",
    "weights_stale": "the worker caught up with the trainer's weights (or it closed)",
    "weights_backwards": "the worker is back on current weights (or it closed)",
}
MISMATCH_WHY = ("the rollout worker generates with other weights than the trainer computes log-probs with: "
                "the importance ratios and the policy gradient are silently wrong")


@dataclass(frozen=True)
class AttestPolicy:
    grace_s: float  # a version the trainer published this long ago must be on every worker
    max_lag: int  # trainer versions a worker may be behind before it is stale at once


@dataclass
class Finding:
    kind: str  # weights_mismatch | weights_stale | weights_backwards
    severity: str
    worker: Attested
    title: str
    detail: dict = field(default_factory=dict)
    reference: Attested | None = None  # the trainer's attestation it was compared with


def reference_for(trainers: list[Attested], version: int) -> Attested | None:
    """The trainer attestation of `version` (several trainer ranks: the lowest process id, its
    latest attestation)."""
    candidates = [t for t in trainers if t.version == version]
    if not candidates:
        return None
    first = min(t.component_id for t in candidates)
    return max((t for t in candidates if t.component_id == first), key=lambda t: t.id)


def verdict(reference: Attested | None, worker: Attested) -> str:
    """same | differs | incomparable (different algorithm or sampling) | pending (no trainer
    attestation of that version yet)."""
    if reference is None:
        return "pending"
    if reference.settings != worker.settings:
        return "incomparable"
    return "same" if reference.digest == worker.digest else "differs"


def compare_tensors(reference: list[dict], worker: list[dict]) -> dict:
    """Which tensors differ, in the trainer's order: the first FIRST_TENSORS of each list and the
    counts. `missing`: the trainer attested them, the worker did not; `extra`: the other way."""
    theirs = {t["name"]: t for t in worker}
    ours = {t["name"] for t in reference}
    differing = [t["name"] for t in reference if t["name"] in theirs and _differs(t, theirs[t["name"]])]
    missing = [t["name"] for t in reference if t["name"] not in theirs]
    extra = [t["name"] for t in worker if t["name"] not in ours]
    return {
        "compared": len(reference) - len(missing),
        "differing": differing[:FIRST_TENSORS], "differing_count": len(differing),
        "missing": missing[:FIRST_TENSORS], "missing_count": len(missing),
        "extra": extra[:FIRST_TENSORS], "extra_count": len(extra),
        "shape_or_dtype": [n for n in differing[:FIRST_TENSORS]
                           if (theirs[n]["dtype"], theirs[n]["shape"]) != _dtype_shape(reference, n)],
    }


def _differs(a: dict, b: dict) -> bool:
    return a["digest"] != b["digest"]


def _dtype_shape(tensors: list[dict], name: str) -> tuple:
    t = next(t for t in tensors if t["name"] == name)
    return t["dtype"], t["shape"]


def mismatch_title(worker: Attested, diff: dict) -> str:
    names = diff["differing"] or diff["missing"]
    more = diff["differing_count"] + diff["missing_count"] - len(names)
    where = ", ".join(names) + (f" and {more} more" if more > 0 else "")
    return (f"rollout {worker.worker_id} holds different weights than the trainer for version {worker.version}: "
            f"{where or 'extra tensors only'}")


def describe_mismatch(finding: Finding, reference_tensors: list[dict], worker_tensors: list[dict]) -> None:
    """Fill a weights_mismatch finding's title and detail with the tensors that differ (the caller
    reads the tensor lists of mismatching workers only)."""
    diff = compare_tensors(reference_tensors, worker_tensors)
    worker, reference = finding.worker, finding.reference
    finding.title = mismatch_title(worker, diff)
    finding.detail = {
        "why": MISMATCH_WHY,
        "version": worker.version, "trainer_digest": reference.digest, "worker_digest": worker.digest,
        "trainer_component_id": reference.component_id,
        "trainer_attestation_id": reference.id, "worker_attestation_id": worker.id,
        "differing_tensors": diff["differing"] + diff["missing"][: max(0, FIRST_TENSORS - len(diff["differing"]))],
        "tensors": diff,
    }


def alert_key(finding: Finding) -> str:
    """One open alert per rollout process and kind."""
    return f"{finding.kind}:{finding.worker.component_id}"


def pause_reason(finding: Finding) -> str:
    """Why a weights mismatch paused the run, as its control state shows it."""
    return f"weights mismatch: {finding.title}"


def check_worker(trainers: list[Attested], worker: Attested, now: datetime, policy: AttestPolicy) -> list[Finding]:
    """What is wrong with one rollout worker's latest attestation (the mismatch itself needs the
    tensor lists: the caller fills its detail with compare_tensors). A closed worker is done:
    nothing."""
    if worker.status == "closed":
        return []
    findings = []
    ref = reference_for(trainers, worker.version)
    result = verdict(ref, worker)
    if result == "differs":
        findings.append(Finding("weights_mismatch", "error", worker, "", reference=ref))
    elif result == "incomparable":
        findings.append(Finding(
            "weights_mismatch", "warning", worker,
            f"rollout {worker.worker_id} and the trainer attest version {worker.version} with different settings: "
            "their digests cannot be compared",
            {"why": "both sides must hash with the same algo, mode, block_bytes and sample settings",
             "trainer_settings": _settings(ref), "worker_settings": _settings(worker)}, ref))
    stale = _staleness(trainers, worker, now, policy)
    if stale is not None:
        findings.append(stale)
    backwards = _backwards(trainers, worker)
    if backwards is not None:
        findings.append(backwards)
    return findings


def _settings(a: Attested) -> dict:
    algo, mode, block_bytes, sample = a.settings
    return {"algo": algo, "mode": mode, "block_bytes": block_bytes, "sample": dict(sample) or None}


def _staleness(trainers: list[Attested], worker: Attested, now: datetime, policy: AttestPolicy) -> Finding | None:
    """Stale: more than max_lag trainer versions ahead of the worker, or one of them published more
    than grace_s ago. Only a live worker can be stale (a closed one is done; a lost one has its
    heartbeat_lost alert)."""
    if worker.status != "live":
        return None
    published = _first_published(trainers)
    newer = sorted(v for v in published if v > worker.version)
    if not newer:
        return None
    overdue = [v for v in newer if now - published[v] > timedelta(seconds=policy.grace_s)]
    if len(newer) <= policy.max_lag and not overdue:
        return None
    why = (f"the trainer published {len(newer)} newer version(s) (at most {policy.max_lag} may be pending)"
           if len(newer) > policy.max_lag else
           f"version {overdue[0]} was published {(now - published[overdue[0]]).total_seconds():.0f} s ago "
           f"(grace {policy.grace_s:g} s)")
    title = f"rollout {worker.worker_id} is still on weights version {worker.version}; the trainer is at {newer[-1]}"
    return Finding("weights_stale", "error", worker, title, {
        "why": f"{why}: the worker keeps generating with old weights (a weight sync that did not reach it)",
        "worker_version": worker.version, "trainer_version": newer[-1], "missed_versions": newer[:FIRST_TENSORS],
        "worker_attested_at": worker.created_at.isoformat()})


def _first_published(trainers: Iterable[Attested]) -> dict[int, datetime]:
    published: dict[int, datetime] = {}
    for t in trainers:
        published[t.version] = min(published.get(t.version, t.created_at), t.created_at)
    return published


def _backwards(trainers: list[Attested], worker: Attested) -> Finding | None:
    """A worker that attested an older version than one it had before, while the trainer is
    ahead of it (when the trainer went back too, a resume from a checkpoint, it is following)."""
    if worker.backwards_from is None:
        return None
    trainer_latest = max(trainers, key=lambda t: t.id).version if trainers else None
    if trainer_latest is not None and trainer_latest <= worker.version:
        return None
    title = (f"rollout {worker.worker_id} went back from weights version {worker.backwards_from} "
             f"to {worker.version}")
    return Finding("weights_backwards", "error", worker, title, {
        "why": "a worker that reloads older weights (a restart from the base checkpoint, a cache that served an "
               "old copy) generates off-policy samples without any error",
        "worker_version": worker.version, "previous_version": worker.backwards_from,
        "trainer_version": trainer_latest})
