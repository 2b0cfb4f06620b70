"""Conformance matrix: TRL's real GRPOTrainer with ParityCallback, one cell per tokenizer convention
real model families ship, against a real backend over HTTP (issue 25, point 2).

Each cell saves a tiny random-weight model (one per tokenizer family, built once) next to its
tokenizer folder; the trainer is TRL 1.16's GRPOTrainer on CPU for two steps, loading the model by
folder and given the processing class the way a user passes it. The rollout side is built the way
TRL's rollout code builds it: GRPOTrainer's vLLM generation (``LLM(model=model.name_or_path)``, or
``trl vllm-serve --model``) gives vLLM the model folder, and vLLM loads its tokenizer from it
(``vllm.tokenizers.get_tokenizer``: ``AutoTokenizer.from_pretrained(folder, truncation_side="left")``,
or ``MistralCommonBackend.from_pretrained(folder, mode=ValidationMode.test)`` with
``tokenizer_mode="mistral"``) and its generation config (``GenerationConfig.from_pretrained(folder)``);
it samples with the values TRL sends (``vllm_generation.py``) and ``logprobs_mode="processed_logprobs"``.
vLLM itself is not installed here (tests/vllm runs the real server): the rollout registers those
objects from its own ``ParityMonitor(side="rollout")``.

Healthy cells end ``finished`` with no alert at all; the seed bug (the trainer's processing class
carries a custom template, the rollout loads the folder by name) pauses the run naming
``chat_template`` while the trainer waits at its next step. The matrix is printed (``-s``) as
``MATRIX | cell | convention | expected | verdict | final state | alerts``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx
import pytest

from paritywatch.backend import migrate
from paritywatch.backend.settings import Settings
from tests.fixtures import tokenizers as builders
from tests.support.live import ThreadServer, detect_jobs_done, first_within, wait_for

pytestmark = pytest.mark.slow

PROJECT = "conformance"
PROMPTS = [[{"role": "user", "content": "What is 2 + 2?"}], [{"role": "user", "content": "Say hello."}]]
# Qwen2.5-Instruct's generation_config.json, with this vocabulary's ids (<|endoftext|> 0, <|im_end|> 2).
QWEN_GENERATION = {"bos_token_id": 0, "pad_token_id": 0, "eos_token_id": [2, 0], "do_sample": True,
                   "repetition_penalty": 1.05, "temperature": 0.7, "top_p": 0.8, "top_k": 20}
# The trainer's processing class in the seed bug: a default system prompt and a think tag of its own.
USER_TEMPLATE = builders.CUSTOM_TEMPLATE


def trl_template(name: str) -> str:
    """A chat template as the model family ships it (TRL keeps verbatim copies of real ones)."""
    import trl.chat_template_utils as templates

    return getattr(templates, f"{name}_chat_template")


@dataclass(frozen=True)
class Family:
    """One tokenizer family: how its folder's processor is loaded on each side, and its tiny model."""
    model: str  # transformers config class
    mistral: bool = False  # mistral-common: MistralCommonBackend on the trainer, vLLM's mistral mode on the rollout

    def trainer_processor(self, folder: Path):
        if self.mistral:
            from transformers.tokenization_mistral_common import MistralCommonBackend

            return MistralCommonBackend.from_pretrained(folder)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder)

    def rollout_processor(self, folder: Path):
        """What vLLM's get_tokenizer loads from the folder (tokenizer_mode "auto", or "mistral")."""
        if self.mistral:
            from mistral_common.protocol.instruct.validator import ValidationMode
            from transformers.tokenization_mistral_common import MistralCommonBackend

            return MistralCommonBackend.from_pretrained(folder, mode=ValidationMode.test)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder, truncation_side="left")


FAMILIES = {"chatml": Family("Qwen2Config"), "llama3": Family("LlamaConfig"),
            "tekken": Family("MistralConfig", mistral=True), "spm": Family("MistralConfig", mistral=True)}


@dataclass(frozen=True)
class Cell:
    name: str
    convention: str
    family: str
    build: Callable[[Path], Path]  # the tokenizer folder, as the family ships it
    trainer_template: str | None = None  # set on the processing class after loading (the seed bug)
    chat_template_kwargs: dict = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return self.trainer_template is None


def chatml(template_name: str, **options) -> Callable[[Path], Path]:
    return lambda tmp: builders.build_chatml_tokenizer(tmp, chat_template=trl_template(template_name),
                                                       generation_config=QWEN_GENERATION, **options)


def llama3(template_name: str, **options) -> Callable[[Path], Path]:
    return lambda tmp: builders.build_llama3_tokenizer(tmp, trl_template(template_name), **options)


CELLS = [
    Cell("llama3-no-pad", "no pad token (Llama 3.1): TRL sets pad = eos on the trainer only; BOS added by the "
         "tokenizer and rendered by the template; a default system prompt", "llama3", llama3("llama3_1")),
    Cell("bos-template-only", "BOS rendered by the template, none added by the tokenizer (Llama 3.2 template)",
         "llama3", llama3("llama3_2", add_bos=False)),
    Cell("bos-tokenizer-only", "BOS added by the tokenizer, none in the template (Phi-3 template)", "llama3",
         llama3("phi3")),
    Cell("pad-is-eos", "pad = eos shipped in tokenizer_config.json (Qwen2.5 template)", "chatml",
         chatml("qwen2_5", pad_token="<|im_end|>")),
    Cell("qwen2.5-system-prompt", "a default system prompt in the template (Qwen2.5), pad <|endoftext|>, "
         "template in chat_template.jinja", "chatml", chatml("qwen2_5")),
    Cell("template-in-config", "the template in tokenizer_config.json, not chat_template.jinja", "chatml",
         chatml("qwen2_5", template_in="tokenizer_config")),
    Cell("qwen3-thinking", "a thinking template (Qwen3) rendered with enable_thinking=False "
         "(GRPOConfig.chat_template_kwargs)", "chatml", chatml("qwen3"),
         chat_template_kwargs={"enable_thinking": False}),
    Cell("mistral-tekken", "tekken (mistral-common): MistralCommonBackend as the processing class",
         "tekken", lambda tmp: builders.build_mistral_common_dir(tmp, "tekken")),
    Cell("mistral-spm", "SentencePiece v3 (mistral-common): MistralCommonBackend as the processing class",
         "spm", lambda tmp: builders.build_mistral_common_dir(tmp, "spm")),
    Cell("seed-bug", "the trainer's processing class has a custom template; the rollout loads the folder by "
         "name (huggingface/trl#5498)", "chatml", chatml("qwen2_5"), trainer_template=USER_TEMPLATE),
]


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('conformance') / 'paritywatch.db'}"
    migrate.upgrade(url)
    with ThreadServer(Settings(database_url=url)) as srv, httpx.Client(base_url=srv.url, timeout=30) as api:
        yield srv, api, url


@functools.lru_cache(maxsize=None)
def tiny_model(family: str, vocab_size: int, eos: int, bos: int | None):
    """One random-weight model per family (1 layer, hidden 16): saved next to each cell's tokenizer."""
    import torch
    import transformers

    config = getattr(transformers, FAMILIES[family].model)(
        vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, max_position_embeddings=512, tie_word_embeddings=True,
        eos_token_id=eos, bos_token_id=bos)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def model_folder(cell: Cell, tmp_path: Path) -> Path:
    """The cell's tokenizer folder with the family's model saved into it; the generation_config.json
    the family ships (if any) is kept, not the one save_pretrained derives from the model config."""
    folder = cell.build(tmp_path)
    shipped = folder / "generation_config.json"
    generation = shipped.read_text() if shipped.exists() else None
    tok = FAMILIES[cell.family].trainer_processor(folder)
    tiny_model(cell.family, len(tok), tok.eos_token_id, tok.bos_token_id).save_pretrained(folder)
    if generation is not None:
        shipped.write_text(generation)
    return folder


def monitor_kwargs(srv, cell: Cell, tmp_path: Path, worker_id: str) -> dict:
    return dict(run=cell.name, project=PROJECT, url=srv.url, worker_id=worker_id, spool_dir=tmp_path / f"spool-{worker_id}",
                flush_interval_s=0.05, poll_timeout_s=5)


def start_rollout(srv, cell: Cell, folder: Path, args, tmp_path: Path):
    """The rollout as TRL's vLLM generation builds it: vLLM's processor and generation config from the
    folder, sampling with the values GRPOTrainer sends and processed log-probs."""
    from transformers import GenerationConfig

    from trainer_hooks.monitor import ParityMonitor

    monitor = ParityMonitor(side="rollout", **monitor_kwargs(srv, cell, tmp_path, "vllm-0"))
    monitor.register_processor(FAMILIES[cell.family].rollout_processor(folder),
                               generation_config=GenerationConfig.from_pretrained(folder),
                               chat_template_kwargs=args.chat_template_kwargs).result(timeout=120)
    monitor.report_sampling_params({"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
                                    "min_p": args.min_p or 0.0, "repetition_penalty": args.repetition_penalty},
                                   logprobs_mode="processed")
    return monitor


def grpo_trainer(srv, cell: Cell, folder: Path, tmp_path: Path, max_steps: int):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from trainer_hooks.integrations.trl import ParityCallback

    processing_class = FAMILIES[cell.family].trainer_processor(folder)
    if cell.trainer_template is not None:
        processing_class.chat_template = cell.trainer_template
    args = GRPOConfig(output_dir=str(tmp_path / "out"), max_steps=max_steps, per_device_train_batch_size=2,
                      num_generations=2, max_completion_length=4, beta=0.0, learning_rate=1e-4, logging_steps=1,
                      save_strategy="no", report_to="none", use_cpu=True, bf16=False, seed=0, disable_tqdm=True,
                      chat_template_kwargs=cell.chat_template_kwargs)
    callback = ParityCallback(**monitor_kwargs(srv, cell, tmp_path, "trainer-0"))
    trainer = GRPOTrainer(model=str(folder), reward_funcs=digit_reward, args=args, processing_class=processing_class,
                          train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS * 64]),
                          callbacks=[callback])
    return trainer, callback


def digit_reward(completions, **_kwargs) -> list[float]:
    return [float(sum(ch.isdigit() for ch in (c if isinstance(c, str) else c[-1]["content"]))) for c in completions]


def run_of(api, cell: Cell) -> dict | None:
    runs = api.get("/api/v1/runs", params={"project": PROJECT, "limit": 100}).json()["runs"]
    return next((r for r in runs if r["name"] == cell.name), None)


def run_state(api, run_id: int) -> str:
    return api.get(f"/api/v1/runs/{run_id}/control").json()["state"]


def verdict_of(api, run_id: int) -> dict:
    (group,) = api.get(f"/api/v1/runs/{run_id}/parity").json()["groups"]
    return group


def report(cell: Cell, expected: str, group: dict, state: str, alerts: list) -> None:
    shown = ", ".join(f"{c['name']}:{c['severity']}" for c in group["diff"]["components"]) if group.get("diff") else ""
    named = ", ".join(f"{a['kind']}({a['severity']}: {', '.join(a['detail'].get('components', []))})" for a in alerts)
    print(f"\nMATRIX | {cell.name} | {cell.convention} | {expected} | {group['verdict']} [{shown}] | {state} | "
          f"{named or 'none'}")


class Training:
    """``trainer.train()`` on a thread; ``stop(api)`` releases a trainer held by a pause."""

    def __init__(self, trainer):
        import threading

        self.thread = threading.Thread(target=trainer.train, daemon=True)
        self.thread.start()

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self, api, run: dict | None) -> None:
        if self.alive and run is not None:  # never leave a trainer blocked behind a failed assertion
            api.post(f"/api/v1/runs/{run['id']}/control", json={"action": "stop", "reason": "test over"})
        self.thread.join(timeout=120)


def open_mismatches(api, run_id: int) -> list:
    alerts = api.get(f"/api/v1/runs/{run_id}/alerts", params={"status": "open"}).json()["alerts"]
    return [a for a in alerts if a["kind"] == "processor_mismatch"]


@pytest.mark.parametrize("cell", [c for c in CELLS if c.healthy], ids=lambda c: c.name)
def test_healthy_convention_trains_quietly_and_finishes(backend, cell, tmp_path):
    srv, api, url = backend
    folder = model_folder(cell, tmp_path)
    trainer, _ = grpo_trainer(srv, cell, folder, tmp_path, max_steps=2)
    rollout = start_rollout(srv, cell, folder, trainer.args, tmp_path)
    training, run = Training(trainer), None  # the callback registers at train begin, closes at train end
    try:
        run = wait_for(lambda: run_of(api, cell), timeout_s=60)
        # a false alarm pauses the run and holds the trainer: fail on it at once, saying why
        wait_for(lambda: not training.alive or run_state(api, run["id"]) == "paused", timeout_s=240)
        assert not training.alive, f"a healthy run was paused: {[a['title'] for a in open_mismatches(api, run['id'])]}"
    finally:
        rollout.close()
        training.stop(api, run)
    wait_for(lambda: detect_jobs_done(url, run["id"]), timeout_s=60, what="the fingerprints judged")
    state = wait_for(lambda: run_state(api, run["id"]) == "finished" and "finished", timeout_s=60,
                     what="the run finished")
    group = verdict_of(api, run["id"])
    alerts = api.get(f"/api/v1/runs/{run['id']}/alerts").json()["alerts"]
    report(cell, "quiet: same or info, finished, no alert", group, state, alerts)
    assert group["verdict"] in ("same", "info"), group["diff"]
    assert alerts == []
    keys = api.get(f"/api/v1/runs/{run['id']}/metrics").json()["keys"]
    assert any(k["key"] == "reward" and k["last_step"] == 2 for k in keys)  # the trainer really trained


@pytest.mark.parametrize("cell", [c for c in CELLS if not c.healthy], ids=lambda c: c.name)
def test_seed_bug_pauses_the_run_on_chat_template_and_holds_the_trainer(backend, cell, tmp_path):
    srv, api, url = backend
    folder = model_folder(cell, tmp_path)
    trainer, callback = grpo_trainer(srv, cell, folder, tmp_path, max_steps=500)  # far more than it may run
    rollout = start_rollout(srv, cell, folder, trainer.args, tmp_path)
    training, run = Training(trainer), None
    try:
        run = wait_for(lambda: run_of(api, cell), timeout_s=60)
        (alert,) = wait_for(lambda: open_mismatches(api, run["id"]), timeout_s=60, what="a processor_mismatch alert")
        assert alert["severity"] == "error" and "chat_template" in alert["detail"]["components"]
        assert run_state(api, run["id"]) == "paused"
        # the trainer waits at its next step boundary: the step in flight when the pause reached it
        # completes, no other starts
        wait_for(lambda: callback.monitor is not None and callback.monitor.state == "paused", timeout_s=30)
        held_at = trainer.state.global_step
        moved = first_within(lambda: trainer.state.global_step > held_at + 1 or not training.alive, window_s=2)
        assert not moved, f"the trainer went on training while the run was paused (step {trainer.state.global_step})"
        api.post(f"/api/v1/runs/{run['id']}/control", json={"action": "stop", "reason": "fix the rollout's processor"})
        training.thread.join(timeout=120)
        assert not training.alive  # the stop ends the pause and the training
    finally:
        rollout.close()
        training.stop(api, run)
    state = wait_for(lambda: (s := run_state(api, run["id"])) in ("stopped", "finished") and s, timeout_s=60,
                     what="the run ended")
    report(cell, "error on chat_template: paused, trainer held", verdict_of(api, run["id"]), f"paused, then {state}",
           [alert])
    assert state == "stopped"
