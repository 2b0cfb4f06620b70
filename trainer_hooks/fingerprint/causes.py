"""Say why two fingerprints differ, not only what: likely causes read from ``env``.

``env`` is never compared (it takes no part in digests or verdicts) but it explains: the class a
processor was loaded through, the libraries, the chat_template kwargs. A cause is reported only
when the components it could explain differ.
"""
from __future__ import annotations

from typing import Any

from ..contract import SAMPLING_PARAMS_COMPONENT

# What a different tokenizer class can change: transformers' model-specific classes build their
# own normalizer / pre-tokenizer / decoder instead of the ones in tokenizer.json.
LOADER_EXPLAINS = frozenset({"normalizer", "pre_tokenizer", "post_processor", "decoder", "model_params", "merges",
                             "vocab", "added_tokens", "special_tokens", "encode_flags", "behavior"})
VERSION_EXPLAINS = LOADER_EXPLAINS | {"chat_template"}
LIBRARIES = ("transformers", "tokenizers", "mistral_common", "vllm")


def likely_causes(a: dict, b: dict, differing: set) -> list[dict]:
    """``differing``: names of the components that differ at warning or error."""
    ea, eb = _env(a), _env(b)
    causes = []
    if a.get("kind") != b.get("kind") and differing - {SAMPLING_PARAMS_COMPONENT}:
        causes.append(_cause("kind", f"a is a {a.get('kind')}, b a {b.get('kind')}: the two sides load the model's "
                                     "processor through different libraries", a.get("kind"), b.get("kind")))
    ca, cb = _loader_class(ea), _loader_class(eb)
    if ca and cb and ca != cb and differing & LOADER_EXPLAINS:
        causes.append(_cause(
            "loader_class",
            f"a was loaded as {ca}, b as {cb}: a model-specific tokenizer class (picked when a config.json names a "
            "model_type, or tokenizer_config.json another tokenizer_class) can replace the normalizer and "
            "pre-tokenizer of tokenizer.json; load both sides through the same class", ca, cb))
    ka, kb = ea.get("chat_template_kwargs") or {}, eb.get("chat_template_kwargs") or {}
    if ka != kb and differing & {"behavior", "chat_template"}:
        causes.append(_cause("chat_template_kwargs",
                             f"the sides render chats with different chat_template kwargs: {ka or '(none)'} on a, "
                             f"{kb or '(none)'} on b", ka, kb))
    mode_a, mode_b = ea.get("vllm_tokenizer_mode"), eb.get("vllm_tokenizer_mode")
    if mode_a != mode_b and mode_a and mode_b:
        causes.append(_cause("vllm_tokenizer_mode", f"vLLM tokenizer_mode {mode_a} vs {mode_b}", mode_a, mode_b))
    if differing & VERSION_EXPLAINS:
        for lib in LIBRARIES:
            va, vb = ea.get(f"{lib}_version"), eb.get(f"{lib}_version")
            if va and vb and va != vb:
                causes.append(_cause(f"{lib}_version", f"{lib} {va} on a, {vb} on b: loading and tokenization "
                                                       "rules change between versions", va, vb))
    if SAMPLING_PARAMS_COMPONENT in differing:
        causes += _filled_defaults(a, b, ea, eb)
    return causes


def _filled_defaults(a: dict, b: dict, ea: dict, eb: dict) -> list[dict]:
    """Sampling values an engine filled in from the model's generation_config.json because the
    request left them unset (vLLM does: NVIDIA-NeMo/RL#3497), among the values that differ."""
    va, vb = _sampling(a), _sampling(b)
    differing = {k for k in set(va) | set(vb) if va.get(k) != vb.get(k)}
    causes = []
    for side, env in (("a", ea), ("b", eb)):
        filled = [k for k in (env.get("sampling") or {}).get("filled_from_generation_config") or [] if k in differing]
        if filled:
            values = va if side == "a" else vb
            shown = ", ".join(f"{k}={values.get(k)}" for k in filled)
            causes.append(_cause("generation_config_defaults",
                                 f"{side} serves {shown}: the defaults of the model's generation_config.json, which "
                                 "vLLM (and transformers' generate) fill in when a request leaves them unset; set "
                                 "them in the request, or serve with --generation-config vllm for neutral defaults",
                                 filled if side == "a" else None, filled if side == "b" else None))
    return causes


def _sampling(fp: dict) -> dict:
    comp = (fp.get("components") or {}).get(SAMPLING_PARAMS_COMPONENT) or {}
    return comp.get("value") if isinstance(comp.get("value"), dict) else {}


def _env(fp: dict) -> dict:
    env = fp.get("env")
    return env if isinstance(env, dict) else {}


def _loader_class(env: dict) -> str:
    """The class name, less wrappers that do not change tokenization (vLLM's Cached<Class>)."""
    name = env.get("class")
    if not isinstance(name, str):
        return ""
    return name[len("Cached"):] if name.startswith("Cached") and len(name) > len("Cached") else name


def _cause(kind: str, summary: str, a: Any, b: Any) -> dict:
    return {"cause": kind, "summary": summary, "a": a, "b": b}
