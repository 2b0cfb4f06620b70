"""Pack definitions and per-worker key names: pure checks."""
from __future__ import annotations

import pytest

from paritywatch.backend.detect import packs
from trainer_hooks.contract import PACK_NAMES, split_worker_key


@pytest.mark.parametrize("key, expected", [
    ("worker3/rollout/kl", ("worker3", "rollout/kl")),
    ("w07/align/kl_k3", ("w07", "align/kl_k3")),
    ("rollout-12/x", ("rollout-12", "x")),
    ("rollout_corr/kl", (None, "rollout_corr/kl")),  # a namespace, not a worker: no digits
    ("train/gen_kl_error", (None, "train/gen_kl_error")),
    ("worker3/", (None, "worker3/")),
    ("3d/x", (None, "3d/x")),
    ("loss", (None, "loss")),
])
def test_worker_segments_are_letters_then_digits(key, expected):
    assert split_worker_key(key) == expected


def test_every_pack_rule_says_where_its_level_comes_from():
    assert tuple(packs.PACKS) == PACK_NAMES
    for pack in packs.PACKS.values():
        assert pack.rules and pack.source
        for rule in pack.rules:
            assert rule.comparison in (">", ">=", "<", "<=") and len(rule.why) > 15, rule


def test_suggestions_name_the_packs_whose_keys_arrive_unless_enabled():
    keys = {"loss", "rollout_corr/kl", "train/gen_kl_error", "mismatch_kl/mean"}
    got = packs.suggest(keys, enabled={"prime_rl"})
    assert [(s.pack, s.keys) for s in got] == [("verl", ("rollout_corr/kl",)), ("nemo_rl", ("train/gen_kl_error",))]
    assert got[0].message == "these metrics look like verl's: enable the verl pack"
    assert packs.suggest({"loss"}, set()) == []


def test_the_moe_pack_is_suggested_by_router_flips_not_by_the_align_keys_every_run_posts():
    assert packs.suggest({"align/kl_k3", "loss"}, set()) == []
    [suggestion] = packs.suggest({"align/kl_k3", "moe/router_flip_rate"}, set())
    assert (suggestion.pack, suggestion.keys) == ("moe", ("moe/router_flip_rate",))
    assert "moe/router_flip_rate" in packs.all_keys() and "align/kl_k3" not in packs.all_keys()


def test_a_pack_rule_of_the_same_key_kind_and_direction_takes_a_builtin_rules_place():
    from types import SimpleNamespace

    from paritywatch.backend.detect import rules

    def rule(id_, key, kind="threshold", comparison=">", builtin=False, pack=None):
        return SimpleNamespace(id=id_, key=key, kind=kind, comparison=comparison, builtin=builtin, pack=pack)

    dense = [rule(1, "align/kl_k3", builtin=True), rule(2, "align/kl_k3", "baseline", builtin=True),
             rule(3, "align/kl_k3", "sawtooth", builtin=True), rule(4, "align/is_ratio_mean", comparison="<", builtin=True)]
    moe = [rule(10 + i, r["key"], r["kind"], r["comparison"], pack="moe") for i, r in enumerate(packs.rules_of("moe"))]
    assert [r.id for r in rules.superseded(dense + moe)] == [1, 2]  # the saw-tooth has no MoE level: it stays
    assert rules.superseded(dense) == []
    own = rule(5, "align/kl_k3", comparison=">=")  # a user's own rule is never set aside
    assert rules.superseded([own] + moe) == []


def test_every_builtin_rule_says_why_with_its_source():
    from paritywatch.backend.detect import rules

    for builtin in rules.BUILTINS:
        why = rules.builtin_why(builtin.key, builtin.kind, builtin.comparison)
        assert why == builtin.why and len(why) > 60, builtin
    sources = " ".join(b.why for b in rules.BUILTINS if b.key not in (
        "align/decode_mismatch_frac", "align/out_of_vocab_frac", "align/prob_abs_diff_mean"))
    for report in ("LMSYS", "ai-dynamo/dynamo#11640", "verl docs/algo/rollout_corr.md", "NVIDIA-NeMo/RL#4243",
                   "prime-rl#2802", "NVIDIA-NeMo/RL#4018"):
        assert report in sources
