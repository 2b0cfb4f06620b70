"""verl 0.9 integration: the trainer and its agent-loop rollout workers report what they really use.

Importing this module is free: verl, ray, torch and transformers load on first use of a name below.

One line changes, the module you launch (every verl override passes through unchanged)::

    export PARITYWATCH_URL=http://paritywatch:8321 PARITYWATCH_TOKEN=...   # reach every Ray worker
    python -m trainer_hooks.integrations.verl  data.train_files=... actor_rollout_ref.model.path=...

The run is verl's ``trainer.experiment_name`` in the project ``trainer.project_name`` (or
PARITYWATCH_RUN / PARITYWATCH_PROJECT); ``+trainer.paritywatch.<ParityMonitor argument>=...`` sets
more (``packs`` defaults to ``["verl"]``). That entry point is verl's own ``main_ppo`` with a task
runner (verl's ``run_ppo(config, task_runner_class)`` hook for recipes) that

* wraps the trainer class ``trainer.v1.trainer_mode`` names with `ParityTrainerMixin`, and
* sets ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` (verl's config-driven class
  path) to `ParityAgentLoopManagerTQ` unless you set your own.

Your own trainer or manager class instead (a recipe)::

    from trainer_hooks.integrations.verl import ParityTrainerMixin
    @register_trainer("my_mode")
    class MyTrainer(ParityTrainerMixin, PPOTrainerSync): ...
    # and actor_rollout_ref.rollout.agent.agent_loop_manager_class=
    #     trainer_hooks.integrations.verl.ParityAgentLoopManagerTQ   (or a subclass of it)

What each side reports (docs/design.md, "verl"): the trainer (the driver's PPO trainer) its
processor (``model_config.get_processor()``, as the actor saves it with checkpoints) with
``data.apply_chat_template_kwargs`` and the model's generation config, what the actor's log-prob
recompute assumes (logits / ``rollout.temperature``, no top-k/top-p), every metric verl logs, and
it obeys pause and stop at step boundaries. Each agent-loop worker (a Ray actor) reports the
tokenizer/processor its agent loops render prompts with, and the sampling parameters each training
request leaves with, as verl's vLLM server will serve them (log-prob mode included).
"""
from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from typing import Any

from ._lazy import lazy_names

__all__ = ["ParityAgentLoopManager", "ParityAgentLoopManagerTQ", "ParityAgentLoopWorker", "ParityAgentLoopWorkerTQ",
           "ParityTrainerMixin", "is_verl_available", "logprob_assumption", "main", "monitor_kwargs",
           "parity_trainer_class", "served_request_sampling"]

_LAZY = {
    "ParityTrainerMixin": "trainer_hooks.integrations._verl_trainer",
    "ParityTaskRunner": "trainer_hooks.integrations._verl_trainer",
    "parity_trainer_class": "trainer_hooks.integrations._verl_trainer",
    "main": "trainer_hooks.integrations._verl_trainer",
    "ParityAgentLoopWorkerMixin": "trainer_hooks.integrations._verl_rollout",
    "ParityAgentLoopWorker": "trainer_hooks.integrations._verl_rollout",
    "ParityAgentLoopManager": "trainer_hooks.integrations._verl_rollout",
    "ParityAgentLoopWorkerTQ": "trainer_hooks.integrations._verl_rollout_tq",
    "ParityAgentLoopManagerTQ": "trainer_hooks.integrations._verl_rollout_tq",
}
# Where `+trainer.paritywatch.*` overrides live in verl's config.
CONFIG_KEY = "paritywatch"
DEFAULT_PACKS = ("verl",)


def is_verl_available() -> bool:
    """Whether verl is installed, without importing it."""
    return importlib.util.find_spec("verl") is not None


def monitor_kwargs(config: Any, side: str, **overrides: Any) -> dict[str, Any]:
    """``ParityMonitor`` keyword arguments for one process of the verl job `config` describes.

    Every process gets the same run without being told: verl's ``trainer.experiment_name`` in the
    project ``trainer.project_name``, unless PARITYWATCH_RUN / PARITYWATCH_PROJECT say otherwise
    (HookSettings reads them when run/project are left out). ``trainer.paritywatch`` (a mapping of
    ParityMonitor arguments, e.g. ``+trainer.paritywatch.packs=[verl]``) and `overrides` go on top."""
    trainer = config_value(config, "trainer") or {}
    kwargs: dict[str, Any] = {"side": side}
    if side == "trainer":
        kwargs["packs"] = list(DEFAULT_PACKS)  # the metrics it forwards are the pack's
    if not os.environ.get("PARITYWATCH_RUN") and config_value(trainer, "experiment_name"):
        kwargs["run"] = str(config_value(trainer, "experiment_name"))
    if not os.environ.get("PARITYWATCH_PROJECT") and config_value(trainer, "project_name"):
        kwargs["project"] = str(config_value(trainer, "project_name"))
    kwargs.update(_plain(config_value(trainer, CONFIG_KEY) or {}))
    kwargs.update(overrides)
    if kwargs["side"] != side:
        raise ValueError(f"trainer.{CONFIG_KEY}.side cannot be set: this process is the {side} side")
    return kwargs


def logprob_assumption(config: Any) -> dict[str, Any]:
    """What verl's actor log-prob recompute assumes (verl 0.9 ``PPOTrainer._update_actor`` and
    ``_step_once`` put ``rollout.temperature`` in the batch's ``extra_info``; the engines divide the
    logits by it, then log-softmax, with no top-k/top-p masking and no penalty)."""
    rollout = config_value(config_value(config, "actor_rollout_ref"), "rollout")
    return {"temperature": float(config_value(rollout, "temperature", 1.0))}


def served_request_sampling(rollout_config: Any, request: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling values verl's vLLM server builds one request's ``SamplingParams`` from (verl 0.9
    ``vLLMHttpServer.generate``): the agent loop's dict, with ``repetition_penalty`` defaulting to
    ``rollout.repetition_penalty`` (1.0). Values the dict leaves out are vLLM's ``SamplingParams``
    defaults: verl builds the object itself, so no generation_config.json value is filled in."""
    params = dict(request)
    params.setdefault("repetition_penalty", float(config_value(rollout_config, "repetition_penalty", 1.0)))
    return params


def require_attrs(obj: Any, names: tuple[str, ...], what: str) -> None:
    """Fail at construction when verl no longer has a name this integration relies on."""
    missing = [n for n in names if not hasattr(obj, n)]
    if missing:
        raise TypeError(f"{type(obj).__name__} is not {what} (missing {', '.join(missing)}): "
                        f"is this verl 0.9?")


def config_value(obj: Any, key: str, default: Any = None) -> Any:
    """A key of an OmegaConf DictConfig, a dataclass config or a mapping (None-safe)."""
    if obj is None:
        return default
    if isinstance(obj, Mapping) or hasattr(obj, "get") and not hasattr(obj, "__dataclass_fields__"):
        try:
            value = obj.get(key, default)
        except Exception:  # an OmegaConf MISSING value
            return default
        return default if value is None else value
    value = getattr(obj, key, default)
    return default if value is None else value


def _plain(value: Any) -> Any:
    """An OmegaConf container as plain dicts and lists (ParityMonitor's arguments are checked as such)."""
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(value):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:
        pass
    return dict(value) if isinstance(value, Mapping) else value


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())


if __name__ == "__main__":  # python -m trainer_hooks.integrations.verl <verl overrides>
    from trainer_hooks.integrations._verl_trainer import main as _main

    _main()
