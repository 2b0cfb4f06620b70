"""Model and engine components: real transformers models and peft adapters, built offline.

Each case has a healthy twin that must stay quiet: two models built apart (other random weights)
with one config read alike, a live model and its saved directory read alike.
"""
from __future__ import annotations

import json

import pytest
from conftest import builders  # noqa: F401  (puts the project root on sys.path, quiets transformers)

from tests.fixtures.models import build_tiny_qwen2_dir, tiny_qwen2
from trainer_hooks.fingerprint import diff_fingerprints
from trainer_hooks.fingerprint.cli import main
from trainer_hooks.fingerprint.core import with_components
from trainer_hooks.fingerprint.model_config import model_components

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "rope_theta": 10000.0}


def model_fp(model) -> dict:
    """What register_model posts for ``model``, JSON round-tripped as it would travel."""
    return json.loads(json.dumps(with_components(None, *model_components(model))))


def rows(result: dict, name: str) -> dict:
    row = next(r for r in result["components"] if r["name"] == name)
    return {r["key"]: r for r in row["detail"]["rows"]}


def test_two_models_with_one_config_are_the_same():
    assert diff_fingerprints(model_fp(tiny_qwen2(seed=0)), model_fp(tiny_qwen2(seed=1))) == {
        "verdict": "same", "components": []}


def test_yarn_factors_differ_is_an_error_naming_the_factor():
    result = diff_fingerprints(model_fp(tiny_qwen2(rope_parameters=YARN)),
                               model_fp(tiny_qwen2(rope_parameters={**YARN, "factor": 2.0})))
    assert result["verdict"] == "error"
    found = rows(result, "model_config")
    assert found["rope.factor"]["severity"] == "error" and (found["rope.factor"]["a"], found["rope.factor"]["b"]) == (4.0, 2.0)
    # YaRN's attention factor is derived from the factor when left out: it differs too, and is judged
    assert found["rope.attention_factor"]["severity"] == "error"
    assert "prime-rl#2802" in result["components"][0]["summary"]


def test_yarn_attention_factor_left_out_equals_the_default_it_computes():
    """An explicit attention_factor equal to transformers' default is the same rope: quiet."""
    implicit = tiny_qwen2(rope_parameters=YARN)
    explicit = tiny_qwen2(rope_parameters={**YARN, "attention_factor": 0.1 * __import__("math").log(4.0) + 1.0,
                                           "beta_fast": 32.0})
    assert diff_fingerprints(model_fp(implicit), model_fp(explicit))["verdict"] == "same"


def test_rope_scaling_on_one_side_only_is_an_error():
    result = diff_fingerprints(model_fp(tiny_qwen2()), model_fp(tiny_qwen2(rope_parameters=YARN)))
    assert result["verdict"] == "error"
    assert rows(result, "model_config")["rope.rope_type"]["severity"] == "error"


def test_norm_eps_differs_is_an_error():
    result = diff_fingerprints(model_fp(tiny_qwen2(rms_norm_eps=1e-6)), model_fp(tiny_qwen2(rms_norm_eps=1e-5)))
    assert result["verdict"] == "error"
    row = rows(result, "model_config")["rms_norm_eps"]
    assert (row["severity"], row["a"], row["b"]) == ("error", 1e-6, 1e-5)


def test_dtype_differs_is_a_warning_with_the_mismatch_to_expect():
    import torch

    result = diff_fingerprints(model_fp(tiny_qwen2()), model_fp(tiny_qwen2().to(torch.bfloat16)))
    assert result["verdict"] == "warning"
    found = rows(result, "model_config")
    assert (found["dtype"]["a"], found["dtype"]["b"]) == ("float32", "bfloat16")
    assert all(r["severity"] == "warning" for r in found.values())
    assert "1e-5 to 1e-3" in found["dtype"]["why"] and "1.05" in found["dtype"]["why"]


def test_fp32_lm_head_on_one_side_is_a_warning():
    import torch

    bf16 = tiny_qwen2(tie_word_embeddings=False).to(torch.bfloat16)
    fp32_head = tiny_qwen2(tie_word_embeddings=False).to(torch.bfloat16)
    fp32_head.lm_head.float()
    result = diff_fingerprints(model_fp(fp32_head), model_fp(bf16))
    assert result["verdict"] == "warning"
    assert list(rows(result, "model_config")) == ["lm_head_dtype"]


def test_a_live_model_and_its_saved_directory_read_alike(tmp_path):
    path = build_tiny_qwen2_dir(tmp_path, rope_parameters=YARN)
    live = tiny_qwen2(vocab_size=json.loads((path / "config.json").read_text())["vocab_size"], rope_parameters=YARN)
    assert diff_fingerprints(model_fp(live), model_fp(path))["verdict"] in ("same", "info")
    assert not [r for r in diff_fingerprints(model_fp(live), model_fp(path))["components"] if r["severity"] != "info"]


# --------------------------------------------------------------------------- peft

@pytest.fixture
def lora():
    peft = pytest.importorskip("peft")
    return lambda model, r=4: peft.get_peft_model(model, peft.LoraConfig(r=r, lora_alpha=8, target_modules=["q_proj", "v_proj"]))


def test_an_adapter_on_the_trainer_and_none_on_the_rollout_is_an_error(lora):
    trainer, rollout = lora(tiny_qwen2()), tiny_qwen2()
    result = diff_fingerprints(model_fp(trainer), model_fp(rollout))
    assert result["verdict"] == "error"
    row = next(r for r in result["components"] if r["name"] == "lora_adapter")
    assert row["severity"] == "error" and "verl#7495" in row["summary"]
    assert row["detail"]["rows"][0]["a"] == "default (rank 4)" and row["detail"]["rows"][0]["b"] == "none"
    # the adapter sits on the same base model: nothing else differs
    assert [r["name"] for r in result["components"]] == ["lora_adapter"]


def test_the_same_adapter_on_both_sides_is_quiet_and_another_rank_is_an_error(lora):
    assert diff_fingerprints(model_fp(lora(tiny_qwen2(seed=0))), model_fp(lora(tiny_qwen2(seed=1))))["verdict"] == "same"
    result = diff_fingerprints(model_fp(lora(tiny_qwen2(), r=4)), model_fp(lora(tiny_qwen2(), r=8)))
    assert result["verdict"] == "error" and rows(result, "lora_adapter")["r"]["severity"] == "error"


def test_disabled_adapters_report_none(lora):
    model = lora(tiny_qwen2())
    with model.disable_adapter():
        assert model_components(model)[0]["lora_adapter"] is None
    assert model_components(model)[0]["lora_adapter"]["r"] == 4


def test_a_saved_adapter_directory_reads_as_its_adapter(lora, tmp_path):
    model = lora(tiny_qwen2())
    model.save_pretrained(tmp_path / "adapter")
    comps, _ = model_components(tmp_path / "adapter")
    assert comps == {"lora_adapter": {k: v for k, v in model_components(model)[0]["lora_adapter"].items() if k != "name"}}


# --------------------------------------------------------------------------- engine_config against a model

def _engine(**fields) -> dict:
    base = {"engine": "vllm", "max_model_len": 512, "enforce_eager": True, "attention_backend": None,
            "kv_cache_dtype": "auto", "prefix_caching": False, "prefix_cache_reset_after_sync": None, "hf_overrides": None}
    return {**base, **fields}


def _with_engine(model, engine: dict) -> dict:
    comps, env = model_components(model)
    comps["engine_config"] = engine
    return json.loads(json.dumps(with_components(None, comps, env)))


@pytest.mark.parametrize("engine, severity", [
    (_engine(), None),
    (_engine(prefix_caching=True, prefix_cache_reset_after_sync=True), None),
    (_engine(prefix_caching=True), "info"),
    (_engine(prefix_caching=True, prefix_cache_reset_after_sync=False), "warning"),
    (_engine(kv_cache_dtype="fp8_e4m3"), "warning"),
    (_engine(max_model_len=1024), "warning"),
    (_engine(max_model_len=256), "info"),
])
def test_a_rollout_engine_is_judged_against_the_trainer_model(engine, severity):
    result = diff_fingerprints(model_fp(tiny_qwen2()), _with_engine(tiny_qwen2(), engine))
    found = [r for r in result["components"] if r["name"] == "engine_config"]
    assert (found[0]["severity"] if found else None) == severity, result


def test_a_stale_prefix_cache_is_reported_even_when_the_trainer_reports_no_engine():
    trainer = model_fp(tiny_qwen2())
    del trainer["components"]["engine_config"]
    result = diff_fingerprints(trainer, _with_engine(tiny_qwen2(), _engine(prefix_caching=True,
                                                                          prefix_cache_reset_after_sync=False)))
    row = next(r for r in result["components"] if r["name"] == "engine_config")
    assert row["severity"] == "warning" and "NVIDIA-NeMo/RL#4018" in row["summary"]


# --------------------------------------------------------------------------- CLI

def test_cli_diff_of_model_directories_differing_in_rope_is_an_error(tmp_path, capsys):
    a = build_tiny_qwen2_dir(tmp_path / "a")
    b = build_tiny_qwen2_dir(tmp_path / "b", rope_parameters=YARN)
    same = build_tiny_qwen2_dir(tmp_path / "same")
    capsys.readouterr()
    assert main(["diff", str(a), str(b), "--json"]) == 2
    result = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in result["components"] if r["severity"] == "error"] == ["model_config"]
    assert main(["diff", str(a), str(b)]) == 2
    assert "model_config" in capsys.readouterr().out
    assert main(["diff", str(a), str(same), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"verdict": "same", "components": []}


def test_cli_fingerprints_a_model_directory_without_a_tokenizer(tmp_path, capsys):
    tiny_qwen2().save_pretrained(tmp_path / "weights-only")
    assert main(["fingerprint", str(tmp_path / "weights-only"), "--json"]) == 0
    fp = json.loads(capsys.readouterr().out)
    assert fp["kind"] == "model" and set(fp["components"]) == {"model_config", "lora_adapter"}
    assert fp["components"]["model_config"]["value"]["rms_norm_eps"] == 1e-6


def test_a_sliding_window_on_one_side_is_an_error_and_a_null_field_is_not_a_missing_one():
    result = diff_fingerprints(model_fp(tiny_qwen2()), model_fp(tiny_qwen2(use_sliding_window=True, sliding_window=128)))
    found = rows(result, "model_config")
    assert result["verdict"] == "error" and found["use_sliding_window"]["severity"] == "error"
    assert found["sliding_window"]["severity"] == "error"  # None (no window) on a is stated, not left out
