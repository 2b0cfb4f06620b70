"""Assemble a fingerprint: one digest per component, an overall digest, informational env."""
from __future__ import annotations

from typing import Any

from . import cache, components
from .canonical import canonical_json, digest, sha256_hex

FINGERPRINT_VERSION = 1


def fingerprint_processor(proc: Any, generation_config: Any = None, *, model_dir: Any = None,
                          refresh: bool = False) -> dict:
    """Fingerprint ``proc`` as loaded in this process (cached per object; see cache.py).

    ``proc``: a transformers tokenizer (fast or slow, v5 or v4), a ProcessorMixin, a vLLM ``LLM``
    or its tokenizer wrappers, or a mistral-common ``MistralTokenizer``.
    ``generation_config``: a GenerationConfig, a dict, or None to read
    ``model_dir/generation_config.json`` when ``model_dir`` is given.
    """
    return cache.cached(proc, generation_config, model_dir,
                        lambda: _compute(proc, generation_config, model_dir), refresh=refresh)


def _compute(proc: Any, generation_config: Any, model_dir: Any) -> dict:
    kind, obj = components.unwrap(proc)
    values = _component_values(kind, obj)
    values.update(components.generation_components(generation_config, model_dir))
    return assemble(kind, values, components.environment(obj, kind))


def _component_values(kind: str, obj: Any) -> dict:
    if kind == "mistral":
        values = components.mistral_components(obj)
        values["behavior"] = components.mistral_behavior(obj)
        return values
    if kind == "processor":
        values, ctx = components.processor_components(obj)
        values["behavior"] = components.tokenizer_behavior(ctx["tokenizer"], ctx["template"])
        return values
    values = components.tokenizer_components(obj)
    values["behavior"] = components.tokenizer_behavior(obj, values["chat_template"])
    return values


def assemble(kind: str, values: dict, env: dict) -> dict:
    """Hash each component once; the stored value is the plain JSON that was hashed."""
    comps = {}
    for name, value in values.items():
        text = canonical_json(value)
        comps[name] = {"digest": sha256_hex(text), "value": value}
    overall = digest({name: c["digest"] for name, c in comps.items()})
    return {"fingerprint_version": FINGERPRINT_VERSION, "digest": overall, "kind": kind,
            "components": comps, "env": env}
