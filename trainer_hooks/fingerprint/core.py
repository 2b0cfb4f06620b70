"""Assemble a fingerprint: one digest per component, an overall digest, informational env."""
from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from . import cache, components
from .canonical import canonical_json, digest, sha256_hex, storable_canonical

FINGERPRINT_VERSION = 1


def fingerprint_processor(proc: Any, generation_config: Any = None, *, model_dir: Any = None,
                          refresh: bool = False, chat_template_kwargs: Any = None) -> dict:
    """Fingerprint ``proc`` as loaded in this process (cached per object; see cache.py).

    ``proc``: a transformers tokenizer (fast or slow, v5 or v4), a ProcessorMixin, a vLLM ``LLM``
    or its tokenizer wrappers, or a mistral-common ``MistralTokenizer``.
    ``generation_config``: a GenerationConfig, a dict, or None to read
    ``model_dir/generation_config.json`` when ``model_dir`` is given.
    ``chat_template_kwargs``: the extra template variables this process renders prompts with
    (e.g. ``{"enable_thinking": False}``); every chat probe is rendered with them. Recorded in
    ``env`` (never compared: the renders are).
    """
    kwargs = components.render_kwargs(chat_template_kwargs)
    return cache.cached(proc, generation_config, model_dir,
                        lambda: _compute(proc, generation_config, model_dir, kwargs), refresh=refresh,
                        variant=canonical_json(kwargs))


def _compute(proc: Any, generation_config: Any, model_dir: Any, kwargs: dict) -> dict:
    with _gc_paused():
        kind, obj = components.unwrap(proc)
        values = _component_values(kind, obj, kwargs)
        values.update(components.generation_components(generation_config, model_dir))
        env = components.environment(obj, kind)
        if kwargs:
            env["chat_template_kwargs"] = kwargs
        return _assembled(kind, {name: storable_canonical(value) for name, value in values.items()}, env)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a cold fingerprint builds ~10^6 acyclic containers
    (a 128k vocab and its merges parsed from JSON, then the vocab's pairs): a collection every 700
    of them, and the full ones walking the whole heap, were ~40% of the cold time. Re-enabled after
    (on error too) only if it was on: a caller that turned it off keeps it off."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _component_values(kind: str, obj: Any, kwargs: dict) -> dict:
    if kind == "mistral":  # mistral-common has no template variables: kwargs do not apply
        values = components.mistral_components(obj)
        values["behavior"] = components.mistral_behavior(obj)
        return values
    if kind == "processor":
        values, ctx = components.processor_components(obj)
        values["behavior"] = components.tokenizer_behavior(ctx["tokenizer"], ctx["template"], kwargs)
        return values
    values = components.tokenizer_components(obj)
    values["behavior"] = components.tokenizer_behavior(obj, values["chat_template"], kwargs)
    return values


def assemble(kind: str, values: dict, env: dict) -> dict:
    """Hash each component once; the stored value is the plain JSON that was hashed."""
    return _assembled(kind, {name: (value, canonical_json(value)) for name, value in values.items()}, env)


def _assembled(kind: str, serialised: dict, env: dict) -> dict:
    """``serialised``: name -> (value, its canonical JSON)."""
    comps = {name: {"digest": sha256_hex(text), "value": value} for name, (value, text) in serialised.items()}
    overall = digest({name: c["digest"] for name, c in comps.items()})
    return {"fingerprint_version": FINGERPRINT_VERSION, "digest": overall, "kind": kind,
            "components": comps, "env": env}


def with_component(fingerprint: dict, name: str, value: Any, env: dict | None = None) -> dict:
    """A copy of ``fingerprint`` with component ``name`` set to ``value`` (plain JSON) and ``env``
    merged in; the other components keep their digests (a 150k vocab is not hashed again)."""
    comps = {n: dict(c) for n, c in fingerprint["components"].items()}
    comps[name] = {"digest": sha256_hex(canonical_json(value)), "value": value}
    overall = digest({n: c["digest"] for n, c in comps.items()})
    return {**fingerprint, "digest": overall, "components": comps, "env": {**(fingerprint.get("env") or {}), **(env or {})}}


def with_components(fingerprint: dict | None, values: dict, env: dict | None = None, *, kind: str = "model") -> dict:
    """``fingerprint`` with each component of ``values`` set (see ``with_component``), or, when there
    is no fingerprint yet, one of kind ``kind`` holding only these components."""
    serialised = {name: storable_canonical(value) for name, value in values.items()}
    if fingerprint is None:
        return _assembled(kind, serialised, dict(env or {}))
    comps = {n: dict(c) for n, c in fingerprint["components"].items()}
    comps.update({n: {"digest": sha256_hex(text), "value": v} for n, (v, text) in serialised.items()})
    overall = digest({n: c["digest"] for n, c in comps.items()})
    return {**fingerprint, "digest": overall, "components": comps, "env": {**(fingerprint.get("env") or {}), **(env or {})}}
