"""Per-sample audit of one rollout batch: what a batch average hides (docs/design.md, "Per-sample audit").

Per sample:

* **length parity**: as many log-probs as completion ids, on the rollout's side and on the
  trainer's (an off-by-one shifts every log-prob onto the wrong token, eval-protocol
  python-sdk#457);
* **re-render**: the first index where the trainer's own render of the sample's messages differs
  from the prompt ids the rollout sampled from (tool-call messages re-rendered differently,
  verl#3960; a reasoning template dropping ``<think>``, NVIDIA-NeMo/RL#2822);
* **token identity**: the ids the trainer trains on against the ids the rollout sampled (its
  ``completion_ids``, and the digest taken where they were sampled): post-processing in between
  breaks the token <-> log-prob pairing (huggingface/trl#7039); a trainer that keeps only a prefix
  is a **truncation** nobody flags (verl#7823);
* **finish**: why the completion ended (`contract.FINISH_REASONS`): on an eos id (the full set:
  the tokenizer's and the generation config's), cut at the length limit, on another stop, or
  unknown; a sample with no finish reason that does not end on eos may have been cut unseen
  (**finish lost**); an eos id the rollout sampled *past* (more sampled tokens follow it) is an
  eos the engine did not honour (**eos ignored**);
* **image features** (VLMs): the rollout's summary of its processor output for the sample's images
  against the trainer's (a training forward without the image features,
  microsoft/agent-lightning#560).

Bounded: the batch's counts plus only the `top_k` worst samples, each with the token strings of
`window` tokens either side of its first mismatch. Pure: no I/O; `ParityMonitor.audit_rollout_batch`
sends the result through the worker thread.

Usage::

    audit = audit_batch(records, tokenizer, trainer_logprobs=per_token_logps, trainer_ids=ids, step=step)
    audit["counts"]   # {"samples": 64, "length_mismatch": 1, "rerender_mismatch": 0, ...}
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from . import contract
from .alignment import RolloutRecord, first_diff, render_prompts, tokenizer_of, trainer_eos_set
from .sample_identity import images_differ


def audit_batch(
    records: Sequence[RolloutRecord],
    processor: Any = None,
    *,
    trainer_logprobs: Any = None,
    trainer_ids: Any = None,
    trainer_images: Sequence[dict[str, Any] | None] | None = None,
    trainer_eos_ids: Iterable[int] | None = None,
    generation_config: Any = None,
    step: int | None = None,
    top_k: int = contract.AUDIT_DEFAULT_TOP_K,
    window: int = contract.AUDIT_DEFAULT_WINDOW,
    rendered: Sequence[list[int] | None] | None = None,
) -> dict[str, Any]:
    """The audit of one batch as it goes on the wire: ``{"step", "counts", "samples"}``.

    ``trainer_logprobs``: per record a list/array/tensor of the trainer's log-probs of the
    completion tokens (None for a record it did not score). A padded ``[batch, T]`` array has no
    per-sample length, so only the rollout's log-probs are checked then.
    ``trainer_ids``: per record the completion ids the trainer trains on (unpadded; None for a
    record it does not say), for the token identity and truncation checks.
    ``trainer_images``: per record ``sample_identity.image_features`` of the trainer's own
    processing of the sample (None: not known), compared with ``RolloutRecord.images``.
    ``trainer_eos_ids``: what counts as eos; default: the processor's eos id and every eos id of
    ``generation_config``.
    ``processor``: the trainer's processor; without it there is no re-render check and token
    windows show ids. ``rendered``: `alignment.render_prompts(records, processor)` if computed already.
    """
    top_k = min(max(0, int(top_k)), contract.AUDIT_MAX_SAMPLES)
    window = min(max(0, int(window)), contract.AUDIT_MAX_WINDOW)
    records = list(records)
    tokenizer = tokenizer_of(processor) if processor is not None else None
    if rendered is None:
        rendered = render_prompts(records, processor) if processor is not None else [None] * len(records)
    logprob_counts = _trainer_row_lengths(trainer_logprobs, len(records))
    ids_rows = _per_record(trainer_ids, len(records), "trainer_ids")
    image_rows = _per_record(trainer_images, len(records), "trainer_images")
    eos = trainer_eos_set(tokenizer, trainer_eos_ids, generation_config)
    findings = [_audit_sample(i, r, rendered[i], logprob_counts[i], ids_rows[i], image_rows[i], eos)
                for i, r in enumerate(records)]
    worst = sorted((f for f in findings if any(_severity(f))), key=_severity, reverse=True)[:top_k]
    return {
        "step": step,
        "counts": _counts(findings),
        "samples": [_with_windows(f, records[f["index"]], rendered[f["index"]], ids_rows[f["index"]], tokenizer, window)
                    for f in worst],
    }


def _trainer_row_lengths(trainer_logprobs: Any, batch_size: int) -> list[int | None]:
    """Per record, how many log-probs the trainer gave (None: unknown, or a padded dense array)."""
    if getattr(trainer_logprobs, "ndim", 1) == 2:
        return [None] * batch_size
    return [None if row is None else len(row) for row in _per_record(trainer_logprobs, batch_size, "trainer_logprobs")]


def _per_record(rows: Any, batch_size: int, name: str) -> list[Any]:
    if rows is None:
        return [None] * batch_size
    rows = list(rows)
    if len(rows) != batch_size:
        raise ValueError(f"{name} has {len(rows)} rows for {batch_size} records")
    return rows


def _audit_sample(index: int, record: RolloutRecord, rendered_ids: list[int] | None, trainer_logprob_count: int | None,
                  trainer_row: Any, trainer_images: dict[str, Any] | None, eos: set[int] | None) -> dict[str, Any]:
    ids = [int(i) for i in record.completion_ids]
    n_rollout = None if record.rollout_logprobs is None else len(record.rollout_logprobs)
    length_mismatch = any(n is not None and n != len(ids) for n in (n_rollout, trainer_logprob_count))
    trained = None if trainer_row is None else [int(i) for i in _as_list(trainer_row)]
    identity = _identity(record, ids, trained, eos)
    finish = finish_of(record, eos)
    return {
        "index": index,
        "finish": finish,
        "finish_reason": (record.finish_reason or None) and str(record.finish_reason)[:32],
        "n_ids": len(ids),
        "n_rollout_logprobs": n_rollout,
        "n_trainer_logprobs": trainer_logprob_count,
        "length_mismatch": length_mismatch,
        "prompt_len": len(record.prompt_ids),
        "rendered_len": None if rendered_ids is None else len(rendered_ids),
        "rerender_first_diff": None if rendered_ids is None else first_diff(list(record.prompt_ids), rendered_ids),
        "n_trainer_ids": None if trained is None else len(trained),
        **identity,
        "finish_lost": not record.finish_reason and finish == "unknown" and eos is not None and bool(ids)
                       and not identity["truncated"],
        "eos_ignored_at": _eos_sampled_past(ids, record.completion_mask, eos),
        **_image_check(record.images, trainer_images),
    }


def _as_list(row: Any) -> Any:
    if hasattr(row, "detach"):  # a torch row, possibly on an accelerator
        row = row.detach().cpu()
    return row.tolist() if hasattr(row, "tolist") else row


def _identity(record: RolloutRecord, sampled: list[int], trained: list[int] | None,
              eos: set[int] | None) -> dict[str, Any]:
    """The ids the trainer trains on against the sampled ones: equal, a prefix (the trainer cut
    the sample: `truncated`), or different from index `ids_first_diff` on (`ids_mismatch`). The
    sampling-time digest also catches ids rewritten before they reached the trainer."""
    out: dict[str, Any] = {"ids_mismatch": None, "ids_first_diff": None, "truncated": False}
    if trained is not None:
        at = first_diff(sampled, trained)
        out["ids_mismatch"] = False
        if at is not None and len(trained) < len(sampled) and at == len(trained) and \
                not set(sampled[at:]) <= (eos or set()):
            out["truncated"] = True  # a prefix; only eos ids dropped would be post-processing instead
        elif at is not None:
            out["ids_mismatch"], out["ids_first_diff"] = True, at
    if record.completion_ids_digest is not None and not out["truncated"] and not out["ids_mismatch"]:
        out["ids_mismatch"] = contract.token_ids_digest(trained if trained is not None else sampled) \
            != record.completion_ids_digest
    return out


def _eos_sampled_past(ids: list[int], mask: Sequence[int] | None, eos: set[int] | None) -> int | None:
    """The first eos id the rollout sampled another token right after (context spliced in after a
    turn's eos, completion_mask 0, is a turn ending, not this)."""
    if not eos or len(ids) < 2 or not eos.intersection(ids[:-1]):
        return None
    sampled = [True] * len(ids) if mask is None else [bool(m) for m in mask] + [True] * (len(ids) - len(mask))
    for i in range(len(ids) - 1):
        if ids[i] in eos and sampled[i] and sampled[i + 1]:
            return i
    return None


def _image_check(rollout: dict[str, Any] | None, trainer: dict[str, Any] | None) -> dict[str, Any]:
    if rollout is None or trainer is None:
        return {"images_mismatch": None, "rollout_images": None, "trainer_images": None}
    return {"images_mismatch": images_differ(rollout, trainer),
            "rollout_images": _bounded_images(rollout), "trainer_images": _bounded_images(trainer)}


def _bounded_images(summary: dict[str, Any]) -> dict[str, Any]:
    return {"images": int(summary.get("images") or 0),
            "grid": [[int(v) for v in row][:contract.AUDIT_MAX_GRID_DIMS]
                     for row in (summary.get("grid") or [])[:contract.AUDIT_MAX_IMAGES]],
            "image_tokens": None if summary.get("image_tokens") is None else int(summary["image_tokens"])}


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


def _severity(finding: dict[str, Any]) -> tuple[int, ...]:
    """Worst first: log-probs off the ids, trained ids off the sampled ones, a re-render that
    differs early, image features that differ, an eos sampled past, a cut nobody flags, a lost
    finish reason, then an engine cut."""
    rerender = finding["rerender_first_diff"]
    return (int(finding["length_mismatch"]), int(bool(finding["ids_mismatch"])),
            0 if rerender is None else 1_000_000 - min(rerender, 999_999),
            int(bool(finding["images_mismatch"])), int(finding["eos_ignored_at"] is not None),
            int(finding["truncated"]), int(finding["finish_lost"]), int(finding["finish"] == "length"))


def _counts(findings: list[dict[str, Any]]) -> dict[str, int]:
    counts = {
        "samples": len(findings),
        "length_mismatch": sum(f["length_mismatch"] for f in findings),
        "rerender_checked": sum(f["rendered_len"] is not None for f in findings),
        "rerender_mismatch": sum(f["rerender_first_diff"] is not None for f in findings),
        "ids_checked": sum(f["ids_mismatch"] is not None for f in findings),
        "ids_mismatch": sum(bool(f["ids_mismatch"]) for f in findings),
        "truncated": sum(f["truncated"] for f in findings),
        "finish_lost": sum(f["finish_lost"] for f in findings),
        "eos_ignored": sum(f["eos_ignored_at"] is not None for f in findings),
        "images_checked": sum(f["images_mismatch"] is not None for f in findings),
        "images_mismatch": sum(bool(f["images_mismatch"]) for f in findings),
    }
    for reason in contract.FINISH_REASONS:
        counts[f"finish_{reason}"] = sum(f["finish"] == reason for f in findings)
    return counts


# ---------------------------------------------------------------- token windows


def _with_windows(finding: dict[str, Any], record: RolloutRecord, rendered_ids: list[int] | None, trainer_row: Any,
                  tokenizer: Any, window: int) -> dict[str, Any]:
    windows = []
    ids = [int(i) for i in record.completion_ids]
    at = finding["rerender_first_diff"]
    if at is not None and rendered_ids is not None:
        windows.append(_window("rerender", at, list(record.prompt_ids), rendered_ids, tokenizer, window))
    if finding["length_mismatch"]:
        # The first position where ids and log-probs stop pairing up one to one.
        counts = [n for n in (finding["n_rollout_logprobs"], finding["n_trainer_logprobs"]) if n is not None]
        at = min([finding["n_ids"], *counts])
        windows.append(_window("length", at, ids, None, tokenizer, window))
    if finding["ids_first_diff"] is not None or finding["truncated"]:
        at = finding["ids_first_diff"] if finding["ids_first_diff"] is not None else finding["n_trainer_ids"]
        windows.append(_window("ids", at, ids, [int(i) for i in _as_list(trainer_row)], tokenizer, window))
    if finding["eos_ignored_at"] is not None:
        windows.append(_window("eos", finding["eos_ignored_at"], ids, None, tokenizer, window))
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
