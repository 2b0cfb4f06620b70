"""Extract each fingerprint component from a processor object, by duck typing.

Nothing heavy is imported here: transformers tokenizers (v5 and v4, fast and slow), ProcessorMixin
processors, vLLM wrappers and mistral-common tokenizers are recognised by their attributes.
Absent key = this kind of processor cannot report the component; ``None`` = it reports "none".
"""
from __future__ import annotations

import json
import math
import operator
import os
import sys
from typing import Any

from .probes import GENERATION_PROMPT, PROBE_CONVERSATIONS, PROBE_TEXTS, chat_probe_key

SPECIAL_NAMES = ("bos", "eos", "unk", "pad", "sep", "cls", "mask")
STRUCTURE_KEYS = ("normalizer", "pre_tokenizer", "post_processor", "decoder")
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# Never fingerprinted: paths, class naming and versions (docs/fingerprint.md, "Shape").
NOISE_KEYS = frozenset({
    "name_or_path", "_name_or_path", "processor_class", "_processor_class", "auto_map",
    "tokenizer_class", "image_processor_type", "feature_extractor_type", "video_processor_type",
    "transformers_version", "_commit_hash", "_from_auto", "_from_pipeline", "chat_template",
    "tokenizer", "image_processor", "feature_extractor", "video_processor", "audio_tokenizer",
})


# --------------------------------------------------------------------------- unwrapping

def unwrap(proc: Any) -> tuple[str, Any]:
    """Return (kind, object): "mistral" -> mistral-common MistralTokenizer; "processor"; "tokenizer"."""
    for _ in range(6):
        if _is_mistral_common(proc):
            return "mistral", proc
        inner = _mistral_inside(proc)
        if inner is not None:
            return "mistral", inner
        if _is_processor(proc):
            return "processor", proc
        if hasattr(proc, "encode") and hasattr(proc, "get_vocab"):
            return "tokenizer", proc
        if callable(getattr(proc, "get_tokenizer", None)):  # vllm.LLM, engines
            proc = proc.get_tokenizer()
        elif getattr(proc, "tokenizer", None) is not None:  # vLLM TokenizerGroup and kin
            proc = proc.tokenizer
        else:
            break
    raise TypeError(f"cannot fingerprint a {type(proc).__name__}: no tokenizer found")


def _is_mistral_common(obj: Any) -> bool:
    return hasattr(obj, "instruct_tokenizer") and hasattr(obj, "encode_chat_completion")


def _mistral_inside(obj: Any) -> Any:
    """vLLM's MistralTokenizer keeps it in ``.mistral``; transformers' MistralCommonBackend in ``.tokenizer``."""
    for attr in ("mistral", "tokenizer"):
        inner = getattr(obj, attr, None)
        if inner is not None and _is_mistral_common(inner):
            return inner
    return None


def _is_processor(obj: Any) -> bool:
    return getattr(obj, "tokenizer", None) is not None and any(
        getattr(obj, a, None) is not None for a in ("image_processor", "video_processor", "feature_extractor")
    )


# --------------------------------------------------------------------------- transformers tokenizers

def tokenizer_components(tok: Any) -> dict[str, Any]:
    comps: dict[str, Any] = {}
    backend = getattr(tok, "backend_tokenizer", None)
    added = _added_tokens(tok)
    if backend is not None:
        comps.update(_backend_components(backend))
    else:
        comps["vocab"] = _vocab_pairs(tok.get_vocab())
    comps["vocab"] = _merge_added(comps["vocab"], added)
    comps["added_tokens"] = added
    comps["special_tokens"] = _special_tokens(tok)
    comps["encode_flags"] = _encode_flags(tok)
    comps["chat_template"] = _chat_template(getattr(tok, "chat_template", None))
    comps["runtime"] = _runtime(tok)
    return comps


def _backend_components(backend: Any) -> dict[str, Any]:
    state = json.loads(backend.to_str())
    model = dict(state.get("model") or {})
    comps = {"vocab": _vocab_pairs(model.pop("vocab", None)), "merges": _merge_pairs(model.pop("merges", None))}
    comps["model_params"] = model
    for key in STRUCTURE_KEYS:
        comps[key] = simplify_structure(state.get(key))
    return comps


def _vocab_pairs(vocab: Any) -> list:
    if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel: token -> id (usually already by id)
        return sorted(map(list, zip(vocab.values(), vocab)), key=_first)  # ~15% faster than a comprehension
    if isinstance(vocab, list):  # Unigram: [token, score] by id; the score drives encoding
        return [[i, t, s] for i, (t, s) in enumerate(vocab)]
    return []


_first = operator.itemgetter(0)  # a row's id; C, not a Python call per row


def _merge_pairs(merges: Any) -> Any:
    """Pairs, never space-joined strings; tokenizers >= 0.20 already writes pairs (kept as is: fast)."""
    if not merges or not isinstance(merges[0], str):
        return merges
    return [m.split(" ", 1) for m in merges]


def _merge_added(vocab: list, added: list) -> list:
    """vocab = every (id, token) the tokenizer knows: model vocab plus added tokens, as get_vocab()."""
    known = set(map(_first, vocab))
    extra = [[row["id"], row["content"]] for row in added if row["id"] not in known]
    return sorted(vocab + extra, key=_first) if extra else vocab


def simplify_structure(node: Any) -> Any:
    """Canonical form of a pipeline subtree: an empty Sequence is none, a one-step Sequence is the step."""
    if isinstance(node, dict) and node.get("type") == "Sequence":
        steps = next((v for k, v in node.items() if k != "type" and isinstance(v, list)), None)
        if steps is not None:
            steps = [simplify_structure(s) for s in steps]
            steps = [s for s in steps if s is not None]
            if not steps:
                return None
            if len(steps) == 1:
                return steps[0]
            key = next(k for k, v in node.items() if k != "type" and isinstance(v, list))
            return {**node, key: steps}
    return node


def _added_tokens(tok: Any) -> list:
    decoder = getattr(tok, "added_tokens_decoder", None) or {}
    rows = []
    for idx, token in sorted(decoder.items()):
        rows.append({
            "id": int(idx), "content": str(token),
            **{a: bool(getattr(token, a, False)) for a in ("lstrip", "rstrip", "normalized", "special", "single_word")},
        })
    return rows


def _special_tokens(tok: Any) -> dict:
    named = {}
    for name in SPECIAL_NAMES:
        text = _safe(lambda name=name: getattr(tok, f"{name}_token", None))
        named[name] = None if text is None else [str(text), _token_id(tok, str(text))]
    listed = {str(t) for t in (_safe(lambda: tok.all_special_tokens) or ())}
    extras = sorted(listed - {v[0] for v in named.values() if v})
    return {**named, "extra": [[t, _token_id(tok, t)] for t in extras]}


def _token_id(tok: Any, text: str) -> Any:
    idx = _safe(lambda: tok.convert_tokens_to_ids(text))
    return idx if isinstance(idx, int) else None


def _encode_flags(tok: Any) -> dict:
    """Measured: which ids encode() adds around the text, plus the decode/encode-affecting switches."""
    text = PROBE_TEXTS[0]
    plain = list(tok.encode(text, add_special_tokens=False))
    full = list(tok.encode(text))
    start = _find(full, plain)
    flags: dict[str, Any] = (
        {"prefix": full[:start], "suffix": full[start + len(plain):]} if start >= 0 else {"with_special": full}
    )
    flags["pair"] = _safe(lambda: tok.num_special_tokens_to_add(pair=True))
    flags["clean_up_tokenization_spaces"] = bool(getattr(tok, "clean_up_tokenization_spaces", False))
    # A tokenizer without the switch never adds a prefix space: None and False mean the same.
    flags["add_prefix_space"] = bool(getattr(tok, "add_prefix_space", False))
    legacy = getattr(tok, "legacy", None)
    flags["legacy"] = legacy if isinstance(legacy, (bool, type(None))) else str(legacy)
    return flags


def _find(seq: list, sub: list) -> int:
    for i in range(len(seq) - len(sub) + 1):
        if seq[i:i + len(sub)] == sub:
            return i
    return -1


def _chat_template(template: Any) -> Any:
    if isinstance(template, dict):  # named templates, sorted by name via canonical JSON
        return {str(k): str(v) for k, v in template.items()} or None
    if isinstance(template, (list, tuple)):  # v4 list form: [{"name":..., "template":...}]
        return {str(t["name"]): str(t["template"]) for t in template} or None
    return None if template is None else str(template)


def _runtime(tok: Any) -> dict:
    max_len = getattr(tok, "model_max_length", None)
    if isinstance(max_len, float):
        max_len = int(max_len) if math.isfinite(max_len) else None
    return {"padding_side": getattr(tok, "padding_side", None),
            "truncation_side": getattr(tok, "truncation_side", None), "model_max_length": max_len}


def tokenizer_behavior(tok: Any, template: Any, chat_template_kwargs: Any = None) -> dict:
    encode = [list(tok.encode(t)) for t in PROBE_TEXTS]
    plain = [list(tok.encode(t, add_special_tokens=False)) for t in PROBE_TEXTS]
    decode = [_safe_call(lambda ids=ids: tok.decode(ids)) for ids in plain]
    chat = _chat_probes(tok, template, render_kwargs(chat_template_kwargs))
    return {"encode": encode, "encode_no_special": plain, "decode": decode, "chat": chat}


# Arguments the probes themselves set: a run's chat_template_kwargs cannot override them.
_PROBE_ARGS = frozenset({"conversation", "messages", "tools", "add_generation_prompt", "tokenize", "chat_template",
                         "return_dict", "continue_final_message"})


def render_kwargs(chat_template_kwargs: Any) -> dict:
    """The run's chat_template kwargs (e.g. enable_thinking) as passed to every probe render."""
    if not chat_template_kwargs:
        return {}
    return {str(k): v for k, v in dict(chat_template_kwargs).items() if str(k) not in _PROBE_ARGS}


def _chat_probes(tok: Any, template: Any, kwargs: dict) -> Any:
    if template is None:
        return None
    out = {}
    for conv in PROBE_CONVERSATIONS:
        for gen in GENERATION_PROMPT:
            out[chat_probe_key(conv.name, gen)] = _render(tok, conv, gen, template, kwargs)
    return out


def select_template(template: Any, tools: Any) -> str:
    """The template text apply_chat_template would use (named templates: tool_use with tools, else default)."""
    if not isinstance(template, dict):
        return template
    if tools is not None and "tool_use" in template:
        return template["tool_use"]
    if "default" in template:
        return template["default"]
    raise ValueError(f"multiple chat templates and none named 'default': {sorted(template)}")


def _render(tok: Any, conv: Any, gen: bool, template: Any, kwargs: dict) -> Any:
    try:
        tools = [dict(t) for t in conv.tools] if conv.tools else None
        text = tok.apply_chat_template([dict(m) for m in conv.messages], tools=tools, tokenize=False,
                                       add_generation_prompt=gen, chat_template=select_template(template, tools),
                                       **kwargs)
    except Exception as exc:  # a template refusing a conversation is itself behavior
        return {"error": type(exc).__name__, "message": str(exc)[:200]}
    return {"text": text, "ids": list(tok.encode(text, add_special_tokens=False))}


# --------------------------------------------------------------------------- multimodal processors

def processor_components(proc: Any) -> tuple[dict, dict]:
    tok = proc.tokenizer
    comps = tokenizer_components(tok)
    template = _chat_template(getattr(proc, "chat_template", None)) or comps["chat_template"]
    comps["chat_template"] = template
    image = getattr(proc, "image_processor", None) or getattr(proc, "video_processor", None)
    comps["image_processor"] = _image_processor(image) if image is not None else None
    comps["processor"] = _processor_config(proc)
    return comps, {"tokenizer": tok, "template": template}


def _image_processor(image: Any) -> dict:
    config = _strip_noise(image.to_dict())
    backend = next((c.__name__ for c in type(image).__mro__ if c.__name__.endswith("Backend")), None)
    if backend is None:
        backend = "fast" if type(image).__name__.endswith("Fast") else "default"
    return {"config": config, "backend": backend}


def _processor_config(proc: Any) -> dict:
    raw = _safe(proc.to_dict) or {}
    return _strip_noise({k: v for k, v in raw.items() if not k.endswith("_processor") and k != "tokenizer"})


def _strip_noise(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_noise(v) for k, v in node.items() if k not in NOISE_KEYS and "path" not in k}
    if isinstance(node, (list, tuple)):
        return [_strip_noise(v) for v in node]
    if isinstance(node, (str, int, float, bool)) or node is None:
        return node
    return str(node)


# --------------------------------------------------------------------------- mistral-common

def mistral_components(mt: Any) -> dict[str, Any]:
    tk = mt.instruct_tokenizer.tokenizer
    vocab = list(tk.vocab())
    special_ids = sorted(_safe(lambda: tk.special_ids) or range(_safe(lambda: tk.num_special_tokens) or 0))
    special = {name: _mistral_special(tk, name) for name in ("bos", "eos", "unk", "pad")}
    plain = tk.encode(PROBE_TEXTS[0], bos=False, eos=False)
    full = tk.encode(PROBE_TEXTS[0], bos=True, eos=False)
    return {
        "vocab": [[i, t] for i, t in enumerate(vocab)],
        "model_params": {"type": type(tk).__name__.lower(), "version": str(getattr(tk, "version", "")),
                         "num_special_tokens": _safe(lambda: tk.num_special_tokens)},
        "added_tokens": [{"id": i, "content": vocab[i], "special": True} for i in special_ids if i < len(vocab)],
        "special_tokens": {**special, "extra": []},
        "encode_flags": {"prefix": full[: len(full) - len(plain)], "suffix": []},
        "chat_template": {"mistral_instruct": type(mt.instruct_tokenizer).__name__},
    }


def _mistral_special(tk: Any, name: str) -> Any:
    idx = _safe(lambda: getattr(tk, f"{name}_id"))
    if not isinstance(idx, int) or idx < 0:
        return None
    return [str(_safe(lambda: tk.id_to_piece(idx))), idx]


def mistral_behavior(mt: Any) -> dict:
    tk = mt.instruct_tokenizer.tokenizer
    encode = [tk.encode(t, bos=True, eos=False) for t in PROBE_TEXTS]
    plain = [tk.encode(t, bos=False, eos=False) for t in PROBE_TEXTS]
    decode = [_safe_call(lambda ids=ids: tk.decode(ids)) for ids in plain]
    return {"encode": encode, "encode_no_special": plain, "decode": decode, "chat": _mistral_chat(mt)}


def _mistral_chat(mt: Any) -> dict:
    from mistral_common.protocol.instruct.request import ChatCompletionRequest  # lazy: optional dependency

    out = {}
    for conv in PROBE_CONVERSATIONS:
        try:
            tools = [dict(t) for t in conv.tools] if conv.tools else None
            req = ChatCompletionRequest(messages=[dict(m) for m in conv.messages], tools=tools)
            tokenized = mt.encode_chat_completion(req)
            out[conv.name] = {"ids": list(tokenized.tokens)}
        except Exception as exc:  # mistral-common refusing a conversation is itself behavior
            out[conv.name] = {"error": type(exc).__name__, "message": str(exc)[:200]}
    return out


# --------------------------------------------------------------------------- generation config

def generation_components(generation_config: Any, model_dir: Any) -> dict[str, Any]:
    """generation_eos / sampling_defaults from an object, a dict, or model_dir/generation_config.json."""
    raw = generation_config_dict(generation_config, model_dir)
    if raw is None:
        return {}  # not reported: the diff treats it as "not comparable", never as a difference
    eos = raw.get("eos_token_id")
    eos_ids = sorted({int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None})
    return {
        "generation_eos": {"eos": eos_ids, "pad": raw.get("pad_token_id"), "bos": raw.get("bos_token_id")},
        "sampling_defaults": {k: raw[k] for k in SAMPLING_KEYS if raw.get(k) is not None},
    }


def generation_config_dict(generation_config: Any, model_dir: Any) -> Any:
    """The generation config as a dict of what it sets (a GenerationConfig's ``to_diff_dict()``, as
    vLLM reads it), a dict as given, or ``model_dir/generation_config.json``; None when there is none."""
    if isinstance(generation_config, dict):
        return generation_config
    if generation_config is not None:
        # vLLM applies only what the model's file sets: the diff against defaults, as vLLM reads it.
        to_diff = getattr(generation_config, "to_diff_dict", None)
        raw = dict(to_diff()) if callable(to_diff) else dict(vars(generation_config))
        for key in ("eos_token_id", "pad_token_id", "bos_token_id"):
            raw.setdefault(key, getattr(generation_config, key, None))
        return raw
    if model_dir is not None:
        path = os.path.join(os.fspath(model_dir), "generation_config.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as fh:
                return json.load(fh)
    return None


# --------------------------------------------------------------------------- env and helpers

def environment(proc: Any, kind: str) -> dict:
    env: dict[str, Any] = {"class": type(proc).__name__, "kind": kind, "python": sys.version.split()[0]}
    for module in ("transformers", "tokenizers", "mistral_common", "vllm"):
        loaded = sys.modules.get(module)
        if loaded is not None:
            env[f"{module}_version"] = getattr(loaded, "__version__", None)
    mode = getattr(proc, "tokenizer_mode", None)
    if isinstance(mode, str):
        env["vllm_tokenizer_mode"] = mode
    return env


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception:
        return None


def _safe_call(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:
        return {"error": type(exc).__name__}
