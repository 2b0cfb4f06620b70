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
