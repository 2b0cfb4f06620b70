"""Unified diffs of chat templates that ``patch``/``git apply`` accept and give the other text back.

Templates rarely end in a newline, and many are one line long: a plain ``difflib`` diff then glues
the last removed line onto the first added one. Here lines split on ``\\n`` only (``\\r`` stays in
the line, so CRLF shows as a change; ``str.splitlines`` would also split on ``\\x0b``, ``\\u2028``...),
and a line without a newline is followed by GNU diff's ``\\ No newline at end of file`` marker.
A missing side (no template at all, or no template of that name) is ``/dev/null``, as in git.
"""
from __future__ import annotations

import difflib
from typing import Any
from urllib.parse import quote

NO_NEWLINE = "\\ No newline at end of file\n"
DEV_NULL = "/dev/null"


def split_lines(text: str) -> list[str]:
    """Lines with their ``\\n`` kept; the last one has none when the text does not end in ``\\n``."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def unified_diff(a: Any, b: Any, path: str, context: int = 3) -> str:
    """Diff of two texts (None = absent) under ``a/<path>`` and ``b/<path>``; "" when equal."""
    la, lb = split_lines(a or ""), split_lines(b or "")
    if la == lb:
        return ""
    from_file = DEV_NULL if a is None else f"a/{path}"
    to_file = DEV_NULL if b is None else f"b/{path}"
    out = []
    for line in difflib.unified_diff(la, lb, from_file, to_file, n=context):
        out.append(line)
        if not line.endswith("\n"):  # the last line of a side, with no newline after it
            out.append("\n" + NO_NEWLINE)
    return "".join(out)


def template_diff(a: Any, b: Any, context: int = 3) -> str:
    """Unified diff of two chat_template values: text, ``{name: text}`` or None.

    Named templates diff name by name (``chat_template/<name>``, the name percent-encoded); a
    plain text facing named templates counts as the one named ``default``, as transformers picks it.
    """
    if not isinstance(a, dict) and not isinstance(b, dict):
        return unified_diff(_text(a), _text(b), "chat_template", context)
    na, nb = _named(a), _named(b)
    return "".join(unified_diff(na.get(name), nb.get(name), f"chat_template/{quote(name, safe='')}", context)
                   for name in sorted(set(na) | set(nb)))


def _text(value: Any) -> Any:
    return None if value is None else str(value)


def _named(value: Any) -> dict:
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    return {"default": str(value)}
