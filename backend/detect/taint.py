"""What a run trained on: which alerts mean the trainer trained on misaligned tokens or weights,
and the step ranges they cover, merged per cause (docs/design.md, "What a run trained on").

Pure: the SQL is backend/store/taint.py, the bookkeeping (in the alert's own transaction)
backend/alerts/taint.py. Steps are the run's last step as ingest sees it: a divergence covers the
steps logged after it opened, up to the last one logged when it resolved (or now, while open).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

# The alert kinds that can mean misaligned training. Not heartbeat_lost (a silent process trains
# nobody on wrong tokens), not weights_stale / weights_backwards (a worker behind on weights is
# off-policy by more versions than allowed, which importance ratios computed from the rollout's own
# log-probs account for; nothing is scored against the wrong tokens or weights), not metric_trend
# and pack rules (advisory levels, warnings).
TAINT_KINDS = ("processor_mismatch", "weights_mismatch", "sample_audit", "metric_threshold")
MAX_WORKER_IDS = 1000  # worker ids a span keeps (the count goes on beyond)
SHOWN_WORKER_IDS = 20  # worker ids an answer lists per range
MAX_RANGES = 100  # ranges an answer lists (earliest first); `ranges_total` counts them all
AUDIT_WHAT = {
    "length_parity": "log-probs misaligned with the completion ids (per-sample audit)",
    "rerender": "prompts re-render differently on the trainer (per-sample audit)",
}


@dataclass(frozen=True)
class Cause:
    key: str  # ranges merge per key
    what: str  # "chat_template differs"
    worker_ids: tuple[str, ...] = ()  # the workers the alert names (empty: not about workers)
    measured_step: int | None = None  # the earliest step the alert itself measured as misaligned


def cause_of(kind: str, severity: str, detail: Mapping[str, Any] | None, step: int | None) -> Cause | None:
    """The divergence an alert stands for, or None when it does not mean misaligned training.
    Only errors count: a warning (templates that differ in text but render alike, a framework
    pack's advisory level, eos disagreement) is not proof that a step trained on wrong tokens."""
    if severity != "error" or kind not in TAINT_KINDS:
        return None
    detail = detail or {}
    if kind == "processor_mismatch":
        names = [str(c) for c in detail.get("components") or []]
        evidence = detail.get("evidence") if isinstance(detail.get("evidence"), dict) else {}
        why = "; ".join(f"{n}: {evidence[n]}" if len(names) > 1 else str(evidence[n]) for n in names if evidence.get(n))
        what = f"{', '.join(names)} {'differs' if len(names) == 1 else 'differ'}" if names else "processor differs"
        what += f" ({why})" if why else ""  # the probes' evidence, e.g. "rendered differently in 3 of 18 ..."
        return Cause("processor:" + ",".join(sorted(names)), what, _ids(detail.get("worker_ids")))
    if kind == "weights_mismatch":
        return Cause("weights", "weights differ from the trainer's", _ids([detail.get("worker_id")]))
    if kind == "sample_audit":
        cause = str(detail.get("cause") or "")
        return Cause(f"sample_audit:{cause}", AUDIT_WHAT.get(cause, f"per-sample audit: {cause}"),
                     measured_step=_int(detail.get("step"), step))
    rule_key = str(detail.get("rule_key") or "")
    if not rule_key.startswith("align/"):  # a rule on any other metric is the user's, not alignment
        return None
    threshold = detail.get("threshold")
    what = f"{rule_key} {detail.get('comparison', '>')} {threshold:g}" if isinstance(threshold, (int, float)) else rule_key
    batch_steps = detail.get("steps") or []
    return Cause(f"metric:{rule_key}", what, _ids([detail.get("worker_id")]),
                 measured_step=_int(batch_steps[0] if batch_steps else None, step))


def first_step(cause: Cause, run_last_step: int | None) -> int:
    """The first step a divergence found now covers: the step after the last one logged (that
    one was trained before it was seen), or the step its alert measured, if earlier."""
    after = 0 if run_last_step is None else run_last_step + 1
    return after if cause.measured_step is None else min(after, cause.measured_step)


def _ids(values: Iterable[Any] | None) -> tuple[str, ...]:
    return tuple(dict.fromkeys(str(v) for v in values or () if v not in (None, "")))[:MAX_WORKER_IDS]


def _int(value: Any, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


# ------------------------------------------------------------------ ranges

@dataclass(frozen=True)
class Span:
    """One stored span, as the store reads it."""

    alert_id: int
    kind: str
    cause: str
    what: str
    first_step: int
    last_step: int | None  # None: still open
    worker_ids: tuple[str, ...] = ()
    workers: int = 0
    rollout_workers: int = 0


@dataclass
class Range:
    """Steps of one cause trained while it was open: overlapping or touching spans merged."""

    cause: str
    kind: str
    what: str
    first_step: int
    last_step: int
    open: bool
    worker_ids: list[str] = field(default_factory=list)
    workers: int = 0
    rollout_workers: int = 0
    alert_ids: list[int] = field(default_factory=list)

    @property
    def summary(self) -> str:
        """"steps 212–251: chat_template differs on 1 of 3 rollout workers"."""
        one = self.first_step == self.last_step
        steps = f"step {self.first_step}" if one else f"steps {self.first_step}–{self.last_step}"
        on = ""
        if self.workers:
            on = f" on {self.workers} of {max(self.workers, self.rollout_workers)} rollout worker"
            on += "" if max(self.workers, self.rollout_workers) == 1 else "s"
        return f"{steps}{' (still open)' if self.open else ''}: {self.what}{on}"

    def as_dict(self) -> dict:
        return {"cause": self.cause, "kind": self.kind, "what": self.what, "first_step": self.first_step,
                "last_step": self.last_step, "open": self.open, "workers": self.workers,
                "worker_ids": self.worker_ids[:SHOWN_WORKER_IDS], "rollout_workers": self.rollout_workers,
                "alert_ids": self.alert_ids, "summary": self.summary}


def merge(spans: Iterable[Span], run_last_step: int | None) -> list[Range]:
    """Ranges per cause, earliest first. An open span reaches the run's last step; a span in
    which no step was trained (fixed during a pause) covers nothing and is left out."""
    by_cause: dict[str, list[Range]] = {}
    for span in sorted(spans, key=lambda x: (x.first_step, x.alert_id)):
        last = span.last_step if span.last_step is not None else run_last_step
        if last is None or last < span.first_step:
            continue
        ranges = by_cause.setdefault(span.cause, [])
        if ranges and span.first_step <= ranges[-1].last_step + 1:
            _extend(ranges[-1], span, last)
        else:
            ranges.append(Range(span.cause, span.kind, span.what, span.first_step, last, span.last_step is None,
                                list(span.worker_ids), span.workers, span.rollout_workers, [span.alert_id]))
    return sorted((r for rs in by_cause.values() for r in rs), key=lambda r: (r.first_step, r.cause))


def _extend(r: Range, span: Span, last: int) -> None:
    r.last_step = max(r.last_step, last)
    r.open = r.open or span.last_step is None
    r.what = span.what  # the latest wording (a rule's threshold may have been retuned)
    r.worker_ids = list(dict.fromkeys([*r.worker_ids, *span.worker_ids]))[:MAX_WORKER_IDS]
    r.workers = max(r.workers, span.workers, len(r.worker_ids))
    r.rollout_workers = max(r.rollout_workers, span.rollout_workers)
    r.alert_ids.append(span.alert_id)


def record(spans: Iterable[Span], run_last_step: int | None) -> dict:
    """A run's account of what it trained on, JSON-ready (the API, webhook payloads):
    `tainted`, `first_step` (the earliest tainted step: a checkpoint saved before it is clean),
    `steps` (how many distinct steps are tainted), `ranges` and `ranges_total`."""
    ranges = merge(spans, run_last_step)
    return {"tainted": bool(ranges), "first_step": min((r.first_step for r in ranges), default=None),
            "steps": _union_length(ranges), "ranges": [r.as_dict() for r in ranges[:MAX_RANGES]],
            "ranges_total": len(ranges)}


def checkpoint(taint: Mapping[str, Any], step: int) -> dict:
    """Was a checkpoint saved at `step` trained on a tainted step? Any tainted step at or before
    it went into its weights; `ranges` are those (the whole of each, for the reader)."""
    behind = [r for r in taint["ranges"] if r["first_step"] <= step]
    return {"step": step, "tainted": bool(behind), "ranges": behind}


def _union_length(ranges: list[Range]) -> int:
    total, reach = 0, -1
    for r in sorted(ranges, key=lambda r: r.first_step):
        lo = max(r.first_step, reach + 1)
        if r.last_step >= lo:
            total += r.last_step - lo + 1
            reach = r.last_step
    return total
