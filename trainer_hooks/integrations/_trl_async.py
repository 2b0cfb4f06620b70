"""The rollout side of TRL's `experimental.async_grpo`, instrumented from inside the worker process.

TRL 1.16's `AsyncRolloutWorker` (the parent-side controller) spawns a child process and builds
`_AsyncRolloutLoop(**loop_kwargs)` there; the loop class is the class attribute `_loop_cls`. The
loop renders every prompt with ``self.tokenizer`` (after ``add_response_schema``) and, when tools
are used with a template that is not prefix-preserving, with ``self.chat_template``. So the place
that sees the processor the rollout REALLY uses is the loop's ``__init__`` in the child.
`ParityRolloutLoop` registers exactly that processor, with a generation config holding the eos ids
and sampling values the loop sends to vLLM, and forwards the loop's own ``rollout/*`` metrics.

Two ways in (see `trainer_hooks.integrations.trl`): `instrument_rollout_worker(worker, ...)` on the
worker `AsyncGRPOTrainer` built (before ``train()``), or `ParityAsyncRolloutWorker` passed as
``rollout_worker=``. Imported lazily: importing this module imports trl, torch and datasets.
"""

from __future__ import annotations

import copy
import logging
import os
import warnings
from typing import Any

from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker, _AsyncRolloutLoop

logger = logging.getLogger(__name__)

# Loop kwarg carrying (monitor_factory or None, monitor kwargs) into the spawned child; picklable.
PARITY_KWARG = "parity_monitor"
# The private TRL hooks this relies on; checked so a TRL refactor fails at setup, not silently.
_REQUIRED_WORKER_ATTRS = ("_loop_cls", "_loop_kwargs", "_process")


class ParityRolloutLoop(_AsyncRolloutLoop):
    """`_AsyncRolloutLoop` that reports its processor and metrics to Paritywatch (runs in the child)."""

    def __init__(self, *, parity_monitor: tuple[Any, dict[str, Any]] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.parity_monitor = _start_monitor(parity_monitor)
        if self.parity_monitor is None:
            return
        try:
            self.parity_monitor.register_processor(
                self.effective_processor(), generation_config=self.effective_generation_config(),
                chat_template_kwargs=self.chat_template_kwargs,  # every prompt is rendered with them
            )
        except Exception:  # never take the rollout worker down
            logger.exception("Paritywatch: could not register the rollout worker's processor")
        report = getattr(self.parity_monitor, "report_sampling_params", None)
        if callable(report):
            served = self.served_sampling()  # the log-prob mode is the vLLM server's: not known here
            report(served["params"], source="trl_async_rollout",
                   filled_from_generation_config=served["filled_from_generation_config"])

    def served_sampling(self) -> dict[str, Any]:
        """What the vLLM server samples the loop's requests with: the values every request sets
        (`_generate_one_turn` leaves `min_p` out when None, and a None elsewhere is a JSON null),
        each unset one filled from the model's generation_config.json as the server does by default
        (`openai_server.request_sampling_params`). The file is read from `model_name` when it is a
        folder, else from the Hugging Face cache; not found, unset values are vLLM's own defaults."""
        from .openai_server import request_sampling_params

        return request_sampling_params(self.request_sampling(), model_dir=_local_model_dir(self.model_name))

    def request_sampling(self) -> dict[str, Any]:
        """The sampling values the loop puts in its requests (None: not sent, or sent as null)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p,
                "repetition_penalty": self.repetition_penalty}

    def effective_processor(self) -> Any:
        """The tokenizer exactly as prompts are rendered with it, training template swap included."""
        if self.chat_template is None:
            return self.tokenizer
        swapped = copy.copy(self.tokenizer)  # shallow: same vocab, only the template differs
        swapped.chat_template = self.chat_template
        return swapped

    def effective_generation_config(self) -> Any:
        """What the loop really asks vLLM for: its eos ids and sampling values (not the model's defaults)."""
        from transformers import GenerationConfig

        with warnings.catch_warnings():  # top_k=0 / temperature=1.0 combos trip GenerationConfig's advisories
            warnings.simplefilter("ignore")
            return GenerationConfig(
                eos_token_id=list(self.eos_token_ids),
                pad_token_id=self.tokenizer.pad_token_id,
                do_sample=True,
                **self.request_sampling(),
            )

    def _push_metrics(self, values: dict[str, Any]) -> None:
        if self.parity_monitor is not None:
            # The same payload TRL sends its trainer (the parent clears counters and rates, so read them first).
            # Rates arrive as (numerator, denominator); the rollout has no step, the policy version is its clock.
            payload = {**values, **self._counters, **{k: tuple(v) for k, v in self._rates.items()}}
            metrics = {k: _rate_value(v) for k, v in payload.items()}
            metrics = {k: v for k, v in metrics.items() if v is not None}
            if metrics:
                self.parity_monitor.log(metrics, step=self.model_version)
            self.parity_monitor.set_policy_version(self.model_version)  # the version this worker serves
        super()._push_metrics(values)

    def run(self) -> None:
        try:
            super().run()
        finally:
            if self.parity_monitor is not None:
                self.parity_monitor.close()


def _local_model_dir(model_name: str) -> str | None:
    """The folder holding `model_name`'s generation_config.json on this machine, if any (never downloads)."""
    if os.path.isdir(model_name):
        return model_name
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model_name, "generation_config.json")
    except Exception:  # not a repo id, no hub library: nothing to read
        return None
    return os.path.dirname(cached) if isinstance(cached, str) else None


class ParityAsyncRolloutWorker(AsyncRolloutWorker):
    """`AsyncRolloutWorker` whose child runs `ParityRolloutLoop`.

    ``ParityAsyncRolloutWorker(parity_monitor_kwargs={"run": ..., "url": ..., "token": ...},
    **AsyncRolloutWorker_kwargs)``; pass it as ``AsyncGRPOTrainer(rollout_worker=...)``.
    ``parity_monitor_factory``: a picklable callable building the monitor in the child (default
    ``trainer_hooks.monitor.ParityMonitor``).
    """

    _loop_cls = ParityRolloutLoop

    def __init__(
        self,
        *,
        parity_monitor_kwargs: dict[str, Any] | None = None,
        parity_monitor_factory: Any = None,
        **worker_kwargs: Any,
    ):
        super().__init__(**worker_kwargs)
        self._loop_kwargs[PARITY_KWARG] = _monitor_spec(parity_monitor_factory, parity_monitor_kwargs or {})


def instrument_rollout_worker(worker: Any, *, monitor_factory: Any = None, **monitor_kwargs: Any) -> Any:
    """Make an `AsyncRolloutWorker` that has not started yet run `ParityRolloutLoop` in its child.

    ``monitor_kwargs`` go to ``ParityMonitor(side="rollout", ...)`` in the child process (they
    must pickle); ``monitor_factory`` replaces ``ParityMonitor``. Returns the worker.
    """
    missing = [a for a in _REQUIRED_WORKER_ATTRS if not hasattr(worker, a)]
    if missing:
        raise TypeError(f"{type(worker).__name__} is not a TRL AsyncRolloutWorker (missing {', '.join(missing)})")
    if worker._process is not None:
        raise RuntimeError("instrument the rollout worker before it starts (before trainer.train())")
    if worker._loop_cls is _AsyncRolloutLoop:
        worker._loop_cls = ParityRolloutLoop
    elif not issubclass(worker._loop_cls, ParityRolloutLoop):
        # The child imports the loop class by name, so a mix-in built here could not be pickled.
        raise TypeError(
            f"{worker._loop_cls.__name__} is a custom rollout loop: define "
            f"`class MyLoop(ParityRolloutLoop, {worker._loop_cls.__name__})` at module level and set it as _loop_cls"
        )
    worker._loop_kwargs[PARITY_KWARG] = _monitor_spec(monitor_factory, monitor_kwargs)
    return worker


def _monitor_spec(factory: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Check the monitor arguments in the parent, where a mistake is cheap to report."""
    import inspect

    if "side" in kwargs:
        raise TypeError("the rollout worker's monitor is the rollout side: do not pass side=")
    if factory is None:
        from trainer_hooks.monitor import ParityMonitor

        inspect.signature(ParityMonitor).bind(side="rollout", **kwargs)
    return factory, {"side": "rollout", **kwargs}


def _start_monitor(spec: tuple[Any, dict[str, Any]] | None) -> Any:
    if spec is None:
        return None
    factory, kwargs = spec
    if factory is None:
        from trainer_hooks.monitor import ParityMonitor as factory
    try:
        return factory(**kwargs)
    except Exception:
        logger.exception("Paritywatch: could not start the rollout worker's monitor")
        return None


def _rate_value(value: Any) -> float | None:
    if isinstance(value, tuple):
        numerator, denominator = value
        return float(numerator) / denominator if denominator else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
