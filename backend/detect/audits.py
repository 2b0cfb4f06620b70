"""Which per-sample audit causes are firing, from a run's latest audited batches (pure).

Two causes, each one alert per run (its dedup key), refreshed by every later bad batch rather than
fired again, and resolved once `clear_batches` audited batches in a row are clean for it:

* `length_parity`: a sample has more or fewer log-probs than completion ids. Every log-prob after
  the first missing one belongs to another token, so the policy ratio, the KL and the loss of that
  sample are computed on the wrong tokens (eval-protocol python-sdk#457).
* `rerender`: the trainer's render of a sample's messages differs from the prompt ids the rollout
  sampled from (tool calls rendered differently, verl#3960; `<think>` dropped from earlier turns,
  NVIDIA-NeMo/RL#2822): the trainer conditions on a context the policy never saw.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

CAUSES = ("length_parity", "rerender")

WHY = {
    "length_parity": "log-probs and token ids do not pair up one to one: from the first unpaired position on, "
                     "each log-prob is scored against another token, so the importance ratio, the KL and the loss "
                     "of these samples are computed on the wrong tokens",
    "rerender": "the trainer renders these samples' messages into other token ids than the prompt the rollout "
                "sampled from: the trainer scores completions in a context the policy never saw",
}
ACTION = {
    "length_parity": "check where the rollout's log-probs are collected (a prompt log-prob left in, or the last "
                     "token's log-prob dropped) and that the trainer's log-probs are sliced to the completion ids; "
                     "the sample audit shows the tokens where the pairs end",
    "rerender": "render prompts once and pass the same token ids to both sides, or give the trainer the rollout's "
                "chat template and template kwargs; the sample audit shows both renders around the first "
                "differing token",
}


class AuditCounts(Protocol):
    id: int
    step: int | None
    samples: int
    length_mismatches: int
    rerender_mismatches: int


@dataclass(frozen=True)
class Finding:
    cause: str
    audit_id: int  # the newest failing batch
    step: int | None
    samples: int
    failing: int  # of `samples`, in that batch
    failing_batches: int  # in the window


def failing_count(audit: AuditCounts, cause: str) -> int:
    return audit.length_mismatches if cause == "length_parity" else audit.rerender_mismatches


def findings(recent: list[AuditCounts]) -> dict[str, Finding | None]:
    """Per cause, the finding to fire (or keep firing) from the latest batches (newest first,
    `clear_batches` of them), or None when every one of them is clean for it (resolve)."""
    out: dict[str, Finding | None] = {}
    for cause in CAUSES:
        bad = [a for a in recent if failing_count(a, cause) > 0]
        newest = bad[0] if bad else None
        out[cause] = None if newest is None else Finding(cause, newest.id, newest.step, newest.samples,
                                                         failing_count(newest, cause), len(bad))
    return out


def title_of(finding: Finding, example: Any) -> str:
    where = f"batch at step {finding.step}" if finding.step is not None else f"audited batch {finding.audit_id}"
    if finding.cause == "length_parity":
        shape = ""
        if example is not None:
            counts = [f"{n} {side} log-probs" for side, n in (("rollout", example.n_rollout_logprobs),
                                                               ("trainer", example.n_trainer_logprobs)) if n is not None]
            shape = f" (e.g. {' and '.join(counts)} for {example.n_ids} ids)" if counts else ""
        return f"log-probs misaligned with token ids in {finding.failing} of {finding.samples} samples, {where}{shape}"
    at = f" (first at prompt token {example.rerender_first_diff})" if example is not None else ""
    return f"trainer re-render differs from the rollout's prompt in {finding.failing} of {finding.samples} samples, {where}{at}"


def detail_of(finding: Finding, example: Any, clear_batches: int) -> dict[str, Any]:
    detail: dict[str, Any] = {
        "cause": finding.cause, "why": WHY[finding.cause], "action": ACTION[finding.cause],
        "audit_id": finding.audit_id, "step": finding.step, "samples": finding.samples,
        "failing_samples": finding.failing, "failing_batches": finding.failing_batches,
        "window_batches": clear_batches,
        "resolves_after": f"{clear_batches} audited batches in a row without this failure",
    }
    if example is not None:
        detail["example"] = {"sample_index": example.sample_index, "n_ids": example.n_ids,
                             "n_rollout_logprobs": example.n_rollout_logprobs,
                             "n_trainer_logprobs": example.n_trainer_logprobs,
                             "rerender_first_diff": example.rerender_first_diff, "windows": example.windows}
    return detail
