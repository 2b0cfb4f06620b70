"""Threshold rules on metrics: built-in defaults for align/*, and the pure evaluation step."""
from __future__ import annotations

import operator
from dataclasses import dataclass

COMPARISONS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
AGGREGATES = ("last", "mean", "max", "min")

# docs/design.md: any re-render or decode mismatch is an error; k3 > 0.01 and a mean abs prob diff
# > 0.01 are warnings (verl / prime-rl alarm levels).
# Every rollout worker posts the same align/* keys, so one bad worker's batches arrive between the
# healthy workers' clean ones: an alert resolves only after this many clean batches in a row (as a
# per-sample audit does), never on the first clean batch of a healthy worker.
BUILTIN_KEEP_FIRING_FOR = 10
BUILTIN_RULES = tuple(dict(r, keep_firing_for=BUILTIN_KEEP_FIRING_FOR) for r in (
    dict(key="align/prompt_rerender_mismatch_frac", comparison=">", threshold=0.0, severity="error", action="pause"),
    dict(key="align/decode_mismatch_frac", comparison=">", threshold=0.0, severity="error", action="pause"),
    dict(key="align/out_of_vocab_frac", comparison=">", threshold=0.0, severity="error", action="pause"),
    dict(key="align/eos_disagreement_frac", comparison=">", threshold=0.0, severity="warning", action="alert"),
    dict(key="align/kl_k3", comparison=">", threshold=0.01, severity="warning", action="alert"),
    dict(key="align/prob_abs_diff_mean", comparison=">", threshold=0.01, severity="warning", action="alert"),
))


def breached(value: float | None, comparison: str, threshold: float) -> bool:
    return value is not None and COMPARISONS[comparison](value, threshold)


def worst(low: float, high: float, comparison: str) -> float:
    """Of a batch's extremes, the one nearest to breaching: the highest for > and >=, else the lowest."""
    return high if comparison.startswith(">") else low


def next_streak(streak: int, is_breached: bool) -> int:
    return streak + 1 if is_breached else 0


def should_fire(streak: int, consecutive: int) -> bool:
    return streak >= max(1, consecutive)


@dataclass(frozen=True)
class Step:
    streak: int  # consecutive breaching evaluations
    clear_streak: int  # consecutive evaluations within the threshold
    action: str | None  # "fire" (or keep firing), "resolve", or None


def evaluate(streak: int, clear_streak: int, is_breached: bool, consecutive: int, keep_firing_for: int,
             firing: bool) -> Step:
    """One evaluation of a rule. It fires once `consecutive` evaluations in a row breach (the
    rule's "for"), and a firing alert resolves only after more than `keep_firing_for` evaluations
    in a row within the threshold, so a value hovering at the threshold is one alert, not a
    fire/resolve pair per batch."""
    if is_breached:
        streak, clear_streak = streak + 1, 0
        return Step(streak, clear_streak, "fire" if should_fire(streak, consecutive) or firing else None)
    streak, clear_streak = 0, clear_streak + 1
    if firing and clear_streak > keep_firing_for:
        return Step(streak, clear_streak, "resolve")
    return Step(streak, clear_streak, None)
