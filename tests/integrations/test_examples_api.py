"""examples/async_grpo.py, run for real up to `trainer.train()` on CPU.

The example needs GPUs and a vLLM server to train, so four things are shimmed, each at the point
where TRL would need hardware or vLLM: the config's default bf16/GPU check (`use_cpu=True`), the
CUDA peak-FLOPs probe, the "is vLLM installed" checks (the weight-transfer client and the rollout
worker are only constructed, never connected) and `train()` itself, which records the trainer
instead of training (it fires our callback's train-begin and train-end events, as `train()` does
first and last). Everything else is the example's own code against the installed TRL and our
hooks: its imports, every keyword argument and config field, the trainer it builds from a local
tiny Qwen2 and tokenizer, the instrumentation of the trainer's real rollout worker, and the
trainer-side hook registering the user's processor with a real backend over HTTP.
"""
from __future__ import annotations

import runpy
import sys
from pathlib import Path

import httpx
import pytest

from paritywatch.backend.settings import Settings
from tests.support.live import ThreadServer, wait_for

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "async_grpo.py"


@pytest.fixture
def tiny_model_dir(tmp_path, qwen_tokenizer) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(qwen_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
        tie_word_embeddings=True, eos_token_id=qwen_tokenizer.eos_token_id, pad_token_id=qwen_tokenizer.pad_token_id,
    )
    path = tmp_path / "tiny-qwen2"
    Qwen2ForCausalLM(config).save_pretrained(path)
    qwen_tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def cpu_only_trl(monkeypatch):
    """The hardware/vLLM shims described in the module docstring; returns what train() recorded."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer, async_grpo_trainer, async_rollout_worker
    from trl.experimental.async_grpo import weight_transfer

    from trainer_hooks.integrations.trl import ParityCallback

    real_init = AsyncGRPOConfig.__init__

    def cpu_config(self, *args, **kwargs):
        kwargs.setdefault("use_cpu", True)
        kwargs.setdefault("bf16", False)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(AsyncGRPOConfig, "__init__", cpu_config)
    monkeypatch.setattr(async_grpo_trainer, "get_peak_flops_per_device", lambda *a, **k: 1e12)
    monkeypatch.setattr(weight_transfer, "is_vllm_available", lambda: True)
    monkeypatch.setattr(async_rollout_worker, "is_vllm_available", lambda: True)
    monkeypatch.setattr(async_rollout_worker, "is_aiohttp_available", lambda: True)
    trained: list = []

    def record_train(self):
        # what the rollout worker looks like when training starts (it spawns its child then) ...
        trained.append((self, self.rollout_worker._loop_cls, dict(self.rollout_worker._loop_kwargs)))
        # ... and our callback's train-begin and train-end events, with what Trainer passes them
        # (TRL's own train-begin callback would wait for the vLLM server)
        for cb in self.callback_handler.callbacks:
            if isinstance(cb, ParityCallback):
                cb.on_train_begin(self.args, self.state, self.control, model=self.model,
                                  processing_class=self.processing_class)
                # training takes a while: by its end the fingerprint has been sent
                wait_for(lambda: cb.monitor.stats()["fingerprints_posted"] >= 1, timeout_s=30)  # noqa: B023
                cb.on_train_end(self.args, self.state, self.control)

    monkeypatch.setattr(AsyncGRPOTrainer, "train", record_train)
    return trained


def test_the_example_builds_an_instrumented_async_grpo_trainer(cpu_only_trl, tiny_model_dir, tmp_path, monkeypatch):
    from trl.experimental.async_grpo import AsyncGRPOTrainer
    from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker

    from trainer_hooks.integrations.trl import ParityCallback, ParityRolloutLoop

    monkeypatch.chdir(tmp_path)  # the example writes its output_dir relative to the working directory
    monkeypatch.setattr(sys, "argv", ["async_grpo.py", "--model", str(tiny_model_dir), "--run", "example-run",
                                      "--vllm-url", "http://127.0.0.1:9", "--max-steps", "3"])
    with ThreadServer(Settings(database_url=f"sqlite:///{tmp_path / 'paritywatch.backend.db'}")) as srv:
        monkeypatch.setenv("PARITYWATCH_URL", srv.url)  # the example configures the hooks by environment
        monkeypatch.setenv("PARITYWATCH_SPOOL_DIR", str(tmp_path / "spool"))
        namespace = runpy.run_path(str(EXAMPLE), run_name="__main__")

        def trainer_registered():
            for r in httpx.get(f"{srv.url}/api/v1/runs").json()["runs"]:
                sides = [c for c in r["components"] if c["side"] == "trainer" and c["fingerprint_digest"]]
                if r["name"] == "example-run" and sides:
                    return r, sides
            return None

        run, trainer_side = wait_for(trainer_registered, timeout_s=30)
        fingerprint = httpx.get(f"{srv.url}/api/v1/fingerprints/{trainer_side[0]['fingerprint_digest']}").json()

    assert len(cpu_only_trl) == 1, "the example did not call trainer.train()"
    trainer, loop_cls, loop_kwargs = cpu_only_trl[0]
    assert isinstance(trainer, AsyncGRPOTrainer)
    assert trainer.args.max_steps == 3 and trainer.args.vllm_server_base_url == "http://127.0.0.1:9"
    # trainer side: the callback is installed ...
    assert len([c for c in trainer.callback_handler.callbacks if isinstance(c, ParityCallback)]) == 1
    # ... and at train begin it registered the user's processor (the example's custom template)
    assert trainer.processing_class.chat_template == namespace["CUSTOM_TEMPLATE"]
    assert run["project"] == "async-grpo" and len(trainer_side) == 1
    assert fingerprint["components"]["chat_template"]["value"] == namespace["CUSTOM_TEMPLATE"]
    # rollout side: TRL's own worker, instrumented before train() (its child builds our loop)
    assert isinstance(trainer.rollout_worker, AsyncRolloutWorker)
    assert loop_cls is ParityRolloutLoop
    assert loop_kwargs["parity_monitor"] == (None, {"side": "rollout", "run": "example-run", "project": "async-grpo"})
