"""Diff two fingerprints: a verdict, the differing components, a human-readable detail for each.

Pure and stdlib-only; works on fingerprints that went through JSON; never raises.
Severity rules (docs/fingerprint.md, "Diff and verdict rules"), each by the difference's effect on
the tokens the rollout samples and the trainer scores:
- vocab, merges, added_tokens, image_processor, processor differ -> error (tables the probes can
  only sample), except a vocab / added_tokens difference that is only one side's new pad token -> info.
- special_tokens, generation_eos, encode_flags, runtime, sampling_defaults: field by field
  (effects.py): an eos id -> error, a pad token or pad id -> info, padding/truncation side and
  model_max_length -> info, the ids encode() adds -> error...
- chat_template differs -> warning when both templates render every probe conversation both sides
  report identically (text, or the error raised), else error.
- sampling_params: temperature or log-prob mode differ -> error; masks and penalties -> warning
  (sampling.py; "disabled" encodings are normalised before hashing, so they never differ).
- STRUCTURE components differ -> error if any behavior probe differs, else warning.
- behavior: a probe that differs -> error; probe sets that differ (other paritywatch versions)
  while every shared probe matches -> info. When another differing component, at least as
  severe, explains each differing part of it (a conversation rendered differently: the chat
  template's; a text encoded differently: a tokenizer table's), the row is that component's
  evidence, not a finding of its own: it carries ``evidence_of`` {part: component}, and
  ``findings`` folds it into that component ("chat_template (rendered differently in 3 of 18
  probe conversations)").
- A component reported by one side only -> info ("not comparable"); the model components
  (model_config, lora_adapter) -> no row (optional: not every process registers its model), except
  engine_config, whose own hazards (a prefix cache not reset after a sync) are judged alone.
- model_config, lora_adapter, engine_config: field by field (model_effects.py): what changes logits
  (rope / YaRN factors, norm eps, shapes, an adapter on one side only) -> error; precision (dtype,
  lm_head dtype, quantization, KV-cache dtype) -> warning; names, kernels -> info.
- env is never compared; it feeds the likely ``causes`` of a difference.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ..contract import (ENGINE_CONFIG_COMPONENT, FINGERPRINT_COMPONENT_ORDER, FINGERPRINT_STRUCTURE, FINGERPRINT_TABLES,
                        LORA_ADAPTER_COMPONENT, MODEL_COMPONENTS, MODEL_CONFIG_COMPONENT, SAMPLING_PARAMS_COMPONENT)
from . import behavior_diff, effects, model_effects, sampling
from .canonical import canonical_json
from .causes import likely_causes
from .probes import PROBE_CONVERSATIONS, PROBE_TEXTS
from .textdiff import template_diff
from .tokens import token_namer

SUPPORTED_VERSIONS = (1,)
RANK = effects.RANK
SAMPLE = 10
PER_PART = 3
MAX_ROWS = 50
MAX_INLINE = 4000


def diff_fingerprints(a: dict, b: dict) -> dict:
    """Compare two fingerprints (dicts, possibly JSON round-tripped). Pure; never raises."""
    try:
        return _diff(a, b)
    except Exception as exc:  # malformed input from another version or a truncated payload
        return _result([_row("fingerprint_version", "error", f"cannot compare: {type(exc).__name__}: {exc}", {})])


@dataclass
class _Sides:
    """Both fingerprints' components and what the behavior probes say, computed once per diff."""
    ca: dict
    cb: dict
    behavior: behavior_diff.Comparison
    renders: behavior_diff.Comparison

    @property
    def behavior_same(self) -> bool:
        return self.behavior.same

    def values(self, name: str) -> tuple:
        return self.ca[name].get("value"), self.cb[name].get("value")

    def same(self, name: str) -> bool:
        """Both sides report `name` with one digest (absent on both counts as the same)."""
        return (self.ca.get(name) or {}).get("digest") == (self.cb.get(name) or {}).get("digest")

    @property
    def measured(self) -> effects.Measured:
        return effects.Measured(behavior_same=self.behavior_same, encode_same=self.same("encode_flags"))

    @cached_property
    def new_pad(self) -> Any:
        """(side, [text, id]) when the sides differ by one side's pad token added as a new token, and
        the behaviour probes differ only on texts that contain that token's text literally; else None."""
        if "vocab" not in self.ca or "vocab" not in self.cb or self.same("vocab"):
            return None
        ma, mb = (_by_id(v) for v in self.values("vocab"))
        if any(ma[i] != mb[i] for i in ma.keys() & mb.keys()):
            return None  # an entry both sides have differs: a real vocab difference
        pads = tuple(((c.get("special_tokens") or {}).get("value") or {}).get("pad") for c in (self.ca, self.cb))
        found = effects.new_pad_token([i for i in ma if i not in mb], [i for i in mb if i not in ma], *pads)
        if found is None or not self.behavior.compared:
            return None
        text = found[1][0]
        literal = all(part in behavior_diff.LIST_PARTS and isinstance(key, int) and 0 <= key < len(PROBE_TEXTS)
                      and text in PROBE_TEXTS[key] for part, key in self.behavior.differing)
        return found if literal else None


def _diff(a: Any, b: Any) -> dict:
    problem = _version_problem(a, "a") or _version_problem(b, "b")
    if problem:
        return _result([_row("fingerprint_version", "error", problem, {})])
    if a.get("digest") == b.get("digest") and a["components"].keys() == b["components"].keys():
        return _result([])
    ca, cb = a["components"], b["components"]
    ba, bb = ca.get("behavior", {}).get("value"), cb.get("behavior", {}).get("value")
    if "behavior" in ca and "behavior" in cb:
        sides = _Sides(ca, cb, behavior_diff.compare(ba, bb), behavior_diff.compare_renders(ba, bb))
    else:
        sides = _Sides(ca, cb, behavior_diff.Comparison(), behavior_diff.Comparison())
    order = FINGERPRINT_COMPONENT_ORDER
    names = sorted(set(ca) | set(cb), key=lambda n: (order.index(n) if n in order else len(order), n))
    rows = [r for r in (_compare(n, sides) for n in names) if r is not None]
    _mark_evidence(rows)
    flagged = {r["name"] for r in rows if RANK[r["severity"]] >= RANK["warning"]}
    return _result(rows, likely_causes(a, b, flagged) if flagged else [])


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


def _compare(name: str, sides: _Sides) -> Any:
    ca, cb = sides.ca, sides.cb
    if (name not in ca or name not in cb) and name == ENGINE_CONFIG_COMPONENT:
        return _judged_row(name, sides)  # one engine's own hazards (a stale prefix cache), against the model
    if (name not in ca or name not in cb) and name in MODEL_COMPONENTS:
        return None  # optional: a side that does not register its model (an OpenAI server) is no news
    if name not in ca or name not in cb:
        side = "a" if name in ca else "b"
        later = " yet (a rollout reports them with the requests it serves)" if name == SAMPLING_PARAMS_COMPONENT else ""
        return _row(name, "info", f"only {side} reports {name}{later}: not comparable", {})
    if ca[name]["digest"] == cb[name]["digest"]:
        return None
    return _judged_row(name, sides)


def _judged_row(name: str, sides: _Sides) -> Any:
    try:
        severity, summary, detail = DETAILS.get(name, _generic)(name, sides)
    except Exception as exc:  # a detail must never hide the verdict
        severity = _fallback_severity(name, sides)
        summary, detail = f"{name} differs", {"detail_error": f"{type(exc).__name__}: {exc}"}
    if severity == "same":  # differs only where nothing changes (e.g. two engines' names)
        return None
    return _row(name, severity, summary, detail)


def _fallback_severity(name: str, sides: _Sides) -> str:
    if name in ("behavior", "chat_template") or name in FINGERPRINT_TABLES:
        return "error"  # a detail that cannot be computed must not hide a real difference
    if name in FINGERPRINT_STRUCTURE:
        return "warning" if sides.behavior_same else "error"
    if name == "runtime":
        return "info"
    return "warning"  # sampling_defaults, and any component this version does not know


def _row(name: str, severity: str, summary: str, detail: dict) -> dict:
    return {"name": name, "severity": severity, "summary": summary, "detail": detail}


def _result(rows: list, causes: Any = None) -> dict:
    verdict = max((r["severity"] for r in rows), key=RANK.__getitem__, default="same")
    result = {"verdict": verdict, "components": rows}
    if causes:
        result["causes"] = causes
    return result


# --------------------------------------------------------------------------- behaviour as evidence

# Which components a differing behaviour part can demonstrate, most readable first (frontend
# diff.js reads the mark and falls back to the same order for diffs stored before it).
TOKENIZER_TABLES = ("added_tokens", "special_tokens", "vocab", "merges", "normalizer", "pre_tokenizer",
                    "post_processor", "decoder", "encode_flags", "model_params")
EXPLAINED_BY = {"chat": ("chat_template",) + TOKENIZER_TABLES, "encode": TOKENIZER_TABLES,
                "encode_no_special": TOKENIZER_TABLES, "decode": TOKENIZER_TABLES}
PART_TEXT = {"chat": ("rendered differently in", "probe conversation"),
             "encode": ("encoded differently in", "probe text"),
             "encode_no_special": ("encoded differently (without special tokens) in", "probe text"),
             "decode": ("decoded differently in", "probe text")}


def _mark_evidence(rows: list) -> None:
    """Set ``evidence_of`` on a differing behaviour row: {part: component} when every differing part
    of it is explained by another differing component as severe (a less severe one would hide the
    verdict's cause), else {}."""
    behavior = next((r for r in rows if r["name"] == "behavior"), None)
    probes = (behavior or {}).get("detail", {}).get("differing_probes")
    if not probes:
        return
    by_name = {r["name"]: r for r in rows}
    explained = {}
    for part in probes:
        by = next((n for n in EXPLAINED_BY.get(part, ()) if n in by_name
                   and RANK[by_name[n]["severity"]] >= RANK[behavior["severity"]]), None)
        if by is None:
            explained = {}  # a difference no other component explains: the behaviour is a finding itself
            break
        explained[part] = by
    behavior["evidence_of"] = explained  # {} says so too (a diff stored before the mark has no key)


def findings(result: dict, severity: str | None = None) -> list[tuple[str, str]]:
    """(component, evidence) of each finding of a diff, at ``severity`` (every one when None):
    a behaviour row marked ``evidence_of`` is no finding; its counts become the evidence of the
    components it demonstrates, e.g. ("chat_template", "rendered differently in 3 of 18 probe
    conversations"); "" when a component has none."""
    rows = result.get("components") or []
    evidence: dict[str, list[str]] = {}
    for row in rows:
        for part, name in (row.get("evidence_of") or {}).items():
            evidence.setdefault(name, []).append(_evidence_text(row, part, name, rows))
    return [(r["name"], "; ".join(evidence.get(r["name"], [])))
            for r in rows if not r.get("evidence_of") and (severity is None or r.get("severity") == severity)]


def findings_text(result: dict, severity: str | None = None) -> str:
    """ "chat_template (rendered differently in 3 of 18 probe conversations), vocab" """
    return ", ".join(f"{name} ({why})" if why else name for name, why in findings(result, severity))


def _evidence_text(behavior: dict, part: str, component: str, rows: list) -> str:
    count = len(((behavior.get("detail") or {}).get("differing_probes") or {}).get(part) or [])
    verb, noun = PART_TEXT.get(part, (f"differ ({part}) in", "probe"))
    if part == "chat" and component != "chat_template":
        verb = "tokenized differently in"  # the renders agree; a tokenizer table splits them otherwise
    of = None
    if part == "chat" and component == "chat_template":
        row = next((r for r in rows if r["name"] == component), {})
        of = ((row.get("detail") or {}).get("renders") or {}).get("compared")
    total = of if of is not None else count
    return f"{verb} {count}{f' of {of}' if of is not None else ''} {noun}{'' if total == 1 else 's'}"


# --------------------------------------------------------------------------- details
# Each detail function: (name, sides) -> (severity, summary, detail).

def _chat_template(name: str, sides: _Sides) -> tuple:
    va, vb = sides.values(name)
    detail = {"unified_diff": template_diff(va, vb), "a_present": va is not None, "b_present": vb is not None}
    if va is None or vb is None:
        missing, other = ("a", vb) if va is None else ("b", va)
        empty = " (the other side's is empty)" if other == "" else ""
        return "error", f"{missing} has no chat template{empty}", detail
    renders = sides.renders
    both_ok = [k for k in renders.common if k not in renders.differing and _rendered_both(sides, k)]
    unexercised = _unexercised_templates(va, vb, renders.common)
    detail["renders"] = {"compared": renders.compared, "same": renders.compared - len(renders.differing),
                         "rendered": len(both_ok), "differing": [key for _, key in renders.differing],
                         "unexercised": unexercised}
    if renders.differing:
        keys = [key for _, key in renders.differing]
        shown = ", ".join(keys[:4]) + (", …" if len(keys) > 4 else "")
        return ("error", f"chat templates differ: {len(keys)} of {renders.compared} probe conversations render "
                         f"differently ({shown})", detail)
    if unexercised:
        return "error", f"chat templates differ in {', '.join(map(repr, unexercised))}, which no probe renders", detail
    if not both_ok:
        return "error", "chat templates differ and neither renders any probe conversation: no behaviour to compare", detail
    raised = renders.compared - len(both_ok)
    also = f" ({raised} of them raise the same error on both sides)" if raised else ""
    return ("warning", f"chat templates differ in text only: they render all {renders.compared} probe "
                       f"conversations identically{also}", detail)


def _rendered_both(sides: _Sides, key: tuple) -> bool:
    ba, bb = sides.ca["behavior"].get("value"), sides.cb["behavior"].get("value")
    return behavior_diff.rendered_ok(ba, key) and behavior_diff.rendered_ok(bb, key)


def _unexercised_templates(va: Any, vb: Any, rendered: list) -> list:
    """Named templates whose text differs but that no compared probe renders (only default and,
    with tools, tool_use are ever picked by apply_chat_template without a name)."""
    if not isinstance(va, dict) and not isinstance(vb, dict):
        return []
    na, nb = _named(va), _named(vb)
    differing = {n for n in set(na) | set(nb) if na.get(n) != nb.get(n)}
    exercised = {"default"}
    if any(TOOL_PROBES.get(str(key).split("/")[0]) for _, key in rendered):
        exercised.add("tool_use")
    return sorted(differing - exercised)


def _named(value: Any) -> dict:
    return value if isinstance(value, dict) else {"default": value}


def _behavior(name: str, sides: _Sides) -> tuple:
    cmp = sides.behavior
    va, vb = sides.values(name)
    if not cmp.compared:
        return "error", "behavior probes cannot be compared: the two sides share no probe", {}
    if not cmp.differing:
        labels = lambda keys: [behavior_diff.probe_label(p, k) for p, k in keys]  # noqa: E731
        return ("info", f"probe sets differ (another paritywatch version?): all {cmp.compared} shared probes "
                        f"match, {len(cmp.only_a)} only on a, {len(cmp.only_b)} only on b",
                {"compared": cmp.compared, "only_a": labels(cmp.only_a), "only_b": labels(cmp.only_b)})
    by_part: dict = {}
    for part, key in cmp.differing:
        by_part.setdefault(part, []).append(key)
    parts = sorted(by_part, key=lambda p: (PART_ORDER.index(p) if p in PART_ORDER else len(PART_ORDER), p))
    name_a, name_b = token_namer(sides.ca), token_namer(sides.cb)
    sample = [behavior_diff.probe_row(part, key, va, vb, name_a, name_b)
              for part in parts for key in by_part[part][:PER_PART]]
    counts = ", ".join(f"{part} ({len(by_part[part])})" for part in parts)
    detail = {"parts": parts, "differing": len(cmp.differing), "compared": cmp.compared, "sample": sample[:SAMPLE],
              "differing_probes": {p: [behavior_diff.probe_label(p, k) for k in by_part[p]] for p in parts}}
    summary = f"{len(cmp.differing)} of {cmp.compared} behavior probes differ: {counts}"
    if sides.new_pad:
        side, (text, _) = sides.new_pad
        return "info", (f"{summary}, each a text containing {text!r} literally: only {side} has that token "
                        "(its new pad token, see vocab)"), detail
    return "error", summary, detail


def _structure(name: str, sides: _Sides) -> tuple:
    summary, detail = _generic_detail(name, *sides.values(name))
    if sides.behavior_same:
        return "warning", summary + " (structure only: every behavior probe matches)", detail
    return "error", summary, detail


def _generic(name: str, sides: _Sides) -> tuple:
    summary, detail = _generic_detail(name, *sides.values(name))
    return _fallback_severity(name, sides), summary, detail


def _plain(fn: Any) -> Any:
    """Adapt a (name, va, vb) -> (summary, detail) builder of a table that is an error when it differs."""
    return lambda name, sides: ("error", *fn(name, *sides.values(name)))


def _vocab(name: str, sides: _Sides) -> tuple:
    va, vb = sides.values(name)
    ma, mb = _by_id(va), _by_id(vb)
    differing = [i for i in sorted(set(ma) | set(mb)) if ma.get(i) != mb.get(i)]
    sample = [{"id": i, "a": ma.get(i), "b": mb.get(i)} for i in differing[:SAMPLE]]
    detail = {"a_size": len(ma), "b_size": len(mb), "differing": len(differing), "sample": sample}
    if sides.new_pad:
        return "info", effects.new_pad_summary(f"vocab differs ({len(ma)} vs {len(mb)} entries)", sides.new_pad), detail
    return ("error", f"vocab differs: {len(differing)} of {max(len(ma), len(mb))} ids ({len(ma)} vs {len(mb)} entries)",
            detail)


def _by_id(rows: Any) -> dict:
    return {r[0]: (r[1] if len(r) == 2 else r[1:]) for r in rows or []}


def _merges(name: str, va: Any, vb: Any) -> tuple[str, dict]:
    la, lb = va or [], vb or []
    differing = [i for i in range(max(len(la), len(lb))) if (la[i:i + 1] or None) != (lb[i:i + 1] or None)]
    sample = [{"rank": i, "a": la[i] if i < len(la) else None, "b": lb[i] if i < len(lb) else None}
              for i in differing[:SAMPLE]]
    return (f"merges differ at {len(differing)} ranks ({len(la)} vs {len(lb)})",
            {"a_size": len(la), "b_size": len(lb), "differing": len(differing), "sample": sample})


def _added_tokens(name: str, sides: _Sides) -> tuple:
    va, vb = sides.values(name)
    ma = {r["id"]: r for r in va or []}
    mb = {r["id"]: r for r in vb or []}
    rows = [{"token": (ma.get(i) or mb.get(i))["content"], "id": i, "a": ma.get(i), "b": mb.get(i)}
            for i in sorted(set(ma) | set(mb)) if ma.get(i) != mb.get(i)]
    detail = {"differing": len(rows), "rows": rows[:MAX_ROWS]}
    if sides.new_pad and [r["id"] for r in rows] == [sides.new_pad[1][1]]:
        return "info", effects.new_pad_summary("added tokens differ", sides.new_pad), detail
    names = ", ".join(repr(r["token"]) for r in rows[:5])
    return "error", f"{len(rows)} added token(s) differ: {names}", detail


def _fields(judge: Any, detail: Any = None) -> Any:
    """Adapt an effects.py judge (severity, summary, rows) of a component made of named fields."""
    def compare(name: str, sides: _Sides) -> tuple:
        va, vb = sides.values(name)
        severity, summary, rows = judge(va, vb, sides)
        return severity, summary, {**(detail(va, vb) if detail else {}), "rows": rows}
    return compare


def _engine_config(name: str, sides: _Sides) -> tuple:
    """Judged against the other side's engine settings, or its model's length when it runs none."""
    value = lambda comps, n: (comps.get(n) or {}).get("value")  # noqa: E731
    va, vb = value(sides.ca, name), value(sides.cb, name)
    severity, summary, rows = model_effects.engine_config(va, vb, value(sides.ca, MODEL_CONFIG_COMPONENT),
                                                         value(sides.cb, MODEL_CONFIG_COMPONENT))
    return severity, summary, {"rows": rows}


def _generation_eos_values(va: Any, vb: Any) -> dict:
    va, vb = va or {}, vb or {}
    return {"a": va.get("eos"), "b": vb.get("eos"), "pad": [va.get("pad"), vb.get("pad")],
            "bos": [va.get("bos"), vb.get("bos")]}


def _generic_detail(name: str, va: Any, vb: Any) -> tuple[str, dict]:
    if isinstance(va, dict) and isinstance(vb, dict):
        keys = [k for k in sorted(set(va) | set(vb)) if canonical_json(va.get(k)) != canonical_json(vb.get(k))]
        rows = [{"key": k, "a": _clip(va.get(k)), "b": _clip(vb.get(k))} for k in keys]
        return f"{name} differs in: {', '.join(keys)}", {"rows": rows}
    return f"{name} differs", {"a": _clip(va), "b": _clip(vb)}


def _clip(value: Any) -> Any:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return value if len(text) <= MAX_INLINE else text[:MAX_INLINE] + "…"


TOOL_PROBES = {conv.name: bool(conv.tools) for conv in PROBE_CONVERSATIONS}
PART_ORDER = ("chat", "encode", "encode_no_special", "decode")
DETAILS = {"chat_template": _chat_template, "behavior": _behavior, "vocab": _vocab, "merges": _plain(_merges),
           "added_tokens": _added_tokens,
           "special_tokens": _fields(lambda va, vb, sides: effects.special_tokens(va, vb, sides.measured)),
           "encode_flags": _fields(lambda va, vb, sides: effects.encode_flags(va, vb, sides.measured)),
           "generation_eos": _fields(lambda va, vb, sides: effects.generation_eos(va, vb), _generation_eos_values),
           "runtime": _fields(lambda va, vb, sides: effects.runtime(va, vb)),
           "sampling_defaults": _fields(lambda va, vb, sides: effects.sampling_defaults(
               va, vb, SAMPLING_PARAMS_COMPONENT in sides.ca and SAMPLING_PARAMS_COMPONENT in sides.cb)),
           **{name: _structure for name in FINGERPRINT_STRUCTURE},
           SAMPLING_PARAMS_COMPONENT: lambda name, sides: sampling.compare(*sides.values(name)),
           MODEL_CONFIG_COMPONENT: _fields(lambda va, vb, sides: model_effects.model_config(va, vb)),
           LORA_ADAPTER_COMPONENT: _fields(lambda va, vb, sides: model_effects.lora_adapter(va, vb)),
           ENGINE_CONFIG_COMPONENT: _engine_config}
