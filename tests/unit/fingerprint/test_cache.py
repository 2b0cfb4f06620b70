"""Each processor object is fingerprinted once; later mutation is noticed."""
from __future__ import annotations

from conftest import builders
from trainer_hooks.fingerprint import diff_fingerprints, fingerprint_processor


def test_second_call_returns_the_cached_fingerprint(chatml_dir, load):
    tok = load(chatml_dir)
    assert fingerprint_processor(tok) is fingerprint_processor(tok)


def test_chat_template_assigned_after_loading_is_noticed(chatml_dir, load):
    tok = load(chatml_dir)
    before = fingerprint_processor(tok)
    tok.chat_template = builders.CUSTOM_TEMPLATE  # the TRL bug's shape
    after = fingerprint_processor(tok)
    assert after is not before
    assert "chat_template" in {c["name"] for c in diff_fingerprints(before, after)["components"]}


def test_added_token_and_side_changes_are_noticed(chatml_dir, load):
    tok = load(chatml_dir)
    first = fingerprint_processor(tok)
    tok.add_special_tokens({"additional_special_tokens": ["<x>"]})
    second = fingerprint_processor(tok)
    assert second["digest"] != first["digest"]
    tok.truncation_side = "left"
    assert fingerprint_processor(tok)["components"]["runtime"]["value"]["truncation_side"] == "left"


def test_generation_config_mutation_is_noticed(chatml_dir, load):
    from transformers import GenerationConfig

    tok, gen = load(chatml_dir), GenerationConfig(eos_token_id=2)
    first = fingerprint_processor(tok, gen)
    gen.eos_token_id = [2, 0]
    assert fingerprint_processor(tok, gen)["components"]["generation_eos"]["value"]["eos"] == [0, 2]
    assert first["components"]["generation_eos"]["value"]["eos"] == [2]
