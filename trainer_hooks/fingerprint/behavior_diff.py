"""Compare two ``behavior`` values probe by probe, on the probes both sides report.

Texts are compared by index, conversations by name: a fingerprint from a version with more probes
still compares with an older one on the probes they share (docs/fingerprint.md, "Probes").
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from .canonical import canonical_json
from .probes import text_probe_label
from .tokens import aligned_tokens, first_difference

LIST_PARTS = ("encode", "encode_no_special", "decode")
MAX_TEXT = 2000  # rendered text shown per side in a row


@dataclass
class Comparison:
    common: list = field(default_factory=list)  # [(part, key)] both sides report, in probe order
    differing: list = field(default_factory=list)  # the common ones whose outcomes differ
    only_a: list = field(default_factory=list)
    only_b: list = field(default_factory=list)

    @property
    def compared(self) -> int:
        return len(self.common)

    @property
    def same(self) -> bool:
        return not self.differing and self.compared > 0


def probes(value: Any) -> dict:
    """{(part, key): outcome}: list parts keyed by index, chat by conversation name."""
    if not isinstance(value, dict):
        return {}
    out = {}
    for part, items in value.items():
        if isinstance(items, list):
            out.update({(part, i): v for i, v in enumerate(items)})
        elif isinstance(items, dict):
            out.update({(part, k): v for k, v in items.items()})
        else:  # chat: null (no template) is an outcome of its own
            out[(part, None)] = items
    return out


def compare(va: Any, vb: Any, outcome: Callable[[str, Any], Any] = lambda part, v: v) -> Comparison:
    pa, pb = probes(va), probes(vb)
    result = Comparison(only_a=[k for k in pa if k not in pb], only_b=[k for k in pb if k not in pa])
    for key in (k for k in pa if k in pb):
        result.common.append(key)
        if canonical_json(outcome(key[0], pa[key])) != canonical_json(outcome(key[0], pb[key])):
            result.differing.append(key)
    for part in _parts_reported_by_one_form(va, vb):  # e.g. no template (null) vs rendered probes
        result.common.append((part, None))
        result.differing.append((part, None))
        result.only_a = [k for k in result.only_a if k[0] != part]
        result.only_b = [k for k in result.only_b if k[0] != part]
    return result


def _parts_reported_by_one_form(va: Any, vb: Any) -> list:
    if not isinstance(va, dict) or not isinstance(vb, dict):
        return []
    return [p for p in va if p in vb and (va[p] is None) != (vb[p] is None)]


def compare_renders(va: Any, vb: Any) -> Comparison:
    """The chat probes only, by what the template produced: the text (or the error it raised).
    Ids are the tokenizer's business, compared by ``compare``."""
    chat_a = va.get("chat") if isinstance(va, dict) else None
    chat_b = vb.get("chat") if isinstance(vb, dict) else None
    return compare({"chat": chat_a}, {"chat": chat_b}, lambda part, v: _render_outcome(v))


def _render_outcome(v: Any) -> Any:
    if isinstance(v, dict):
        if "text" in v:
            return ["text", v["text"]]
        if "error" in v:
            return ["error", v.get("error"), v.get("message")]
        return ["ids", v.get("ids")]  # mistral: the ids are the render
    return v


def rendered_ok(va: Any, key: tuple) -> bool:
    v = probes(va).get(key)
    return isinstance(v, dict) and "error" not in v


def probe_label(part: str, key: Any) -> str:
    if part in LIST_PARTS and isinstance(key, int):
        return text_probe_label(key)
    return "no chat template" if key is None else str(key)


def probe_row(part: str, key: Any, va: Any, vb: Any, name_a: Callable, name_b: Callable) -> dict:
    """One differing probe, readable: label, the text on both sides, tokens at the first difference."""
    if key is None:  # the whole part is null on one side (no chat template) and reported on the other
        return {"part": part, "probe": probe_label(part, key), "a": _part_summary(va, part), "b": _part_summary(vb, part)}
    xa, xb = probes(va).get((part, key)), probes(vb).get((part, key))
    row: dict = {"part": part, "probe": probe_label(part, key), "a": _clip(xa), "b": _clip(xb)}
    if part == "decode":
        row["text"] = {"a": _text_of(xa), "b": _text_of(xb)}
        row["first_diff_char"] = _first_char_difference(row["text"]["a"], row["text"]["b"])
        return row
    ids_a, ids_b = _ids(xa), _ids(xb)
    if part == "chat":
        row["text"] = {"a": _text_of(xa), "b": _text_of(xb)}
        row["first_diff_char"] = _first_char_difference(row["text"]["a"], row["text"]["b"])
        errors = {side: f"{x['error']}: {x.get('message', '')}" for side, x in (("a", xa), ("b", xb))
                  if isinstance(x, dict) and "error" in x}
        if errors:
            row["error"] = {"a": errors.get("a"), "b": errors.get("b")}
    if ids_a is not None and ids_b is not None:
        row["tokens"] = aligned_tokens(ids_a, ids_b, name_a, name_b)
    return row


def _part_summary(value: Any, part: str) -> str:
    items = value.get(part) if isinstance(value, dict) else None
    if items is None:
        return "no chat template: nothing rendered" if part == "chat" else f"no {part}"
    return f"{len(items)} probes reported"


def _ids(x: Any) -> Any:
    if isinstance(x, list) and all(isinstance(i, int) for i in x):
        return x
    if isinstance(x, dict) and isinstance(x.get("ids"), list):
        return x["ids"]
    return None


def _text_of(x: Any) -> Any:
    if isinstance(x, str):
        return x[:MAX_TEXT]
    if isinstance(x, dict) and isinstance(x.get("text"), str):
        return x["text"][:MAX_TEXT]
    return None


def _first_char_difference(a: Any, b: Any) -> Any:
    if not isinstance(a, str) or not isinstance(b, str):
        return None
    at = first_difference(list(a), list(b))
    return None if at < 0 else at


def _clip(value: Any, limit: int = 4000) -> Any:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return value if len(text) <= limit else text[:limit] + "…"
