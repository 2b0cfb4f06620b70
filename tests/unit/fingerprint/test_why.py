"""Say why, not only what (issue 12, point 4): the likely cause of a difference, read from env, and
behaviour rows as token strings aligned at the first differing id."""
from __future__ import annotations

import json

from conftest import builders
from trainer_hooks.fingerprint import diff_fingerprints
from trainer_hooks.fingerprint.cli import format_diff


def _row(result, name):
    return next(c for c in result["components"] if c["name"] == name)


def test_a_model_specific_tokenizer_class_is_named_as_the_likely_cause(chatml_dir, model_specific_dir, load, fp):
    generic, specific = load(chatml_dir), load(model_specific_dir)
    assert type(generic).__name__ != type(specific).__name__  # the premise: two classes, same files
    result = diff_fingerprints(fp(generic), fp(specific))
    assert result["verdict"] == "error" and "pre_tokenizer" in {c["name"] for c in result["components"]}
    cause = next(c for c in result["causes"] if c["cause"] == "loader_class")
    assert (cause["a"], cause["b"]) == (type(generic).__name__, type(specific).__name__)
    assert "config.json names a model_type" in cause["summary"]
    assert "likely cause: a was loaded as" in format_diff(result, "a", "b")


def test_behaviour_rows_show_token_strings_at_the_first_difference(chatml_dir, model_specific_dir, load, fp):
    result = diff_fingerprints(fp(load(chatml_dir)), fp(load(model_specific_dir)))
    detail = _row(result, "behavior")["detail"]
    digits = next(r for r in detail["sample"] if r["part"] == "encode" and r["probe"].startswith("text[3] "))
    assert digits["probe"] == "text[3] '0 7 42 1234567890 3.141…'"
    # the generic tokenizer keeps " 7" whole; Qwen2's pre-tokenizer splits digits off the space
    assert digits["tokens"] == {"at": 1, "before": ["0"], "a": [" 7"], "b": [" ", "7"], "span": " 7"}
    newlines = next(r for r in detail["sample"] if r["part"] == "encode" and r["probe"].startswith("text[4] "))
    assert newlines["tokens"]["span"].startswith("\n") and newlines["tokens"]["a"] != newlines["tokens"]["b"]
    chat = next(r for r in detail["sample"] if r["part"] == "chat")
    assert chat["probe"] == "user/gen=0" and chat["text"]["a"] == chat["text"]["b"]  # same text, other ids
    assert chat["tokens"]["span"] == " 2"
    out = format_diff(result, "a", "b")
    assert 'encode text[3] \'0 7 42 1234567890 3.141…\'' in out
    assert 'at token 1, after ["0"]: " 7" → [" 7"] vs [" ", "7"]' in out


def test_no_cause_is_invented(tmp_path, chatml_dir, load, fp):
    """Same class on both sides (a changed normalizer): no loader cause; a vLLM Cached<Class> copy is the same class."""
    from tokenizers import normalizers

    nfkc = builders.build_chatml_tokenizer(tmp_path, name="nfkc", normalizer=normalizers.NFKC())
    result = diff_fingerprints(fp(load(chatml_dir)), fp(load(nfkc)))
    assert result["verdict"] == "error" and "causes" not in result
    a = fp(load(chatml_dir))
    b = json.loads(json.dumps(fp(load(nfkc))))
    b["env"]["class"] = "Cached" + a["env"]["class"]
    assert "causes" not in diff_fingerprints(a, b)


def test_rendered_text_is_shown_with_the_first_difference(tmp_path, load, fp):
    from tests.fixtures.chat_templates import GEN_PROMPT_NEWLINE_VARIANT, TRL_DEFAULT_TEMPLATE

    a = builders.build_chatml_tokenizer(tmp_path, name="a", chat_template=TRL_DEFAULT_TEMPLATE)
    b = builders.build_chatml_tokenizer(tmp_path, name="b", chat_template=GEN_PROMPT_NEWLINE_VARIANT)
    result = diff_fingerprints(fp(load(a)), fp(load(b)))
    row = _row(result, "behavior")["detail"]["sample"][0]
    assert row["probe"] == "user/gen=1"
    assert row["text"]["b"] == row["text"]["a"] + "\n" and row["first_diff_char"] == len(row["text"]["a"])
    assert row["tokens"]["a"] == [] and row["tokens"]["b"] == ["\n"]  # the trainer's render ends there
    assert '…"with  two spaces.<|im_end|>\\n<|im_start|>assistant\\n⟦\\n"' in format_diff(result, "a", "b")


def test_token_strings_from_each_decoder_form():
    from trainer_hooks.fingerprint.tokens import token_namer

    def comps(vocab, decoder, added=()):
        return {"vocab": {"value": [[i, t] for i, t in enumerate(vocab)]}, "decoder": {"value": decoder},
                "added_tokens": {"value": [{"id": i} for i in added]}}

    byte_level = token_namer(comps(["\u010a\u010a", "\u010a", "\u0120hi", "\u00f0\u0141"], {"type": "ByteLevel"}))
    assert [byte_level(i) for i in range(4)] == ["\n\n", "\n", " hi", "\\xf0\\x9f"]  # partial UTF-8 escaped
    sentencepiece = token_namer(comps(["\u2581hi", "<0x0A>", "<s>"], {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}, added=(2,)))
    assert [sentencepiece(i) for i in range(3)] == [" hi", "\n", "<s>"]
    assert token_namer(comps(["##ing"], {"type": "WordPiece", "prefix": "##"}))(0) == "ing"
    assert token_namer(comps(["x"], None))(7) == "<id 7>"


def test_alignment_resynchronises_where_both_sides_spell_the_same_text():
    from trainer_hooks.fingerprint.tokens import aligned_tokens

    name = {1: "\n\n", 2: "\n", 3: "a", 4: "b", 5: "c"}.get
    assert aligned_tokens([3, 1, 4], [3, 2, 2, 4], name, name) == {
        "at": 1, "before": ["a"], "a": ["\n\n"], "b": ["\n", "\n"], "span": "\n\n"}
    texts_differ = aligned_tokens([3, 4], [3, 5], name, name)
    assert (texts_differ["a"], texts_differ["b"], texts_differ["span"]) == (["b"], ["c"], None)
    assert aligned_tokens([3], [3], name, name) is None
