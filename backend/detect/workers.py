"""The workers view, pure: the state a process is shown in, fingerprint group labels, lag behind
the trainer, which open alerts concern which process, and which workers' series stand out from
the others. No I/O: the route reads the rows (backend/store/workers.py) and hands them here."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np

from paritywatch.backend.models import ENDED_PROCESS, ENDED_RUN_STATES
from paritywatch.backend.store.alerts import heartbeat_key
from paritywatch.backend.detect.parity import mismatch_digest
from paritywatch.backend.detect.trend import mad_sigma
from paritywatch.backend.store.metric_packing import group_starts

# A worker this many versions or more behind the trainer is flagged `lagging`. Async GRPO runs
# one or two versions off-policy by design; more than that is a stuck weight sync.
LAGGING_VERSIONS = 3


def process_state(status: str, last_heartbeat: datetime, run_state: str, cutoff: datetime) -> str:
    """The state a reader is shown: the stored one (live, closed, lost), except that a live process
    of a run that ended (stopped, finished) silent since `cutoff` is `ended`. Its orchestrator shut
    it down without close() (a finished run's rollout workers often get a SIGTERM); the heartbeat
    sweep reads live runs only, so that its cost does not grow with history, and never marks it.
    It is not live, and not lost either: a clean end pages nobody and is nothing to look into.
    `cutoff`: store/workers.py silent_cutoff (the SQL of the same rule is there too)."""
    if status == "live" and run_state in ENDED_RUN_STATES and last_heartbeat < cutoff:
        return ENDED_PROCESS
    return status


def group_labels(digests: list[str], trainer_digest: str | None) -> dict[str, str]:
    """A short, stable name per distinct fingerprint: "A" is the trainer's, then B, C... in the
    order their first process registered (AA, AB... past Z)."""
    ordered = ([trainer_digest] if trainer_digest else []) + [d for d in digests if d != trainer_digest]
    return {digest: _letters(i) for i, digest in enumerate(ordered)}


def _letters(i: int) -> str:
    out = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        out = chr(65 + r) + out
    return out


def lag(side: str, version: int | None, trainer_version: int | None) -> int | None:
    """Versions a rollout worker is behind the trainer (None when either has not reported)."""
    if side != "rollout" or version is None or trainer_version is None:
        return None
    return trainer_version - version


def alerts_by_component(alerts, components) -> dict[int, list]:
    """Open alerts that concern a process: its heartbeat_lost, and the processor_mismatch of
    its fingerprint (the processes the alert lists; or, for an alert without that list, those
    whose digest its key names). Run-wide alerts (metric rules) concern no single process."""
    by_digest: dict[str, list] = {}
    by_component: dict[int, list] = {}
    by_key: dict[str, object] = {}
    for alert in alerts:
        digest = mismatch_digest(alert.dedup_key)
        listed = (getattr(alert, "detail", None) or {}).get("component_ids")
        if digest is not None and isinstance(listed, list):
            # its key names processor digests, which differ from the processes' own digests once
            # they report sampling_params: the alert's list is exact
            for component_id in listed:
                by_component.setdefault(component_id, []).append(alert)
        elif digest is not None:
            by_digest.setdefault(digest, []).append(alert)
        else:
            by_key[alert.dedup_key] = alert
    out: dict[int, list] = {}
    for comp in components:
        mine = list(by_digest.get(comp.fingerprint_digest, ())) if comp.fingerprint_digest else []
        mine += by_component.get(comp.id, [])
        beat = by_key.get(heartbeat_key(comp.id))
        if beat is not None:
            mine.append(beat)
        out[comp.id] = mine
    return out


# ------------------------------------------------------------------ per-worker series

@dataclass
class Outlier:
    component_id: int
    score: float  # robust z-score of the worker's mean against the other workers' means
    mean: float
    points: int


def rank_outliers(points: dict[int, tuple[np.ndarray, np.ndarray]], top: int) -> tuple[list[Outlier], float | None]:
    """The `top` workers whose mean over the range lies furthest from the workers' median, and
    that median. Distance in robust standard deviations (1.4826 x the median absolute
    deviation; when most workers agree exactly that is 0, and the plain standard deviation
    stands in), so one bad replica among hundreds scores high instead of moving the mean."""
    if not points:
        return [], None
    ids = list(points)
    means = np.array([float(points[c][1].mean()) for c in ids])
    median = float(np.median(means))
    deviation = np.abs(means - median)
    scale = mad_sigma(means)
    if scale <= 0:
        scale = float(means.std())
    scores = deviation / scale if scale > 0 else np.zeros_like(deviation)
    order = np.argsort(-scores, kind="stable")[:top]
    return [Outlier(ids[i], round(float(scores[i]), 3), float(means[i]), int(len(points[ids[i]][0]))) for i in order], median


def all_points(parts: dict) -> tuple[np.ndarray, np.ndarray]:
    """Every point of a per-worker split (the unattributed ones too), for the aggregate."""
    if not parts:
        return np.empty(0, np.int64), np.empty(0, np.float64)
    return (np.concatenate([st for st, _ in parts.values()]), np.concatenate([vs for _, vs in parts.values()]))


def bucket_means(st: np.ndarray, vs: np.ndarray, origin: int, width: int) -> dict[str, list]:
    """Mean, min, max and count per bucket of `width` steps from `origin`, of sorted points."""
    if not len(st):
        return {"step": [], "mean": [], "min": [], "max": [], "count": []}
    order = np.argsort(st, kind="stable")
    st, vs = st[order], vs[order]
    tb = (st - origin) // width
    starts = group_starts(tb)
    counts = np.diff(np.append(starts, len(st)))
    return {
        "step": (origin + tb[starts] * width).tolist(),
        "mean": (np.add.reduceat(vs, starts) / counts).tolist(),
        "min": np.minimum.reduceat(vs, starts).tolist(),
        "max": np.maximum.reduceat(vs, starts).tolist(),
        "count": counts.tolist(),
    }
