"""ParityCallback inside real transformers/TRL trainers, and the instrumented AsyncGRPO rollout worker.

The monitor here is `RecordingMonitor`, a stand-in with ParityMonitor's interface; the monitor's
own HTTP behaviour is tested with the monitor.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.integrations.recording_monitor import FileMonitor, RecordingMonitor, trivial_reward

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [[{"role": "user", "content": "What is 2 + 2?"}], [{"role": "user", "content": "Say hello."}]]


def test_importing_the_integration_loads_no_framework():
    script = (
        "import sys, trainer_hooks.integrations.trl as m\n"
        "heavy = [x for x in ('torch', 'transformers', 'trl', 'numpy') if x in sys.modules]\n"
        "print(heavy, m.is_trl_available())"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] True"


# ------------------------------------------------------------------ the callback, driven by hand


def make_state(world_zero=True, step=0):
    from transformers import TrainerControl, TrainerState

    state = TrainerState(is_world_process_zero=world_zero)
    state.global_step = step
    return state, TrainerControl()


class FakeModel:
    generation_config = object()


def test_train_begin_registers_processing_class_and_generation_config():
    from trainer_hooks.integrations.trl import ParityCallback

    monitor = RecordingMonitor()
    callback = ParityCallback(monitor=monitor)
    state, control = make_state()
    tokenizer = object()
    callback.on_train_begin(None, state, control, model=FakeModel(), processing_class=tokenizer)
    assert monitor.processors == [(tokenizer, FakeModel.generation_config)]


def test_train_begin_reports_what_the_grpo_recompute_assumes(tmp_path):
    from trl import GRPOConfig

    from trainer_hooks.integrations.trl import ParityCallback

    monitor = RecordingMonitor()
    state, control = make_state()
    args = GRPOConfig(output_dir=str(tmp_path), temperature=0.6, top_p=0.9, top_k=20, use_cpu=True, report_to="none",
                      chat_template_kwargs={"enable_thinking": False})
    ParityCallback(monitor=monitor).on_train_begin(args, state, control, model=FakeModel(), processing_class=object())
    # TRL divides the logits by the temperature and masks nothing: top_p/top_k are the rollout's business
    assert monitor.sampling == [({"temperature": 0.6}, {"logprobs_mode": "processed", "source": "trl"})]
    # the trainer renders every prompt with the config's template kwargs: its probes must too
    assert monitor.chat_template_kwargs == [{"enable_thinking": False}]


def test_train_begin_accepts_the_older_tokenizer_keyword():
    from trainer_hooks.integrations.trl import ParityCallback

    monitor = RecordingMonitor()
    state, control = make_state()
    tokenizer = object()
    ParityCallback(monitor=monitor).on_train_begin(None, state, control, model=None, tokenizer=tokenizer)
    assert monitor.processors == [(tokenizer, None)]


def test_on_log_forwards_finite_numbers_with_the_global_step():
    import numpy as np
    import torch
    from trainer_hooks.integrations.trl import ParityCallback

    monitor = RecordingMonitor()
    callback = ParityCallback(monitor=monitor)
    state, control = make_state(step=7)
    logs = {
        "kl": 0.01, "entropy": 2, "ratio": torch.tensor(1.02), "buffer_qsize": np.int64(3),
        "sampling/importance_sampling_ratio/min": float("nan"),  # dropped: never NaN on the wire
        "done": True, "note": "text", "missing": None, "vector": torch.ones(2),
    }
    callback.on_log(None, state, control, logs=logs)
    assert monitor.logged == [({"kl": 0.01, "entropy": 2.0, "ratio": pytest.approx(1.02), "buffer_qsize": 3.0}, 7)]


def test_stop_sets_save_and_training_stop():
    from trainer_hooks.integrations.trl import ParityCallback

    monitor = RecordingMonitor()
    callback = ParityCallback(monitor=monitor)
    state, control = make_state()
    callback.on_step_begin(None, state, control)
    assert not control.should_training_stop
    monitor.request_stop()
    callback.on_step_end(None, state, control)
    assert control.should_training_stop and control.should_save


def test_pause_holds_step_begin_until_resumed():
    from trainer_hooks.integrations.trl import ParityCallback

    monitor = RecordingMonitor()
    monitor.pause()
    callback = ParityCallback(monitor=monitor)
    state, control = make_state()
    returned = threading.Event()
    step = threading.Thread(target=lambda: (callback.on_step_begin(None, state, control), returned.set()), daemon=True)
    step.start()
    assert monitor.waiting.wait(10.0)  # the step is waiting on the monitor...
    assert not returned.is_set()       # ...and cannot return before the resume
    monitor.resume()
    assert returned.wait(10.0)
    assert not control.should_training_stop


def test_other_ranks_never_touch_the_monitor():
    from trainer_hooks.integrations.trl import ParityCallback

    monitor = RecordingMonitor()
    monitor.pause()  # would block forever if a non-zero rank waited on it
    callback = ParityCallback(monitor=monitor)
    state, control = make_state(world_zero=False)
    callback.on_train_begin(None, state, control, processing_class=object())
    callback.on_step_begin(None, state, control)
    callback.on_log(None, state, control, logs={"kl": 1.0})
    callback.on_train_end(None, state, control)
    assert (monitor.processors, monitor.logged, monitor.waits, monitor.closed) == ([], [], [], False)


def test_train_end_closes():
    from trainer_hooks.integrations.trl import ParityCallback

    monitor = RecordingMonitor()
    state, control = make_state()
    ParityCallback(monitor=monitor).on_train_end(None, state, control)
    assert monitor.closed


class StrictParityMonitor(RecordingMonitor):
    """ParityMonitor's constructor signature, for the keyword-argument path."""

    def __init__(self, run: str, side: str, url: str | None = None, token: str | None = None):
        super().__init__(run=run, side=side, url=url, token=token)


@pytest.fixture
def fake_monitor_module(monkeypatch):
    import types

    module = types.ModuleType("trainer_hooks.monitor")
    module.ParityMonitor = StrictParityMonitor
    monkeypatch.setitem(sys.modules, "trainer_hooks.monitor", module)
    return module


def test_keyword_arguments_build_a_trainer_side_monitor_at_train_begin(fake_monitor_module):
    from trainer_hooks.integrations.trl import ParityCallback

    callback = ParityCallback(run="r1", url="http://127.0.0.1:1", token="t")
    assert callback.monitor is None  # nothing opened before training starts
    state, control = make_state()
    callback.on_train_begin(None, state, control, processing_class=object())
    assert callback.monitor.kwargs == {"run": "r1", "side": "trainer", "url": "http://127.0.0.1:1", "token": "t"}


def test_real_parity_monitor_is_built_on_train_begin_and_closed():
    from trainer_hooks.monitor import ParityMonitor

    from trainer_hooks.integrations.trl import ParityCallback

    callback = ParityCallback(run="r1", url="http://127.0.0.1:1", enabled=False)  # disabled: no threads, no network
    state, control = make_state()
    callback.on_train_begin(None, state, control, processing_class=None)
    monitor = callback.monitor
    assert isinstance(monitor, ParityMonitor) and monitor.side == "trainer"
    callback.on_step_begin(None, state, control)  # a disabled monitor never pauses
    callback.on_train_end(None, state, control)
    assert callback.monitor is None
    with pytest.raises(TypeError, match="side"):
        ParityCallback(run="r1", side="rollout")  # the callback is the trainer side, always


def test_wrong_arguments_fail_at_construction(fake_monitor_module):
    from trainer_hooks.integrations.trl import ParityCallback

    with pytest.raises(TypeError):
        ParityCallback(run="r1", colour="blue")
    with pytest.raises(TypeError):
        ParityCallback(monitor=RecordingMonitor(), run="r1")


# ------------------------------------------------------------------ a real GRPOTrainer run on CPU


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory, qwen_tokenizer):
    """A random-weight 2-layer Qwen2 (head_dim 64) saved locally, so TRL can load it (and its reference copy)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(qwen_tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=512,
        tie_word_embeddings=True, eos_token_id=qwen_tokenizer.eos_token_id, pad_token_id=qwen_tokenizer.pad_token_id,
    )
    path = tmp_path_factory.mktemp("tiny-qwen2")
    Qwen2ForCausalLM(config).save_pretrained(path)
    qwen_tokenizer.save_pretrained(path)
    return str(path)


def test_grpo_trainer_run_registers_forwards_pauses_and_stops(tiny_qwen2, qwen_tokenizer, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from trainer_hooks.integrations.trl import ParityCallback

    monitor = RecordingMonitor()
    monitor.pause()  # paused before the first step: the trainer must wait
    monitor.stop_after_step = 1  # a stop arrives with step 1's metrics: step 2 runs, saves, and training ends
    # an operator resumes once the trainer waits (however long its set-up took on a loaded machine)
    threading.Thread(target=lambda: monitor.waiting.wait(300) and monitor.resume(), daemon=True).start()
    args = GRPOConfig(
        output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4, num_generations=4,
        max_completion_length=8, beta=0.04, learning_rate=1e-4, logging_steps=1, save_strategy="no",
        report_to="none", use_cpu=True, bf16=False, seed=0, disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=tiny_qwen2, reward_funcs=trivial_reward, args=args, processing_class=qwen_tokenizer,
        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS * 4]), callbacks=[ParityCallback(monitor)],
    )
    trainer.train()

    processor, generation_config = monitor.processors[0]
    assert processor is qwen_tokenizer
    assert generation_config.eos_token_id == qwen_tokenizer.eos_token_id
    assert monitor.wait_ends[0] >= monitor.resumed_at  # step 1 held until the resume
    names = set().union(*(metrics for metrics, _ in monitor.logged))
    assert {"kl", "entropy", "reward", "clip_ratio/region_mean", "completions/mean_length"} <= names
    assert [step for _, step in monitor.logged][:2] == [1, 2]
    assert trainer.state.global_step == 2 and (tmp_path / "checkpoint-2").is_dir()
    assert monitor.closed


# ------------------------------------------------------------------ TRL AsyncGRPO's rollout worker


def loop_kwargs(tokenizer, **extra):
    from datasets import Dataset

    return {**dict(
        model_name="tiny-qwen2", dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]),
        reward_funcs=[trivial_reward], processing_class=tokenizer, eos_token_ids=[tokenizer.eos_token_id],
        temperature=0.7, top_p=0.9,
    ), **extra}


def build_loop(tokenizer, monitor_spec, **extra):
    from trainer_hooks.integrations.trl import ParityRolloutLoop

    return ParityRolloutLoop(
        **loop_kwargs(tokenizer, **extra), parity_monitor=monitor_spec, rollout_buffer=queue.Queue(),
        model_version_value=mp.Value("i", 3), heartbeat_value=mp.Value("d", 0.0), failed_event=threading.Event(),
        exception_info_queue=queue.Queue(), metrics_queue=queue.Queue(),
    )


def close_loop(loop):
    loop._tool_pool.shutdown(wait=True)
    loop._loop.close()


def test_rollout_loop_registers_the_processor_it_renders_with(qwen_tokenizer):
    loop = build_loop(qwen_tokenizer, (RecordingMonitor, {"side": "rollout", "run": "r1"}),
                      chat_template_kwargs={"enable_thinking": False})
    try:
        monitor = loop.parity_monitor
        assert monitor.kwargs == {"side": "rollout", "run": "r1"}
        (processor, generation_config), = monitor.processors
        assert processor is loop.tokenizer  # after TRL's add_response_schema
        assert monitor.chat_template_kwargs == [{"enable_thinking": False}]  # as the loop renders prompts
        assert generation_config.eos_token_id == [qwen_tokenizer.eos_token_id]
        assert (generation_config.temperature, generation_config.top_p) == (0.7, 0.9)
        (params, how), = monitor.sampling  # what every request of the loop sets
        assert (params["temperature"], params["top_p"], how["source"]) == (0.7, 0.9, "trl_async_rollout")
        assert how["filled_from_generation_config"] == []  # "tiny-qwen2": no such folder, nothing cached

        loop._rates["rollout/turns_mean"] = [6.0, 3.0]
        loop._push_metrics({"rollout/score_s": 0.5, "rollout/generated_tok_s": (100.0, 0.0)})
        assert monitor.logged == [({"rollout/score_s": 0.5, "rollout/turns_mean": 2.0}, 3)]
        assert monitor.policy_versions == [3]  # the version the worker serves, for the workers view
        assert loop._metrics_queue.get_nowait()["rollout/score_s"] == 0.5  # TRL's own path still fed
    finally:
        close_loop(loop)


def test_rollout_loop_reports_what_the_server_fills_from_the_models_generation_config(qwen_tokenizer, tmp_path):
    """The loop leaves min_p out of its requests when unset; vLLM's server then takes the model's
    generation_config.json value, which the trainer's recompute knows nothing of."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "generation_config.json").write_text(json.dumps({"min_p": 0.05, "top_k": 20, "temperature": 0.6}))
    loop = build_loop(qwen_tokenizer, (RecordingMonitor, {}), model_name=str(model_dir), top_k=0)
    try:
        (params, how), = loop.parity_monitor.sampling
        assert how["filled_from_generation_config"] == ["min_p"]
        # the request's own values win: temperature 0.7 and top_k 0 (off) are sent with every request
        assert (params["min_p"], params["temperature"], params["top_k"]) == (0.05, 0.7, 0)
    finally:
        close_loop(loop)


def test_rollout_loop_reports_the_training_template_it_swaps_in(tmp_path):
    from trl.chat_template_utils import qwen3_chat_template

    from tests.integrations.conftest import build_qwen_like_tokenizer

    # Qwen3's template is not prefix-preserving: with tools, TRL renders with its training variant.
    tokenizer = build_qwen_like_tokenizer(tmp_path, qwen3_chat_template)
    loop = build_loop(tokenizer, (RecordingMonitor, {}), tools=[multiply])
    try:
        (processor, _), = loop.parity_monitor.processors
        assert loop.chat_template is not None and loop.chat_template != qwen3_chat_template
        assert processor.chat_template == loop.chat_template
        assert processor.encode("2 + 2") == tokenizer.encode("2 + 2")
        assert tokenizer.chat_template == qwen3_chat_template  # the worker's own tokenizer untouched
    finally:
        close_loop(loop)


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a * b


@pytest.fixture
def vllm_free_worker_class(monkeypatch):
    """TRL's AsyncRolloutWorker refuses to construct without vLLM and aiohttp; its child needs neither to start."""
    from trl.experimental.async_grpo import async_rollout_worker

    monkeypatch.setattr(async_rollout_worker, "is_vllm_available", lambda: True)
    monkeypatch.setattr(async_rollout_worker, "is_aiohttp_available", lambda: True)
    return async_rollout_worker.AsyncRolloutWorker


def test_instrument_rollout_worker_swaps_the_loop_class(vllm_free_worker_class, qwen_tokenizer, fake_monitor_module):
    from trainer_hooks.integrations.trl import ParityRolloutLoop, instrument_rollout_worker

    worker = vllm_free_worker_class(**loop_kwargs(qwen_tokenizer))
    assert instrument_rollout_worker(worker, run="r1", url="http://127.0.0.1:1") is worker
    assert worker._loop_cls is ParityRolloutLoop
    assert worker._loop_kwargs["parity_monitor"] == (None, {"side": "rollout", "run": "r1", "url": "http://127.0.0.1:1"})
    with pytest.raises(TypeError):
        instrument_rollout_worker(worker, colour="blue")  # checked against ParityMonitor's signature
    with pytest.raises(TypeError, match="not a TRL AsyncRolloutWorker"):
        instrument_rollout_worker(object(), run="r1")
    worker._process = object()  # as after start()
    with pytest.raises(RuntimeError, match="before it starts"):
        instrument_rollout_worker(worker, run="r1")


def test_parity_worker_subclass_carries_the_monitor_spec(vllm_free_worker_class, qwen_tokenizer, fake_monitor_module):
    from trainer_hooks.integrations.trl import ParityAsyncRolloutWorker, ParityRolloutLoop

    worker = ParityAsyncRolloutWorker(parity_monitor_kwargs={"run": "r1"}, **loop_kwargs(qwen_tokenizer))
    assert worker._loop_cls is ParityRolloutLoop
    assert worker._loop_kwargs["parity_monitor"] == (None, {"side": "rollout", "run": "r1"})


def test_spawned_worker_child_reports_its_processor(vllm_free_worker_class, qwen_tokenizer, tmp_path):
    """The real spawn: TRL's child process builds ParityRolloutLoop and registers from there.

    Without vLLM (and aiohttp) the child's generate loop then fails; registration happens before that.
    """
    from trainer_hooks.integrations.trl import instrument_rollout_worker

    log = tmp_path / "child.jsonl"
    worker = vllm_free_worker_class(**loop_kwargs(qwen_tokenizer), child_ready_timeout=120)
    instrument_rollout_worker(worker, monitor_factory=FileMonitor, path=str(log), run="r1")
    try:
        worker.start()
        events = [json.loads(line) for line in log.read_text().splitlines()]
    finally:
        worker.stop()
    init, register = events[0], events[1]
    assert init["kwargs"] == {"side": "rollout", "run": "r1"}
    assert register["event"] == "register_processor"
    assert register["chat_template"] == qwen_tokenizer.chat_template
    assert register["vocab_size"] == len(qwen_tokenizer)
    assert register["eos_token_id"] == [qwen_tokenizer.eos_token_id]
