"""Sampling parity end to end over real HTTP, with a real tokenizer and a tiny random Qwen2 on CPU.

The trainer is TRL's side (ParityCallback reading a real GRPOConfig: the recompute assumes its
temperature); rollouts sample with transformers ``generate`` on the tiny model (the hook asks the
model for the config generate really resolves) or report an OpenAI-server request.

- the rollout samples at 0.6 (filled in from the model's generation_config.json) while the
  trainer assumes 1.0 -> a sampling_params error alert that says why, and a paused run; before
  the rollout served anything it was "not comparable", never an alert;
- identical settings, spelled differently (top_k 0 / -1 / None, top_p 1.0 / None), and a raw
  log-prob mode where raw and processed coincide -> no alert;
- generate's own default top_k=50 against a trainer that does not mask -> a warning, no pause.
"""
from __future__ import annotations

import contextlib

import httpx
import pytest
from transformers import AutoTokenizer

from paritywatch.backend.settings import Settings
from tests.fixtures.tokenizers import build_chatml_tokenizer
from tests.support.live import ThreadServer, wait_for
from trainer_hooks.integrations.openai_server import report_request_sampling
from trainer_hooks.integrations.transformers_generate import report_generate_sampling
from trainer_hooks.integrations.trl import ParityCallback
from trainer_hooks.monitor import ParityMonitor

PROMPT = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """ChatML tokenizer + random 2-layer Qwen2 whose generation_config.json samples at 0.6."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    path = build_chatml_tokenizer(tmp_path_factory.mktemp("model"), name="tiny-qwen2")
    tok = AutoTokenizer.from_pretrained(path)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config = GenerationConfig(do_sample=True, temperature=0.6, eos_token_id=tok.eos_token_id,
                                               pad_token_id=tok.pad_token_id)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def model_and_tokenizer(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)


def monitor(srv, side, worker_id, tmp_path):
    return ParityMonitor(run="sampling", project="e2e", side=side, url=srv.url, worker_id=worker_id,
                         spool_dir=tmp_path / f"spool-{side}-{worker_id}", flush_interval_s=0.05, poll_timeout_s=5)


def start_trainer(srv, tmp_path, model, tok, temperature):
    """The TRL trainer side as a GRPOTrainer starts it: the callback's on_train_begin."""
    from transformers import TrainerControl, TrainerState
    from trl import GRPOConfig

    args = GRPOConfig(output_dir=str(tmp_path / "out"), temperature=temperature, use_cpu=True, report_to="none")
    trainer = monitor(srv, "trainer", "0", tmp_path)
    ParityCallback(monitor=trainer).on_train_begin(args, TrainerState(is_world_process_zero=True), TrainerControl(),
                                                   model=model, processing_class=tok)
    return trainer


def sample(model, tok, **generate_kwargs):
    """One real sampled completion from the tiny model (the rollout's work)."""
    import torch

    ids = tok.apply_chat_template(PROMPT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=4, **generate_kwargs)
    assert out.shape[1] > ids["input_ids"].shape[1]


def delivered(*monitors, registrations=()):
    """Fingerprints computed and posted; the backend evaluates parity inside each post."""
    for future in registrations:
        future.result(timeout=60)
    for m in monitors:
        assert m.flush(timeout=60)


def trainer_reported(api, run_id):
    """The callback fingerprints on a background thread: wait until the backend holds the trainer's
    processor fingerprint with its sampling assumption merged in (the last thing it posts)."""
    def complete():
        trainer = api.get(f"/api/v1/runs/{run_id}/parity").json()["trainer"]
        body = api.get(f"/api/v1/fingerprints/{trainer['digest']}").json() if trainer and trainer["digest"] else {}
        return {"vocab", "sampling_params"} <= set(body.get("components", {}))
    wait_for(complete, timeout_s=60)


def alerts(api, run_id):
    return [a for a in api.get(f"/api/v1/runs/{run_id}/alerts").json()["alerts"] if a["status"] != "resolved"]


def run_id_of(api):
    return wait_for(lambda: next((r["id"] for r in api.get("/api/v1/runs").json()["runs"] if r["name"] == "sampling"),
                                 None), timeout_s=30)


@contextlib.contextmanager
def live_run(db_url, tmp_path, model, tok, *workers):
    """A real backend, the TRL trainer side at temperature 1.0, and one rollout monitor per worker
    id that has registered the same processor: yields (api, rollouts, registration futures)."""
    with ThreadServer(Settings(database_url=db_url)) as srv, httpx.Client(base_url=srv.url, timeout=30) as api:
        trainer = start_trainer(srv, tmp_path, model, tok, temperature=1.0)  # top_k/top_p: none (not masked)
        rollouts = [monitor(srv, "rollout", worker, tmp_path) for worker in workers]
        try:
            yield api, rollouts, [r.register_processor(tok, model.generation_config) for r in rollouts]
        finally:
            for m in (trainer, *rollouts):
                m.close()


def sampling_row(diff):
    return next((c for c in diff["components"] if c["name"] == "sampling_params"), None)


def test_rollout_at_0_6_against_a_trainer_at_1_0_pauses_the_run(db_url, model_and_tokenizer, tmp_path):
    model, tok = model_and_tokenizer
    with live_run(db_url, tmp_path, model, tok, "w0") as (api, [rollout], registered):
        delivered(rollout, registrations=registered)
        run_id = run_id_of(api)
        trainer_reported(api, run_id)
        # the rollout has served nothing yet: its sampling is unknown, which is not a mismatch
        group, = api.get(f"/api/v1/runs/{run_id}/parity").json()["groups"]
        assert group["verdict"] == "info" and sampling_row(group["diff"])["severity"] == "info", group["diff"]
        assert alerts(api, run_id) == []

        # the rollout samples leaving temperature unset: generate fills 0.6 from generation_config.json
        sample(model, tok, do_sample=True, top_k=0)
        assert report_generate_sampling(rollout, model, do_sample=True, top_k=0, logprobs_mode="processed")
        delivered(rollout)

        alert = wait_for(lambda: alerts(api, run_id), timeout_s=30)[0]
        assert (alert["kind"], alert["severity"]) == ("processor_mismatch", "error")
        assert alert["detail"]["components"] == ["sampling_params"]
        assert "temperature differs (1.0 vs 0.6)" in alert["title"] and "importance ratio" in alert["title"]
        diff = alert["detail"]["diff"]
        row = sampling_row(diff)
        assert {r["key"]: (r["a"], r["b"], r["severity"]) for r in row["detail"]["rows"]} == {
            "temperature": (1.0, 0.6, "error")}
        cause, = [c for c in diff["causes"] if c["cause"] == "generation_config_defaults"]
        assert cause["b"] == ["temperature"] and "temperature=0.6" in cause["summary"]
        assert api.get(f"/api/v1/runs/{run_id}/control").json()["state"] == "paused"
        wait_for(lambda: rollout.state == "paused", timeout_s=30)


def test_the_same_sampling_spelled_differently_raises_nothing(db_url, model_and_tokenizer, tmp_path):
    model, tok = model_and_tokenizer
    with live_run(db_url, tmp_path, model, tok, "generate", "openai") as (api, [local, server], futures):
        sample(model, tok, do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
        report_generate_sampling(local, model, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 logprobs_mode="processed")
        # vLLM's "-1 means no top-k", an explicit null top_p, a server with neutral defaults, and
        # raw log-probs, which at temperature 1 without masking are the processed ones
        request = {"model": "tiny", "messages": PROMPT, "temperature": 1, "top_k": -1, "top_p": None}
        report_request_sampling(server, request, generation_config="vllm", logprobs_mode="raw_logprobs")
        delivered(local, server, registrations=futures)
        run_id = run_id_of(api)
        trainer_reported(api, run_id)

        groups = api.get(f"/api/v1/runs/{run_id}/parity").json()["groups"]
        by_worker = {g["components"][0]["worker_id"]: g for g in groups}
        assert by_worker["generate"]["verdict"] == "same"  # identical once normalised: same digest
        openai_row = sampling_row(by_worker["openai"]["diff"])
        assert by_worker["openai"]["verdict"] == "info", by_worker["openai"]["diff"]
        assert [r["key"] for r in openai_row["detail"]["rows"]] == ["logprobs_mode"]
        assert alerts(api, run_id) == []
        assert api.get(f"/api/v1/runs/{run_id}/control").json()["state"] == "running"


def test_generates_default_top_k_is_a_warning_that_does_not_pause(db_url, model_and_tokenizer, tmp_path):
    model, tok = model_and_tokenizer
    with live_run(db_url, tmp_path, model, tok, "w0") as (api, [rollout], registered):
        sample(model, tok, do_sample=True, temperature=1.0)  # top_k unset: generate truncates to 50
        report_generate_sampling(rollout, model, do_sample=True, temperature=1.0)
        delivered(rollout, registrations=registered)
        run_id = run_id_of(api)
        trainer_reported(api, run_id)

        alert = wait_for(lambda: alerts(api, run_id), timeout_s=30)[0]
        assert alert["severity"] == "warning" and alert["detail"]["components"] == ["sampling_params"]
        assert "top_k differs (off vs 50)" in alert["title"]
        assert api.get(f"/api/v1/runs/{run_id}/control").json()["state"] == "running"


def test_a_later_report_refreshes_the_open_alert_and_an_escalation_pauses(db_url, model_and_tokenizer, tmp_path):
    """Each report re-posts the fingerprint under a new digest; the alert is keyed by the processor,
    so it is refreshed in place (no resolved-then-fired copy), and warning -> error pauses."""
    model, tok = model_and_tokenizer
    with live_run(db_url, tmp_path, model, tok, "w0") as (api, [rollout], registered):
        report_generate_sampling(rollout, model, do_sample=True, temperature=1.0)  # top_k 50: a warning
        delivered(rollout, registrations=registered)
        run_id = run_id_of(api)
        trainer_reported(api, run_id)
        warning = wait_for(lambda: alerts(api, run_id), timeout_s=30)[0]
        assert warning["severity"] == "warning"
        assert api.get(f"/api/v1/runs/{run_id}/control").json()["state"] == "running"

        report_generate_sampling(rollout, model, do_sample=True, top_k=0)  # now 0.6 from generation_config.json
        delivered(rollout)
        everything = api.get(f"/api/v1/runs/{run_id}/alerts").json()["alerts"]
        assert [(a["id"], a["status"], a["severity"]) for a in everything] == [(warning["id"], "firing", "error")]
        assert "temperature differs (1.0 vs 0.6)" in everything[0]["title"]
        assert api.get(f"/api/v1/runs/{run_id}/control").json()["state"] == "paused"
