"""Readable token strings for behavior diffs: ``"\\n\\n" -> ["\\n", "\\n"] vs ["\\n\\n"]``.

The diff has only the two fingerprints, not the tokenizers: each side's ids are shown through that
side's own ``vocab`` and ``decoder`` components (byte-level, metaspace, byte-fallback and WordPiece
forms turned back into text). Display only: nothing here takes part in a verdict.
"""
from __future__ import annotations

import re
from typing import Any, Callable

RESYNC_LIMIT = 8  # tokens per side searched for the point where both sides cover the same text
WINDOW = 5  # tokens shown per side when the texts themselves differ
BEFORE = 3  # common tokens shown before the first difference

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: every byte as one printable character."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for byte in range(256):
        if byte in keep:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


_UNICODE_TO_BYTE = {ch: byte for byte, ch in _bytes_to_unicode().items()}


def token_namer(components: dict) -> Callable[[Any], str]:
    """id -> display text for one side of a diff (components as in a fingerprint)."""
    vocab = _value(components, "vocab") or []
    table = {row[0]: row[1] for row in vocab if isinstance(row, list) and len(row) >= 2}
    added = {row.get("id") for row in _value(components, "added_tokens") or [] if isinstance(row, dict)}
    steps = _decoder_steps(_value(components, "decoder"))

    def name(token_id: Any) -> str:
        token = table.get(token_id)
        if not isinstance(token, str):
            return f"<id {token_id}>"
        return token if token_id in added else _decode_piece(token, steps)
    return name


def _value(components: dict, name: str) -> Any:
    comp = components.get(name)
    return comp.get("value") if isinstance(comp, dict) else None


def _decoder_steps(decoder: Any) -> list:
    if not isinstance(decoder, dict):
        return []
    if decoder.get("type") == "Sequence":
        return [d for d in decoder.get("decoders") or [] if isinstance(d, dict)]
    return [decoder]


def _decode_piece(token: str, steps: list) -> str:
    text = token
    for step in steps:
        kind = step.get("type")
        if kind == "ByteLevel":
            text = _byte_level(text)
        elif kind == "Metaspace":
            text = text.replace(step.get("replacement") or "\u2581", " ")
        elif kind == "Replace":
            pattern = (step.get("pattern") or {}).get("String")
            if isinstance(pattern, str) and pattern:
                text = text.replace(pattern, str(step.get("content", "")))
        elif kind == "ByteFallback":
            match = _BYTE_FALLBACK.match(text)
            if match:
                text = _bytes_text(bytes([int(match.group(1), 16)]))
        elif kind == "WordPiece":
            prefix = step.get("prefix") or "##"
            text = text[len(prefix):] if text.startswith(prefix) else text
    return text


def _byte_level(token: str) -> str:
    if not all(ch in _UNICODE_TO_BYTE for ch in token):
        return token
    return _bytes_text(bytes(_UNICODE_TO_BYTE[ch] for ch in token))


def _bytes_text(raw: bytes) -> str:
    """Partial UTF-8 (a token holding part of a character) shows as \\x escapes."""
    return raw.decode("utf-8", errors="backslashreplace")


def first_difference(a: list, b: list) -> int:
    """Index of the first differing position (len of the shorter when one is a prefix); -1 if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return -1 if len(a) == len(b) else min(len(a), len(b))


def aligned_tokens(ids_a: list, ids_b: list, name_a: Callable, name_b: Callable) -> Any:
    """Token strings at the first differing id, both sides covering the same text when they can.

    ``{"at", "before", "a", "b", "span"}``: ``span`` is the text both token runs spell (None when
    the texts themselves differ: then up to WINDOW tokens per side are shown).
    """
    at = first_difference(ids_a, ids_b)
    if at < 0:
        return None
    rest_a = [name_a(i) for i in ids_a[at:at + RESYNC_LIMIT]]
    rest_b = [name_b(i) for i in ids_b[at:at + RESYNC_LIMIT]]
    run = _resync(rest_a, rest_b)
    before = [name_a(i) for i in ids_a[max(0, at - BEFORE):at]]
    if run is None:
        return {"at": at, "before": before, "a": rest_a[:WINDOW], "b": rest_b[:WINDOW], "span": None}
    i, j = run
    return {"at": at, "before": before, "a": rest_a[:i], "b": rest_b[:j], "span": "".join(rest_a[:i])}


def _resync(a: list, b: list) -> Any:
    """Shortest runs a[:i], b[:j] (both non-empty) that spell the same text, or None."""
    i = j = 0
    text_a = text_b = ""
    while True:
        if i and j and text_a == text_b:
            return i, j
        if not (text_a.startswith(text_b) or text_b.startswith(text_a)):
            return None
        if (len(text_a) <= len(text_b) or j == len(b)) and i < len(a):
            text_a += a[i]
            i += 1
        elif j < len(b):
            text_b += b[j]
            j += 1
        else:
            return None
