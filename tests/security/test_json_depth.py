"""The request guard's nesting check (issue 13.2): linear, and exactly the byte-by-byte rule."""
from __future__ import annotations

import json
import random

import pytest

from paritywatch.backend.middleware import MAX_JSON_DEPTH, json_too_deep


def _reference_depth(text: bytes) -> int:
    """Brackets outside strings, byte by byte: the obvious (slow) definition."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in text:
        ch = chr(byte)
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


@pytest.mark.parametrize("seed", range(40))
def test_nesting_check_agrees_with_the_byte_by_byte_definition(seed, monkeypatch):
    """Strings holding brackets, escaped quotes and backslash runs, across chunk boundaries."""
    import paritywatch.backend.middleware as mw

    monkeypatch.setattr(mw, "SCAN_CHUNK", random.Random(seed).choice([1, 2, 3, 7, 64]))
    rng = random.Random(seed)
    parts = []
    for _ in range(rng.randint(50, 400)):
        kind = rng.random()
        if kind < 0.35:
            parts.append(rng.choice(["[", "{", "]", "}", "[[", "]]"]))
        elif kind < 0.8:
            inner = "".join(rng.choice(['[', ']', '{', '}', 'a', '\\\\', '\\"', ' ']) for _ in range(rng.randint(0, 12)))
            parts.append(f'"{inner}"')
        else:
            parts.append(rng.choice([",", ":", "1", "true", " "]))
    text = "".join(parts).encode()
    deepest = _reference_depth(text)
    for limit in (max(0, deepest - 1), deepest, deepest + 1):
        assert json_too_deep(text, limit) == (deepest > limit), (text, limit, deepest)


def test_nesting_inside_strings_is_not_nesting():
    text = json.dumps({"template": "[" * 5000, "nested": [[[[1]]]]}).encode()
    assert not json_too_deep(text)
    assert json_too_deep(b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1))
