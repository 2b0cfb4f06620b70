"""The rollout side of verl 0.9: its agent-loop workers (``verl.experimental.agent_loop``).

An ``AgentLoopWorker`` is a Ray actor; every agent loop it runs is built with its ``tokenizer`` and
``processor`` (``custom_chat_template`` applied) and renders prompts through verl's Continuous
Token builder with ``data.apply_chat_template_kwargs``; every request leaves through its
``llm_client.generate`` (an ``LLMServerClient``) towards verl's vLLM server. So the worker is where
the processor the rollout really renders with, and the sampling each request is sent with, can be
seen. Imported lazily through `trainer_hooks.integrations.verl` (imports verl, ray, torch).
"""
from __future__ import annotations

import contextvars
import logging
import re
from typing import Any

import ray
from verl.experimental.agent_loop import AgentLoopManager, AgentLoopWorker

from ._verl_model import rollout_model_components
from .verl import config_value, monitor_kwargs, require_attrs, served_request_sampling

logger = logging.getLogger(__name__)

# The verl names this relies on; checked at construction, so a verl refactor fails there.
_REQUIRED_WORKER_ATTRS = ("_run_agent_loop", "llm_client", "tokenizer", "processor", "rollout_config", "model_config")
# Set while an agent loop of a validation batch runs (its requests use val_kwargs, never trained on).
_VALIDATING: contextvars.ContextVar[bool] = contextvars.ContextVar("paritywatch_verl_validating", default=False)
SOURCE = "verl_agent_loop"


class ParityAgentLoopWorkerMixin:
    """Put first in the bases of a verl ``AgentLoopWorker`` (its Ray actor process runs this).

    * construction: starts a rollout ``ParityMonitor`` (worker id from the Ray actor's name,
      ``agent_loop_worker_3_<hex>`` -> ``agent-loop-worker-3``), registers the processor its agent
      loops render with (`rendering_registration`), reports the sampling its training requests are
      configured with, and watches ``llm_client.generate``.
    * every request of a training batch: reports what verl's vLLM server will build its
      ``SamplingParams`` from (`served_request_sampling`: a custom agent loop's own temperature,
      ToolAgentLoop's stop ids... as really sent), with the engine's ``rollout.logprobs_mode``;
      the answer's weight version (``global_steps``) becomes the monitor's policy version.
      Validation requests (``val_kwargs``) are not reported: nothing trains on them.
    * ``close_parity_monitor()``: called by the Paritywatch trainer when ``fit`` returns.

    A monitor that cannot start is logged and the worker runs unmonitored.
    """

    parity_monitor: Any = None

    def __init__(self, config: Any, *args: Any, **kwargs: Any):
        super().__init__(config, *args, **kwargs)
        require_attrs(self, _REQUIRED_WORKER_ATTRS, "a verl AgentLoopWorker")
        self.parity_monitor = _start_monitor(config)
        if self.parity_monitor is None:
            return
        try:
            self.parity_monitor.register_processor(**rendering_registration(self))
            self._report_request(configured_request_sampling(self.rollout_config))
        except Exception:  # never take the rollout worker down
            logger.exception("Paritywatch: could not register the agent-loop worker's processor")
        try:
            self.parity_monitor.report_model_components(rollout_model_components(self, self.rollout_config),
                                                        {"model_source": SOURCE})
        except Exception:
            logger.exception("Paritywatch: could not read the agent-loop worker's model config")
        self._watch_requests()

    async def _run_agent_loop(self, sampling_params: Any, trajectory: Any, *args: Any, **kwargs: Any) -> Any:
        token = _VALIDATING.set(bool(trajectory.get("validate", False)))
        try:
            return await super()._run_agent_loop(sampling_params, trajectory, *args, **kwargs)
        finally:
            _VALIDATING.reset(token)

    def close_parity_monitor(self, timeout: float = 5.0) -> bool:
        return True if self.parity_monitor is None else self.parity_monitor.close(timeout)

    def _watch_requests(self) -> None:
        client = self.llm_client
        original = client.generate
        if getattr(original, "_paritywatch_watched", False):
            return

        async def generate(request_id: Any, *, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
            if not _VALIDATING.get():
                self._report_request(sampling_params)
            output = await original(request_id, sampling_params=sampling_params, **kwargs)
            version = (getattr(output, "extra_fields", None) or {}).get("global_steps")
            if isinstance(version, int) and not isinstance(version, bool):
                self.parity_monitor.set_policy_version(version)
            return output

        generate._paritywatch_watched = True  # type: ignore[attr-defined]
        client.generate = generate

    def _report_request(self, request: dict[str, Any]) -> None:
        # Cheap per request: the monitor re-posts only when the values change.
        self.parity_monitor.report_sampling_params(served_request_sampling(self.rollout_config, request),
                                                   logprobs_mode=config_value(self.rollout_config, "logprobs_mode"),
                                                   source=SOURCE)


def rendering_registration(worker: Any) -> dict[str, Any]:
    """``register_processor`` arguments for what an agent-loop worker's loops render prompts with:
    the multimodal processor, else the tokenizer (verl's Continuous Token builder picks the same),
    ``data.apply_chat_template_kwargs`` and the model's generation config as verl loaded it (the
    model config goes separately: ``_verl_model.rollout_model_components``)."""
    processor = worker.processor if worker.processor is not None else worker.tokenizer
    data = config_value(worker.config, "data")
    return {"processor": processor, "generation_config": worker.model_config.generation_config,
            "chat_template_kwargs": dict(config_value(data, "apply_chat_template_kwargs") or {})}


def configured_request_sampling(rollout_config: Any) -> dict[str, Any]:
    """The sampling dict verl's agent-loop worker gives every training agent loop (verl 0.9
    ``AgentLoopWorker.generate_sequences``; the TransferQueue worker builds the same)."""
    def value(key: str, default: Any) -> Any:
        return config_value(rollout_config, key, default)

    return {"temperature": value("temperature", 1.0), "top_p": value("top_p", 1.0), "top_k": value("top_k", -1),
            "repetition_penalty": 1.0, "logprobs": value("calculate_log_probs", False)}


def _start_monitor(config: Any) -> Any:
    from trainer_hooks.monitor import ParityMonitor

    kwargs = monitor_kwargs(config, "rollout")
    kwargs.setdefault("worker_id", _actor_worker_id())
    if kwargs["worker_id"] is None:
        del kwargs["worker_id"]
    try:
        return ParityMonitor(**kwargs)
    except Exception:
        logger.exception("Paritywatch: could not start the agent-loop worker's monitor")
        return None


def _actor_worker_id() -> str | None:
    """``agent_loop_worker_3_1f2e3d4c`` (verl names its workers so) -> ``agent-loop-worker-3``."""
    if not ray.is_initialized():
        return None
    try:
        name = ray.get_runtime_context().get_actor_name()
    except Exception:
        return None
    if not name:
        return None
    return re.sub(r"_[0-9a-f]{8}$", "", name).replace("_", "-")


class ParityAgentLoopWorker(ParityAgentLoopWorkerMixin, AgentLoopWorker):
    """verl's ``AgentLoopWorker`` (the batch-returning one of ``AgentLoopManager``) with Paritywatch."""


class ParityAgentLoopManager(AgentLoopManager):
    """``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` for verl's ``AgentLoopManager``
    path: its workers are `ParityAgentLoopWorker` actors."""

    agent_loop_workers_class = ray.remote(ParityAgentLoopWorker)

    def close_parity_monitors(self) -> list[bool]:
        return close_worker_monitors(self.agent_loop_workers)


def close_worker_monitors(workers: list[Any]) -> list[bool]:
    return ray.get([worker.close_parity_monitor.remote() for worker in workers])
