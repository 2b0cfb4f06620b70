"""Diff two fingerprints: a verdict, the differing components, a human-readable detail for each.

Pure and stdlib-only; works on fingerprints that went through JSON; never raises.
Severity rules (docs/fingerprint.md):
- ALWAYS_ERROR components differ -> error (tables and settings the probes cannot cover fully).
- STRUCTURE components differ -> error if any behavior digest differs, else warning.
- behavior differs -> error. sampling_defaults -> warning. runtime -> info. env is never compared.
- A component reported by one side only -> info ("not comparable"), except chat_template,
  where absence of a template is itself a value (null) and differs -> error.
"""
from __future__ import annotations

import difflib
import json
from typing import Any

from .canonical import canonical_json

SUPPORTED_VERSIONS = (1,)
ALWAYS_ERROR = ("vocab", "merges", "added_tokens", "special_tokens", "encode_flags", "chat_template",
                "generation_eos", "image_processor", "processor")
STRUCTURE = ("model_params", "normalizer", "pre_tokenizer", "post_processor", "decoder")
ORDER = ("behavior",) + ALWAYS_ERROR + STRUCTURE + ("sampling_defaults", "runtime")
RANK = {"same": 0, "info": 1, "warning": 2, "error": 3}
SAMPLE = 10
MAX_ROWS = 50
MAX_INLINE = 4000


def diff_fingerprints(a: dict, b: dict) -> dict:
    """Compare two fingerprints (dicts, possibly JSON round-tripped). Pure; never raises."""
    try:
        return _diff(a, b)
    except Exception as exc:  # malformed input from another version or a truncated payload
        return _result([_row("fingerprint_version", "error", f"cannot compare: {type(exc).__name__}: {exc}", {})])


def _diff(a: Any, b: Any) -> dict:
    problem = _version_problem(a, "a") or _version_problem(b, "b")
    if problem:
        return _result([_row("fingerprint_version", "error", problem, {})])
    if a.get("digest") == b.get("digest") and a["components"].keys() == b["components"].keys():
        return _result([])
    ca, cb = a["components"], b["components"]
    behavior_same = "behavior" in ca and "behavior" in cb and _dg(ca, "behavior") == _dg(cb, "behavior")
    names = sorted(set(ca) | set(cb), key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))
    rows = [r for r in (_compare(n, ca, cb, behavior_same) for n in names) if r is not None]
    return _result(rows)


def _version_problem(fp: Any, side: str) -> str:
    if not isinstance(fp, dict):
        return f"{side} is not a fingerprint object"
    version = fp.get("fingerprint_version")
    if version not in SUPPORTED_VERSIONS:
        return f"{side} has fingerprint_version {version!r}; this diff reads {list(SUPPORTED_VERSIONS)}"
    comps = fp.get("components")
    if not isinstance(comps, dict) or not all(isinstance(c, dict) and isinstance(c.get("digest"), str)
                                              for c in comps.values()):
        return f"{side} has malformed components"
    return ""


def _dg(comps: dict, name: str) -> str:
    return comps[name]["digest"]


def _compare(name: str, ca: dict, cb: dict, behavior_same: bool) -> Any:
    if name not in ca or name not in cb:
        side = "a" if name in ca else "b"
        return _row(name, "info", f"only {side} reports {name}: not comparable", {})
    if _dg(ca, name) == _dg(cb, name):
        return None
    va, vb = ca[name].get("value"), cb[name].get("value")
    severity = _severity(name, behavior_same)
    try:
        summary, detail = DETAILS.get(name, _generic)(name, va, vb)
    except Exception as exc:  # a detail must never hide the verdict
        summary, detail = f"{name} differs", {"detail_error": f"{type(exc).__name__}: {exc}"}
    if severity == "warning" and name in STRUCTURE:
        summary += " (structure only: every behavior probe matches)"
    return _row(name, severity, summary, detail)


def _severity(name: str, behavior_same: bool) -> str:
    if name == "behavior" or name in ALWAYS_ERROR:
        return "error"
    if name in STRUCTURE:
        return "warning" if behavior_same else "error"
    if name == "sampling_defaults":
        return "warning"
    if name == "runtime":
        return "info"
    return "warning"  # a component this version does not know


def _row(name: str, severity: str, summary: str, detail: dict) -> dict:
    return {"name": name, "severity": severity, "summary": summary, "detail": detail}


def _result(rows: list) -> dict:
    verdict = max((r["severity"] for r in rows), key=RANK.__getitem__, default="same")
    return {"verdict": verdict, "components": rows}


# --------------------------------------------------------------------------- details

def _chat_template(name: str, va: Any, vb: Any) -> tuple[str, dict]:
    if va is None or vb is None:
        side = "a" if va is None else "b"
        return f"{side} has no chat template", {"a_present": va is not None, "b_present": vb is not None,
                                                "unified_diff": _unified(va, vb)}
    return "chat templates differ", {"unified_diff": _unified(va, vb)}


def _unified(va: Any, vb: Any) -> str:
    def lines(v: Any) -> list:
        if v is None:
            return []
        if isinstance(v, dict):
            return [ln for k in sorted(v) for ln in ([f"### template {k!r}\n"] + str(v[k]).splitlines(True))]
        return str(v).splitlines(True)
    return "".join(difflib.unified_diff(lines(va), lines(vb), "a/chat_template", "b/chat_template"))


def _vocab(name: str, va: Any, vb: Any) -> tuple[str, dict]:
    ma, mb = _by_id(va), _by_id(vb)
    differing = [i for i in sorted(set(ma) | set(mb)) if ma.get(i) != mb.get(i)]
    sample = [{"id": i, "a": ma.get(i), "b": mb.get(i)} for i in differing[:SAMPLE]]
    return (f"vocab differs: {len(differing)} of {max(len(ma), len(mb))} ids ({len(ma)} vs {len(mb)} entries)",
            {"a_size": len(ma), "b_size": len(mb), "differing": len(differing), "sample": sample})


def _by_id(rows: Any) -> dict:
    return {r[0]: (r[1] if len(r) == 2 else r[1:]) for r in rows or []}


def _merges(name: str, va: Any, vb: Any) -> tuple[str, dict]:
    la, lb = va or [], vb or []
    differing = [i for i in range(max(len(la), len(lb))) if (la[i:i + 1] or None) != (lb[i:i + 1] or None)]
    sample = [{"rank": i, "a": la[i] if i < len(la) else None, "b": lb[i] if i < len(lb) else None}
              for i in differing[:SAMPLE]]
    return (f"merges differ at {len(differing)} ranks ({len(la)} vs {len(lb)})",
            {"a_size": len(la), "b_size": len(lb), "differing": len(differing), "sample": sample})


def _added_tokens(name: str, va: Any, vb: Any) -> tuple[str, dict]:
    ma = {r["id"]: r for r in va or []}
    mb = {r["id"]: r for r in vb or []}
    rows = [{"token": (ma.get(i) or mb.get(i))["content"], "id": i, "a": ma.get(i), "b": mb.get(i)}
            for i in sorted(set(ma) | set(mb)) if ma.get(i) != mb.get(i)]
    names = ", ".join(repr(r["token"]) for r in rows[:5])
    return f"{len(rows)} added token(s) differ: {names}", {"differing": len(rows), "rows": rows[:MAX_ROWS]}


def _special_tokens(name: str, va: Any, vb: Any) -> tuple[str, dict]:
    va, vb = va or {}, vb or {}
    rows = [{"token": k, "a": va.get(k), "b": vb.get(k)} for k in sorted(set(va) | set(vb)) if va.get(k) != vb.get(k)]
    return "special tokens differ: " + ", ".join(r["token"] for r in rows), {"rows": rows}


def _generation_eos(name: str, va: Any, vb: Any) -> tuple[str, dict]:
    va, vb = va or {}, vb or {}
    detail = {"a": va.get("eos"), "b": vb.get("eos"),
              "pad": [va.get("pad"), vb.get("pad")], "bos": [va.get("bos"), vb.get("bos")]}
    return f"generation_config eos ids differ: {va.get('eos')} vs {vb.get('eos')}", detail


def _behavior(name: str, va: Any, vb: Any) -> tuple[str, dict]:
    va, vb = va or {}, vb or {}
    parts = [p for p in sorted(set(va) | set(vb)) if canonical_json(va.get(p)) != canonical_json(vb.get(p))]
    sample = []
    for part in parts:
        sample.extend(_first_differences(part, va.get(part), vb.get(part)))
    return f"behavior probes differ: {', '.join(parts)}", {"parts": parts, "sample": sample[:SAMPLE]}


def _first_differences(part: str, xa: Any, xb: Any) -> list:
    if isinstance(xa, list) and isinstance(xb, list):
        return [{"part": part, "probe": i, "a": p, "b": q} for i, (p, q) in enumerate(zip(xa, xb)) if p != q][:3]
    if isinstance(xa, dict) and isinstance(xb, dict):
        keys = [k for k in sorted(set(xa) | set(xb)) if xa.get(k) != xb.get(k)]
        return [{"part": part, "probe": k, "a": xa.get(k), "b": xb.get(k)} for k in keys[:3]]
    return [{"part": part, "probe": None, "a": _clip(xa), "b": _clip(xb)}]


def _generic(name: str, va: Any, vb: Any) -> tuple[str, dict]:
    if isinstance(va, dict) and isinstance(vb, dict):
        keys = [k for k in sorted(set(va) | set(vb)) if canonical_json(va.get(k)) != canonical_json(vb.get(k))]
        rows = [{"key": k, "a": _clip(va.get(k)), "b": _clip(vb.get(k))} for k in keys]
        return f"{name} differs in: {', '.join(keys)}", {"rows": rows}
    return f"{name} differs", {"a": _clip(va), "b": _clip(vb)}


def _clip(value: Any) -> Any:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return value if len(text) <= MAX_INLINE else text[:MAX_INLINE] + "…"


DETAILS = {"chat_template": _chat_template, "vocab": _vocab, "merges": _merges,
           "added_tokens": _added_tokens, "special_tokens": _special_tokens,
           "generation_eos": _generation_eos, "behavior": _behavior}
