"""Canonical JSON and SHA-256 digests: the same value hashes alike in any process or machine."""
from __future__ import annotations

import hashlib
import json
import math
from typing import Any


def _default(obj: Any) -> Any:
    """Serialise what plain JSON cannot: sets sorted, everything else by its string form."""
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=canonical_json)
    if isinstance(obj, float) and not math.isfinite(obj):  # pragma: no cover - json handles floats
        return repr(obj)
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    return str(obj)


def canonical_json(value: Any) -> str:
    """sort_keys, compact separators, ensure_ascii=False, floats by repr (json's own rule)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_default)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def digest(value: Any) -> str:
    """SHA-256 hex of the canonical JSON of ``value``."""
    return sha256_hex(canonical_json(value))


def to_plain(value: Any) -> Any:
    """Round-trip through canonical JSON so the stored value is exactly what was hashed."""
    return json.loads(canonical_json(value))


NUL_STANDIN = "\u2400"  # ␀, SYMBOL FOR NULL


def storable(value: Any) -> Any:
    """``value`` with every NUL character written ␀ (U+2400): PostgreSQL cannot store NUL in text,
    so the backend refuses it, and tekken's byte-0 token is one. Values without NUL are returned
    as they are (the same object), and so is every digest of a fingerprint that could be stored
    before. Whether there is one is asked of json's C encoder, which writes NUL as ``\\u0000``: a
    128k vocab walked in Python cost ~0.6 s of a fingerprint's 1 s budget."""
    try:
        if "\\u0000" not in json.dumps(value, ensure_ascii=False, default=_default):
            return value
    except (TypeError, ValueError):  # a key json cannot write, a cycle: walk it
        pass
    return _nul_replaced(value)


def storable_canonical(value: Any) -> tuple[Any, str]:
    """``storable(value)`` and its canonical JSON, serialised once: the NUL check reads the text
    the digest hashes (serialising a 128k vocab twice cost ~60 ms of the cold fingerprint)."""
    try:
        text = canonical_json(value)
    except (TypeError, ValueError):  # what storable walks; canonical_json raises as it would after
        value = storable(value)
        return value, canonical_json(value)
    if "\\u0000" not in text:
        return value, text
    value = _nul_replaced(value)
    return value, canonical_json(value)


def _nul_replaced(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", NUL_STANDIN)
    if isinstance(value, (list, tuple)):
        return [_nul_replaced(v) for v in value]
    if isinstance(value, dict):
        return {_nul_replaced(k): _nul_replaced(v) for k, v in value.items()}
    return value
