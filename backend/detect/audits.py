"""Which per-sample audit causes are firing, from a run's latest audited batches (pure).

Each cause is one alert per run (its dedup key), refreshed by every later bad batch rather than
fired again, and resolved once `clear_batches` audited batches in a row are clean for it. The
hooks' checks are trainer_hooks/audit.py; each cause below says why it matters and where to look:

* `length_parity`: a sample has more or fewer log-probs than completion ids (eval-protocol
  python-sdk#457);
* `rerender`: the trainer's render of a sample's messages differs from the prompt ids the rollout
  sampled from (verl#3960, NVIDIA-NeMo/RL#2822);
* `token_identity`: the ids the trainer trains on are not the ids the rollout sampled
  (post-processing in between, huggingface/trl#7039);
* `truncation`: the trainer trains on a prefix of what was sampled: a cut no clip ratio counts
  (verl-project/verl#7823);
* `finish_lost`: a sample without a finish reason that does not end on eos: it was cut at the
  length limit or stopped by something else, and nothing downstream can tell (verl#7823);
* `eos_ignored`: the rollout sampled more tokens after an eos id of the model's full eos set
  (Blaizzy/mlx-vlm#2112: generation_config's eos list replaced by the tokenizer's);
* `image_features`: the trainer's image features for a sample differ from what the rollout's
  processor produced, or are missing (microsoft/agent-lightning#560).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Cause:
    name: str
    count: str  # the batch count that holds its failing samples (the hooks' name)
    severity: str
    why: str
    action: str


CAUSE_LIST = (
    Cause("length_parity", "length_mismatch", "error",
          "log-probs and token ids do not pair up one to one: from the first unpaired position on, each log-prob is "
          "scored against another token, so the importance ratio, the KL and the loss of these samples are computed "
          "on the wrong tokens",
          "check where the rollout's log-probs are collected (a prompt log-prob left in, or the last token's log-prob "
          "dropped) and that the trainer's log-probs are sliced to the completion ids; the sample audit shows the "
          "tokens where the pairs end"),
    Cause("rerender", "rerender_mismatch", "error",
          "the trainer renders these samples' messages into other token ids than the prompt the rollout sampled from: "
          "the trainer scores completions in a context the policy never saw",
          "render prompts once and pass the same token ids to both sides, or give the trainer the rollout's chat "
          "template and template kwargs; the sample audit shows both renders around the first differing token"),
    Cause("token_identity", "ids_mismatch", "error",
          "the trainer trains on other token ids than the rollout sampled: the rollout's log-probs belong to the "
          "sampled ids, so from the first difference on the ratio and the loss pair each log-prob with another token "
          "(huggingface/trl#7039)",
          "find the step between sampling and training that rewrites the completion (stripping or re-adding eos, "
          "decoding and re-tokenizing, trimming stop strings) and train on the sampled ids; the sample audit shows "
          "both sides' tokens where they part"),
    Cause("truncation", "truncated", "warning",
          "the trainer trains on only the first part of what the rollout sampled: the end of these samples (their "
          "answer, their eos) never reaches the loss, and no clip ratio counts them as cut (verl-project/verl#7823)",
          "make the trainer's response length limit at least the rollout's max_tokens, or mark the cut samples as "
          "truncated (overlong filtering); the sample audit shows where the trained ids stop"),
    Cause("finish_lost", "finish_lost", "warning",
          "these samples carry no finish reason and do not end on an eos id: they were cut at the length limit (or "
          "stopped by something else), and nothing downstream can tell them from complete answers: clip ratios read "
          "0 while responses are cut (verl-project/verl#7823)",
          "pass the engine's finish_reason into each RolloutRecord (vLLM: CompletionOutput.finish_reason) and count "
          "'length' samples as truncated"),
    Cause("eos_ignored", "eos_ignored", "error",
          "the rollout sampled tokens after an end-of-sequence id of the model's eos set: the engine did not stop "
          "where the model ended (only the tokenizer's eos honoured, not the generation config's list: "
          "Blaizzy/mlx-vlm#2112), so the trainer learns from text after the end",
          "give the engine every eos id of generation_config.json (vLLM reads it unless generation_config='vllm'; "
          "stop_token_ids otherwise); if the tokens after it are context you spliced in (tool outputs), mark them "
          "with completion_mask 0; the sample audit shows the eos and what followed"),
    Cause("image_features", "images_mismatch", "error",
          "the trainer's image features for these samples differ from what the rollout's processor produced (another "
          "resolution, another image, or none at all): the policy is trained on inputs it did not sample from "
          "(microsoft/agent-lightning#560: the training forward ran without the image features)",
          "pass the same images (and processor settings: min/max pixels) to the training forward as to the rollout, "
          "and check that pixel_values and image_grid_thw reach the model; the sample audit shows both sides' grids "
          "and image-token counts"),
)
CAUSES = {c.name: c for c in CAUSE_LIST}


class AuditCounts(Protocol):
    id: int
    step: int | None
    samples: int
    counts: dict


@dataclass(frozen=True)
class Finding:
    cause: str
    audit_id: int  # the newest failing batch
    step: int | None
    samples: int
    failing: int  # of `samples`, in that batch
    failing_batches: int  # in the window


def failing_count(audit: AuditCounts, cause: str) -> int:
    return int((audit.counts or {}).get(CAUSES[cause].count, 0) or 0)


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


def shows(sample: Any, cause: str) -> bool:
    """Whether a stored sample is an example of `cause`."""
    return {
        "length_parity": lambda: bool(sample.length_mismatch),
        "rerender": lambda: sample.rerender_first_diff is not None,
        "token_identity": lambda: bool(sample.ids_mismatch),
        "truncation": lambda: bool(sample.truncated),
        "finish_lost": lambda: bool(sample.finish_lost),
        "eos_ignored": lambda: sample.eos_ignored_at is not None,
        "image_features": lambda: bool(sample.images_mismatch),
    }[cause]()


def example_of(samples: list[Any], cause: str) -> Any:
    """The batch's worst sample showing `cause` (samples worst first), or None."""
    return next((s for s in samples if shows(s, cause)), None)


def title_of(finding: Finding, example: Any) -> str:
    where = f"batch at step {finding.step}" if finding.step is not None else f"audited batch {finding.audit_id}"
    of = f"{finding.failing} of {finding.samples} samples"
    what = {
        "length_parity": f"log-probs misaligned with token ids in {of}, {where}{_length_shape(example)}",
        "rerender": f"trainer re-render differs from the rollout's prompt in {of}, {where}"
                    + (f" (first at prompt token {example.rerender_first_diff})" if example is not None else ""),
        "token_identity": f"trainer trains on other token ids than the rollout sampled in {of}, {where}"
                          + (f" (first at completion token {example.ids_first_diff})"
                             if example is not None and example.ids_first_diff is not None else ""),
        "truncation": f"trainer trains on a cut completion in {of}, {where}"
                      + (f" ({example.n_trainer_ids} of {example.n_ids} sampled ids)" if example is not None else ""),
        "finish_lost": f"finish reason lost: {of} end without eos and say nothing of why, {where}",
        "eos_ignored": f"rollout sampled past an eos id in {of}, {where}"
                       + (f" (eos at completion token {example.eos_ignored_at})" if example is not None else ""),
        "image_features": f"trainer image features differ from the rollout's in {of}, {where}{_image_shape(example)}",
    }
    return what[finding.cause]


def _length_shape(example: Any) -> str:
    if example is None:
        return ""
    counts = [f"{n} {side} log-probs" for side, n in (("rollout", example.n_rollout_logprobs),
                                                       ("trainer", example.n_trainer_logprobs)) if n is not None]
    return f" (e.g. {' and '.join(counts)} for {example.n_ids} ids)" if counts else ""


def _image_shape(example: Any) -> str:
    if example is None or example.rollout_images is None or example.trainer_images is None:
        return ""
    return f" (rollout {describe_images(example.rollout_images)}; trainer {describe_images(example.trainer_images)})"


def describe_images(summary: dict) -> str:
    """`1 image 1x16x16, 64 image tokens`, or `no image features`."""
    n = summary.get("images") or 0
    if not n:
        return "no image features"
    grids = ", ".join("x".join(str(v) for v in row) for row in (summary.get("grid") or [])[:4])
    tokens = summary.get("image_tokens")
    return f"{n} image{'s' if n != 1 else ''} {grids}" + ("" if tokens is None else f", {tokens} image tokens")


def detail_of(finding: Finding, example: Any, clear_batches: int) -> dict[str, Any]:
    cause = CAUSES[finding.cause]
    detail: dict[str, Any] = {
        "cause": cause.name, "why": cause.why, "action": cause.action,
        "audit_id": finding.audit_id, "step": finding.step, "samples": finding.samples,
        "failing_samples": finding.failing, "failing_batches": finding.failing_batches,
        "window_batches": clear_batches,
        "resolves_after": f"{clear_batches} audited batches in a row without this failure",
    }
    if example is not None:
        detail["example"] = {name: getattr(example, name) for name in EXAMPLE_FIELDS}
    return detail


EXAMPLE_FIELDS = ("sample_index", "n_ids", "n_rollout_logprobs", "n_trainer_logprobs", "rerender_first_diff",
                  "n_trainer_ids", "ids_first_diff", "eos_ignored_at", "rollout_images", "trainer_images", "windows")
