"""An in-process ``vllm.LLM``: registration and RequestOutput conversion with real log-probs."""
from __future__ import annotations

import math

import pytest

from tests.vllm.conftest import GENERATION_CONFIG, dump
from trainer_hooks import contract
from trainer_hooks.alignment import compute_alignment_metrics
from trainer_hooks.fingerprint import diff_fingerprints, fingerprint_processor
from trainer_hooks.integrations.vllm import llm_generation_config, records_from_request_outputs, register_llm

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello world!"}],
    [{"role": "user", "content": "Café naïve — 中文 👋"}],
]


class CapturingMonitor:
    def __init__(self):
        self.registered = []

    def register_processor(self, processor, generation_config=None):
        self.registered.append((processor, generation_config))
        return fingerprint_processor(processor, generation_config)


def test_generation_config_is_what_the_engine_applies(llm, hf_tokenizer):
    gen = llm_generation_config(llm)
    eos = hf_tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = hf_tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert sorted(gen["eos_token_id"]) == sorted([eos, pad])
    assert {k: gen[k] for k in GENERATION_CONFIG} == GENERATION_CONFIG
    # the same defaults vLLM itself applies to a request without sampling params
    defaults = llm.get_default_sampling_params()
    assert defaults.temperature == GENERATION_CONFIG["temperature"] and defaults.top_k == GENERATION_CONFIG["top_k"]


def test_register_llm_matches_the_transformers_fingerprint(llm, hf_tokenizer, hf_generation_config):
    monitor = CapturingMonitor()
    fp_vllm = register_llm(monitor, llm)
    processor, _ = monitor.registered[0]
    assert processor is llm.get_tokenizer()  # vLLM's own (cached, pooled) tokenizer wrapper
    fp_hf = fingerprint_processor(hf_tokenizer, hf_generation_config)
    diff = diff_fingerprints(fp_hf, fp_vllm)
    assert diff["verdict"] in ("same", "info"), dump(diff)
    for name in ("vocab", "chat_template", "behavior", "generation_eos", "sampling_defaults", "special_tokens"):
        assert fp_vllm["components"][name]["digest"] == fp_hf["components"][name]["digest"], name
    assert fp_vllm["components"]["sampling_defaults"]["value"]["temperature"] == 0.7


def test_register_llm_sees_another_template_as_an_error(llm, hf_tokenizer, hf_generation_config):
    import copy

    from tests.fixtures.tokenizers import CUSTOM_TEMPLATE

    trainer = copy.copy(hf_tokenizer)
    trainer.chat_template = CUSTOM_TEMPLATE  # the user's processing_class (the TRL bug's shape)
    diff = diff_fingerprints(fingerprint_processor(trainer, hf_generation_config), register_llm(CapturingMonitor(), llm))
    assert diff["verdict"] == "error"
    assert {"chat_template", "behavior"} <= {c["name"] for c in diff["components"]}


@pytest.fixture(scope="module")
def chat_outputs(llm):
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=12, logprobs=0, n=2, seed=1234, temperature=1.0)
    return llm.chat(CONVERSATIONS, params, use_tqdm=False)


def test_records_from_request_outputs(chat_outputs, hf_tokenizer):
    records = records_from_request_outputs(chat_outputs, messages=CONVERSATIONS, policy_version=7)
    assert len(records) == 2 * len(CONVERSATIONS)  # n=2 completions per request
    for i, record in enumerate(records):
        conversation = CONVERSATIONS[i // 2]
        assert record.messages == conversation
        rendered = hf_tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        assert record.prompt_ids == hf_tokenizer.encode(rendered, add_special_tokens=False)
        assert 1 <= len(record.completion_ids) <= 12
        assert len(record.rollout_logprobs) == len(record.completion_ids)
        assert all(math.isfinite(v) and v <= 0 for v in record.rollout_logprobs)
        assert record.finish_reason in ("stop", "length")
        assert record.policy_version == 7
        assert record.completion_text == chat_outputs[i // 2].outputs[i % 2].text
    # the trainer's view of the same batch: nothing misaligned
    metrics = compute_alignment_metrics(records, hf_tokenizer, trainer_policy_version=9)
    assert metrics["align/prompt_rerender_mismatch_frac"] == 0.0
    assert metrics["align/decode_mismatch_frac"] == 0.0
    assert metrics["align/out_of_vocab_frac"] == 0.0
    assert metrics["rollout/staleness_mean"] == 2.0


def test_records_carry_the_sampled_ids_digest_and_the_engines_full_eos_set_audits_clean(chat_outputs, hf_tokenizer, llm):
    """The digest taken where vLLM sampled: the batch as sampled audits clean against the engine's
    own eos list (its generation config lists two), and a copy whose trailing eos a post-processor
    stripped is a token-identity finding (huggingface/trl#7039)."""
    from trainer_hooks.audit import audit_batch

    records = records_from_request_outputs(chat_outputs, messages=CONVERSATIONS)
    assert all(r.completion_ids_digest == contract.token_ids_digest(r.completion_ids) for r in records)
    clean = audit_batch(records, hf_tokenizer, generation_config=llm_generation_config(llm))
    counts = clean["counts"]
    assert (counts["ids_checked"], counts["ids_mismatch"], counts["eos_ignored"], counts["finish_lost"]) == (
        len(records), 0, 0, 0)
    stopped = [r for r in records if r.finish_reason == "stop"]
    for record in stopped:
        record.completion_ids = record.completion_ids[:-1]
    if stopped:
        assert audit_batch(records, hf_tokenizer)["counts"]["ids_mismatch"] == len(stopped)


def test_rollout_logprobs_are_the_models(chat_outputs, tiny_model_dir):
    """The sampled token's log-prob from vLLM equals a transformers forward pass of the same ids
    (temperature 1.0: vLLM returns log-probs of the raw model distribution)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    record = records_from_request_outputs(chat_outputs[:1])[0]
    ids = torch.tensor([record.prompt_ids + record.completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(record.prompt_ids) - 1:-1]
    ref = torch.log_softmax(logits.float(), dim=-1).gather(1, torch.tensor(record.completion_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(record.rollout_logprobs), ref, atol=2e-3), (record.rollout_logprobs, ref.tolist())
    metrics = compute_alignment_metrics([record], None, trainer_logprobs=[ref.tolist()])
    assert metrics["align/logprob_abs_diff_max"] < 2e-3


def test_records_without_logprobs_and_misaligned_messages(llm):
    from vllm import SamplingParams

    outputs = llm.generate(["Hello world"], SamplingParams(max_tokens=4, seed=0), use_tqdm=False)
    (record,) = records_from_request_outputs(outputs)
    assert record.rollout_logprobs is None and record.messages is None and record.policy_version is None
    with pytest.raises(ValueError, match="conversations"):
        records_from_request_outputs(outputs, messages=CONVERSATIONS)


def test_stop_string_is_not_reported_as_an_eos_stop(llm, hf_tokenizer):
    from vllm import SamplingParams

    outputs = llm.generate(["Hello world"], SamplingParams(max_tokens=30, seed=3, temperature=1.0), use_tqdm=False)
    text = outputs[0].outputs[0].text
    stop = next((ch for ch in text[1:] if ch.strip()), None)
    if stop is None:
        pytest.skip("the random model produced no usable stop string")
    outputs = llm.generate(["Hello world"], SamplingParams(max_tokens=30, seed=3, temperature=1.0, stop=[stop]),
                           use_tqdm=False)
    (record,) = records_from_request_outputs(outputs)
    assert outputs[0].outputs[0].finish_reason == "stop" and outputs[0].outputs[0].stop_reason == stop
    assert record.finish_reason == "stop_string"
    assert "align/eos_disagreement_frac" not in compute_alignment_metrics([record], hf_tokenizer)


def test_served_sampling_includes_the_generation_config_defaults_vllm_filled_in(llm, hf_tokenizer, sqlite_url,
                                                                                 tmp_path):
    """A request without SamplingParams is served with the model's generation_config.json values
    (NVIDIA-NeMo/RL#3497); the watched engine reports exactly those, with vLLM's raw log-prob mode,
    and against a trainer scoring at temperature 1.0 the backend raises a sampling_params error."""
    import httpx
    from vllm import SamplingParams

    from paritywatch.backend.settings import Settings
    from tests.support.live import ThreadServer, wait_for
    from trainer_hooks.integrations.vllm import watch_llm_sampling
    from trainer_hooks.monitor import ParityMonitor

    with ThreadServer(Settings(database_url=sqlite_url)) as srv, httpx.Client(base_url=srv.url, timeout=30) as api:
        monitors = {side: ParityMonitor(run="vllm-sampling", project="vllm", side=side, url=srv.url, worker_id=side,
                                        spool_dir=tmp_path / side, flush_interval_s=0.05) for side in ("trainer", "rollout")}
        unwatch = watch_llm_sampling(monitors["rollout"], llm)
        try:
            monitors["trainer"].report_sampling_params(temperature=1.0, logprobs_mode="processed")
            register_llm(monitors["rollout"], llm).result(timeout=60)
            outputs = llm.generate(["Hello world"], use_tqdm=False)  # no SamplingParams: the engine's defaults
            assert outputs[0].outputs[0].token_ids
            for monitor in monitors.values():
                assert monitor.flush(timeout=60)

            run = api.get("/api/v1/runs", params={"project": "vllm"}).json()["runs"][0]
            components = api.get(f"/api/v1/runs/{run['id']}").json()["components"]
            digest = next(c["fingerprint_digest"] for c in components if c["side"] == "rollout")
            posted = api.get(f"/api/v1/fingerprints/{digest}").json()
            value = posted["components"]["sampling_params"]["value"]
            assert value == {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": None, "repetition_penalty": 1.05,
                             "presence_penalty": None, "frequency_penalty": None, "logprobs_mode": "raw"}, dump(value)
            assert {k: value[k] for k in GENERATION_CONFIG} == GENERATION_CONFIG
            assert posted["env"]["sampling"]["filled_from_generation_config"] == sorted(GENERATION_CONFIG)
            assert "vocab" in posted["components"]  # merged into the processor fingerprint, not a separate one

            alert = wait_for(lambda: api.get(f"/api/v1/runs/{run['id']}/alerts").json()["alerts"], timeout_s=60)[0]
            assert alert["severity"] == "error" and alert["detail"]["components"] == ["sampling_params"], dump(alert)
            assert "temperature differs (1.0 vs 0.7)" in alert["title"]
            assert "generation_config_defaults" in {c["cause"] for c in alert["detail"]["diff"]["causes"]}

            # the request sets its own values: those are reported instead, and nothing was filled in
            llm.generate(["Hello world"], SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, repetition_penalty=1.0,
                                                         max_tokens=4), use_tqdm=False)
            assert monitors["rollout"].flush(timeout=60)
            components = api.get(f"/api/v1/runs/{run['id']}").json()["components"]
            digest = next(c["fingerprint_digest"] for c in components if c["side"] == "rollout")
            posted = api.get(f"/api/v1/fingerprints/{digest}").json()
            assert posted["components"]["sampling_params"]["value"]["temperature"] == 1.0
            assert posted["env"]["sampling"]["filled_from_generation_config"] == []
        finally:
            unwatch()
            for monitor in monitors.values():
                monitor.close()


# --------------------------------------------------------------------------- model and engine components

def _trainer_model_fp(model_dir, **config_overrides):
    """The trainer side as register_model posts it: the model loaded with transformers."""
    import json

    import torch
    from transformers import AutoModelForCausalLM

    from trainer_hooks.fingerprint.core import with_components
    from trainer_hooks.fingerprint.model_config import model_components

    dtype = config_overrides.pop("dtype", torch.float32)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, **config_overrides)
    return json.loads(json.dumps(with_components(None, *model_components(model))))


def _engine_fp(llm):
    import json

    from trainer_hooks.fingerprint.core import with_components
    from trainer_hooks.fingerprint.model_config import model_components

    return json.loads(json.dumps(with_components(None, *model_components(llm))))


def test_model_engine_settings_read_from_the_llm(llm):
    from tests.vllm.conftest import MAX_MODEL_LEN

    comps = _engine_fp(llm)["components"]
    engine = comps["engine_config"]["value"]
    cache = llm.llm_engine.vllm_config.cache_config
    assert (engine["engine"], engine["max_model_len"], engine["enforce_eager"]) == ("vllm", MAX_MODEL_LEN, True)
    assert engine["prefix_caching"] is cache.enable_prefix_caching and engine["kv_cache_dtype"] == "auto"
    assert comps["model_config"]["value"]["dtype"] == "float32"
    assert comps["model_config"]["value"]["rms_norm_eps"] == llm.llm_engine.model_config.hf_config.rms_norm_eps
    assert comps["lora_adapter"]["value"] is None  # the engine runs without LoRA support


def test_model_engine_against_the_trainer_model(llm, tiny_model_dir):
    """The healthy twin (the trainer loads the same directory in float32) stays below warning; a
    bf16 trainer is a precision warning; a trainer configured for shorter sequences than the engine
    serves is a warning on both the config and the engine's max_model_len."""
    rollout = _engine_fp(llm)
    healthy = diff_fingerprints(_trainer_model_fp(tiny_model_dir), rollout)
    assert healthy["verdict"] in ("same", "info"), dump(healthy)
    assert "model_config" not in [r["name"] for r in healthy["components"]], dump(healthy)

    import torch

    bf16 = diff_fingerprints(_trainer_model_fp(tiny_model_dir, dtype=torch.bfloat16), rollout)
    assert bf16["verdict"] == "warning", dump(bf16)
    row = next(r for r in bf16["components"] if r["name"] == "model_config")
    assert {r["key"] for r in row["detail"]["rows"]} == {"dtype", "lm_head_dtype"}

    shorter = diff_fingerprints(_trainer_model_fp(tiny_model_dir, max_position_embeddings=256), rollout)
    by_name = {r["name"]: r for r in shorter["components"]}
    assert by_name["engine_config"]["severity"] == "warning", dump(shorter)
    assert by_name["engine_config"]["detail"]["rows"][0]["key"] == "max_model_len"
    assert by_name["model_config"]["severity"] == "warning"

    eps = diff_fingerprints(_trainer_model_fp(tiny_model_dir, rms_norm_eps=1e-5), rollout)
    assert eps["verdict"] == "error" and eps["components"][0]["name"] == "model_config", dump(eps)


class EngineMonitor:
    """What watch_llm_engine needs of a ParityMonitor: the policy version and component reports."""

    def __init__(self):
        self.policy_version = 0
        self.reports = []

    def report_model_components(self, values, env=None):
        self.reports.append(values)
        return True


def test_model_engine_prefix_cache_reset_after_sync(llm):
    from vllm import SamplingParams

    from trainer_hooks.integrations.vllm import watch_llm_engine

    if not llm.llm_engine.vllm_config.cache_config.enable_prefix_caching:
        pytest.skip("the fixture engine runs without prefix caching")
    params = SamplingParams(max_tokens=2, temperature=0.0)
    prompt = [{"role": "user", "content": "Hello world!"}]
    for reset in (True, False):
        monitor = EngineMonitor()
        unwatch = watch_llm_engine(monitor, llm)
        try:
            llm.chat(prompt, params)
            monitor.policy_version = 1  # a weight sync: the worker now serves version 1
            if reset:
                llm.reset_prefix_cache()
            llm.chat(prompt, params)
        finally:
            unwatch()
        engines = [r["engine_config"] for r in monitor.reports if "engine_config" in r]
        assert engines and engines[-1]["prefix_cache_reset_after_sync"] is reset
        assert [r["lora_adapter"] for r in monitor.reports if "lora_adapter" in r] == [None]
        if not reset:
            trainer = {"fingerprint_version": 1, "digest": "t", "kind": "model", "components": {}}
            from trainer_hooks.fingerprint.core import with_components

            stale = diff_fingerprints(trainer, with_components(None, {"engine_config": engines[-1]}))
            assert stale["verdict"] == "warning" and "NVIDIA-NeMo/RL#4018" in stale["components"][0]["summary"]


def test_model_engine_lora_request_reads_as_the_trainers_adapter(tmp_path):
    """The adapter a vLLM request carries (a real LoRARequest over a saved peft adapter) against the
    trainer's PeftModel: the same adapter (only names and the version differ: info); none -> error."""
    import peft
    from vllm.lora.request import LoRARequest

    from tests.fixtures.models import tiny_qwen2
    from trainer_hooks.fingerprint.core import with_components
    from trainer_hooks.fingerprint.model_config import model_components, vllm_lora_value

    trainer = peft.get_peft_model(tiny_qwen2(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    trainer.save_pretrained(tmp_path / "adapter")
    trainer_fp = with_components(None, *model_components(trainer))
    served = vllm_lora_value(LoRARequest("policy", 3, str(tmp_path / "adapter")))
    assert (served["r"], served["lora_alpha"], served["name"], served["version"]) == (4, 8, "policy", 3)
    same = diff_fingerprints(trainer_fp, with_components(trainer_fp, {"lora_adapter": served}))
    assert same["verdict"] == "info" and {r["key"] for r in same["components"][0]["detail"]["rows"]} == {"name", "version"}
    missing = diff_fingerprints(trainer_fp, with_components(trainer_fp, {"lora_adapter": vllm_lora_value(None)}))
    assert missing["verdict"] == "error" and missing["components"][0]["name"] == "lora_adapter"
