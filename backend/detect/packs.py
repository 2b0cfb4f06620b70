"""Framework metric packs: the mismatch metrics each RL framework already logs, with that
framework's own documented alarm levels, as ready-made rules (docs/design.md, "Framework packs").

A pack is enabled per run or per project by name; enabling it adds its rules (marked with the
pack's name) to that scope, where they behave like any rule and can be retuned or disabled one by
one. Where a framework documents no level for a metric, the rule says so in `why` and states the
value chosen and the reason. `suggest` names the packs whose metrics a run already posts.

The `moe` pack is no framework: it says "this run trains a mixture-of-experts model". Its rules
hold MoE levels for Paritywatch's own `align/*` keys and the router flip rate; a pack rule on the
same key, kind and direction as a built-in rule takes its place for that run (`supersedes`), so
an MoE run is judged at MoE levels, not dense ones.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from trainer_hooks.contract import PACK_NAMES


@dataclass(frozen=True)
class PackRule:
    key: str
    comparison: str
    threshold: float
    why: str  # the source of the level, or why it was chosen where the framework gives none
    severity: str = "warning"
    consecutive: int = 1
    kind: str = "threshold"
    window: int = 1
    per_worker: bool = False

    def as_rule(self, pack: str) -> dict:
        return dict(key=self.key, comparison=self.comparison, threshold=self.threshold, severity=self.severity,
                    consecutive=self.consecutive, action="alert", aggregate="last", window=self.window,
                    kind=self.kind, per_worker=self.per_worker, pack=pack)


@dataclass(frozen=True)
class Pack:
    name: str
    framework: str
    source: str  # where the framework documents its metrics
    rules: tuple[PackRule, ...] = field(default_factory=tuple)
    # The keys whose arrival suggests the pack (default: all its keys; `moe` shares align/* with every run).
    hint_keys: frozenset[str] | None = None

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(r.key for r in self.rules)

    @property
    def suggested_by(self) -> frozenset[str]:
        return self.keys if self.hint_keys is None else self.hint_keys


VERL_DOC = "verl docs/algo/rollout_corr.md, example alert checks"
MOE_K3_WHY = ("typical k3 KL between rollout and trainer is 1e-3 to 1e-1 for MoE models (1e-5 to 1e-3 for dense; LMSYS "
              "blog, 2026-01-16): above 0.1 is past the top of the MoE range")
_LOGP_DIFF_WHY = ("{fw} documents no level; 0.1 is slime's CI gate for the same quantity (mean |train - rollout| "
                  "log-prob, THUDM/slime#1968), about 7x the healthy 0.015 TRL reports in huggingface/trl#5312")

PACKS: dict[str, Pack] = {p.name: p for p in (
    Pack("verl", "verl", "verl docs/algo/rollout_corr.md (Rollout Correction metrics)", (
        PackRule("rollout_corr/rollout_is_mean", "<", 0.5, f"{VERL_DOC}: mean IS weight outside [0.5, 2]"),
        PackRule("rollout_corr/rollout_is_mean", ">", 2.0, f"{VERL_DOC}: mean IS weight outside [0.5, 2]"),
        PackRule("rollout_corr/rollout_is_eff_sample_size", "<", 0.3, f"{VERL_DOC}: effective sample size < 0.3"),
        PackRule("rollout_corr/rollout_is_std", ">", 1.0, f"{VERL_DOC}: IS weight std > 1"),
        PackRule("rollout_corr/kl", ">", 0.1, f"{VERL_DOC}: |kl| > 0.1"),
        PackRule("rollout_corr/kl", "<", -0.1, f"{VERL_DOC}: |kl| > 0.1 (the estimator can go negative)"),
        PackRule("rollout_corr/chi2_token", ">", 1.0, f"{VERL_DOC}: chi2_token > 1"),
        PackRule("training/rollout_probs_diff_mean", ">", 0.01,
                 "verl logs it as a debug metric with no level; 0.01 is the mean |p_train - p_rollout| level of "
                 "Paritywatch's own align/prob_abs_diff_mean rule (docs/design.md)"),
    )),
    Pack("trl", "TRL (GRPOTrainer with vLLM)", "trl GRPOConfig.vllm_importance_sampling_* and GRPOTrainer metrics", (
        PackRule("sampling/importance_sampling_ratio/max", ">=", 3.0,
                 "TRL's IS cap vllm_importance_sampling_clip_max defaults to 3 (huggingface/trl#4772): ratios "
                 "reach the cap, tokens are being clipped or masked"),
        PackRule("sampling/importance_sampling_ratio/mean", ">=", 2.0,
                 "TRL documents no level; verl's band [0.5, 2] for the mean IS weight, inclusive at 2: "
                 "huggingface/trl#4159's temperature mismatch sat at exactly 2.0"),
        PackRule("sampling/importance_sampling_ratio/mean", "<=", 0.5,
                 "TRL documents no level; verl's band [0.5, 2] for the mean IS weight"),
        PackRule("sampling/sampling_logp_difference/mean", ">", 0.1, _LOGP_DIFF_WHY.format(fw="TRL")),
    )),
    Pack("slime", "slime", "slime train metrics; CI assertion in THUDM/slime#1968", (
        PackRule("train/train_rollout_logprob_abs_diff", ">", 0.1,
                 "slime's CI asserts train_rollout_logprob_abs_diff <= 0.1 (THUDM/slime#1968)"),
    )),
    Pack("nemo_rl", "NeMo-RL", "NeMo-RL docs/guides/grpo.md and its CI metric checks", (
        PackRule("train/token_mult_prob_error", ">", 1.05,
                 "NeMo-RL's CI gates token_mult_prob_error < 1.05 (1.1 for some recipes); its GRPO guide: "
                 "steadily above ~1-2% points to weight updates", consecutive=3),
        PackRule("train/gen_kl_error", ">", 1e-3,
                 "NeMo-RL's GRPO guide: KL < 1e-3 is acceptable; its CI gates gen_kl_error < 1e-3"),
        # The same metrics as NeMo-RL's metrics dict names them, before its logger adds `train/`.
        PackRule("token_mult_prob_error", ">", 1.05, "as train/token_mult_prob_error", consecutive=3),
        PackRule("gen_kl_error", ">", 1e-3, "as train/gen_kl_error"),
    )),
    Pack("skyrl", "SkyRL", "SkyRL policy metrics", (
        PackRule("policy/rollout_train_logprobs_abs_diff_mean", ">", 0.1, _LOGP_DIFF_WHY.format(fw="SkyRL")),
    )),
    Pack("prime_rl", "prime-rl", "prime-rl trainer metrics (mismatch_kl/*)", (
        PackRule("mismatch_kl/mean", ">", 0.01,
                 "prime-rl documents no level; 0.01 is 10x the top of the dense-model range of this k3 KL "
                 "(1e-5 to 1e-3, LMSYS 2026-01-16) and Paritywatch's align/kl_k3 level; MoE runs (1e-3 to 1e-1) "
                 "should raise it"),
    )),
    Pack("moe", "MoE models", "LMSYS blog 2026-01-16 (k3 ranges); NVIDIA/Megatron-LM#4168 (router disagreement)", (
        PackRule("align/kl_k3", ">", 0.1, f"{MOE_K3_WHY}; takes the place of the dense built-in level 0.01"),
        PackRule("align/kl_k3", ">", 0.1, f"{MOE_K3_WHY}, already at the run's start (median of its first 10 "
                                          "points): a model-definition difference; takes the place of the dense "
                                          "built-in start level 0.015", kind="baseline", window=10,
                 per_worker=True),
        PackRule("moe/router_flip_rate", ">", 0.05,
                 "NVIDIA/Megatron-LM#4168: ~10% of routers disagreeing per forward pass between inference and "
                 "training engines collapsed 3 of 3 Qwen3-30B-A3B GRPO runs without routing replay (R3); 0.05 is "
                 "half of that: enable routing replay (Megatron moe_enable_routing_replay, verl router_replay R3)"),
    ), hint_keys=frozenset({"moe/router_flip_rate"})),
)}
assert tuple(PACKS) == PACK_NAMES  # one list of names, in the wire contract


def rules_of(name: str) -> list[dict]:
    """The rule rows (Rule columns) pack `name` adds to a run or project."""
    return [r.as_rule(name) for r in PACKS[name].rules]


@dataclass(frozen=True)
class Suggestion:
    pack: str
    keys: tuple[str, ...]  # the run's keys that belong to the pack

    @property
    def message(self) -> str:
        return f"these metrics look like {PACKS[self.pack].framework}'s: enable the {self.pack} pack"


def all_keys() -> frozenset[str]:
    return frozenset().union(*(p.suggested_by for p in PACKS.values()))


def suggest(run_keys: set[str], enabled: set[str]) -> list[Suggestion]:
    """Packs not enabled yet whose metrics the run posts."""
    out = []
    for name, pack in PACKS.items():
        seen = sorted(pack.suggested_by & run_keys)
        if name not in enabled and seen:
            out.append(Suggestion(name, tuple(seen)))
    return out
