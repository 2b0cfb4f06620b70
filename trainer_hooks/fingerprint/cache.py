"""Fingerprint each processor object once per process.

Keyed by object identity (plus generation config, model_dir and chat_template kwargs); a cheap
stamp (chat template, special tokens, sizes, sides, generation config) notices mutation after
loading, e.g. TRL-style ``tok.chat_template = custom``.
Not noticed: in-place edits of the Rust pipeline (``backend_tokenizer.normalizer = ...``); pass
``refresh=True`` or call ``clear()`` after such surgery.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

_STAMP_ATTRS = ("chat_template", "bos_token", "eos_token", "unk_token", "pad_token", "sep_token",
                "cls_token", "mask_token", "padding_side", "truncation_side", "model_max_length",
                "clean_up_tokenization_spaces", "add_bos_token", "add_eos_token")
_GEN_ATTRS = ("eos_token_id", "pad_token_id", "bos_token_id", "temperature", "top_p", "top_k",
              "min_p", "repetition_penalty")

_lock = threading.Lock()
_entries: dict[tuple, tuple[Any, tuple, dict]] = {}


def stamp(proc: Any, generation_config: Any) -> tuple:
    """Cheap (µs) summary of everything a user typically mutates after loading."""
    parts: list = []
    for obj in (proc, getattr(proc, "tokenizer", None)):
        if obj is None:
            continue
        parts.append(tuple(_attr(obj, a) for a in _STAMP_ATTRS))
        parts.append(_attr(obj, "__len__", call=True))
        image = getattr(obj, "image_processor", None)
        if image is not None:
            parts.append(tuple(sorted((k, repr(v)) for k, v in vars(image).items())))
    if isinstance(generation_config, dict):
        parts.append(repr(sorted(generation_config.items())))
    elif generation_config is not None:
        parts.append(tuple(repr(getattr(generation_config, a, None)) for a in _GEN_ATTRS))
    return tuple(parts)


def _attr(obj: Any, name: str, call: bool = False) -> Any:
    try:
        value = getattr(obj, name, None)
        value = value() if call and value is not None else value
    except Exception:
        return None
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


def cached(proc: Any, generation_config: Any, model_dir: Any, compute: Callable[[], dict],
           refresh: bool = False, variant: str = "") -> dict:
    """``variant``: anything else the result depends on (the chat_template kwargs, as canonical JSON)."""
    key = (id(proc), id(generation_config), None if model_dir is None else str(model_dir), variant)
    current = stamp(proc, generation_config)
    with _lock:
        entry = _entries.get(key)
    if entry is not None and not refresh and _alive(entry[0], proc) and entry[1] == current:
        return entry[2]
    result = compute()
    with _lock:
        _entries[key] = (_ref(proc, key), current, result)
    return result


def _ref(proc: Any, key: tuple) -> Any:
    """A weak reference that drops the entry when the object dies (so a reused id never hits)."""
    try:
        return weakref.ref(proc, lambda _r, key=key: _drop(key))
    except TypeError:
        return lambda proc=proc: proc  # not weak-referenceable: keep it alive so its id stays unique


def _alive(ref: Any, proc: Any) -> bool:
    return ref() is proc


def _drop(key: tuple) -> None:
    with _lock:
        _entries.pop(key, None)


def clear() -> None:
    with _lock:
        _entries.clear()
