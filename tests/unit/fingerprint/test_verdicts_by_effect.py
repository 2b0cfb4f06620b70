"""Fingerprint differences are judged by their effect on the tokens the rollout samples and the
trainer scores (issue 25, point 1), with real tokenizers built offline.

The bug that opened it: TRL sets ``pad_token = eos`` on a trainer tokenizer that has none (and the
pad id on the model's generation config); a rollout that loads the same folder keeps none. That was
an ``error`` on ``special_tokens`` and ``generation_eos`` ("eos ids differ: [2] vs [2]") and paused
healthy runs of every Llama-style model.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import builders, names
from trainer_hooks.fingerprint import diff_fingerprints

PADLESS_GENERATION = {"eos_token_id": 2}


def _row(result, name):
    return next(c for c in result["components"] if c["name"] == name)


@pytest.fixture
def padless(tmp_path):
    """A Llama-style folder: ChatML BPE, eos <|im_end|> (id 2), no pad token."""
    return builders.build_chatml_tokenizer(tmp_path, name="padless", pad_token=None,
                                           generation_config=PADLESS_GENERATION)


def test_trl_pad_equals_eos_against_a_rollout_loaded_by_name_is_info(padless, load, fp):
    from transformers import GenerationConfig

    trainer = load(padless)
    trainer.pad_token = trainer.eos_token  # what GRPOTrainer / AsyncGRPOTrainer do to a tokenizer without one
    generation = GenerationConfig.from_pretrained(padless)
    generation.pad_token_id = trainer.pad_token_id  # ... and to the model's generation config
    rollout = load(padless)  # vLLM / the worker loads the folder by name: no pad token
    result = diff_fingerprints(fp(trainer, generation), fp(rollout, model_dir=padless))

    assert result["verdict"] == "info", result
    assert {c["name"]: c["severity"] for c in result["components"]} == {"special_tokens": "info",
                                                                       "generation_eos": "info"}
    special, gen = _row(result, "special_tokens"), _row(result, "generation_eos")
    assert special["summary"].startswith("pad token differs ('<|im_end|>' (id 2) vs none): padding is masked out")
    # a pad id is never read as an eos difference, and the summary names the values that differ
    assert gen["summary"].startswith("generation_config pad_token_id differs (2 vs none): ")
    assert "eos" not in gen["summary"].split(":")[0]
    assert [(r["key"], r["a"], r["b"]) for r in gen["detail"]["rows"]] == [("pad", 2, None)]
    assert "causes" not in result  # nothing at warning or worse to explain


@pytest.mark.parametrize("pad", ["<pad>", "[PAD]"])
def test_a_new_pad_token_on_one_side_is_info(padless, load, fp, pad):
    """``add_special_tokens({"pad_token": ...})``: a token the model never had, masked out. A probe
    text that contains "<pad>" literally encodes differently: info too, saying so."""
    trainer = load(padless)
    trainer.add_special_tokens({"pad_token": pad})
    result = diff_fingerprints(fp(trainer), fp(load(padless)))
    assert result["verdict"] == "info", result
    new_id = len(load(padless))
    for name in ("vocab", "added_tokens"):
        assert f"only a has {pad!r} (id {new_id}), its pad token, a token the other side does not have" in \
            _row(result, name)["summary"]
    if pad == "<pad>":  # text[11] holds "<pad>": the only probes that differ
        assert names(result) == {"vocab", "added_tokens", "special_tokens", "behavior"}
        assert f"each a text containing {pad!r} literally" in _row(result, "behavior")["summary"]
    else:
        assert names(result) == {"vocab", "added_tokens", "special_tokens"}


def test_a_new_token_that_is_not_the_pad_token_stays_an_error(padless, load, fp):
    trainer = load(padless)
    trainer.pad_token = trainer.eos_token
    trainer.add_tokens(["<tool_call>"])  # a token the trainer can score that the rollout cannot produce alike
    result = diff_fingerprints(fp(trainer), fp(load(padless)))
    assert {"vocab", "added_tokens"} <= names(result, "error")
    assert _row(result, "special_tokens")["severity"] == "info"  # the pad part of it is still harmless


def test_a_new_pad_token_beside_a_changed_vocab_entry_stays_an_error(tmp_path, load, fp):
    base = builders.build_chatml_tokenizer(tmp_path, name="base", pad_token=None)
    edited = builders.build_chatml_tokenizer(tmp_path, name="edited", pad_token=None, vocab_edit=("\u0120lazy", "\u0120l4zy"))
    trainer = load(edited)
    trainer.add_special_tokens({"pad_token": "[PAD]"})
    result = diff_fingerprints(fp(trainer), fp(load(base)))  # no probe holds "lazy": only the tables show it
    assert "vocab" in names(result, "error")
    assert _row(result, "vocab")["summary"].startswith("vocab differs: 2 of ")


def test_a_new_pad_token_whose_text_a_chat_probe_renders_stays_an_error(padless, load, fp):
    """The template renders the new token's text: prompts really encode differently."""
    trainer = load(padless)
    trainer.add_special_tokens({"pad_token": "<|im_start|>system"})  # text the ChatML template writes
    result = diff_fingerprints(fp(trainer), fp(load(padless)))
    assert {"vocab", "added_tokens", "behavior"} <= names(result, "error")


def test_an_eos_id_that_really_differs_is_an_error_named_first(tmp_path, load, fp):
    a = builders.build_chatml_tokenizer(tmp_path, name="a", generation_config={"eos_token_id": 2, "pad_token_id": 0})
    b = builders.build_chatml_tokenizer(tmp_path, name="b", generation_config={"eos_token_id": [2, 0]})
    gen = _row(diff_fingerprints(fp(load(a), model_dir=a), fp(load(b), model_dir=b)), "generation_eos")
    assert gen["severity"] == "error"
    assert gen["summary"].startswith("generation_config eos_token_id differs ([2] vs [0, 2]): vLLM stops sampling")
    assert gen["summary"].endswith("; also generation_config pad_token_id 0 vs none")


@pytest.mark.parametrize(("setting", "a", "b"), [("padding_side", "right", "left"),
                                                  ("truncation_side", "right", "left"),
                                                  ("model_max_length", 32768, 131072)])
def test_padding_and_truncation_settings_are_info_with_their_values(padless, load, fp, setting, a, b):
    result = diff_fingerprints(fp(load(padless, **{setting: a})), fp(load(padless, **{setting: b})))
    assert (result["verdict"], names(result)) == ("info", {"runtime"})
    assert _row(result, "runtime")["summary"].startswith(f"{setting} differs ({a!r} vs {b!r}): ")


def test_a_bos_added_on_one_side_stays_an_error(tmp_path, load, fp):
    from tokenizers import processors

    bos = processors.TemplateProcessing(single="<|endoftext|> $A", pair="<|endoftext|> $A $B",
                                        special_tokens=[("<|endoftext|>", 0)])
    a = builders.build_chatml_tokenizer(tmp_path, name="a")
    b = builders.build_chatml_tokenizer(tmp_path, name="b", post_processor=bos)
    flags = _row(diff_fingerprints(fp(load(a)), fp(load(b))), "encode_flags")
    assert flags["severity"] == "error"
    assert flags["summary"].startswith("ids encode() adds before a text differs ([] vs [0]): ")
    assert "also special tokens added to a pair 0 vs 1" in flags["summary"]  # info on its own


def test_a_bos_token_no_probe_uses_is_a_warning_that_says_where_it_can_matter(padless, load, fp):
    """A bos token named on one side only, never added by encode() nor rendered by the template."""
    result = diff_fingerprints(fp(load(padless, bos_token="<|endoftext|>")), fp(load(padless)))
    assert (result["verdict"], names(result)) == ("warning", {"special_tokens"})
    assert "only where code inserts the bos token by id itself" in _row(result, "special_tokens")["summary"]


def test_sampling_defaults_are_info_once_both_sides_report_what_they_serve(tmp_path, load, fp):
    from trainer_hooks.fingerprint.core import with_component
    from trainer_hooks.fingerprint.sampling import sampling_value

    a = builders.build_chatml_tokenizer(tmp_path, name="a", generation_config={"eos_token_id": 2, "temperature": 0.6})
    b = builders.build_chatml_tokenizer(tmp_path, name="b", generation_config={"eos_token_id": 2})
    fa, fb = fp(load(a), model_dir=a), fp(load(b), model_dir=b)
    assert diff_fingerprints(fa, fb)["verdict"] == "warning"  # an unset request would get 0.6 on a
    served = sampling_value({"temperature": 1.0})
    result = diff_fingerprints(with_component(fa, "sampling_params", served), with_component(fb, "sampling_params", served))
    assert (result["verdict"], names(result)) == ("info", {"sampling_defaults"})


# --------------------------------------------------------------------------- the real CLI, on folders


def _variant(base: Path, out: Path, tokenizer_config=None, generation_config=None) -> Path:
    """A copy of the folder `base` with keys of its tokenizer_config.json / generation_config.json replaced."""
    import shutil

    shutil.copytree(base, out)
    for file, changes in (("tokenizer_config.json", tokenizer_config), ("generation_config.json", generation_config)):
        if changes:
            data = json.loads((out / file).read_text())
            data.update(changes)
            (out / file).write_text(json.dumps(data))
    return out


@pytest.mark.parametrize(("variant", "shown"), [
    ({"tokenizer_config": {"pad_token": "<|im_end|>"}}, "pad token differs (none vs '<|im_end|>' (id 2))"),
    ({"generation_config": {"pad_token_id": 2}}, "generation_config pad_token_id differs (none vs 2)"),
    ({"tokenizer_config": {"padding_side": "left"}}, "padding_side differs ('right' vs 'left')"),
    ({"tokenizer_config": {"model_max_length": 4096}}, "model_max_length differs (1000000000000000019884624838656 vs 4096)"),
])
def test_paritywatch_diff_on_folders_that_differ_only_in_padding_is_not_an_error(padless, tmp_path, variant, shown):
    other = _variant(padless, tmp_path / "variant", **variant)
    out = subprocess.run([str(Path(sys.executable).parent / "paritywatch"), "diff", str(padless), str(other)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr  # 0: same or info
    assert "verdict: INFO" in out.stdout
    assert shown in out.stdout, out.stdout
    assert "[2] vs [2]" not in out.stdout
