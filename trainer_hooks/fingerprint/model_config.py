"""The model and engine components: what computes the logits the two sides compare.

``model_config``: the config fields that change logits (rope scaling with YaRN's factors, norm eps,
shapes, activation, sliding window...), the weights' and lm_head's real dtype and the quantization.
``lora_adapter``: the adapter really active (rank, alpha, target modules, name, version), or None.
``engine_config``: how an engine runs the model (max_model_len, eager vs graphs, attention backend,
KV-cache dtype, prefix caching and its reset after each weight sync, hf_overrides).

Read from a transformers model (a ``PreTrainedModel`` or its config), a peft ``PeftModel``, a
``vllm.LLM`` or a model directory (config.json, adapter_config.json as JSON). Stdlib only and
duck typed: nothing heavy is imported here (docs/fingerprint.md, "Model and engine").
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

from ..contract import ENGINE_CONFIG_COMPONENT, LORA_ADAPTER_COMPONENT, MODEL_CONFIG_COMPONENT

# Config keys that change nothing a forward pass computes (bookkeeping, ids the generation config
# owns, generation settings old configs carry, dropout-free training switches).
IGNORED_KEYS = frozenset({
    "transformers_version", "name_or_path", "_name_or_path", "auto_map", "tokenizer_class", "use_cache",
    "output_hidden_states", "output_attentions", "return_dict", "use_return_dict", "chunk_size_feed_forward",
    "is_encoder_decoder", "id2label", "label2id", "problem_type", "initializer_range", "pad_token_id",
    "bos_token_id", "eos_token_id", "sep_token_id", "decoder_start_token_id", "torchscript", "pruned_heads",
    "tf_legacy_loss", "add_cross_attention", "tie_encoder_decoder", "finetuning_task", "task_specific_params",
    "prefix", "cross_attention_hidden_size", "architectures", "torch_dtype", "dtype", "quantization_config",
    "rope_scaling", "rope_theta", "rope_parameters", "max_length", "min_length", "do_sample", "early_stopping",
    "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p",
    "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "output_router_logits", "router_aux_loss_coef", "keys_to_ignore_at_inference",
    "gradient_checkpointing", "use_bfloat16", "xla_device", "is_decoder",
})
_PREFIX_NOISE = ("_attn_implementation", "_commit_hash", "_from_", "_experts_implementation")
# Rope defaults the libraries fill in when a config leaves them out (transformers'
# modeling_rope_utils; vLLM's YaRN rotary embedding): filled here so "left to the default" and
# "set to the default" are one value.
YARN_DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0}


# --------------------------------------------------------------------------- model_config

def model_config_value(config: Any, *, dtype: Any = None, lm_head_dtype: Any = None,
                       quantization: Any = None) -> dict[str, Any]:
    """The ``model_config`` component: the config's logit-relevant fields, flat (``rope.factor``,
    ``text_config.rms_norm_eps``), plus ``dtype`` / ``lm_head_dtype`` (the real ones when given,
    else the config's) and ``quantization`` (the config's quantization_config, else ``quantization``)."""
    raw = config_dict(config)
    value = _flatten(raw, "")
    value["dtype"] = dtype_name(dtype) or dtype_name(raw.get("dtype") or raw.get("torch_dtype"))
    if lm_head_dtype is not None:
        value["lm_head_dtype"] = dtype_name(lm_head_dtype)
    value["quantization"] = _quantization(raw.get("quantization_config"), quantization)
    if value.get("lm_head_dtype", "") is None:
        del value["lm_head_dtype"]
    return value


def config_dict(config: Any) -> dict[str, Any]:
    """A config as the dict save_pretrained writes (``to_diff_dict()``: what config.json holds, so a
    live model and its saved directory read alike), a mapping as given, or a path's config.json."""
    if isinstance(config, Mapping):
        return dict(config)
    if isinstance(config, (str, os.PathLike)):
        return read_json(os.path.join(os.fspath(config), "config.json")) or {}
    to_diff = getattr(config, "to_diff_dict", None)
    if callable(to_diff):
        return dict(to_diff())
    return dict(config.to_dict())


def _flatten(raw: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key in IGNORED_KEYS or key.startswith(_PREFIX_NOISE) or "dropout" in key and not value:
            continue
        if isinstance(value, Mapping) and key.endswith("_config"):  # text_config, vision_config...
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = _plain(value)
    out.update({f"{prefix}{k}": v for k, v in rope_value(raw).items()})
    return out


def rope_value(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Rope settings under ``rope.*``: transformers v5 ``rope_parameters`` and v4 ``rope_scaling`` +
    ``rope_theta`` read alike, ``type`` read as ``rope_type``, YaRN's defaults filled in (its
    attention factor as transformers computes it). A config with no rope field reports none."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling")
    theta = raw.get("rope_theta")
    if params is None and theta is None:
        return {}
    params = dict(params or {})
    if params and all(isinstance(v, Mapping) for v in params.values()):  # per layer type (Gemma 3)
        return {f"rope.{layer}.{k}": v for layer, sub in params.items()
                for k, v in _rope_fields(dict(sub), theta, raw).items()}
    return {f"rope.{k}": v for k, v in _rope_fields(params, theta, raw).items()}


def _rope_fields(params: dict, theta: Any, raw: Mapping[str, Any]) -> dict[str, Any]:
    if "type" in params:
        params.setdefault("rope_type", params.pop("type"))
    params.setdefault("rope_type", "default")
    if theta is not None:
        params.setdefault("rope_theta", theta)
    if params["rope_type"] == "yarn":
        for key, default in YARN_DEFAULTS.items():
            params.setdefault(key, default)
        params.setdefault("original_max_position_embeddings", raw.get("max_position_embeddings"))
        if params.get("attention_factor") is None and isinstance(params.get("factor"), (int, float)):
            params["attention_factor"] = _yarn_attention_factor(params)
    return {k: _plain(v) for k, v in params.items() if v is not None}


def _yarn_attention_factor(params: Mapping[str, Any]) -> float:
    """transformers' ``_compute_yarn_parameters`` default (and vLLM's ``yarn_get_mscale``)."""
    factor, mscale, mscale_all_dim = params["factor"], params.get("mscale"), params.get("mscale_all_dim")

    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if mscale and mscale_all_dim:
        return float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
    return get_mscale(factor)


def _quantization(config_quant: Any, engine_quant: Any) -> Any:
    if config_quant:
        quant = config_quant if isinstance(config_quant, Mapping) else _safe_dict(config_quant)
        return {k: _plain(v) for k, v in quant.items() if not k.startswith("_")}
    if engine_quant:
        return {"quant_method": str(engine_quant)}
    return None


def dtype_name(dtype: Any) -> Any:
    """``torch.bfloat16``, ``"bfloat16"`` and ``"torch.bfloat16"`` are one name; "auto" is no name."""
    if dtype is None:
        return None
    text = str(dtype)
    text = text[len("torch."):] if text.startswith("torch.") else text
    return None if text in ("auto", "None", "") else {"half": "float16", "float": "float32", "bf16": "bfloat16",
                                                      "fp16": "float16", "fp32": "float32"}.get(text, text)


# --------------------------------------------------------------------------- lora_adapter

def lora_value(adapter_config: Any, *, name: Any = None, version: Any = None) -> dict[str, Any] | None:
    """The ``lora_adapter`` component: what changes the adapter's output (rank, alpha, target
    modules, rsLoRA / DoRA), plus its name and version (info). None: no adapter is active."""
    if adapter_config is None:
        return None
    cfg = adapter_config if isinstance(adapter_config, Mapping) else _safe_dict(adapter_config)
    targets = cfg.get("target_modules")
    if isinstance(targets, (list, tuple, set, frozenset)):
        targets = sorted(str(t) for t in targets)
    value = {"peft_type": _plain(cfg.get("peft_type")), "r": cfg.get("r"), "lora_alpha": cfg.get("lora_alpha"),
             "target_modules": targets, "use_rslora": bool(cfg.get("use_rslora", False)),
             "use_dora": bool(cfg.get("use_dora", False)), "modules_to_save": _plain(cfg.get("modules_to_save"))}
    if name is not None:
        value["name"] = str(name)
    if version is not None:
        value["version"] = _plain(version)
    return value


# --------------------------------------------------------------------------- sources

def model_components(model: Any, *, hf_overrides: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(components, env) for a model object or directory: a ``vllm.LLM`` (or its engine), a peft
    ``PeftModel``, a transformers ``PreTrainedModel``, a ``PretrainedConfig`` or mapping, or a path."""
    if isinstance(model, (str, os.PathLike)):
        return model_dir_components(model)
    if _vllm_model_config(model) is not None:
        return vllm_components(model)
    if hasattr(model, "peft_config") and hasattr(model, "active_adapter"):
        return peft_components(model)
    if hasattr(model, "config") and hasattr(model, "parameters"):
        return transformers_components(model)
    return {MODEL_CONFIG_COMPONENT: model_config_value(model)}, {"model_source": type(model).__name__}


def model_dir_components(path: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """config.json and adapter_config.json of a directory, as JSON (no torch, no transformers).
    An adapter directory (adapter_config.json only) reports the adapter and its base model's name."""
    path = os.fspath(path)
    comps: dict[str, Any] = {}
    config = read_json(os.path.join(path, "config.json"))
    if config is not None:
        comps[MODEL_CONFIG_COMPONENT] = model_config_value(config)
    adapter = read_json(os.path.join(path, "adapter_config.json"))
    if config is not None or adapter is not None:
        comps[LORA_ADAPTER_COMPONENT] = lora_value(adapter)
    return comps, {"model_source": "directory"}


def transformers_components(model: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    config = model.config
    value = model_config_value(config, dtype=_param_dtype(model), lm_head_dtype=_lm_head_dtype(model))
    engine = {"engine": "transformers", "attention_backend": _attn_implementation(config),
              "enforce_eager": not _compiled(model)}
    return ({MODEL_CONFIG_COMPONENT: value, LORA_ADAPTER_COMPONENT: None, ENGINE_CONFIG_COMPONENT: engine},
            {"model_source": type(model).__name__})


def peft_components(model: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A PeftModel: its base model's config and precision, and the adapter really active (none when
    adapters are disabled: ``with model.disable_adapter()`` or a merged-and-unloaded model)."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    comps, env = transformers_components(base)
    active = getattr(model, "active_adapter", None)
    if isinstance(active, (list, tuple)):
        active = active[0] if active else None
    enabled = not getattr(model, "_adapters_disabled", False)  # `with model.disable_adapter():`
    config = (model.peft_config or {}).get(active) if active is not None and enabled else None
    comps[LORA_ADAPTER_COMPONENT] = lora_value(config, name=active)
    env["model_source"] = type(model).__name__
    return comps, env


def vllm_components(llm: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A ``vllm.LLM`` (or engine): the hf_config the engine built the model from (hf_overrides
    applied), its real dtype and quantization, and the engine settings (engine_config)."""
    mc = _vllm_model_config(llm)
    vllm_config = _first_attr(llm, ("llm_engine.vllm_config", "vllm_config"))
    cache = getattr(vllm_config, "cache_config", None)
    lora = getattr(vllm_config, "lora_config", None)
    value = model_config_value(mc.hf_config, dtype=mc.dtype, lm_head_dtype=mc.dtype,
                               quantization=getattr(mc, "quantization", None))
    overrides = getattr(mc, "hf_overrides", None)
    engine = {
        "engine": "vllm",
        "max_model_len": getattr(mc, "max_model_len", None),
        "enforce_eager": bool(getattr(mc, "enforce_eager", False)),
        "attention_backend": _plain(_first_attr(vllm_config, ("attention_config.backend",)) or None),
        "kv_cache_dtype": _plain(getattr(cache, "cache_dtype", None)),
        "prefix_caching": bool(getattr(cache, "enable_prefix_caching", False)),
        "hf_overrides": _plain(overrides) if isinstance(overrides, Mapping) and overrides else None,
    }
    comps = {MODEL_CONFIG_COMPONENT: value, ENGINE_CONFIG_COMPONENT: engine}
    if lora is None:  # no LoRA support configured: no request can carry an adapter
        comps[LORA_ADAPTER_COMPONENT] = None
    return comps, {"model_source": "vllm"}


def vllm_lora_value(lora_request: Any, version: Any = None) -> dict[str, Any] | None:
    """The adapter a vLLM request is served with (a ``LoRARequest``): its adapter_config.json read
    from ``lora_path``, its name, and ``version`` (its ``lora_int_id`` when not given)."""
    if lora_request is None:
        return None
    path = getattr(lora_request, "lora_path", None) or getattr(lora_request, "path", None)
    config = read_json(os.path.join(os.fspath(path), "adapter_config.json")) if path else None
    return lora_value(config or {}, name=getattr(lora_request, "lora_name", None),
                      version=version if version is not None else getattr(lora_request, "lora_int_id", None))


# --------------------------------------------------------------------------- helpers

def _vllm_model_config(obj: Any) -> Any:
    mc = _first_attr(obj, ("llm_engine.model_config", "model_config", "llm_engine.vllm_config.model_config"))
    return mc if mc is not None and hasattr(mc, "hf_config") and hasattr(mc, "max_model_len") else None


def _first_attr(obj: Any, paths: tuple[str, ...]) -> Any:
    for path in paths:
        cur = obj
        for attr in path.split("."):
            cur = getattr(cur, attr, None)
            if cur is None:
                break
        if cur is not None:
            return cur
    return None


def _param_dtype(model: Any) -> Any:
    dtype = getattr(model, "dtype", None)
    if dtype is None:
        first = next(iter(model.parameters()), None)
        dtype = getattr(first, "dtype", None)
    return dtype


def _lm_head_dtype(model: Any) -> Any:
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return getattr(getattr(head, "weight", None), "dtype", None)


def _attn_implementation(config: Any) -> Any:
    impl = getattr(config, "_attn_implementation", None)
    return impl if isinstance(impl, str) else None


def _compiled(model: Any) -> bool:
    return hasattr(model, "_orig_mod") or bool(getattr(model, "_compiled_call_impl", None))


def _safe_dict(obj: Any) -> dict[str, Any]:
    to_dict = getattr(obj, "to_dict", None)
    try:
        return dict(to_dict()) if callable(to_dict) else dict(vars(obj))
    except Exception:
        return {}


def _plain(value: Any) -> Any:
    """JSON-able: enums by value, sets sorted, torch dtypes by name, other objects by str."""
    inner = getattr(value, "value", None)  # enums (PeftType, vLLM's) by value
    if isinstance(inner, (str, int, float)) and not isinstance(value, (bool, int, float)):
        return inner
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(_plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return dtype_name(value)


def read_json(path: str) -> Any:
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)
