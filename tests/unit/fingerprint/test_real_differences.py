"""Every real difference is an error that names the right component."""
from __future__ import annotations

import pytest

from conftest import builders, names
from trainer_hooks.fingerprint import (ProcessorMismatchError, assert_processor_consistent,
                                       diff_fingerprints)


def _diff(tmp_path, load, fp, **change):
    base = builders.build_chatml_tokenizer(tmp_path, name="base")
    changed = builders.build_chatml_tokenizer(tmp_path, name="changed", **change)
    return diff_fingerprints(fp(load(base)), fp(load(changed)))


def test_trl_bug_custom_template_on_trainer_default_on_worker(tmp_path, load, fp):
    trainer = load(builders.build_chatml_tokenizer(tmp_path, name="model"))
    trainer.chat_template = builders.CUSTOM_TEMPLATE  # set after loading, as TRL users do
    worker = load(tmp_path / "model")  # AutoTokenizer.from_pretrained(model_name): default template
    result = diff_fingerprints(fp(trainer), fp(worker))
    assert result["verdict"] == "error"
    assert {"chat_template", "behavior"} <= names(result, "error")
    row = next(c for c in result["components"] if c["name"] == "chat_template")
    unified = row["detail"]["unified_diff"]
    assert unified.startswith("--- a/chat_template\n+++ b/chat_template")
    assert "-<think>" in unified and "-{% if messages[0]['role'] != 'system' %}" in unified


def test_no_chat_template_on_one_side(tmp_path, load, fp):
    result = _diff(tmp_path, load, fp, chat_template=None)
    assert result["verdict"] == "error"
    assert {"chat_template", "behavior"} <= names(result, "error")
    behavior = next(c for c in result["components"] if c["name"] == "behavior")
    assert behavior["detail"]["sample"][0] == {"part": "chat", "probe": "no chat template", "a": "18 probes reported",
                                               "b": "no chat template: nothing rendered"}
    template = next(c for c in result["components"] if c["name"] == "chat_template")
    assert template["detail"]["unified_diff"].startswith("--- a/chat_template\n+++ /dev/null\n")


def test_added_special_token(tmp_path, load, fp):
    result = _diff(tmp_path, load, fp, extra_special_tokens=("<tool_call>",))
    assert result["verdict"] == "error"
    assert "added_tokens" in names(result, "error")
    row = next(c for c in result["components"] if c["name"] == "added_tokens")
    assert row["detail"]["rows"][0]["token"] == "<tool_call>"


def test_changed_eos_token(tmp_path, load, fp):
    result = _diff(tmp_path, load, fp, eos_token="<|endoftext|>")
    assert result["verdict"] == "error"
    assert "special_tokens" in names(result, "error")
    row = next(c for c in result["components"] if c["name"] == "special_tokens")
    [eos] = row["detail"]["rows"]
    assert (eos["key"], eos["a"], eos["b"], eos["severity"]) == ("eos", ["<|im_end|>", 2], ["<|endoftext|>", 0], "error")
    assert row["summary"].startswith("eos token differs ('<|im_end|>' (id 2) vs '<|endoftext|>' (id 0)): ")


def test_different_generation_config_eos_ids(tmp_path, load, fp):
    a = builders.build_chatml_tokenizer(tmp_path, name="a", generation_config={"eos_token_id": 2})
    b = builders.build_chatml_tokenizer(tmp_path, name="b", generation_config={"eos_token_id": [2, 0]})
    result = diff_fingerprints(fp(load(a), model_dir=a), fp(load(b), model_dir=b))
    assert result["verdict"] == "error"
    assert names(result) == {"generation_eos"}
    row = result["components"][0]
    assert (row["detail"]["a"], row["detail"]["b"]) == ([2], [0, 2])


def test_changed_normalizer(tmp_path, load, fp):
    from tokenizers import normalizers

    result = _diff(tmp_path, load, fp, normalizer=normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()]))
    assert result["verdict"] == "error"
    assert {"normalizer", "behavior"} <= names(result, "error")


def test_nfkc_instead_of_nfc_is_caught_by_the_probes(tmp_path, load, fp):
    from tokenizers import normalizers

    result = _diff(tmp_path, load, fp, normalizer=normalizers.NFKC())
    assert result["verdict"] == "error"
    assert "normalizer" in names(result, "error")


def test_changed_pre_tokenizer(tmp_path, load, fp):
    from tokenizers import pre_tokenizers

    result = _diff(tmp_path, load, fp, pre_tokenizer=pre_tokenizers.ByteLevel(add_prefix_space=True))
    assert result["verdict"] == "error"
    assert "pre_tokenizer" in names(result, "error")


def test_post_processor_that_adds_bos(tmp_path, load, fp):
    from tokenizers import processors

    bos = processors.TemplateProcessing(single="<|endoftext|> $A", pair="<|endoftext|> $A $B",
                                        special_tokens=[("<|endoftext|>", 0)])
    result = _diff(tmp_path, load, fp, post_processor=bos)
    assert result["verdict"] == "error"
    assert {"post_processor", "encode_flags"} <= names(result, "error")
    flags = next(c for c in result["components"] if c["name"] == "encode_flags")
    by_key = {r["key"]: (r["a"], r["b"], r["severity"]) for r in flags["detail"]["rows"]}
    assert by_key["prefix"] == ([], [0], "error")  # a bos added on one side: every encoded prompt differs


def test_one_vocab_entry_changed(tmp_path, load, fp):
    result = _diff(tmp_path, load, fp, vocab_edit=("\u0120world", "\u0120wor1d"))
    assert result["verdict"] == "error"
    assert "vocab" in names(result, "error")
    row = next(c for c in result["components"] if c["name"] == "vocab")
    assert row["detail"]["differing"] == 1
    assert (row["detail"]["sample"][0]["a"], row["detail"]["sample"][0]["b"]) == ("\u0120world", "\u0120wor1d")


def test_changed_image_processor_setting(tmp_path, fp):
    from transformers import AutoProcessor

    a = AutoProcessor.from_pretrained(builders.build_multimodal_processor(tmp_path, image_size=32, name="a"))
    b = AutoProcessor.from_pretrained(builders.build_multimodal_processor(tmp_path, image_size=48, name="b"))
    fa, fb = fp(a), fp(b)
    assert fa["kind"] == "processor"
    result = diff_fingerprints(fa, fb)
    assert result["verdict"] == "error"
    assert names(result) == {"image_processor"}


def test_multimodal_processor_loaded_twice_is_same(tmp_path, fp):
    from transformers import AutoProcessor

    path = builders.build_multimodal_processor(tmp_path)
    assert diff_fingerprints(fp(AutoProcessor.from_pretrained(path)), fp(AutoProcessor.from_pretrained(path)))[
        "verdict"] == "same"


def test_sampling_defaults_differ_is_a_warning(tmp_path, load, fp):
    a = builders.build_chatml_tokenizer(tmp_path, name="a", generation_config={"eos_token_id": 2, "temperature": 0.6})
    b = builders.build_chatml_tokenizer(tmp_path, name="b", generation_config={"eos_token_id": 2, "temperature": 1.0})
    result = diff_fingerprints(fp(load(a), model_dir=a), fp(load(b), model_dir=b))
    assert (result["verdict"], names(result)) == ("warning", {"sampling_defaults"})


def test_shipped_tokenizers_differ_from_each_other(tmp_path, load, fp):
    smol = fp(load(builders.build_smollm2_tokenizer(tmp_path)))
    deepseek = fp(load(builders.deepseek_tokenizer_dir()))
    tekken = fp(builders.load_tekken())
    for a, b in ((smol, deepseek), (deepseek, tekken), (smol, tekken)):
        result = diff_fingerprints(a, b)
        assert result["verdict"] == "error"
        assert {"vocab", "behavior"} <= names(result, "error")


def test_smollm2_custom_template_is_a_chat_template_error(tmp_path, load, fp):
    path = builders.build_smollm2_tokenizer(tmp_path)
    trainer = load(path)
    trainer.chat_template = builders.CUSTOM_TEMPLATE
    result = diff_fingerprints(fp(trainer), fp(load(path)))
    assert {"chat_template", "behavior"} == names(result, "error")


def test_assert_processor_consistent_names_components(tmp_path, load):
    base = load(builders.build_chatml_tokenizer(tmp_path, name="base"))
    other = load(builders.build_chatml_tokenizer(tmp_path, name="other", eos_token="<|endoftext|>"))
    with pytest.raises(ProcessorMismatchError) as info:
        assert_processor_consistent(base, other)
    assert "special_tokens" in info.value.components
    assert "special_tokens" in str(info.value)
    assert assert_processor_consistent(base, load(tmp_path / "base"))["verdict"] == "same"


def test_assert_processor_consistent_fail_on_warning(tmp_path, load):
    base = load(builders.build_chatml_tokenizer(tmp_path, name="base"))
    assert assert_processor_consistent(base, load(tmp_path / "base", truncation_side="left"))["verdict"] == "info"
    with pytest.raises(ProcessorMismatchError):
        assert_processor_consistent(base, load(tmp_path / "base", truncation_side="left"), fail_on="info")
