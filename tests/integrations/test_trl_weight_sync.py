"""The TRL callback attests the weights of TRL's own weight sync (`VLLMGeneration.sync_weights`,
colocate mode) on the trainer side: what reached `load_weights` is what was attested, at the
trainer's step. vLLM is not installed here, so the engine is a stand-in that records what
`load_weights` received; TRL's sync code, the monitor and the backend (over HTTP) are real."""
from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest
import torch

from paritywatch.backend.settings import Settings
from tests.e2e.tiny_qwen2 import tiny_qwen2
from tests.support.live import ThreadServer
from trainer_hooks.attest import digest_weights
from trainer_hooks.integrations.trl import ParityCallback

pytest.importorskip("trl")


class RecordingEngine:
    """`llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights`, recorded."""

    def __init__(self) -> None:
        self.loaded: list[tuple[str, torch.Tensor]] = []
        model = SimpleNamespace(load_weights=lambda weights: self.loaded.extend((n, t.clone()) for n, t in weights))
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(
            driver_worker=SimpleNamespace(model_runner=SimpleNamespace(model=model))))

    def reset_prefix_cache(self) -> None:
        pass


def colocated_generation(model):
    from accelerate import Accelerator
    from trl.generation.vllm_generation import VLLMGeneration

    class WithoutEngine(VLLMGeneration):
        def _init_vllm(self) -> None:  # the engine is the stand-in below
            self.llm = RecordingEngine()

    return WithoutEngine(model, Accelerator(cpu=True), processing_class=None, mode="colocate")


def test_the_callback_attests_what_each_trl_weight_sync_sends(sqlite_url, tmp_path):
    from tests.conftest import _empty_all_tables

    _empty_all_tables(sqlite_url)
    model = tiny_qwen2(seed=0)
    generation = colocated_generation(model)
    trainer = SimpleNamespace(vllm_generation=generation, state=SimpleNamespace(global_step=0))
    with ThreadServer(Settings(database_url=sqlite_url)) as srv, httpx.Client(base_url=f"{srv.url}/api/v1") as api:
        callback = ParityCallback(run="trl-sync", project="trl", url=srv.url, spool_dir=tmp_path)
        callback.attest_weight_syncs(trainer)
        callback.on_train_begin(SimpleNamespace(), SimpleNamespace(is_world_process_zero=True), SimpleNamespace())
        sent = {}
        for step in (1, 2):
            trainer.state.global_step = step
            with torch.no_grad():
                next(model.parameters()).add_(1.0)  # a training step
            generation.sync_weights()
            sent[step] = digest_weights(generation.llm.loaded, step)
            generation.llm.loaded.clear()
        assert callback.monitor.flush(30)
        run_id = api.get("/runs", params={"project": "trl"}).json()["runs"][0]["id"]
        got = {a["version"]: a for a in api.get(f"/runs/{run_id}/attestations").json()["attestations"]}
        assert set(got) == {1, 2} and {a["side"] for a in got.values()} == {"trainer"}
        assert all(got[v]["digest"] == sent[v]["digest"] for v in (1, 2))
        assert got[1]["digest"] != got[2]["digest"] and got[1]["tensor_count"] == len(list(model.parameters()))
        callback.on_train_end(SimpleNamespace(), SimpleNamespace(is_world_process_zero=True), SimpleNamespace())


def test_a_trainer_that_syncs_nothing_is_refused_at_once():
    with pytest.raises(ValueError, match="no vllm_generation"):
        ParityCallback(run="x").attest_weight_syncs(SimpleNamespace(state=SimpleNamespace(global_step=0)))
