"""Model parity end to end over real HTTP: tiny random Qwen2 models on CPU, a real peft adapter.

The trainer side is TRL's ParityCallback (it registers the model it trains: a PeftModel); the
rollout registers its processor and model with ``monitor.register_model``.

- the trainer trains a LoRA adapter and the rollout runs the base model (verl#7495's shape) ->
  a lora_adapter error alert and a paused run;
- both sides run the same adapter on the same base -> no alert, the run keeps running.
"""
from __future__ import annotations

import contextlib

import httpx
import pytest
from transformers import AutoTokenizer

from paritywatch.backend.settings import Settings
from tests.fixtures.models import tiny_qwen2
from tests.fixtures.tokenizers import build_chatml_tokenizer
from tests.support.live import ThreadServer, wait_for
from trainer_hooks.integrations.trl import ParityCallback
from trainer_hooks.monitor import ParityMonitor

peft = pytest.importorskip("peft")
ROLLOUTS: list = []  # the live run's rollout monitor, for tests that post again


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return AutoTokenizer.from_pretrained(build_chatml_tokenizer(tmp_path_factory.mktemp("tok")))


def with_lora(model):  # noqa: ANN001
    return peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))


def monitor(srv, side, tmp_path):  # noqa: ANN001
    return ParityMonitor(run="model", project="e2e", side=side, url=srv.url, worker_id=side,
                         spool_dir=tmp_path / f"spool-{side}", flush_interval_s=0.05, poll_timeout_s=5)


@contextlib.contextmanager
def live_run(db_url, tmp_path, tok, trainer_model, rollout_model):  # noqa: ANN001
    from transformers import TrainerControl, TrainerState
    from trl import GRPOConfig

    with ThreadServer(Settings(database_url=db_url)) as srv, httpx.Client(base_url=srv.url, timeout=30) as api:
        trainer, rollout = monitor(srv, "trainer", tmp_path), monitor(srv, "rollout", tmp_path)
        try:
            args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none")
            ParityCallback(monitor=trainer).on_train_begin(args, TrainerState(is_world_process_zero=True),
                                                           TrainerControl(), model=trainer_model, processing_class=tok)
            registered = rollout.register_processor(tok)  # first: the model waits for it, one post holds both
            assert rollout.register_model(rollout_model)
            registered.result(timeout=60)
            for m in (trainer, rollout):
                assert m.flush(timeout=60)
            ROLLOUTS[:] = [rollout]
            yield api, wait_for(lambda: next((r["id"] for r in api.get("/api/v1/runs").json()["runs"]
                                              if r["name"] == "model"), None), timeout_s=30)
        finally:
            trainer.close()
            rollout.close()


def trainer_posted_model(api, run_id):  # noqa: ANN001
    def complete():
        trainer = api.get(f"/api/v1/runs/{run_id}/parity").json()["trainer"]
        body = api.get(f"/api/v1/fingerprints/{trainer['digest']}").json() if trainer and trainer["digest"] else {}
        return {"vocab", "model_config", "lora_adapter"} <= set(body.get("components", {}))
    wait_for(complete, timeout_s=60)


def open_alerts(api, run_id):  # noqa: ANN001
    return [a for a in api.get(f"/api/v1/runs/{run_id}/alerts").json()["alerts"] if a["status"] != "resolved"]


def test_an_adapter_the_rollout_never_applies_pauses_the_run(db_url, tok, tmp_path):
    with live_run(db_url, tmp_path, tok, with_lora(tiny_qwen2(len(tok))), tiny_qwen2(len(tok))) as (api, run_id):
        trainer_posted_model(api, run_id)
        alert = wait_for(lambda: open_alerts(api, run_id), timeout_s=30)[0]
        assert (alert["kind"], alert["severity"]) == ("processor_mismatch", "error")
        assert alert["detail"]["components"] == ["lora_adapter"]
        row = next(c for c in alert["detail"]["diff"]["components"] if c["name"] == "lora_adapter")
        assert "verl#7495" in row["summary"] and row["detail"]["rows"][0]["b"] == "none"
        assert api.get(f"/api/v1/runs/{run_id}/control").json()["state"] == "paused"


def test_the_same_adapter_on_both_sides_raises_nothing(db_url, tok, tmp_path):
    trainer_model, rollout_model = with_lora(tiny_qwen2(len(tok), seed=0)), with_lora(tiny_qwen2(len(tok), seed=1))
    with live_run(db_url, tmp_path, tok, trainer_model, rollout_model) as (api, run_id):
        trainer_posted_model(api, run_id)
        group, = api.get(f"/api/v1/runs/{run_id}/parity").json()["groups"]
        assert group["verdict"] in ("same", "info"), group["diff"]
        assert open_alerts(api, run_id) == []
        assert api.get(f"/api/v1/runs/{run_id}/control").json()["state"] == "running"


def test_an_engine_state_learned_later_refreshes_the_open_alert(db_url, tok, tmp_path):
    """A rollout learns its prefix-cache state at its first weight sync and re-posts: the open
    alert about the adapter is refreshed in place, never resolved and fired again."""
    with live_run(db_url, tmp_path, tok, with_lora(tiny_qwen2(len(tok))), tiny_qwen2(len(tok))) as (api, run_id):
        trainer_posted_model(api, run_id)
        first = wait_for(lambda: open_alerts(api, run_id), timeout_s=30)[0]
        rollout = next(c for g in api.get(f"/api/v1/runs/{run_id}/parity").json()["groups"] for c in g["components"])
        before = rollout["digest"]
        engine = {"engine": "vllm", "max_model_len": 512, "enforce_eager": True, "prefix_caching": True,
                  "prefix_cache_reset_after_sync": True}
        assert ROLLOUTS[0].report_model_components({"engine_config": engine})
        assert ROLLOUTS[0].flush(timeout=60)
        wait_for(lambda: next(c for g in api.get(f"/api/v1/runs/{run_id}/parity").json()["groups"]
                              for c in g["components"])["digest"] != before, timeout_s=30, what="the re-post")
        everything = api.get(f"/api/v1/runs/{run_id}/alerts").json()["alerts"]
        assert [(a["id"], a["status"]) for a in everything] == [(first["id"], "firing")]
