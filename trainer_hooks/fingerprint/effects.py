"""Verdicts by effect for the components made of named fields (docs/fingerprint.md, "Verdicts by effect").

A difference is judged by what it does to the tokens the rollout samples and the trainer scores:
`error` when it changes them, `warning` when it can under a condition the row names, `info` when
it cannot (a pad token is masked out, a padding side moves only padding). Each differing field is
one row ``{key, a, b, severity, why}``; the component's severity is its worst row, and its summary
names the real values of every differing field, the worst first with its consequence.

Stdlib only (the backend's diff imports it); pure.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

RANK = {"same": 0, "info": 1, "warning": 2, "error": 3}


@dataclass(frozen=True)
class Measured:
    """What the behaviour probes and the measured encode flags say about the two sides."""
    behavior_same: bool  # every shared behaviour probe (encode, decode, chat renders) matches
    encode_same: bool  # the measured encode flags (ids encode() adds, prefix space, clean-up...) match

    @property
    def same(self) -> bool:
        return self.behavior_same and self.encode_same


def row(key: str, a: Any, b: Any, severity: str, why: str) -> dict:
    return {"key": key, "a": a, "b": b, "severity": severity, "why": why}


def summarise(rows: list[dict], label: Callable[[str], str], show: Callable[[Any], str]) -> tuple[str, str]:
    """(severity, summary) of differing-field rows: the worst row with its values and why, then
    the others with their values ("…; also padding_side 'left' vs 'right'")."""
    rows.sort(key=lambda r: -RANK[r["severity"]])
    worst = rows[0]
    summary = f"{label(worst['key'])} differs ({show(worst['a'])} vs {show(worst['b'])}): {worst['why']}"
    others = [f"{label(r['key'])} {show(r['a'])} vs {show(r['b'])}" for r in rows[1:]]
    if others:
        summary += "; also " + ", ".join(others)
    return worst["severity"], summary


def _show_value(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str):  # [text, id]
        return f"{value[0]!r} (id {value[1]})"
    return repr(value) if isinstance(value, str) else str(value)


def _differing(va: Any, vb: Any) -> list[str]:
    va, vb = va or {}, vb or {}
    return [k for k in sorted(set(va) | set(vb)) if va.get(k) != vb.get(k)]


def _judged(rows: list[dict], label: Callable[[str], str]) -> tuple[str, str, list[dict]]:
    if not rows:  # digests differ on fields this version does not know
        return "warning", "differs in fields this version does not compare", rows
    severity, summary = summarise(rows, label, _show_value)
    return severity, summary, rows


# --------------------------------------------------------------------------- special_tokens

WHY_EOS = ("the rollout stops sampling at its eos token and the trainer ends each scored completion at its own: "
           "completions end at different tokens")
WHY_PAD = ("padding is masked out of attention and the loss, and no sampler produces it on purpose: nothing "
           "sampled or scored changes (TRL sets pad = eos on a trainer tokenizer that has none; a rollout that "
           "loads the model by name keeps none)")
WHY_ROLE_MEASURED = "and the probes encode or render differently on the two sides (see behavior, encode_flags)"
WHY_ROLE_UNUSED = ("every probe encodes, decodes and renders the same on both sides: it changes tokens only where "
                   "code inserts the {role} token by id itself{extra}")
WHY_EXTRA = ("a token special on one side only is dropped there by decode(skip_special_tokens=True), so reward "
             "functions read other text")


def special_tokens(va: Any, vb: Any, measured: Measured) -> tuple[str, str, list[dict]]:
    """eos: error. pad: info. bos, unk, sep, cls, mask and the extra special tokens: error when the
    probes or the encode flags differ too (the role is used), else a warning naming where it can matter."""
    va, vb = va or {}, vb or {}
    rows = []
    for key in _differing(va, vb):
        a, b = va.get(key), vb.get(key)
        if key == "eos":
            rows.append(row(key, a, b, "error", WHY_EOS))
        elif key == "pad":
            rows.append(row(key, a, b, "info", WHY_PAD))
        elif not measured.same:
            why = WHY_EXTRA if key == "extra" else f"the {key} token differs"
            rows.append(row(key, a, b, "error", f"{why}, {WHY_ROLE_MEASURED}"))
        elif key == "extra":
            rows.append(row(key, a, b, "warning", WHY_EXTRA))
        else:
            extra = ", or encodes text the vocabulary has no piece for" if key == "unk" else ""
            rows.append(row(key, a, b, "warning", WHY_ROLE_UNUSED.format(role=key, extra=extra)))
    return _judged(rows, lambda k: "extra special tokens" if k == "extra" else f"{k} token")


# --------------------------------------------------------------------------- generation_eos

WHY_GEN_EOS = ("vLLM stops sampling at the generation config's eos ids and TRL ends each scored completion at "
               "them: completions end at different tokens")
WHY_GEN_PAD = ("generate() pads finished sequences with it and padding is masked out of the loss: nothing sampled "
               "or scored changes (TRL writes the tokenizer's pad id into the trainer model's generation config)")
WHY_GEN_BOS = ("used only to start generating from an empty prompt; prompts bring their own first token and vLLM "
               "does not read it")
GENERATION_FIELDS = {"eos": ("eos_token_id", "error", WHY_GEN_EOS), "pad": ("pad_token_id", "info", WHY_GEN_PAD),
                     "bos": ("bos_token_id", "info", WHY_GEN_BOS)}


def generation_eos(va: Any, vb: Any) -> tuple[str, str, list[dict]]:
    """eos ids: error. pad_token_id, bos_token_id: info (never read as an eos difference)."""
    rows = [row(key, (va or {}).get(key), (vb or {}).get(key), *GENERATION_FIELDS[key][1:])
            for key in _differing(va, vb) if key in GENERATION_FIELDS]
    unknown = [k for k in _differing(va, vb) if k not in GENERATION_FIELDS]
    rows += [row(k, (va or {}).get(k), (vb or {}).get(k), "warning", "a field this version does not judge")
             for k in unknown]
    return _judged(rows, lambda k: f"generation_config {GENERATION_FIELDS.get(k, (k,))[0]}")


# --------------------------------------------------------------------------- runtime

RUNTIME_WHY = {
    "padding_side": ("padding is masked out of attention and the loss: the side it goes on changes no sampled or "
                     "scored token"),
    "truncation_side": ("only a text longer than the truncation length is cut, and only when a caller asks for "
                        "truncation (vLLM sets 'left' on the tokenizer it loads)"),
    "model_max_length": ("a limit the tokenizer warns about: it cuts a text only when a caller asks for truncation "
                         "without a max_length"),
}


def runtime(va: Any, vb: Any) -> tuple[str, str, list[dict]]:
    """Padding and truncation settings: info (they move padding, or apply only on request)."""
    rows = [row(k, (va or {}).get(k), (vb or {}).get(k), "info",
                RUNTIME_WHY.get(k, "a tokenizer setting that changes no token unless a caller asks for it"))
            for k in _differing(va, vb)]
    return _judged(rows, str)


# --------------------------------------------------------------------------- encode_flags

WHY_ADDED_IDS = ("encode() adds other special tokens around a text: a prompt encoded with special tokens (a "
                 "plain-text prompt, vLLM's completions endpoint) starts or ends with other ids on each side")
WHY_PAIR = "only text pairs (classifiers, cross-encoders) get these: generation never encodes a pair"
ENCODE_WHY = {
    "clean_up_tokenization_spaces": ("decode() removes the space before punctuation on one side only: reward "
                                     "functions read, and multi-turn rollouts re-tokenize, other text"),
    "add_prefix_space": "encode() puts a space before the first word on one side only: the first token differs",
    "legacy": "SentencePiece's legacy mode changes how text after a special token is encoded",
}
WHY_ENCODE_UNSEEN = "; no probe encodes or decodes differently, so only texts unlike them can show it"


def encode_flags(va: Any, vb: Any, measured: Measured) -> tuple[str, str, list[dict]]:
    """Ids encode() adds (prefix, suffix): error. Pair specials: info. The switches (clean-up,
    prefix space, legacy): error when a probe differs, else a warning."""
    rows = []
    for key in _differing(va, vb):
        a, b = (va or {}).get(key), (vb or {}).get(key)
        if key in ("prefix", "suffix", "with_special"):
            rows.append(row(key, a, b, "error", WHY_ADDED_IDS))
        elif key == "pair":
            rows.append(row(key, a, b, "info", WHY_PAIR))
        else:
            why = ENCODE_WHY.get(key, "an encode setting this version does not judge")
            rows.append(row(key, a, b, "error", why) if not measured.behavior_same
                        else row(key, a, b, "warning", why + WHY_ENCODE_UNSEEN))
    return _judged(rows, lambda k: {"prefix": "ids encode() adds before a text", "suffix": "ids encode() adds after a "
                                    "text", "pair": "special tokens added to a pair"}.get(k, k))


# --------------------------------------------------------------------------- a new pad token on one side

WHY_NEW_PAD = ("its pad token, a token the other side does not have: padding is masked out of the loss, no chat "
               "probe renders it, and a model never trained to produce it does not sample it; only a text that "
               "contains {text!r} literally encodes differently")


def new_pad_token(ids_only_a: list, ids_only_b: list, pad_a: Any, pad_b: Any) -> Any:
    """(side, [text, id]) when the only vocab entries that differ are one side's pad token, absent
    on the other (a pad added as a new token: ``add_special_tokens({"pad_token": "<pad>"})``), else None."""
    for side, only, other, pad in (("a", ids_only_a, ids_only_b, pad_a), ("b", ids_only_b, ids_only_a, pad_b)):
        if only and not other and isinstance(pad, list) and len(pad) == 2 and list(only) == [pad[1]]:
            return side, pad
    return None


def new_pad_summary(what: str, found: tuple) -> str:
    side, (text, idx) = found
    return f"{what}: only {side} has {text!r} (id {idx}), {WHY_NEW_PAD.format(text=text)}"


# --------------------------------------------------------------------------- sampling_defaults

WHY_DEFAULTS_SERVED = ("the values served are compared in sampling_params, which both sides report: the defaults "
                       "change nothing beyond them")
WHY_DEFAULTS = ("vLLM and generate() fill a request's unset sampling values from these: a rollout that leaves "
                "them unset samples with other values than the trainer assumes")


def sampling_defaults(va: Any, vb: Any, served_reported: bool) -> tuple[str, str, list[dict]]:
    """Generation-config sampling defaults: info once both sides report the values they really serve
    (sampling_params), else a warning (they are what an unset request gets)."""
    severity, why = ("info", WHY_DEFAULTS_SERVED) if served_reported else ("warning", WHY_DEFAULTS)
    rows = [row(k, (va or {}).get(k), (vb or {}).get(k), severity, why) for k in _differing(va, vb)]
    return _judged(rows, str)
