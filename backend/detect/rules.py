"""Rules on metrics: the built-in rules on align/*, why each fires, and the pure evaluation step.

Rule kinds: `threshold` (a level), `trend` (backend/detect/trend.py), `baseline` (the median of a
series' first `window` points: what a run starts with) and `sawtooth` (backend/detect/sawtooth.py).
"""
from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

COMPARISONS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
AGGREGATES = ("last", "mean", "max", "min")

# docs/design.md, section 5 ("Alignment metrics") has the table of levels and their sources.
# Every rollout worker posts the same align/* keys, so one bad worker's batches arrive between the
# healthy workers' clean ones: an alert resolves only after this many clean batches in a row (as a
# per-sample audit does), never on the first clean batch of a healthy worker.
BUILTIN_KEEP_FIRING_FOR = 10
BASELINE_WINDOW = 10  # points at a run's start whose median is its baseline
SAWTOOTH_WINDOW = 25  # points per block of the saw-tooth detector (48 blocks: 1,200 points looked at)


@dataclass(frozen=True)
class BuiltinRule:
    key: str
    comparison: str
    threshold: float
    why: str
    severity: str = "warning"
    action: str = "alert"
    kind: str = "threshold"
    window: int = 1
    per_worker: bool = False

    def row(self) -> dict[str, Any]:
        return dict(key=self.key, comparison=self.comparison, threshold=self.threshold, severity=self.severity,
                    action=self.action, kind=self.kind, window=self.window, per_worker=self.per_worker,
                    keep_firing_for=BUILTIN_KEEP_FIRING_FOR)


_TOKENS_WHY = ("the trainer's processor sees other tokens than the rollout sampled (a chat template, vocab or special "
               "token differs): the loss is computed on misaligned tokens while log-prob metrics stay clean")
_IS_MEAN_WHY = ("mean importance ratio outside [0.5, 2] (verl docs/algo/rollout_corr.md example alert): the rollout "
                "samples from another distribution than the trainer scores (temperature, log-prob mode, weights)")
BUILTINS = (
    BuiltinRule("align/prompt_rerender_mismatch_frac", ">", 0.0, f"{_TOKENS_WHY}; huggingface/trl#5498",
                severity="error", action="pause"),
    BuiltinRule("align/decode_mismatch_frac", ">", 0.0, _TOKENS_WHY, severity="error", action="pause"),
    BuiltinRule("align/out_of_vocab_frac", ">", 0.0, "the rollout sampled ids the trainer's vocabulary does not hold: "
                "the two sides load different tokenizers or models", severity="error", action="pause"),
    BuiltinRule("align/eos_disagreement_frac", ">", 0.0, "the two sides disagree on which id ends a completion "
                "(Blaizzy/mlx-vlm#2112): the trainer masks or learns the end of samples wrongly"),
    BuiltinRule("align/kl_k3", ">", 0.01, "k3 KL between rollout and trainer log-probs is above 10x the top of the "
                "dense-model range (1e-5 to 1e-3, LMSYS 2026-01-16): the two sides compute different distributions; "
                "for an MoE model enable the moe pack (1e-3 to 1e-1 is typical there)"),
    BuiltinRule("align/prob_abs_diff_mean", ">", 0.01, "mean |p_train - p_rollout| above 0.01: the two sides' token "
                "probabilities differ by more than a point on average, beyond the numerical noise of matching "
                "engines"),
    BuiltinRule("align/logprob_pearson", "<", 0.9, "rollout and trainer log-probs barely correlate although their "
                "mean difference may look plausible: healthy runs sit at ~0.999; ai-dynamo/dynamo#11640's corrupted "
                "log-prob transport showed 0.05-0.62 with k1 0.003 (k3 1635): check how log-probs travel from the "
                "engine (ordering, dtype, the sampled token's entry)"),
    BuiltinRule("align/is_ratio_mean", ">", 2.0, _IS_MEAN_WHY),
    BuiltinRule("align/is_ratio_mean", "<", 0.5, _IS_MEAN_WHY),
    BuiltinRule("align/is_ess", "<", 0.3, "effective sample size of the importance weights under 0.3 (verl docs/"
                "algo/rollout_corr.md example alert): a few tokens carry the update, corrections are doing the work "
                "a matching rollout should"),
    BuiltinRule("align/is_masked_frac", ">", 0.1, "more than 10% of tokens have an importance ratio outside "
                "[0.5, 5], the share a token mask at verl's IcePop band drops: a correction masking that much hides "
                "a bug instead of correcting noise (NVIDIA-NeMo/RL#4243: 60-71% of sequences masked); no framework "
                "documents a level, and a matching rollout masks almost none (a token must be half or five times "
                "as likely under the trainer)"),
    BuiltinRule("align/kl_k3", ">", 0.015, "the mismatch is high from the run's very first steps (median of its "
                "first 10 points), before any weight update or staleness could cause it: the two sides compute "
                "different models (rope/YaRN scaling, norm eps, dtype, attention implementation; "
                "PrimeIntellect-ai/prime-rl#2802: mismatch_kl 0.030 against a ~0.0015 floor); prime-rl expects new "
                "models below 0.015", kind="baseline", window=BASELINE_WINDOW, per_worker=True),
    BuiltinRule("align/kl_k3", ">", 8.0, "the mismatch climbs, falls back at once and climbs again: it grows until "
                "the engine restarts, the mark of a cache kept across weight syncs (stale prefix cache: "
                "NVIDIA-NeMo/RL#4018, huggingface/trl#3024): reset the prefix cache after every weight sync (vLLM: "
                "reset_prefix_cache())", kind="sawtooth", window=SAWTOOTH_WINDOW, per_worker=True),
)
BUILTIN_RULES = tuple(r.row() for r in BUILTINS)


def _identity(key: str, kind: str, comparison: str) -> tuple[str, str, str]:
    """What makes two rules the same check: key, kind and direction (> and >= alike)."""
    return key, kind, comparison[0]


_BUILTIN_WHY = {_identity(r.key, r.kind, r.comparison): r.why for r in BUILTINS}


def builtin_why(key: str, kind: str, comparison: str) -> str | None:
    return _BUILTIN_WHY.get(_identity(key, kind, comparison))


def superseded(rules: Iterable[Any]) -> list[Any]:
    """The built-in rules among `rules` that a pack rule of the same key, kind and direction takes
    the place of (the `moe` pack's MoE levels for align/kl_k3)."""
    rules = list(rules)
    packed = {_identity(r.key, r.kind, r.comparison) for r in rules if r.pack}
    return [r for r in rules if r.builtin and not r.pack and _identity(r.key, r.kind, r.comparison) in packed]


def baseline(values: np.ndarray, window: int) -> float | None:
    """The median of a series' first `window` points (oldest first), None until it has them."""
    window = max(1, int(window))
    return float(np.median(values[:window])) if len(values) >= window else None


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
