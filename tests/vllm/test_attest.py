"""Weight-sync attestation through a real engine's workers (``LLM.collective_rpc``): the digests
each worker computes of the weights its model loaded match the trainer's for the same tiny random
Qwen2, and an alert names the one tensor that was changed on the way."""
from __future__ import annotations

import httpx
import torch

from paritywatch.backend import migrate
from paritywatch.backend.settings import Settings
from tests.support.live import ThreadServer
from trainer_hooks.integrations.vllm import (close_weight_attestation, commit_weight_attestation,
                                             install_weight_attestation)
from trainer_hooks.monitor import ParityMonitor

PERTURBED = "model.layers.1.self_attn.o_proj.weight"


def load_weights_rpc(worker, weights):
    """vLLM's in-place reload (it calls the model's load_weights between its layerwise set-up and
    the kernel repacking; a bare load_weights cannot refill CPU linears already repacked)."""
    worker.model_runner.reload_weights(weights_iterator=iter(weights))


def test_workers_attest_what_they_loaded_and_a_changed_tensor_is_named(llm, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    url = f"sqlite:///{tmp_path / 'paritywatch.db'}"
    migrate.upgrade(url)
    state = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    with ThreadServer(Settings(database_url=url)) as srv, httpx.Client(base_url=f"{srv.url}/api/v1") as api, \
            ParityMonitor("vllm-sync", project="vllm", side="trainer", url=srv.url, spool_dir=tmp_path / "t") as trainer:
        [worker_id] = llm.collective_rpc(install_weight_attestation, kwargs=dict(
            run="vllm-sync", project="vllm", url=srv.url, spool_dir=str(tmp_path / "w"), worker_id="engine0"))
        assert worker_id == "engine0-rank0"

        trainer.attest_weights(state, version=1)
        llm.collective_rpc(load_weights_rpc, args=(list(state.items()),))
        [summary] = llm.collective_rpc(commit_weight_attestation, args=(1,))
        assert summary["tensor_count"] == len(state) and summary["version"] == 1

        changed = dict(state)
        changed[PERTURBED] = state[PERTURBED].clone()
        changed[PERTURBED][0, 0] += 1e-3
        trainer.attest_weights(state, version=2)
        llm.collective_rpc(load_weights_rpc, args=(list(changed.items()),))
        llm.collective_rpc(commit_weight_attestation, args=(2,))
        assert trainer.flush(30) and all(llm.collective_rpc(close_weight_attestation))

        run_id = api.get("/runs", params={"project": "vllm"}).json()["runs"][0]["id"]
        versions = {v["version"]: v for v in api.get(f"/runs/{run_id}/attestations/versions").json()["versions"]}
        [same] = versions[1]["workers"]
        assert same["worker_id"] == "engine0-rank0" and same["verdict"] == "same"
        assert same["digest"] == versions[1]["trainer"]["digest"]
        [differs] = versions[2]["workers"]
        assert differs["verdict"] == "differs" and differs["tensors"]["differing"] == [PERTURBED]
        [alert] = api.get(f"/runs/{run_id}/alerts", params={"status": "open"}).json()["alerts"]
        assert alert["kind"] == "weights_mismatch" and PERTURBED in alert["title"]
        # the engine still serves with what it loaded
        assert llm.generate(["Hello"], use_tqdm=False)[0].outputs[0].token_ids is not None
