"""`ParityCallback`: the trainer side of Paritywatch inside any `transformers.Trainer` (TRL's included).

Imported lazily through `trainer_hooks.integrations.trl`; see that module for usage.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from collections.abc import Mapping
from typing import Any

from transformers import TrainerCallback

logger = logging.getLogger(__name__)


class ParityCallback(TrainerCallback):
    """Fingerprints the trainer's processor, forwards the trainer's metrics, obeys pause and stop.

    Usage::

        trainer = GRPOTrainer(..., callbacks=[ParityCallback(run="my-run", url=URL, token=TOKEN)])

    ``ParityCallback(monitor=m)`` uses an existing monitor object; otherwise the keyword arguments
    go to ``trainer_hooks.monitor.ParityMonitor(side="trainer", ...)``, checked here and
    instantiated at train begin on world process zero only (other ranks open no connection).

    * on_train_begin: registers ``processing_class`` (``tokenizer`` on older transformers), the
      model's ``generation_config`` and the ``chat_template_kwargs`` the trainer renders prompts
      with (``args.chat_template_kwargs``, e.g. ``{"enable_thinking": False}``); for trainers with a sampling ``temperature`` (GRPOConfig...),
      reports what the log-prob recompute assumes (``trl_logprob_assumption``).
    * on_step_begin: blocks while the run is paused; a stop becomes ``should_save`` +
      ``should_training_stop`` (checked again at step end, so a stop saves the step just done).
    * on_log: forwards every finite numeric entry of the logs (GRPO's ``sampling/*``, ``kl``,
      ``entropy``, ``clip_ratio/*``, AsyncGRPO's ``ratio``, ``buffer_qsize`` ...) at
      ``state.global_step``.
    * on_train_end: closes the monitor (also one passed in).
    * ``callback.attest_weight_syncs(trainer)`` (optional, before ``train()``): every weight sync
      to vLLM attests the tensors it sends, at ``state.global_step`` (``model_version`` for
      AsyncGRPO); see ``trainer_hooks.integrations._trl_weights``.

    Multi-process runs: rank 0 decides and broadcasts pause/stop at each step boundary, so every
    rank stops on the same step; the other ranks wait in that broadcast while rank 0 is paused,
    so a pause longer than the process-group timeout (``ddp_timeout``) needs that timeout raised.
    """

    def __init__(self, monitor: Any = None, **monitor_kwargs: Any):
        if monitor is not None and monitor_kwargs:
            raise TypeError("pass either monitor= or ParityMonitor keyword arguments, not both")
        self._monitor = monitor
        self._make_monitor = None if monitor is not None else _monitor_factory(monitor_kwargs)

    @property
    def monitor(self) -> Any:
        return self._monitor

    def attest_weight_syncs(self, trainer: Any, **attest_options: Any) -> Any:
        """Attest the weights each of `trainer`'s syncs to vLLM sends, through this callback's
        monitor (world process zero only). `attest_options` as for `ParityMonitor.attest_weights`."""
        from ._trl_weights import instrument_weight_sync

        return instrument_weight_sync(trainer, lambda: self._monitor, **attest_options)

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        if self._monitor is None:
            self._monitor = self._make_monitor()
        processor = kwargs.get("processing_class") or kwargs.get("tokenizer")
        if processor is None:
            logger.warning("Paritywatch: the trainer has no processing_class; nothing to fingerprint")
            return
        model = kwargs.get("model")
        generation_config = getattr(getattr(model, "module", model), "generation_config", None)
        try:
            self._monitor.register_processor(processor, generation_config=generation_config,
                                             chat_template_kwargs=getattr(args, "chat_template_kwargs", None))
        except Exception:  # monitoring must never take the training run down with it
            logger.exception("Paritywatch: could not register the trainer's processor")
        self._register_model(getattr(model, "module", model))
        self._report_logprob_assumption(args)

    def _register_model(self, model) -> None:
        """The model the trainer scores with (its config, precision, the peft adapter active)."""
        register = getattr(self._monitor, "register_model", None)
        if model is None or not callable(register):
            return
        try:
            register(model)
        except Exception:
            logger.exception("Paritywatch: could not register the trainer's model")

    def _report_logprob_assumption(self, args) -> None:
        """What TRL's log-prob recompute assumes (GRPO and kin: ``logits / args.temperature``, then
        log-softmax; no top-p/top-k/min-p masking, no penalty), so the backend can compare it with
        what the rollout served. Skipped for trainers without a sampling temperature."""
        assumption = trl_logprob_assumption(args)
        report = getattr(self._monitor, "report_sampling_params", None)
        if assumption is None or not callable(report):
            return
        try:
            report(assumption, logprobs_mode="processed", source="trl")
        except Exception:
            logger.exception("Paritywatch: could not report the trainer's sampling assumption")

    def on_step_begin(self, args, state, control, **kwargs):
        stop = False
        if state.is_world_process_zero and self._monitor is not None:
            self._monitor.wait_if_paused()
            stop = bool(self._monitor.should_stop)
        if _agree_across_ranks(stop, args):
            _request_stop(control)

    def on_step_end(self, args, state, control, **kwargs):
        stop = state.is_world_process_zero and self._monitor is not None and bool(self._monitor.should_stop)
        if _agree_across_ranks(stop, args):
            _request_stop(control)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or self._monitor is None or not logs:
            return
        metrics = numeric_metrics(logs)
        if metrics:
            self._monitor.log(metrics, step=state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero or self._monitor is None:
            return
        self._monitor.close()
        if self._make_monitor is not None:
            self._monitor = None  # a later train() call builds a fresh one


def trl_logprob_assumption(args: Any) -> dict[str, Any] | None:
    """The sampling parameters TRL's recompute scores tokens with, from its config: the
    temperature only (TRL 1.16 ``_get_per_token_logps_and_entropies`` divides the logits by it and
    masks nothing, whatever top_p/top_k the rollout samples with). None without a temperature."""
    temperature = getattr(args, "temperature", None)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        return None
    return {"temperature": float(temperature)}


def _monitor_factory(monitor_kwargs: dict[str, Any]):
    """Check the arguments now (fail at construction, not in a training step); build the monitor later."""
    from trainer_hooks.monitor import ParityMonitor

    if "side" in monitor_kwargs:
        raise TypeError("ParityCallback is the trainer side: do not pass side=")
    kwargs = {"side": "trainer", **monitor_kwargs}
    inspect.signature(ParityMonitor).bind(**kwargs)  # TypeError on a wrong or missing argument
    return functools.partial(ParityMonitor, **kwargs)


def numeric_metrics(logs: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a Trainer log dict (bools, strings, None and NaN/inf dropped)."""
    out = {}
    for key, value in logs.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            value = _scalar_or_none(value)
            if value is None:
                continue
        value = float(value)
        if math.isfinite(value):
            out[key] = value
    return out


def _scalar_or_none(value: Any) -> float | None:
    # 0-d tensors and numpy scalars; bools are flags, not metrics.
    if isinstance(value, bool) or not hasattr(value, "item") or getattr(value, "ndim", 0) != 0:
        return None
    item = value.item()
    return item if isinstance(item, (int, float)) and not isinstance(item, bool) else None


def _request_stop(control) -> None:
    control.should_save = True
    control.should_training_stop = True


def _agree_across_ranks(flag: bool, args) -> bool:
    """Rank 0's decision, broadcast to every rank when several processes train together."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    import torch

    tensor = torch.tensor([int(flag)], device=args.device)
    dist.broadcast(tensor, src=0)
    return bool(tensor.item())
