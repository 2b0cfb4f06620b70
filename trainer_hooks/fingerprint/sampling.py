"""Sampling parity: how a rollout really sampled its tokens vs what the trainer's log-prob recompute assumes.

The ``sampling_params`` component (docs/fingerprint.md, "Sampling parameters"). A rollout process
reports the parameters each request was served with, after the engine filled its defaults; the
trainer reports what its recompute applies (its temperature; top-p/top-k masking only if it masks).
Both go through ``sampling_value``, which normalises every encoding of "disabled" (top_k None / 0 /
-1, top_p None / 1.0, penalties at their neutral value), so equivalent settings hash alike and
never raise an alarm. Stdlib only: the backend's diff imports this.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..contract import LOGPROBS_MODES, SAMPLING_PARAM_KEYS
from .effects import summarise

MASK_KEYS = ("top_p", "top_k", "min_p")
PENALTY_KEYS = ("repetition_penalty", "presence_penalty", "frequency_penalty")
# vLLM's LogprobsMode values and the short forms; *_logits are the same distributions unnormalised.
_MODE_ALIASES = {"raw": "raw", "raw_logprobs": "raw", "raw_logits": "raw",
                 "processed": "processed", "processed_logprobs": "processed", "processed_logits": "processed"}
_DIGITS = 6  # a float32 0.6 (0.6000000238...) and a Python 0.6 are the same setting

WHY_TEMPERATURE = ("the trainer scores tokens at another temperature than the rollout sampled them at, so "
                   "the importance ratio pi_train/pi_rollout is biased on every token (huggingface/trl#4159: "
                   "the ratio sat at 2.0 with temperature 0.6)")
WHY_LOGPROBS_MODE = ("raw log-probs are taken before temperature, penalties and top-k/top-p, processed ones "
                     "after: the two sides' log-probs describe different distributions, which biases the "
                     "importance ratio and every mismatch metric (vLLM v1 returns raw log-probs unless "
                     "logprobs_mode='processed_logprobs'; prime-rl#679)")
WHY_MOOT_MODE = ("log-prob modes differ, but the processed side samples at temperature 1 with no masking or "
                 "penalty, where raw and processed log-probs are the same")
WHY_MASK = ("one side truncates the distribution (top-p / top-k / min-p) where the other does not, or at "
            "another cut-off: tokens near the cut-off get biased importance ratios")
WHY_PENALTY = ("a penalty reshapes one side's distribution and the other side does not reproduce it: "
               "the importance ratio is biased on the penalised tokens")


# --------------------------------------------------------------------------- the component value

def sampling_value(params: Any = None, *, logprobs_mode: Any = None, **overrides: Any) -> dict[str, Any]:
    """The normalised ``sampling_params`` value of ``params`` with ``overrides`` applied on top.

    ``params``: a mapping, a vLLM ``SamplingParams``, a transformers ``GenerationConfig`` (an
    explicit ``do_sample=False`` is greedy: temperature 0), or None. Unknown keys are ignored.
    ``logprobs_mode``: "raw" / "processed" or vLLM's ``raw_logprobs``, ``processed_logits``...;
    None (and no ``logprobs_mode`` in ``params``) means not known: it is never compared then.
    """
    raw = {**read_params(params), **overrides}
    greedy = raw.get("do_sample") is False or _number(raw.get("temperature"), 1.0) == 0.0
    value: dict[str, Any] = {
        "temperature": 0.0 if greedy else _rounded(_number(raw.get("temperature"), 1.0)),
        "top_p": None if greedy else _enabled(raw.get("top_p"), lambda x: 0 < x < 1),
        "top_k": None if greedy else _top_k(raw.get("top_k")),
        "min_p": None if greedy else _enabled(raw.get("min_p"), lambda x: x > 0),
        "repetition_penalty": _enabled(raw.get("repetition_penalty"), lambda x: x != 1),
        "presence_penalty": _enabled(raw.get("presence_penalty"), lambda x: x != 0),
        "frequency_penalty": _enabled(raw.get("frequency_penalty"), lambda x: x != 0),
    }
    value["logprobs_mode"] = normalise_logprobs_mode(logprobs_mode if logprobs_mode is not None
                                                     else raw.get("logprobs_mode"))
    return value


def read_params(params: Any) -> dict[str, Any]:
    """The sampling keys of a mapping or an object (read by attribute), as given."""
    keys = (*SAMPLING_PARAM_KEYS, "do_sample", "logprobs_mode")
    if params is None:
        return {}
    if isinstance(params, Mapping):
        return {k: params[k] for k in keys if k in params}
    return {k: getattr(params, k) for k in keys if getattr(params, k, None) is not None}


def normalise_logprobs_mode(mode: Any) -> str | None:
    if mode is None:
        return None
    mode = getattr(mode, "value", mode)  # an enum
    if not isinstance(mode, str) or mode.lower() not in _MODE_ALIASES:
        raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES} (or vLLM's raw_logprobs, "
                         f"processed_logprobs, raw_logits, processed_logits), not {mode!r}")
    return _MODE_ALIASES[mode.lower()]


def _number(value: Any, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or isinstance(value, str):
        raise TypeError(f"sampling parameters are numbers, not {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"sampling parameters are finite numbers, not {number}")
    return number


def _rounded(number: float) -> float:
    return round(number, _DIGITS)


def _enabled(value: Any, active: Any) -> float | None:
    """The value when it changes the distribution, None when it is one of the "off" encodings."""
    if value is None:
        return None
    number = _rounded(_number(value, 0.0))
    return number if active(number) else None


def _top_k(value: Any) -> int | None:
    """vLLM's 0 and -1, transformers' 0 and None all mean "no top-k"."""
    if value is None:
        return None
    number = int(_number(value, 0.0))
    return number if number > 0 else None


def is_neutral(value: Mapping[str, Any]) -> bool:
    """Temperature 1 and nothing else: raw and processed log-probs are then the same numbers."""
    return value.get("temperature", 1.0) == 1.0 and all(value.get(k) is None for k in (*MASK_KEYS, *PENALTY_KEYS))


# --------------------------------------------------------------------------- the diff

def compare(va: Any, vb: Any) -> tuple[str, str, dict]:
    """(severity, summary, detail) for two ``sampling_params`` values that hash differently.
    temperature or log-prob mode differing: error; masks and penalties: warning."""
    va, vb = dict(va or {}), dict(vb or {})
    rows = [row for row in (_row(key, va, vb) for key in (*SAMPLING_PARAM_KEYS, "logprobs_mode")) if row]
    if not rows:
        return "info", _not_compared(va, vb), {"rows": [], "a": va, "b": vb}
    severity, summary = summarise(rows, str, _show)
    return severity, summary, {"rows": rows, "a": va, "b": vb}


def _not_compared(va: dict, vb: dict) -> str:
    """Why values that hash differently raised no row: a log-prob mode one side does not know
    (vLLM's server does not say its --logprobs-mode), or keys this version does not know."""
    a, b = va.get("logprobs_mode"), vb.get("logprobs_mode")
    if a != b and (a is None or b is None):
        return (f"logprobs_mode is known on one side only ({_show_mode(a)} vs {_show_mode(b)}): not comparable; "
                "every value compared is the same")
    return "sampling_params differ only in keys this version does not compare"


def _show_mode(mode: Any) -> str:
    return "not known" if mode is None else mode


def _row(key: str, va: dict, vb: dict) -> dict | None:
    a, b = va.get(key), vb.get(key)
    if key == "temperature":
        a, b = (1.0 if a is None else a), (1.0 if b is None else b)
    if a == b:
        return None
    if key == "logprobs_mode":
        if a is None or b is None:
            return None  # one side does not know its mode: not comparable
        processed = va if a == "processed" else vb
        severity, why = ("info", WHY_MOOT_MODE) if is_neutral(processed) else ("error", WHY_LOGPROBS_MODE)
    elif key == "temperature":
        severity, why = "error", WHY_TEMPERATURE
    elif key in MASK_KEYS:
        severity, why = "warning", WHY_MASK
    else:
        severity, why = "warning", WHY_PENALTY
    return {"key": key, "a": a, "b": b, "severity": severity, "why": why}


def _show(value: Any) -> str:
    return "off" if value is None else str(value)
