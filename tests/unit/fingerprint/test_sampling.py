"""The sampling_params component: normalisation of equivalent settings, severities, causes."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from paritywatch.backend.store.fingerprints import validate_fingerprint
from trainer_hooks.fingerprint import diff_fingerprints
from trainer_hooks.fingerprint.core import assemble, with_component
from trainer_hooks.fingerprint.sampling import sampling_value

OFF = {"top_p": None, "top_k": None, "min_p": None, "repetition_penalty": None, "presence_penalty": None,
       "frequency_penalty": None}


@pytest.mark.parametrize("spelling", [
    {},
    {"temperature": None, "top_k": -1, "top_p": 1.0},            # vLLM before 0.11 / OpenAI request with nulls
    {"temperature": 1, "top_k": 0, "top_p": None, "min_p": 0.0},  # vLLM 0.32 and transformers' "off"
    {"repetition_penalty": 1.0, "presence_penalty": 0, "frequency_penalty": 0.0, "max_tokens": 16},
    SimpleNamespace(temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0, repetition_penalty=1.0),  # SamplingParams-like
])
def test_disabled_encodings_normalise_to_one_value(spelling):
    assert sampling_value(spelling) == {"temperature": 1.0, **OFF, "logprobs_mode": None}


def test_values_that_change_the_distribution_are_kept():
    value = sampling_value({"temperature": 0.6000000238418579, "top_p": 0.95, "top_k": 20, "min_p": 0.05,
                            "repetition_penalty": 1.05}, logprobs_mode="processed_logprobs")
    assert value == {**OFF, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05,
                     "repetition_penalty": 1.05, "logprobs_mode": "processed"}


def test_greedy_is_temperature_zero_whatever_the_masks():
    from transformers import GenerationConfig

    greedy = {"temperature": 0.0, **OFF, "logprobs_mode": None}
    assert sampling_value(GenerationConfig(do_sample=False, temperature=0.7, top_k=20)) == greedy
    assert sampling_value({"temperature": 0, "top_p": 0.9}) == greedy


def test_overrides_go_on_top_and_bad_values_raise():
    assert sampling_value({"temperature": 0.7}, temperature=0.6)["temperature"] == 0.6
    for mode in ("raw_logits", "RAW", "raw_logprobs"):
        assert sampling_value(logprobs_mode=mode)["logprobs_mode"] == "raw"
    with pytest.raises(ValueError):
        sampling_value(logprobs_mode="logits")
    with pytest.raises(TypeError):
        sampling_value({"temperature": "0.6"})


def fp(value, env=None, kind="tokenizer"):
    processor = assemble(kind, {"vocab": [[0, "a"]]}, {})
    return processor if value is None else with_component(processor, "sampling_params", value, env)


def row(result):
    return next(c for c in result["components"] if c["name"] == "sampling_params")


@pytest.mark.parametrize("a, b, severity, keys", [
    ({"temperature": 1.0}, {"temperature": 0.6}, "error", ["temperature"]),
    # vLLM v1 default (raw) against a trainer scoring at its sampling temperature (prime-rl#679)
    ({"temperature": 0.6}, {"temperature": 0.6}, "error", ["logprobs_mode"]),
    ({"temperature": 1.0, "top_p": 0.9}, {"temperature": 1.0, "top_p": 0.9}, "error", ["logprobs_mode"]),
    ({"temperature": 1.0}, {"temperature": 1.0, "top_p": 0.9}, "warning", ["top_p"]),
    ({"top_k": 20}, {"top_k": 50}, "warning", ["top_k"]),
    ({}, {"repetition_penalty": 1.05}, "warning", ["repetition_penalty"]),
])
def test_severity_rules(a, b, severity, keys):
    mode_a, mode_b = ("processed", "raw") if keys == ["logprobs_mode"] else ("processed", "processed")
    result = diff_fingerprints(fp(sampling_value(a, logprobs_mode=mode_a)), fp(sampling_value(b, logprobs_mode=mode_b)))
    assert result["verdict"] == severity
    assert [r["key"] for r in row(result)["detail"]["rows"]] == keys
    assert row(result)["summary"].startswith(f"{keys[0]} differs")


def test_the_temperature_error_says_why_it_matters():
    summary = row(diff_fingerprints(fp(sampling_value(temperature=1.0)), fp(sampling_value(temperature=0.6))))["summary"]
    assert "temperature differs (1.0 vs 0.6)" in summary and "importance ratio" in summary and "trl#4159" in summary


def test_log_prob_modes_that_coincide_are_info():
    """At temperature 1 with nothing masked or penalised, raw and processed are the same numbers."""
    result = diff_fingerprints(fp(sampling_value(logprobs_mode="processed")), fp(sampling_value(logprobs_mode="raw")))
    assert result["verdict"] == "info"


def test_an_unknown_log_prob_mode_is_not_compared():
    same = diff_fingerprints(fp(sampling_value(temperature=0.6, logprobs_mode="processed")),
                             fp(sampling_value(temperature=0.6)))
    assert same["verdict"] == "info" and row(same)["detail"]["rows"] == []
    assert row(same)["summary"].startswith("logprobs_mode is known on one side only (processed vs not known)")


def test_a_side_that_has_not_reported_yet_is_not_comparable():
    result = diff_fingerprints(fp(sampling_value(temperature=1.0)), fp(None))
    assert result["verdict"] == "info"
    assert row(result)["summary"].startswith("only a reports sampling_params yet")


def test_the_merged_fingerprint_is_one_the_server_accepts_and_other_digests_stay():
    base = assemble("tokenizer", {"vocab": [[0, "a"]], "chat_template": "x"}, {"class": "T"})
    merged = with_component(base, "sampling_params", sampling_value(temperature=0.6), {"sampling": {"source": "vllm"}})
    assert validate_fingerprint(merged) == (merged["digest"], 1)
    assert merged["components"]["vocab"] == base["components"]["vocab"]
    assert merged["env"] == {"class": "T", "sampling": {"source": "vllm"}}
    assert "sampling_params" not in base["components"]  # not mutated


def test_generation_config_defaults_are_named_as_the_likely_cause():
    filled = {"sampling": {"filled_from_generation_config": ["temperature", "top_k"]}}
    result = diff_fingerprints(fp(sampling_value(temperature=1.0, top_k=20)),
                               fp(sampling_value(temperature=0.7, top_k=20), filled, kind="sampling"))
    causes = {c["cause"]: c for c in result["causes"]}
    assert set(causes) == {"generation_config_defaults"}  # not "kind": only sampling differs
    assert causes["generation_config_defaults"]["b"] == ["temperature"]  # top_k is the same on both sides
    assert "temperature=0.7" in causes["generation_config_defaults"]["summary"]


def test_an_openai_request_is_served_with_the_servers_defaults_where_it_sets_nothing(tmp_path):
    import json

    from trainer_hooks.integrations.openai_server import request_sampling_params

    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.7, "top_k": 20, "eos_token_id": 2}))
    request = {"messages": [], "temperature": None, "top_p": 0.9}
    served = request_sampling_params(request, model_dir=tmp_path)
    assert served["filled_from_generation_config"] == ["temperature", "top_k"]
    assert sampling_value(served["params"]) == {**OFF, "temperature": 0.7, "top_k": 20, "top_p": 0.9,
                                                "logprobs_mode": None}
    neutral = request_sampling_params(request, generation_config="vllm")  # --generation-config vllm
    assert neutral["filled_from_generation_config"] == [] and sampling_value(neutral["params"])["temperature"] == 1.0
