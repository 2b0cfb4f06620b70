"""Equivalent processors must never produce more than info (a false alarm pauses a GPU run)."""
from __future__ import annotations

import shutil

from conftest import builders, names
from trainer_hooks.fingerprint import diff_fingerprints


def test_same_tokenizer_loaded_twice_is_same(chatml_dir, load, fp):
    result = diff_fingerprints(fp(load(chatml_dir)), fp(load(chatml_dir)))
    assert result == {"verdict": "same", "components": []}


def test_saved_and_reloaded_is_same(chatml_dir, load, fp, tmp_path):
    tok = load(chatml_dir)
    tok.save_pretrained(tmp_path / "resaved")
    assert diff_fingerprints(fp(tok), fp(load(tmp_path / "resaved")))["verdict"] == "same"


def test_loaded_from_another_path_is_same(chatml_dir, load, fp, tmp_path):
    other = shutil.copytree(chatml_dir, tmp_path / "elsewhere" / "copy")
    a, b = fp(load(chatml_dir)), fp(load(other))
    assert diff_fingerprints(a, b)["verdict"] == "same"
    assert a["digest"] == b["digest"]


def test_fast_and_slow_bert_that_encode_alike_are_at_most_info(tmp_path, fp):
    from transformers import BertTokenizer
    from transformers.models.bert import BertTokenizerLegacy

    vocab = builders.build_bert_vocab(tmp_path)
    # v5 defaults differ (fast: no clean-up, slow: clean-up), which really changes decode; see below.
    fast = BertTokenizer(str(vocab), clean_up_tokenization_spaces=True)
    slow = BertTokenizerLegacy(str(vocab), clean_up_tokenization_spaces=True)
    assert fast.encode("Hello the dogs, I'm jumping!") == slow.encode("Hello the dogs, I'm jumping!")
    result = diff_fingerprints(fp(fast), fp(slow))
    assert result["verdict"] == "info", result
    # the slow tokenizer cannot report the Rust pipeline: not comparable, never an error
    assert names(result) == {"merges", "model_params", "normalizer", "pre_tokenizer", "post_processor", "decoder"}


def test_fast_and_slow_bert_with_v5_defaults_decode_differently_and_say_so(tmp_path, fp):
    from transformers import BertTokenizer
    from transformers.models.bert import BertTokenizerLegacy

    vocab = str(builders.build_bert_vocab(tmp_path))
    fast, slow = BertTokenizer(vocab), BertTokenizerLegacy(vocab)
    ids = fast.encode("i'm here", add_special_tokens=False)
    assert fast.decode(ids) != slow.decode(ids)  # a true positive, not a false alarm
    result = diff_fingerprints(fp(fast), fp(slow))
    assert result["verdict"] == "error"
    assert {"encode_flags", "behavior"} <= names(result, "error")


def test_vllm_style_truncation_side_left_is_info_on_runtime(chatml_dir, load, fp):
    result = diff_fingerprints(fp(load(chatml_dir)), fp(load(chatml_dir, truncation_side="left")))
    assert result["verdict"] == "info"
    assert names(result) == {"runtime"}


def test_deepseek_128k_loaded_twice_is_same(load, fp):
    path = builders.deepseek_tokenizer_dir()
    a, b = fp(load(path)), fp(load(path))
    assert a["components"]["vocab"]["value"][-1][0] >= 128_000
    assert diff_fingerprints(a, b)["verdict"] == "same"


def test_smollm2_from_gguf_saved_and_reloaded_is_same(tmp_path, load, fp):
    path = builders.build_smollm2_tokenizer(tmp_path)
    tok = load(path)
    tok.save_pretrained(tmp_path / "again")
    a, b = fp(tok), fp(load(tmp_path / "again"))
    assert a["components"]["chat_template"]["value"].startswith("{% for message in messages %}")
    assert diff_fingerprints(a, b)["verdict"] == "same"


def test_tekken_loaded_twice_is_same(fp):
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    a = fp(builders.load_tekken())
    b = fp(MistralTokenizer.from_file(str(builders.tekken_file())))
    assert a["kind"] == "mistral"
    assert diff_fingerprints(a, b)["verdict"] == "same"


def test_vllm_wrappers_fingerprint_like_the_tokenizer(chatml_dir, load, fp):
    """Duck-typed stand-ins for vLLM (not installed here): LLM.get_tokenizer() and the cached
    wrapper that get_cached_tokenizer builds (a copy whose class is a dynamic subclass)."""
    import copy

    tok = load(chatml_dir)

    class LLM:  # vllm.LLM exposes get_tokenizer()
        def get_tokenizer(self):
            return cached

    cached = copy.copy(tok)
    cached.__class__ = type(f"Cached{type(tok).__name__}", (type(tok),), {})
    assert diff_fingerprints(fp(tok), fp(LLM()))["verdict"] == "same"


def test_vllm_mistral_wrapper_unwraps_to_mistral_common(fp):
    class VllmMistralTokenizer:  # vLLM keeps the mistral-common object in .mistral
        def __init__(self, mistral):
            self.mistral = mistral
            self.tokenizer = mistral.instruct_tokenizer.tokenizer

    tekken = builders.load_tekken()
    assert diff_fingerprints(fp(tekken), fp(VllmMistralTokenizer(tekken)))["verdict"] == "same"


def test_generation_config_object_and_file_agree(chatml_dir, load, fp, tmp_path):
    from transformers import GenerationConfig

    path = builders.build_chatml_tokenizer(tmp_path, generation_config={"eos_token_id": [2, 0], "temperature": 0.6},
                                           name="with-gen")
    tok = load(path)
    from_file = fp(tok, model_dir=path)
    from_object = fp(tok, GenerationConfig(eos_token_id=[2, 0], temperature=0.6))
    assert from_file["components"]["generation_eos"]["value"]["eos"] == [0, 2]
    assert diff_fingerprints(from_file, from_object)["verdict"] == "same"


def test_structure_only_difference_is_a_warning(tmp_path, load, fp):
    from tokenizers import normalizers

    plain = builders.build_chatml_tokenizer(tmp_path, name="plain")
    doubled = builders.build_chatml_tokenizer(
        tmp_path, normalizer=normalizers.Sequence([normalizers.NFC(), normalizers.NFC()]), name="doubled")
    result = diff_fingerprints(fp(load(plain)), fp(load(doubled)))
    assert result["verdict"] == "warning"
    assert names(result) == {"normalizer"}


def test_equivalent_sequence_forms_are_same(tmp_path, load, fp):
    from tokenizers import normalizers

    plain = builders.build_chatml_tokenizer(tmp_path, name="plain")
    wrapped = builders.build_chatml_tokenizer(tmp_path, normalizer=normalizers.Sequence([normalizers.NFC()]),
                                              name="wrapped")
    assert diff_fingerprints(fp(load(plain)), fp(load(wrapped)))["verdict"] == "same"
