"""Per-sample audit of one rollout batch: what a batch average hides (docs/design.md, "Per-sample audit").

Per sample:

* **length parity**: as many log-probs as completion ids, on the rollout's side and on the
  trainer's (an off-by-one shifts every log-prob onto the wrong token, eval-protocol
  python-sdk#457);
* **re-render**: the first index where the trainer's own render of the sample's messages differs
  from the prompt ids the rollout sampled from (tool-call messages re-rendered differently,
  verl#3960; a reasoning template dropping ``<think>``, NVIDIA-NeMo/RL#2822);
* **finish**: why the completion ended (`contract.FINISH_REASONS`): on an eos id, cut at the
  length limit, on another stop, or unknown.

Bounded: the batch's counts plus only the `top_k` worst samples, each with the token strings of
`window` tokens either side of its first mismatch. Pure: no I/O; `ParityMonitor.audit_rollout_batch`
sends the result through the worker thread.

Usage::

    audit = audit_batch(records, tokenizer, trainer_logprobs=per_token_logps, step=step)
    audit["counts"]   # {"samples": 64, "length_mismatch": 1, "rerender_mismatch": 0, ...}
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from . import contract
from .alignment import RolloutRecord, first_diff, render_prompts, tokenizer_of, trainer_eos_set


def audit_batch(
    records: Sequence[RolloutRecord],
    processor: Any = None,
    *,
    trainer_logprobs: Any = None,
    trainer_eos_ids: Iterable[int] | None = None,
    step: int | None = None,
    top_k: int = contract.AUDIT_DEFAULT_TOP_K,
    window: int = contract.AUDIT_DEFAULT_WINDOW,
    rendered: Sequence[list[int] | None] | None = None,
) -> dict[str, Any]:
    """The audit of one batch as it goes on the wire: ``{"step", "counts", "samples"}``.

    ``trainer_logprobs``: per record a list/array/tensor of the trainer's log-probs of the
    completion tokens (None for a record it did not score). A padded ``[batch, T]`` array has no
    per-sample length, so only the rollout's log-probs are checked then.
    ``processor``: the trainer's processor; without it there is no re-render check and token
    windows show ids. ``rendered``: `alignment.render_prompts(records, processor)` if computed already.
    """
    top_k = min(max(0, int(top_k)), contract.AUDIT_MAX_SAMPLES)
    window = min(max(0, int(window)), contract.AUDIT_MAX_WINDOW)
    records = list(records)
    tokenizer = tokenizer_of(processor) if processor is not None else None
    if rendered is None:
        rendered = render_prompts(records, processor) if processor is not None else [None] * len(records)
    trainer_rows = _trainer_row_lengths(trainer_logprobs, len(records))
    eos = trainer_eos_set(tokenizer, trainer_eos_ids)
    findings = [_audit_sample(i, r, rendered[i], trainer_rows[i], eos) for i, r in enumerate(records)]
    worst = sorted((f for f in findings if _severity(f) > (0, 0, 0)), key=_severity, reverse=True)[:top_k]
    return {
        "step": step,
        "counts": _counts(findings),
        "samples": [_with_windows(f, records[f["index"]], rendered[f["index"]], tokenizer, window) for f in worst],
    }


def _trainer_row_lengths(trainer_logprobs: Any, batch_size: int) -> list[int | None]:
    """Per record, how many log-probs the trainer gave (None: unknown, or a padded dense array)."""
    if trainer_logprobs is None or getattr(trainer_logprobs, "ndim", 1) == 2:
        return [None] * batch_size
    rows = list(trainer_logprobs)
    if len(rows) != batch_size:
        raise ValueError(f"trainer_logprobs has {len(rows)} rows for {batch_size} records")
    return [None if row is None else len(row) for row in rows]


def _audit_sample(index: int, record: RolloutRecord, trainer_ids: list[int] | None, trainer_logprob_count: int | None,
                  eos: set[int] | None) -> dict[str, Any]:
    n_ids = len(record.completion_ids)
    n_rollout = None if record.rollout_logprobs is None else len(record.rollout_logprobs)
    length_mismatch = any(n is not None and n != n_ids for n in (n_rollout, trainer_logprob_count))
    rerender_at = None if trainer_ids is None else first_diff(list(record.prompt_ids), trainer_ids)
    return {
        "index": index,
        "finish": finish_of(record, eos),
        "finish_reason": (record.finish_reason or None) and str(record.finish_reason)[:32],
        "n_ids": n_ids,
        "n_rollout_logprobs": n_rollout,
        "n_trainer_logprobs": trainer_logprob_count,
        "length_mismatch": length_mismatch,
        "prompt_len": len(record.prompt_ids),
        "rendered_len": None if trainer_ids is None else len(trainer_ids),
        "rerender_first_diff": rerender_at,
    }


def finish_of(record: RolloutRecord, eos: set[int] | None) -> str:
    """`contract.FINISH_REASONS`: vLLM's finish_reason "length" is a cut; one of the trainer's eos
    ids as the last token is eos (whatever the engine said); "stop" on any other id is another
    stop (a stop string, or a stop id the trainer does not count as eos)."""
    if record.finish_reason == "length":
        return "length"
    last = record.completion_ids[-1] if record.completion_ids else None
    if eos is None:  # without the trainer's eos ids an eos and another stop look alike
        return "unknown"
    if last in eos:
        return "eos"
    # "stop_string": the vLLM adapter's name for a stop string (integrations/vllm.py).
    return "stop" if record.finish_reason in ("stop", "stop_string") else "unknown"


def _severity(finding: dict[str, Any]) -> tuple[int, int, int]:
    """Worst first: log-probs off the ids, then a re-render that differs early, then a cut."""
    rerender = finding["rerender_first_diff"]
    return (int(finding["length_mismatch"]),
            0 if rerender is None else 1_000_000 - min(rerender, 999_999),
            int(finding["finish"] == "length"))


def _counts(findings: list[dict[str, Any]]) -> dict[str, int]:
    counts = {
        "samples": len(findings),
        "length_mismatch": sum(f["length_mismatch"] for f in findings),
        "rerender_checked": sum(f["rendered_len"] is not None for f in findings),
        "rerender_mismatch": sum(f["rerender_first_diff"] is not None for f in findings),
    }
    for reason in contract.FINISH_REASONS:
        counts[f"finish_{reason}"] = sum(f["finish"] == reason for f in findings)
    return counts


# ---------------------------------------------------------------- token windows


def _with_windows(finding: dict[str, Any], record: RolloutRecord, trainer_ids: list[int] | None, tokenizer: Any,
                  window: int) -> dict[str, Any]:
    windows = []
    at = finding["rerender_first_diff"]
    if at is not None and trainer_ids is not None:
        windows.append(_window("rerender", at, list(record.prompt_ids), trainer_ids, tokenizer, window))
    if finding["length_mismatch"]:
        # The first position where ids and log-probs stop pairing up one to one.
        counts = [n for n in (finding["n_rollout_logprobs"], finding["n_trainer_logprobs"]) if n is not None]
        at = min([finding["n_ids"], *counts])
        windows.append(_window("length", at, list(record.completion_ids), None, tokenizer, window))
    return {**finding, "windows": windows}


def _window(kind: str, at: int, rollout_ids: list[int], trainer_ids: list[int] | None, tokenizer: Any,
            width: int) -> dict[str, Any]:
    start = max(0, at - width)
    return {
        "kind": kind,
        "at": at,
        "start": start,
        "rollout": token_strings(tokenizer, rollout_ids[start:at + width + 1]),
        "trainer": None if trainer_ids is None else token_strings(tokenizer, trainer_ids[start:at + width + 1]),
    }


def token_strings(tokenizer: Any, ids: list[int]) -> list[str]:
    """Each id as the text it decodes to on its own (cut to `contract.AUDIT_MAX_TOKEN_CHARS`);
    the raw token when decoding fails, ``<id N>`` without a tokenizer."""
    texts: list[Any] = []
    if tokenizer is not None:
        try:  # one call for the window
            texts = list(tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False))
        except Exception:
            texts = []
        if len(texts) != len(ids):
            texts = [_raw_token(tokenizer, i) for i in ids]
    else:
        texts = [None] * len(ids)
    return [_clip(t if isinstance(t, str) else f"<id {i}>") for i, t in zip(ids, texts)]


def _raw_token(tokenizer: Any, token_id: int) -> str | None:
    try:
        token = tokenizer.convert_ids_to_tokens(int(token_id))
    except Exception:
        return None
    return token if isinstance(token, str) else None


def _clip(text: str) -> str:
    limit = contract.AUDIT_MAX_TOKEN_CHARS
    return text if len(text) <= limit else text[:limit - 1] + "…"
