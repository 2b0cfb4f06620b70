"""What identifies a sample beyond its prompt: the images its processor turned into features, and
the experts an MoE model routed its tokens to. Each side computes these with its own processor and
model; the per-sample audit and the `moe` pack compare them (docs/design.md, "Per-sample audit").

* ``image_features(outputs, image_token_id)``: a processor's output for one sample's images, as
  a small summary: how many images, their grids, how many image tokens the text holds. The rollout
  side puts it on ``RolloutRecord.images``; the trainer passes its own (``trainer_images=`` of
  ``log_rollout_batch``). A training forward run without the image features
  (microsoft/agent-lightning#560) or with another resolution shows as a different summary. The
  pixel values themselves are not compared: engine and trainer legitimately hold them in other
  dtypes.
* ``router_flip_rate(rollout_experts, trainer_experts)``: the share of (token, layer) top-k expert
  choices that differ between the rollout engine and the trainer (vLLM returns its choices as
  ``CompletionOutput.routed_experts``, ``[tokens, layers, top_k]``; a trainer records its own the
  same way for routing replay). ~10% of routers disagreeing a forward pass is the reported failure
  (NVIDIA/Megatron-LM#4168); log it as ``contract.MOE_ROUTER_FLIP_RATE_KEY`` and enable the
  ``moe`` pack.

numpy is imported lazily (``router_flip_rate`` needs it; ``image_features`` does not).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import contract


def image_features(outputs: Any, image_token_id: int | None = None) -> dict[str, Any]:
    """The summary of one sample's processor output (a ``BatchFeature`` or a mapping):
    ``{"images": n, "grid": [[t, h, w] or [h, w], ...], "image_tokens": k or None}``.

    Grids come from ``image_grid_thw`` (Qwen2-VL family: patches per image), else from the
    ``pixel_values`` shape (one ``[h, w]`` per image). ``image_tokens`` counts ``image_token_id``
    in the output's ``input_ids`` (None without either). No image features at all: 0 images."""
    grid = _grid(outputs)
    tokens = None
    ids = _get(outputs, "input_ids")
    if image_token_id is not None and ids is not None:
        tokens = sum(1 for i in _flat(_tolist(ids)) if i == image_token_id)
    return {"images": len(grid), "grid": grid[:contract.AUDIT_MAX_IMAGES], "image_tokens": tokens}


def images_differ(rollout: Mapping[str, Any], trainer: Mapping[str, Any]) -> bool:
    """Whether two summaries describe different image features (token counts compared only when
    both sides counted them)."""
    if rollout.get("images") != trainer.get("images") or list(rollout.get("grid") or []) != list(trainer.get("grid") or []):
        return True
    a, b = rollout.get("image_tokens"), trainer.get("image_tokens")
    return a is not None and b is not None and a != b


def _grid(outputs: Any) -> list[list[int]]:
    thw = _get(outputs, "image_grid_thw")
    if thw is not None:
        return [[int(v) for v in row] for row in _tolist(thw)]
    pixels = _get(outputs, "pixel_values")
    if pixels is None:
        return []
    shape = [int(n) for n in getattr(pixels, "shape", ())]
    if len(shape) == 5:  # [batch of one, images, channels, h, w]
        return [shape[-2:] for _ in range(shape[1])]
    if len(shape) == 4:  # [images, channels, h, w]
        return [shape[-2:] for _ in range(shape[0])]
    if len(shape) == 3:  # one image [channels, h, w]
        return [shape[-2:]]
    return [shape] if shape else []


def _get(outputs: Any, name: str) -> Any:
    if isinstance(outputs, Mapping) or hasattr(outputs, "keys"):
        try:
            return outputs[name] if name in outputs else None
        except Exception:
            return None
    return getattr(outputs, name, None)


def _tolist(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


def _flat(values: Any):
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from _flat(v)
        else:
            yield v


def router_flip_rate(rollout_experts: Any, trainer_experts: Any) -> float | None:
    """Share of (token, layer) expert choices that differ between the two sides.

    Each argument: one array ``[tokens, layers, top_k]`` of expert ids, or a sequence of them (one
    per sample, same shapes pairwise). The order within a top-k set does not matter. None when there
    is nothing to compare."""
    import numpy as np

    pairs = _pairs(rollout_experts, trainer_experts)
    chosen = flipped = 0
    for a, b in pairs:
        a, b = np.sort(np.asarray(a), axis=-1), np.sort(np.asarray(b), axis=-1)
        if a.shape != b.shape:
            raise ValueError(f"routed experts of shape {a.shape} against {b.shape}: the same tokens and layers on both sides")
        decisions = a.reshape(-1, a.shape[-1]) if a.ndim > 1 else a.reshape(-1, 1)
        other = b.reshape(decisions.shape)
        chosen += decisions.shape[0]
        flipped += int((decisions != other).any(axis=1).sum())
    return flipped / chosen if chosen else None


def _pairs(rollout: Any, trainer: Any) -> list[tuple[Any, Any]]:
    if hasattr(rollout, "ndim") and hasattr(trainer, "ndim"):
        return [(rollout, trainer)]
    rollout, trainer = list(rollout), list(trainer)
    if len(rollout) != len(trainer):
        raise ValueError(f"{len(rollout)} rollout samples against {len(trainer)} trainer samples")
    return list(zip(rollout, trainer))
