"""transformers ``generate`` as the rollout engine: the sampling parameters it really samples with.

``model.generate(**kwargs)`` starts from ``model.generation_config``, applies ``kwargs`` on top,
and fills what neither sets from transformers' global defaults (v5:
``GenerationConfig._get_default_generation_params()``, where ``top_k`` is 50: a sampled
``generate`` truncates to the top 50 tokens unless told ``top_k=0``). This module asks the model
for that resolved config, the same way ``generate`` builds it, so the report is what was served::

    out = model.generate(**inputs, do_sample=True, temperature=0.6, max_new_tokens=64)
    report_generate_sampling(monitor, model, do_sample=True, temperature=0.6, max_new_tokens=64)

Nothing is imported here: the model is read by duck typing.
"""
from __future__ import annotations

from typing import Any

from ..contract import SAMPLING_PARAM_KEYS
from ..fingerprint.components import generation_config_dict

__all__ = ["generate_sampling_params", "report_generate_sampling"]


def generate_sampling_params(model: Any, generation_config: Any = None, **generate_kwargs: Any) -> dict[str, Any]:
    """``{"params": GenerationConfig, "filled_from_generation_config": [keys]}`` for
    ``model.generate(generation_config=generation_config, **generate_kwargs)``.

    ``filled_from_generation_config``: the sampling keys the call leaves unset that the model's
    own ``generation_config`` (its generation_config.json) sets.
    """
    prepare = getattr(model, "_prepare_generation_config", None)
    if not callable(prepare):
        raise TypeError(f"{type(model).__name__} has no _prepare_generation_config: not a transformers generative model")
    config, _ = prepare(generation_config, **generate_kwargs)
    model_sets = generation_config_dict(getattr(model, "generation_config", None), None) or {}
    filled = sorted(k for k in SAMPLING_PARAM_KEYS if generate_kwargs.get(k) is None and generation_config is None
                    and model_sets.get(k) is not None)
    return {"params": config, "filled_from_generation_config": filled}


def report_generate_sampling(monitor: Any, model: Any, generation_config: Any = None, *,
                             logprobs_mode: str | None = None, **generate_kwargs: Any) -> bool:
    """Report ``generate_sampling_params`` through a rollout-side ``monitor``. ``logprobs_mode``:
    how the rollout takes its log-probs: ``"processed"`` from ``output_scores`` (after the logits
    processors), ``"raw"`` from ``output_logits``; None when it takes none."""
    served = generate_sampling_params(model, generation_config, **generate_kwargs)
    return monitor.report_sampling_params(served["params"], logprobs_mode=logprobs_mode, source="transformers",
                                          filled_from_generation_config=served["filled_from_generation_config"])
