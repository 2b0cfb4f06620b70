"""The trainer side of verl 0.9 (the v1 ``PPOTrainer`` on the driver's task runner).

Imported lazily through `trainer_hooks.integrations.verl` (this module imports verl, ray, torch).
verl's v1 trainer calls its own lifecycle hooks (``PPOTrainer.fit``: ``init`` ->
``on_init_end``; ``fit`` -> [``on_validate_begin``] -> ``on_train_begin`` -> per step
``on_step_begin`` ... ``on_step_end`` -> ``self.logger.log(metrics, step)``): the mixin takes those.
"""
from __future__ import annotations

import logging
from typing import Any

import ray
from verl.trainer import main_ppo
from verl.trainer.ppo.v1 import trainer_base

from .verl import logprob_assumption, monitor_kwargs, require_attrs

logger = logging.getLogger(__name__)

# verl names this mixin relies on; checked at construction so a verl refactor fails there, not in a step.
_REQUIRED_TRAINER_ATTRS = ("on_init_end", "on_train_begin", "on_validate_begin", "on_step_end", "on_train_end",
                           "fit", "_save_checkpoint", "_shutdown_dump_executor")
METRICS_BACKEND = "paritywatch"


class _StopRequested(Exception):
    """Raised from a hook before the first step: `fit` ends at once (a stop while paused before training)."""


class ParityTrainerMixin:
    """Put first in the bases of a verl v1 ``PPOTrainer`` (``class T(ParityTrainerMixin, PPOTrainerSync)``).

    * construction: starts the trainer's ``ParityMonitor`` (arguments: `monitor_kwargs`, so a wrong
      ``trainer.paritywatch`` entry fails here).
    * ``on_init_end`` (after verl loaded the tokenizer and synced the rollout's weights):
      `register_with_paritywatch`.
    * ``on_validate_begin`` / ``on_train_begin``: verl's metrics logger (``Tracking``) gets a
      ``paritywatch`` backend, so every metric verl logs (``rollout_corr/*``,
      ``training/rollout_probs_diff_*``, ``actor/*`` ...) is forwarded at verl's step.
      ``on_train_begin`` also blocks while the run is paused (a mismatch found as the rollout
      workers registered pauses the run before its first step) and ends ``fit`` on a stop.
    * ``on_step_end`` (after the step's weight sync): blocks while paused; a stop saves a checkpoint
      (when ``trainer.save_freq`` > 0 and this step has none yet) and makes this step the last.
    * ``fit`` returning closes the agent-loop workers' monitors (a Paritywatch manager's), then the
      trainer's: the run shows ``finished``, or ``stopped`` after a stop.

    verl's driver is one process: no rank agreement is needed.
    """

    parity_monitor: Any = None

    def __init__(self, config: Any, *args: Any, **kwargs: Any):
        super().__init__(config, *args, **kwargs)
        require_attrs(self, _REQUIRED_TRAINER_ATTRS, "a verl v1 PPOTrainer")
        from trainer_hooks.monitor import ParityMonitor

        self.parity_monitor = ParityMonitor(**monitor_kwargs(config, "trainer"))

    # ------------------------------------------------------------------ what the trainer uses

    def register_with_paritywatch(self) -> Any:
        """Register the processor verl's trainer side uses and what its recompute assumes.

        The processor is ``model_config.get_processor()`` (the multimodal processor, else the
        tokenizer), as verl's ``_init_tokenizer`` loaded it (``custom_chat_template`` applied) and as
        the actor's checkpoints save it; the chat probes are rendered with
        ``data.apply_chat_template_kwargs`` (what verl's dataset renders prompts with); the eos ids
        and sampling defaults are the model's generation config as verl reads it. Returns the Future
        of the fingerprint."""
        future = self.parity_monitor.register_processor(**trainer_registration(self))
        self.parity_monitor.report_sampling_params(logprob_assumption(self.config), logprobs_mode="processed",
                                                   source="verl_actor")
        try:
            from ._verl_model import trainer_model_components

            self.parity_monitor.report_model_components(
                trainer_model_components(self.config, model_local_dir(self.config)), {"model_source": "verl_actor"})
        except Exception:  # the processor registration stands without it
            logger.exception("Paritywatch: could not read the trainer's model config")
        return future

    # ------------------------------------------------------------------ verl's hooks

    def on_init_end(self) -> None:
        super().on_init_end()
        try:
            self.register_with_paritywatch()
        except Exception:  # monitoring must never take the run down with it
            logger.exception("Paritywatch: could not register the trainer's processor")

    def on_validate_begin(self) -> None:
        super().on_validate_begin()
        self._forward_metrics()

    def on_train_begin(self) -> None:
        self._forward_metrics()
        self.parity_monitor.wait_if_paused()
        if self.parity_monitor.should_stop:
            raise _StopRequested
        super().on_train_begin()

    def on_step_end(self) -> None:
        super().on_step_end()
        self.parity_monitor.wait_if_paused()
        if self.parity_monitor.should_stop:
            self._stop_after_this_step()

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        """verl's ``fit``; its return closes the monitors (an exception leaves them to the
        process's exit, as a crash: the run is not ``finished``)."""
        try:
            result = super().fit(*args, **kwargs)
        except _StopRequested:
            logger.warning("Paritywatch: the run was stopped before its first step")
            self.on_train_end()  # what verl's fit does when its loop ends
            self._shutdown_dump_executor()
            result = None
        self.close_paritywatch()
        return result

    def close_paritywatch(self) -> None:
        """Close the agent-loop workers' monitors (a Paritywatch manager's), then the trainer's."""
        close_workers = getattr(getattr(self, "agent_loop_manager", None), "close_parity_monitors", None)
        if callable(close_workers):
            try:
                close_workers()
            except Exception:
                logger.exception("Paritywatch: could not close the agent-loop workers' monitors")
        self.parity_monitor.close()

    def _stop_after_this_step(self) -> None:
        """verl's loop runs while ``global_steps <= total_training_steps`` and counts the step after
        ``on_step_end``: ending the count here makes this step the last one logged."""
        save_freq = self.config.trainer.save_freq
        if save_freq > 0 and not self._verl_saved_this_step(save_freq):
            self._save_checkpoint()
        logger.warning("Paritywatch: stop requested; step %s is the last", self.global_steps)
        self.total_training_steps = self.global_steps

    def _verl_saved_this_step(self, save_freq: int) -> bool:
        """verl's fit saves on every save_freq-th step and on the last one."""
        return self.global_steps % save_freq == 0 or self.global_steps >= self.total_training_steps

    def _forward_metrics(self) -> None:
        tracking = getattr(self, "logger", None)
        backends = getattr(tracking, "logger", None)
        if isinstance(backends, dict) and METRICS_BACKEND not in backends:
            backends[METRICS_BACKEND] = MetricsForwarder(self.parity_monitor)


class MetricsForwarder:
    """A backend of verl's ``Tracking`` (it calls ``backend.log(data=..., step=...)`` on each)."""

    def __init__(self, monitor: Any):
        self.monitor = monitor

    def log(self, data: dict[str, Any], step: int) -> None:
        from ._trl_callback import numeric_metrics

        metrics = numeric_metrics(data)
        if metrics:
            self.monitor.log(metrics, step=int(step))


def trainer_registration(trainer: Any) -> dict[str, Any]:
    """``register_processor`` arguments for a verl trainer after its ``_init_tokenizer`` (the model
    config goes separately: ``_verl_model.trainer_model_components``)."""
    processor = trainer.processor if getattr(trainer, "processor", None) is not None else trainer.tokenizer
    data = trainer.config.data
    return {"processor": processor, "generation_config": model_generation_config(trainer.config),
            "chat_template_kwargs": dict(data.get("apply_chat_template_kwargs") or {})}


def model_generation_config(config: Any) -> Any:
    """The model's generation config as verl's ``HFModelConfig`` loads it (``hf_config_path`` or ``path``)."""
    from verl.utils.model import get_generation_config

    model = config.actor_rollout_ref.model
    return get_generation_config(model_local_dir(config), trust_remote_code=model.get("trust_remote_code", False))


def model_local_dir(config: Any) -> str:
    """The local copy of the model's config directory, as verl's ``HFModelConfig`` makes it."""
    from verl.utils.fs import copy_to_local

    model = config.actor_rollout_ref.model
    return copy_to_local(model.get("hf_config_path") or model.path, use_shm=model.get("use_shm", False))


def parity_trainer_class(base: type) -> type:
    """``base`` (a verl v1 PPOTrainer class) with `ParityTrainerMixin` first. Built here, in the
    process that runs it (verl's task runner): the class is never pickled."""
    if issubclass(base, ParityTrainerMixin):
        return base
    if not issubclass(base, trainer_base.PPOTrainer):
        raise TypeError(f"{base.__name__} is not a verl v1 PPOTrainer")
    return type(f"Parity{base.__name__}", (ParityTrainerMixin, base), {"__module__": __name__})


# --------------------------------------------------------------------------- the entry point

MANAGER_KEY = "agent_loop_manager_class"
PARITY_MANAGER = "trainer_hooks.integrations.verl.ParityAgentLoopManagerTQ"


def instrument_config(config: Any) -> None:
    """Make verl build Paritywatch's agent-loop manager unless the config names its own."""
    from omegaconf import open_dict

    agent = config.actor_rollout_ref.rollout.agent
    if not agent.get(MANAGER_KEY):
        with open_dict(agent):
            agent[MANAGER_KEY] = PARITY_MANAGER


def instrument_trainer_registry(mode: str) -> type:
    """In this process only, make verl's trainer registry hand out `mode`'s class with the mixin."""
    cls = parity_trainer_class(trainer_base.get_trainer_cls(mode))
    trainer_base.TRAINER_REGISTRY[mode] = cls
    return cls


@ray.remote
class ParityTaskRunner(main_ppo.TaskRunnerV1.__ray_actor_class__):
    """verl's v1 task runner, with the trainer class wrapped and the agent-loop manager set."""

    def run(self, config: Any) -> Any:
        instrument_trainer_registry(config.trainer.v1.trainer_mode)
        instrument_config(config)
        return super().run(config)


def main() -> None:
    """``python -m trainer_hooks.integrations.verl <overrides>``: verl's ``main_ppo`` with the
    Paritywatch task runner (verl's ``run_ppo(config, task_runner_class)``)."""
    import hydra

    @hydra.main(config_path="pkg://verl.trainer.config", config_name="ppo_trainer", version_base=None)
    def _main(config: Any) -> None:
        main_ppo.auto_set_device(config)
        main_ppo.validate_config(config=config, use_reference_policy=main_ppo.need_reference_policy(config),
                                 use_critic=main_ppo.need_critic(config))
        if not config.trainer.use_v1:
            raise SystemExit("Paritywatch instruments verl's v1 trainer: set trainer.use_v1=True")
        main_ppo.run_ppo(config, task_runner_class=ParityTaskRunner)

    _main()

