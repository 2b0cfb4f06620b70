"""Verdicts by effect for the model and engine components (docs/fingerprint.md, "Model and engine").

What changes logits is an ``error`` (rope scaling and YaRN's factors, norm eps, shapes, activation,
sliding window, a LoRA adapter active on one side only); a precision difference (weights, lm_head,
quantization, KV cache) is a ``warning`` naming the mismatch to expect; names, paths and kernels
that compute the same function are ``info``. Stdlib only (the backend's diff imports it); pure.
"""
from __future__ import annotations

from typing import Any

from .effects import row, summarise

# Published mismatch levels a precision difference is judged against (shared/FAILURE-CLASSES.md).
EXPECTED_PRECISION = ("expect the trainer/rollout mismatch above the same-precision floor (k3 KL 1e-5 to 1e-3 for "
                      "a dense model, LMSYS 2026-01; FP8 rollouts raise it further: verl docs/advance/fp8.md, "
                      "verl#7519 rollout_corr/kl x3.1 over 32 steps); NeMo-RL's token_mult_prob_error should stay "
                      "<= 1.05 (arXiv 2510.26788 on bf16 vs fp16)")
WHY_ROPE = ("rotary position embeddings are computed differently: logits differ at every position (prime-rl#2802: "
            "vLLM dropping YaRN's attention factor gave mismatch_kl 0.030 against a ~0.0015 floor)")
WHY_EPS = "the normalisation layers divide by another epsilon: every layer's activations, so every logit, shift"
WHY_SHAPE = "the two sides do not build the same network: their logits are unrelated"
WHY_LOGIT = "a model-definition field of the forward pass: every logit can differ"
WHY_MAX_POS = ("the longest sequence the model is configured for: a side cuts or refuses longer ones, and dynamic / "
               "longrope scaling computes positions from it")
WHY_DROPOUT = "dropout is active when a trainer scores in train mode: its log-probs are noisy, the rollout's are not"
WHY_UNJUDGED = "a config field this version does not judge: it may change the forward pass"
WHY_ONE_SIDED = "set on one side only, the other leaves it to its library's default: compare the defaults"
WHY_PRECISION = {"dtype": "the weights run at another precision", "lm_head_dtype": "the lm_head (the logits' last "
                 "matmul) runs at another precision", "quantization": "one side runs quantized weights"}
SHAPE_KEYS = frozenset({"model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                        "num_attention_heads", "num_key_value_heads", "head_dim", "num_experts", "num_local_experts",
                        "moe_intermediate_size", "num_experts_per_tok", "tie_word_embeddings"})
LOGIT_HINTS = ("eps", "epsilon", "rope", "rotary", "softcap", "multiplier", "scal", "norm", "bias", "window",
               "layer_types", "act", "expert", "router", "topk", "head", "partial", "attn", "attention", "mlp")
DYNAMIC_ROPE = ("dynamic", "longrope")


def _base(key: str) -> str:
    """``text_config.rms_norm_eps`` -> ``rms_norm_eps``; ``rope.factor`` stays ``rope.factor``."""
    parts = key.split(".")
    return ".".join(parts[parts.index("rope"):]) if "rope" in parts else parts[-1]


def _model_row(key: str, va: dict, vb: dict, rope_types: set) -> dict:
    base, a, b = _base(key), va.get(key), vb.get(key)
    if (key not in va or key not in vb or (base == "dtype" and None in (a, b))) and base != "quantization":
        return row(key, a, b, "info", WHY_ONE_SIDED)  # left to a library default (quantization: stated)
    if base in WHY_PRECISION:
        return row(key, a, b, "warning", f"{WHY_PRECISION[base]}: {EXPECTED_PRECISION}")
    if base.startswith("rope."):
        return row(key, a, b, "error", WHY_ROPE)
    if "eps" in base:
        return row(key, a, b, "error", WHY_EPS)
    if base in SHAPE_KEYS:
        return row(key, a, b, "error", WHY_SHAPE)
    if base == "max_position_embeddings":
        return row(key, a, b, "error" if rope_types & set(DYNAMIC_ROPE) else "warning", WHY_MAX_POS)
    if "dropout" in base:
        return row(key, a, b, "warning", WHY_DROPOUT)
    if any(hint in base for hint in LOGIT_HINTS):
        return row(key, a, b, "error", WHY_LOGIT)
    return row(key, a, b, "warning", WHY_UNJUDGED)


def model_config(va: Any, vb: Any) -> tuple[str, str, list[dict]]:
    """Field by field; a field one side leaves out is info (its library default applies), except
    quantization (none is stated: not quantized) and the lm_head's dtype (unknown: the weights')."""
    va, vb = _lm_head_at_dtype(va), _lm_head_at_dtype(vb)
    rope_types = {v for d in (va, vb) for k, v in d.items() if k.endswith("rope_type")}
    rows = [_model_row(k, va, vb, rope_types) for k in _differing(va, vb)
            if not (_base(k) == "quantization" and not va.get(k) and not vb.get(k))]
    return _judged(rows)


def _lm_head_at_dtype(value: Any) -> dict:
    """A side that does not know its lm_head's dtype (a config.json) runs it at the weights' dtype."""
    value = dict(value or {})
    if value.get("lm_head_dtype") is None and value.get("dtype") is not None:
        value["lm_head_dtype"] = value["dtype"]
    return value


# --------------------------------------------------------------------------- lora_adapter

WHY_LORA_ONE_SIDE = ("a LoRA adapter is active on one side only: one side samples or scores with the base weights, "
                     "the other with the adapter's (verl-project/verl#7495: the rollout kept identical frozen weights "
                     "every sync, rollout_corr/kl x36)")
WHY_LORA_SHAPE = "the adapters differ in what they add to the weights: the two sides run different models"
WHY_LORA_NAME = "a name or path: the adapter's values are compared by the fields above"
WHY_LORA_VERSION = ("the rollout serves another adapter version than the trainer's: its samples come from stale "
                    "adapter weights (see the weight attestations)")


def lora_adapter(va: Any, vb: Any) -> tuple[str, str, list[dict]]:
    if (va is None) != (vb is None):
        return _judged([row("adapter", _lora_label(va), _lora_label(vb), "error", WHY_LORA_ONE_SIDE)])
    rows = []
    for key in _differing(va, vb):
        a, b = (va or {}).get(key), (vb or {}).get(key)
        if key in ("name", "path"):
            rows.append(row(key, a, b, "info", WHY_LORA_NAME))
        elif key == "version":
            rows.append(row(key, a, b, "warning" if a is not None and b is not None else "info",
                            WHY_LORA_VERSION if a is not None and b is not None else WHY_ONE_SIDED))
        else:
            rows.append(row(key, a, b, "error", WHY_LORA_SHAPE))
    return _judged(rows)


def _lora_label(value: Any) -> str:
    if value is None:
        return "none"
    return f"{value.get('name') or 'an adapter'} (rank {value.get('r')})"


# --------------------------------------------------------------------------- engine_config

WHY_PREFIX_STALE = ("prefix caching is on and no cache reset was seen after a weight sync: cached prompt KV computed "
                    "with old weights is reused (NVIDIA-NeMo/RL#4018, huggingface/trl#3024: a mismatch saw-tooth "
                    "that resets on restart); call reset_prefix_cache() after each sync")
WHY_PREFIX_UNSEEN = "prefix caching is on; no weight sync seen yet, so no reset to check"
WHY_KV_CACHE = "the KV cache is stored at another precision (e.g. FP8) than the trainer's activations"
WHY_EAGER = ("CUDA graphs replay the eager kernels; a difference beyond the precision floor at step 0 points at a "
             "shape-dependent kernel: try enforce_eager=True")
WHY_BACKEND = "another attention kernel computing the same function: differences stay at the precision floor"
WHY_OVERRIDES = "the engine overrides these config fields: their effect shows in model_config"
WHY_LEN_LONGER = ("the rollout samples sequences longer than the trainer's max_position_embeddings: the trainer "
                  "scores positions its model is not configured for")
WHY_LEN_SHORTER = "the rollout cuts sequences at max_model_len (finish_reason \"length\"); the trainer can score longer"


def engine_config(va: Any, vb: Any, model_a: Any, model_b: Any) -> tuple[str, str, list[dict]]:
    """Two engines' settings, or one engine's against the other side's model (a trainer reports no
    engine settings beyond its attention implementation): each key both report is compared, each
    key one reports is judged by its own effect (prefix caching without a reset after a sync)."""
    va, vb = va or {}, vb or {}
    rows = []
    for key in sorted(set(va) | set(vb)):
        a, b = va.get(key), vb.get(key)
        judged = _engine_row(key, a, b, model_a or {}, model_b or {}, va, vb)
        if judged is not None:
            rows.append(judged)
    return _judged(rows)


def _engine_row(key: str, a: Any, b: Any, model_a: dict, model_b: dict, va: dict, vb: dict) -> Any:
    if key == "prefix_caching":
        return _prefix_row(va, vb)
    if key == "prefix_cache_reset_after_sync":
        return None  # read with prefix_caching
    if key == "kv_cache_dtype":
        precise = {None, "auto"}
        if a in precise and b in precise:
            return None
        return row(key, a, b, "warning", f"{WHY_KV_CACHE}: {EXPECTED_PRECISION}")
    if key == "max_model_len":
        return _length_row(a, b, model_a, model_b)
    if key == "engine":
        return None  # a name: what each engine computes is compared in model_config
    if a == b or a is None or b is None:
        return None  # a kernel or name one side does not have: nothing to compare
    why = {"enforce_eager": WHY_EAGER, "attention_backend": WHY_BACKEND, "hf_overrides": WHY_OVERRIDES}
    return row(key, a, b, "info", why.get(key, "an engine setting this version does not judge"))


def _prefix_row(va: dict, vb: dict) -> Any:
    for value in (va, vb):
        if value.get("prefix_caching") and value.get("prefix_cache_reset_after_sync") is False:
            return row("prefix_caching", _prefix_label(va), _prefix_label(vb), "warning", WHY_PREFIX_STALE)
    if any(v.get("prefix_caching") and v.get("prefix_cache_reset_after_sync") is None for v in (va, vb)):
        return row("prefix_caching", _prefix_label(va), _prefix_label(vb), "info", WHY_PREFIX_UNSEEN)
    return None


def _prefix_label(value: dict) -> Any:
    if "prefix_caching" not in value:
        return None
    if not value["prefix_caching"]:
        return "off"
    reset = value.get("prefix_cache_reset_after_sync")
    return "on, " + {True: "reset after each sync", False: "not reset after a sync", None: "no sync yet"}[reset]


def _length_row(a: Any, b: Any, model_a: dict, model_b: dict) -> Any:
    """An engine's max_model_len against the other engine's, else the other side's model length."""
    ta = a if a is not None else model_a.get("max_position_embeddings")
    tb = b if b is not None else model_b.get("max_position_embeddings")
    if ta is None or tb is None or ta == tb:
        return None
    rollout_longer = (a is not None and b is None and a > tb) or (b is not None and a is None and b > ta)
    if a is not None and b is not None:
        return row("max_model_len", a, b, "warning", "the engines cut sequences at different lengths")
    why = WHY_LEN_LONGER if rollout_longer else WHY_LEN_SHORTER
    return row("max_model_len", ta, tb, "warning" if rollout_longer else "info", why)


# --------------------------------------------------------------------------- shared

def _differing(va: Any, vb: Any) -> list[str]:
    va, vb = va or {}, vb or {}
    return [k for k in sorted(set(va) | set(vb)) if (k in va) != (k in vb) or va.get(k) != vb.get(k)]


def _show(value: Any) -> str:
    if value is None:
        return "none"
    return repr(value) if isinstance(value, str) else str(value)


def _judged(rows: list[dict]) -> tuple[str, str, list[dict]]:
    """(severity, summary, rows); "same" when no field differs in effect (the diff shows no row)."""
    if not rows:
        return "same", "differs only in fields that change nothing compared here", rows
    severity, summary = summarise(rows, str, _show)
    return severity, summary, rows
