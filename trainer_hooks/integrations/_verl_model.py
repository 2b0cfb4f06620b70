"""The model and engine components of a verl run, from what each side of verl builds the model with.

Trainer (the driver): ``actor_rollout_ref.model`` (config.json of ``hf_config_path`` or ``path`` with
``override_config`` applied, as verl's ``HFModelConfig`` does) and the LoRA adapter the actor trains
(``lora_rank`` > 0). Rollout (an agent-loop worker): ``worker.model_config.hf_config`` as verl
loaded it for the rollout, and the rollout config's engine settings (max_model_len, enforce_eager).
The adapter the vLLM servers really apply and their prefix-cache resets are not visible from an
agent-loop worker: the rollout reports neither (no row, never a guess).
"""
from __future__ import annotations

from typing import Any

from ..contract import ENGINE_CONFIG_COMPONENT, LORA_ADAPTER_COMPONENT, MODEL_CONFIG_COMPONENT
from ..fingerprint.model_config import config_dict, lora_value, model_config_value, read_json
from .verl import config_value


def trainer_model_components(config: Any, local_dir: str) -> dict[str, Any]:
    """``local_dir``: the local copy of the model's config directory (verl's ``copy_to_local``)."""
    model = config.actor_rollout_ref.model
    raw = dict(read_json(f"{local_dir}/config.json") or {})
    raw.update(_overrides(config_value(model, "override_config", {})))
    rank = int(config_value(model, "lora_rank", 0) or 0)
    adapter = None
    if rank > 0:
        targets = config_value(model, "target_modules", None)
        adapter = lora_value({"peft_type": "LORA", "r": rank, "lora_alpha": config_value(model, "lora_alpha", None),
                              "target_modules": targets if isinstance(targets, str) else list(targets or [])})
    return {MODEL_CONFIG_COMPONENT: model_config_value(raw), LORA_ADAPTER_COMPONENT: adapter}


def rollout_model_components(worker: Any, rollout_config: Any) -> dict[str, Any]:
    hf_config = getattr(getattr(worker, "model_config", None), "hf_config", None)
    comps: dict[str, Any] = {}
    if hf_config is not None:
        comps[MODEL_CONFIG_COMPONENT] = model_config_value(config_dict(hf_config))
    engine = {"engine": str(config_value(rollout_config, "name", "vllm")),
              "enforce_eager": bool(config_value(rollout_config, "enforce_eager", False))}
    max_len = config_value(rollout_config, "max_model_len", None)
    if max_len is not None:
        engine["max_model_len"] = int(max_len)
    comps[ENGINE_CONFIG_COMPONENT] = engine
    return comps


def _overrides(override: Any) -> dict[str, Any]:
    """verl's ``override_config`` (its ``model_config`` part when it has one), as plain values."""
    plain = dict(override or {})
    inner = plain.get("model_config")
    return dict(inner) if inner is not None else plain
