"""Threshold rules on metrics: built-in defaults for align/*, and the pure evaluation step."""
from __future__ import annotations

import operator

COMPARISONS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
AGGREGATES = ("last", "mean", "max", "min")

# DESIGN.md: any re-render or decode mismatch is an error; k3 > 0.01 and a mean abs prob diff
# > 0.01 are warnings (verl / prime-rl alarm levels).
BUILTIN_RULES = (
    dict(key="align/prompt_rerender_mismatch_frac", comparison=">", threshold=0.0, severity="error", action="pause"),
    dict(key="align/decode_mismatch_frac", comparison=">", threshold=0.0, severity="error", action="pause"),
    dict(key="align/out_of_vocab_frac", comparison=">", threshold=0.0, severity="error", action="pause"),
    dict(key="align/eos_disagreement_frac", comparison=">", threshold=0.0, severity="warning", action="alert"),
    dict(key="align/kl_k3", comparison=">", threshold=0.01, severity="warning", action="alert"),
    dict(key="align/prob_abs_diff_mean", comparison=">", threshold=0.01, severity="warning", action="alert"),
)


def breached(value: float | None, comparison: str, threshold: float) -> bool:
    return value is not None and COMPARISONS[comparison](value, threshold)


def next_streak(streak: int, is_breached: bool) -> int:
    return streak + 1 if is_breached else 0


def should_fire(streak: int, consecutive: int) -> bool:
    return streak >= max(1, consecutive)
