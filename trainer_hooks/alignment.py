"""Per-batch alignment metrics between a rollout's view of a batch and the trainer's.

The metric names are part of the API (docs/design.md, "Alignment metrics").
Two kinds of checks live here:

* token checks that need the trainer's processor (re-render, decode, eos, vocab). They are the only
  ones that catch a template or tokenizer mismatch in a token-in/token-out pipeline, where both
  sides score the same ids and log-prob metrics stay clean;
* numeric checks on log-probs (ratios, KL estimators), vectorised with numpy or torch: the two
  sides padded into ``[batch, max_len]`` arrays, then compressed to the scored tokens.

Usage::

    records = [RolloutRecord(messages=msgs, prompt_ids=p, completion_ids=c,
                             rollout_logprobs=lp, policy_version=v) for ...]
    metrics = compute_alignment_metrics(records, tokenizer, trainer_logprobs=per_token_logps,
                                        trainer_policy_version=step)
    monitor.log(metrics, step)

Performance: the numeric part (lists or arrays in, padding included, metrics dict out) is the part
docs/design.md's "< 10 ms for 64 x 1,024 tokens" target covers; ``bench/alignment.py`` measures it.
The re-render and decode checks run the tokenizer and cost what the tokenizer costs; they are
de-duplicated per batch (GRPO repeats each prompt ``num_generations`` times) and decoded in one
batched call.

numpy and torch are imported lazily: this module imports in a process that has neither, and then
computes every metric except the log-prob ones.
"""

from __future__ import annotations

import array
import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

# exp() of a larger log-ratio overflows float32; verl clamps the log-ratio the same way.
_LOG_RATIO_CLAMP = 20.0
# A token whose importance ratio leaves this band is what a token-level mask drops (`align/is_masked_frac`):
# verl's IcePop preset (RolloutCorrectionConfig.decoupled_token_is_icepop) masks outside [0.5, 5].
IS_MASK_BAND = (0.5, 5.0)
# Fewer scored tokens than this make a correlation noise, not a measurement.
PEARSON_MIN_TOKENS = 16
# A side whose log-probs vary less than this (variance per token, nats^2) is constant: no correlation.
_CONSTANT = 1e-12


@dataclass(kw_only=True)
class RolloutRecord:
    """What a rollout worker produced for one sequence (keyword-only fields).

    ``completion_mask`` marks sampled tokens (1) against context the worker spliced in, e.g. tool
    outputs (0); masked tokens are ignored by every per-token metric.
    ``completion_text`` is the text the rollout side decoded, when it sent one (vLLM's
    ``output.text``, which skips special tokens).
    ``completion_ids_digest``: ``contract.token_ids_digest`` of the ids as sampled, computed where
    they were sampled (the vLLM adapter fills it): post-processing after that point shows.
    ``images``: ``sample_identity.image_features`` of what the rollout's processor produced for the
    sample's images (VLMs).
    """

    messages: list[dict[str, Any]] | None = None
    prompt_ids: list[int]
    completion_ids: list[int]
    rollout_logprobs: list[float] | None = None
    finish_reason: str | None = None
    policy_version: int | None = None
    completion_mask: list[int] | None = None
    tools: list[Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    completion_text: str | None = None
    completion_ids_digest: str | None = None
    images: dict[str, Any] | None = None


def compute_alignment_metrics(
    records: Sequence[RolloutRecord],
    processor: Any = None,
    *,
    trainer_logprobs: Any = None,
    rollout_eos_ids: Iterable[int] | None = None,
    trainer_eos_ids: Iterable[int] | None = None,
    rollout_decode: Callable[[list[int]], str] | None = None,
    trainer_policy_version: int | None = None,
    is_clip: float = 2.0,
    backend: str | None = None,
    rendered: Sequence[list[int] | None] | None = None,
    generation_config: Any = None,
) -> dict[str, float]:
    """Compute docs/design.md's alignment metrics for one batch; metrics that cannot be computed are omitted.

    ``trainer_logprobs``: per record a list/array of the trainer's log-probs of the completion
    tokens (``None`` for a record it did not score), or one ``[batch, T]`` array/tensor,
    left-aligned with the completions. ``rollout_eos_ids`` defaults to what ``finish_reason``
    says ("stop" = ended on eos); ``trainer_eos_ids`` to the processor's eos id with every eos id of
    ``generation_config`` (the model's full eos set: a list in most chat models).
    ``rollout_decode(ids) -> str`` is compared with ``processor.decode(ids)``; a record's
    ``completion_text`` with ``processor.decode(ids, skip_special_tokens=True)``.
    ``backend``: "numpy" or "torch" to force one; by default torch when the trainer's log-probs
    are a tensor (they stay on their device), else numpy, else torch.
    ``rendered``: ``render_prompts(records, processor)`` when the caller has it already (the
    per-sample audit uses the same renders).
    """
    records = list(records)
    if not records:
        return {}
    tokenizer = tokenizer_of(processor)
    metrics: dict[str, float] = {}
    if processor is not None:
        metrics.update(_rerender_metrics(records, rendered if rendered is not None else render_prompts(records, processor)))
        metrics.update(_decode_metrics(records, tokenizer, rollout_decode))
        metrics.update(_out_of_vocab_metrics(records, tokenizer))
    metrics.update(_eos_metrics(records, trainer_eos_set(tokenizer, trainer_eos_ids, generation_config),
                                rollout_eos_ids))
    metrics.update(_finish_metrics(records))
    metrics.update(_staleness_metrics(records, trainer_policy_version))
    if trainer_logprobs is not None:
        metrics.update(_logprob_metrics(records, trainer_logprobs, is_clip, backend))
    return metrics


# ---------------------------------------------------------------- token checks (need the processor)


def tokenizer_of(processor: Any) -> Any:
    # Multimodal processors wrap the tokenizer; decode/vocab/eos live on it.
    return getattr(processor, "tokenizer", None) or processor


def render_prompts(records: Sequence[RolloutRecord], processor: Any) -> list[list[int] | None]:
    """Per record, the trainer's render of its messages (None: no messages, or the template failed).
    One render per distinct prompt: GRPO repeats each prompt `num_generations` times."""
    cache: dict[str, list[int] | None] = {}
    out: list[list[int] | None] = []
    for record in records:
        if not record.messages:
            out.append(None)
            continue
        key = _render_key(record)
        if key not in cache:
            cache[key] = _render(processor, record)
        out.append(cache[key])
    return out


def _rerender_metrics(records: list[RolloutRecord], rendered: Sequence[list[int] | None]) -> dict[str, float]:
    checked = mismatched = 0
    first_diffs: list[int] = []
    for record, trainer_ids in zip(records, rendered):
        if trainer_ids is None:
            continue
        checked += 1
        diff = first_diff(list(record.prompt_ids), trainer_ids)
        if diff is not None:
            mismatched += 1
            first_diffs.append(diff)
    if not checked:
        return {}
    metrics = {"align/prompt_rerender_mismatch_frac": mismatched / checked}
    if first_diffs:
        metrics["align/prompt_first_diff_pos_mean"] = sum(first_diffs) / len(first_diffs)
    return metrics


def _render_key(record: RolloutRecord) -> str:
    # default=repr: tools may be callables; their repr is stable within one batch.
    payload = [record.messages, record.tools, record.chat_template_kwargs]
    return json.dumps(payload, sort_keys=True, default=repr, ensure_ascii=False)


def _render(processor: Any, record: RolloutRecord) -> list[int] | None:
    kwargs = dict(record.chat_template_kwargs or {})
    if record.tools is not None:
        kwargs["tools"] = record.tools
    try:
        out = processor.apply_chat_template(
            record.messages, add_generation_prompt=True, tokenize=True, **kwargs
        )
    except Exception as exc:  # a template that cannot render the rollout's messages is a finding, not a crash
        logger.warning("trainer processor could not render a rollout prompt: %s", exc)
        return None
    return _as_id_list(out)


def _as_id_list(out: Any) -> list[int]:
    # transformers v5 returns a BatchEncoding (return_dict=True is the default), v4 a list;
    # some processors return a batch of one, some a tensor.
    if isinstance(out, Mapping):
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    if out and isinstance(out[0], (list, tuple)):
        out = out[0]
    return [int(i) for i in out]


def first_diff(a: list[int], b: list[int]) -> int | None:
    """First index where the two id lists differ (the shorter length if one is a prefix); None if equal."""
    if a == b:
        return None
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def _decode_metrics(
    records: list[RolloutRecord], tokenizer: Any, rollout_decode: Callable[[list[int]], str] | None
) -> dict[str, float]:
    if not hasattr(tokenizer, "decode"):
        return {}
    if rollout_decode is not None:
        ids = [list(r.completion_ids) for r in records]
        rollout_texts = [_safe_call(rollout_decode, i) for i in ids]
        trainer_texts = _batch_decode(tokenizer, ids, skip_special_tokens=False)
    else:
        with_text = [r for r in records if r.completion_text is not None]
        if not with_text:
            return {}
        rollout_texts = [r.completion_text for r in with_text]
        trainer_texts = _batch_decode(tokenizer, [list(r.completion_ids) for r in with_text], skip_special_tokens=True)
    # A side that cannot decode at all (None) differs from a side that can.
    mismatched = sum(1 for a, b in zip(rollout_texts, trainer_texts) if a is None or a != b)
    return {"align/decode_mismatch_frac": mismatched / len(trainer_texts)}


def _batch_decode(tokenizer: Any, ids: list[list[int]], *, skip_special_tokens: bool) -> list[str | None]:
    try:  # one call into the Rust tokenizer for the whole batch
        return list(tokenizer.batch_decode(ids, skip_special_tokens=skip_special_tokens))
    except Exception:  # e.g. an out-of-vocab id: fall back per sequence so one bad row stays one
        return [_safe_call(tokenizer.decode, i, skip_special_tokens=skip_special_tokens) for i in ids]


def _safe_call(fn: Callable[..., str], *args: Any, **kwargs: Any) -> str | None:
    try:
        return fn(*args, **kwargs)
    except Exception:
        return None


def _out_of_vocab_metrics(records: list[RolloutRecord], tokenizer: Any) -> dict[str, float]:
    try:
        vocab_size = len(tokenizer)  # includes added tokens, unlike .vocab_size
    except TypeError:
        return {}
    total = outside = 0
    for record in records:
        for token_id, keep in zip(record.completion_ids, _mask_of(record)):
            if keep:
                total += 1
                outside += not 0 <= token_id < vocab_size
    return {"align/out_of_vocab_frac": outside / total} if total else {}


def _mask_of(record: RolloutRecord) -> Iterable[int]:
    if record.completion_mask is None:
        return (1 for _ in record.completion_ids)
    return record.completion_mask


def _eos_metrics(
    records: list[RolloutRecord],
    trainer_eos: set[int] | None,
    rollout_eos_ids: Iterable[int] | None,
) -> dict[str, float]:
    if trainer_eos is None:
        return {}
    rollout_eos = set(rollout_eos_ids) if rollout_eos_ids is not None else None
    checked = disagreed = 0
    for record in records:
        if not record.completion_ids:
            continue
        last = record.completion_ids[-1]
        rollout_says_eos = _rollout_ended_on_eos(record, last, rollout_eos)
        if rollout_says_eos is None:
            continue
        checked += 1
        disagreed += rollout_says_eos != (last in trainer_eos)
    return {"align/eos_disagreement_frac": disagreed / checked} if checked else {}


def trainer_eos_set(tokenizer: Any, trainer_eos_ids: Iterable[int] | None,
                    generation_config: Any = None) -> set[int] | None:
    """What the trainer counts as eos: `trainer_eos_ids` when given, else the tokenizer's eos id
    and every eos id of the generation config (Qwen and Llama chat models list several there:
    a sample ending on the second one ended, it was not stopped by something else). None: unknown."""
    if trainer_eos_ids is not None:
        return set(trainer_eos_ids)
    eos = _ids(getattr(tokenizer, "eos_token_id", None)) | eos_ids_of(generation_config)
    return eos or None


def eos_ids_of(generation_config: Any) -> set[int]:
    """The eos ids of a GenerationConfig (or its dict): an int, a list, or none."""
    if isinstance(generation_config, Mapping):
        return _ids(generation_config.get("eos_token_id"))
    return _ids(getattr(generation_config, "eos_token_id", None))


def _ids(value: Any) -> set[int]:
    if value is None:
        return set()
    return {int(v) for v in value} if isinstance(value, (list, tuple, set)) else {int(value)}


def _rollout_ended_on_eos(record: RolloutRecord, last: int, rollout_eos: set[int] | None) -> bool | None:
    if rollout_eos is not None:
        return last in rollout_eos
    # vLLM: "stop" = stopped on an eos/stop id (kept as the last id), "length" = ran out of tokens.
    if record.finish_reason in ("stop", "length"):
        return record.finish_reason == "stop"
    return None


def _finish_metrics(records: list[RolloutRecord]) -> dict[str, float]:
    """The share the engine cut at the length limit: the true truncation rate to hold against the
    framework's own clip ratio (verl#7823 reported 0 while responses were cut at max_model_len)."""
    told = [r.finish_reason for r in records if r.finish_reason]
    return {"align/truncated_frac": sum(f == "length" for f in told) / len(told)} if told else {}


def _staleness_metrics(records: list[RolloutRecord], trainer_policy_version: int | None) -> dict[str, float]:
    if trainer_policy_version is None:
        return {}
    lags = [trainer_policy_version - r.policy_version for r in records if r.policy_version is not None]
    if not lags:
        return {}
    return {"rollout/staleness_mean": sum(lags) / len(lags), "rollout/staleness_max": float(max(lags))}


# ---------------------------------------------------------------- numeric checks (log-probs)


def _logprob_metrics(
    records: list[RolloutRecord], trainer_logprobs: Any, is_clip: float, backend: str | None
) -> dict[str, float]:
    xp = _pick_backend(backend, trainer_logprobs)
    if xp is None:
        logger.warning("neither numpy nor torch is installed: log-prob alignment metrics skipped")
        return {}
    batch = _pad_batch(records, trainer_logprobs, xp)
    if batch is None:
        return {}
    lp_train, lp_roll, mask = batch
    return _ratio_stats(lp_train, lp_roll, mask, is_clip, xp)


def _pick_backend(backend: str | None, trainer_logprobs: Any) -> str | None:
    if backend is not None:
        return backend
    if type(trainer_logprobs).__module__.startswith("torch"):
        return "torch"  # already imported by whoever made the tensor
    for name in ("numpy", "torch"):
        try:
            __import__(name)
        except ImportError:
            continue
        return name
    return None


def _pad_batch(records: list[RolloutRecord], trainer_logprobs: Any, xp: str):
    """Pad both sides into ``[B, T]`` arrays plus a boolean mask of the tokens both sides scored."""
    train_rows, train_dense = _trainer_rows(trainer_logprobs, len(records))
    lengths = [_scored_length(r, i, train_rows, train_dense) for i, r in enumerate(records)]
    width = max(lengths)
    if width == 0:
        return None
    if train_rows is not None:
        train_rows = [None if row is None else _as_list(row) for row in train_rows]
    if xp == "torch":
        return _pad_torch(records, train_rows, train_dense, lengths, width)
    return _pad_numpy(records, train_rows, train_dense, lengths, width)


def _trainer_rows(trainer_logprobs: Any, batch_size: int):
    """Split the trainer's log-probs into (per-row list, or None) and (dense [B, T] array/tensor, or None)."""
    if getattr(trainer_logprobs, "ndim", 1) == 2:
        if trainer_logprobs.shape[0] != batch_size:
            raise ValueError(f"trainer_logprobs has {trainer_logprobs.shape[0]} rows for {batch_size} records")
        return None, trainer_logprobs
    rows = list(trainer_logprobs)
    if len(rows) != batch_size:
        raise ValueError(f"trainer_logprobs has {len(rows)} rows for {batch_size} records")
    return rows, None


def _scored_length(record: RolloutRecord, index: int, train_rows, train_dense) -> int:
    """How many leading completion tokens both sides have a log-prob for."""
    if record.rollout_logprobs is None:
        return 0
    n = min(len(record.completion_ids), len(record.rollout_logprobs))
    if train_dense is not None:
        n = min(n, train_dense.shape[-1])
    else:
        n = min(n, 0 if train_rows[index] is None else len(train_rows[index]))
    if record.completion_mask is not None:
        n = min(n, len(record.completion_mask))
    return n


def _as_list(row: Any) -> Any:
    if hasattr(row, "detach"):  # a torch row, possibly on an accelerator
        return row.detach().float().cpu().tolist()
    return row


def _pad_numpy(records, train_rows, train_dense, lengths, width):
    import numpy as np

    batch = len(records)
    lp_roll = np.zeros((batch, width), dtype=np.float64)
    lp_train = np.zeros((batch, width), dtype=np.float64)
    mask = np.zeros((batch, width), dtype=bool)
    for i, (record, n) in enumerate(zip(records, lengths)):
        if n == 0:
            continue
        lp_roll[i, :n] = _float_row(record.rollout_logprobs, n)
        if train_rows is not None:
            lp_train[i, :n] = _float_row(train_rows[i], n)
        mask[i, :n] = True if record.completion_mask is None else _bool_row(record.completion_mask, n)
    if train_dense is not None:
        lp_train = _dense_numpy(train_dense, width)
    # A -inf or NaN on either side is a broken score, not a token to average in.
    mask &= np.isfinite(lp_roll) & np.isfinite(lp_train)
    return lp_train, lp_roll, mask


def _float_row(values: Any, n: int):
    """The first n values as float64; lists go through array.array, ~25% faster than np.asarray."""
    import numpy as np

    if isinstance(values, list):
        try:
            return np.frombuffer(array.array("d", _head(values, n)), dtype=np.float64)
        except TypeError:  # e.g. None entries: let numpy produce NaN / raise as it would
            pass
    return np.asarray(values[:n], dtype=np.float64)


def _bool_row(values: Any, n: int):
    """The first n mask entries, to assign into a bool array (which reads any nonzero as True);
    a 0/1 list goes through bytes(), ~3x faster than np.asarray."""
    import numpy as np

    if isinstance(values, list):
        try:
            return np.frombuffer(bytes(_head(values, n)), dtype=np.uint8)
        except (TypeError, ValueError):  # not small ints: the general path
            pass
    return np.asarray(values[:n]).astype(bool)


def _head(values: list, n: int) -> list:
    return values if len(values) == n else values[:n]  # a whole row is the usual case: no copy


def _dense_numpy(dense: Any, width: int):
    import numpy as np

    if hasattr(dense, "detach"):
        dense = dense.detach()[:, :width].double().cpu().numpy()
    return np.asarray(dense[:, :width], dtype=np.float64)


def _pad_torch(records, train_rows, train_dense, lengths, width):
    import torch

    device = train_dense.device if isinstance(train_dense, torch.Tensor) else torch.device("cpu")
    try:  # numpy turns Python lists into arrays several times faster than torch.tensor does
        lp_train, lp_roll, mask = _pad_numpy(records, train_rows, None, lengths, width)
        lp_train, lp_roll, mask = (torch.from_numpy(a).to(device) for a in (lp_train, lp_roll, mask))
    except ImportError:
        lp_train, lp_roll, mask = _pad_torch_only(records, train_rows, lengths, width)
    if train_dense is not None:
        # detach: the metrics are read-outs, and _ratio_stats works in place (no autograd graph)
        lp_train = torch.as_tensor(train_dense).detach()[:, :width].to(device=device, dtype=torch.float64)
        mask &= torch.isfinite(lp_train)
    return lp_train, lp_roll, mask


def _pad_torch_only(records, train_rows, lengths, width):
    import torch

    batch = len(records)
    lp_roll = torch.zeros((batch, width), dtype=torch.float64)
    lp_train = torch.zeros((batch, width), dtype=torch.float64)
    mask = torch.zeros((batch, width), dtype=torch.bool)
    for i, (record, n) in enumerate(zip(records, lengths)):
        if n == 0:
            continue
        lp_roll[i, :n] = torch.tensor(record.rollout_logprobs[:n], dtype=torch.float64)
        if train_rows is not None:
            lp_train[i, :n] = torch.tensor(train_rows[i][:n], dtype=torch.float64)
        mask[i, :n] = True if record.completion_mask is None else torch.tensor(record.completion_mask[:n]).bool()
    mask &= torch.isfinite(lp_roll) & torch.isfinite(lp_train)
    return lp_train, lp_roll, mask


def _ratio_stats(lp_train, lp_roll, mask, is_clip: float, xp: str) -> dict[str, float]:
    """The statistics over the scored tokens only: one compress of the padded arrays into 1-D
    arrays (row after row), then a pass or two per statistic; numpy arrays and torch tensors alike.

    Three full-size arrays in all, the rest computed in their buffers: on CPU each new one is a
    fresh mmap whose page faults cost more than the arithmetic (~0.3 ms per 64k float64 tokens on
    the loaded 2-core bench machine)."""
    lib = _array_lib(xp)
    per_seq_tokens = mask.sum(1)
    count = int(per_seq_tokens.sum())
    if count == 0:
        return {}
    train, roll = _select(lp_train, mask, xp), _select(lp_roll, mask, xp)
    stats = {}
    if count >= PEARSON_MIN_TOKENS:
        stats["align/logprob_pearson"] = _pearson(train, roll, count, lib)
    log_ratio = train - roll
    lib.clip(log_ratio, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP, out=log_ratio)
    # train and roll are scratch space from here on.
    abs_p = lib.exp(train, out=train)
    abs_p -= lib.exp(roll, out=roll)
    lib.abs(abs_p, out=abs_p)
    stats["align/prob_abs_diff_mean"] = abs_p.sum() / count
    stats["align/prob_abs_diff_max"] = abs_p.max()
    abs_lp = lib.abs(log_ratio, out=train)
    stats["align/logprob_abs_diff_mean"] = abs_lp.sum() / count
    stats["align/logprob_abs_diff_max"] = abs_lp.max()
    ratio = lib.exp(log_ratio, out=roll)
    k3 = lib.subtract(ratio, log_ratio, out=train)
    k3 -= 1.0
    ratio_sum, ratio_sq_sum = ratio.sum(), _dot(ratio, ratio, lib)
    low, high = IS_MASK_BAND
    stats.update({
        "align/kl_k1": -log_ratio.sum() / count,
        "align/kl_k3": k3.sum() / count,
        "align/is_ratio_mean": ratio_sum / count,
        # Normalised effective sample size of the token IS weights (verl's rollout_is_eff_sample_size).
        "align/is_ess": ratio_sum * ratio_sum / (count * ratio_sq_sum),
        # Counted in float64: a torch integer count over an int is float32.
        "align/is_masked_frac": ((ratio < low) | (ratio > high)).sum(dtype=ratio.dtype) / count,
        "align/is_ratio_max": ratio.max(),
        "align/is_ratio_min": ratio.min(),
        "align/is_ratio_clip_frac": (ratio > is_clip).sum(dtype=ratio.dtype) / count,
        "align/seq_is_ratio_geo_mean": _seq_geo_mean(log_ratio, mask, per_seq_tokens, xp),
    })
    return {k: v for k, v in _to_floats(stats, xp).items() if math.isfinite(v)}


def _array_lib(xp: str):
    if xp == "torch":
        import torch

        return torch
    import numpy

    return numpy


def _select(padded, mask, xp: str):
    """The masked entries, row after row, as a 1-D array (torch: masked_select, ~5x faster on CPU
    than boolean indexing)."""
    if xp == "torch":
        import torch

        return torch.masked_select(padded, mask)
    return padded[mask]


def _dot(a, b, lib):
    """Sum of the products of two 1-D arrays in one pass, without a temporary. numpy's einsum runs
    its own loop, not BLAS: numpy's BLAS threads would contend with the trainer's."""
    return lib.einsum("i,i->", a, b)


def _seq_geo_mean(log_ratio, mask, per_seq_tokens, xp: str):
    """Mean over the sequences with a scored token of exp(their mean log-ratio). Row sums in the
    compressed layout: numpy sums each row's run in place (add.reduceat, the runs all non-empty);
    torch puts the values back in place and sums along the rows, deterministic on every device
    (a weighted bincount or a float cumsum on CUDA is not)."""
    lib = _array_lib(xp)
    has_tokens = per_seq_tokens > 0
    tokens = per_seq_tokens[has_tokens]
    if xp == "torch":
        placed = lib.zeros_like(mask, dtype=log_ratio.dtype).masked_scatter_(mask, log_ratio)
        row_sums = placed.sum(1)[has_tokens]
    else:
        starts = lib.cumsum(tokens) - tokens
        row_sums = lib.add.reduceat(log_ratio, starts)
    return lib.exp(row_sums / tokens).mean()


def _pearson(a, b, count: int, lib):
    """Pearson correlation of the two sides' log-probs over the scored tokens (1-D: NaN/-inf and
    masked tokens are already out): ~0.999 healthy, far lower when one side's values are corrupted
    or misaligned although their mean difference (k1) looks fine (ai-dynamo/dynamo#11640: k1 0.003,
    Pearson 0.05-0.62). NaN (dropped) when either side is constant. From sums of products."""
    sum_a, sum_b = a.sum(), b.sum()
    var_a = _dot(a, a, lib) - sum_a * sum_a / count
    var_b = _dot(b, b, lib) - sum_b * sum_b / count
    if float(var_a) <= _CONSTANT * count or float(var_b) <= _CONSTANT * count:
        return math.nan
    return (_dot(a, b, lib) - sum_a * sum_b / count) / lib.sqrt(var_a * var_b)


def _to_floats(stats: dict[str, Any], xp: str) -> dict[str, float]:
    if xp == "torch":
        import torch

        # One device-to-host sync for the whole dict instead of one per metric.
        values = torch.stack([torch.as_tensor(v, dtype=torch.float64) for v in stats.values()]).tolist()
    else:
        values = [float(v) for v in stats.values()]
    return dict(zip(stats.keys(), values))
