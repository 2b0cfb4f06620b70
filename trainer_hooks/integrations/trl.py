"""TRL / transformers integration: a trainer callback and an instrumented AsyncGRPO rollout worker.

Importing this module is free: transformers, torch and trl load on first use of a name below.

Trainer side (any `transformers.Trainer`, including TRL's `GRPOTrainer` and `AsyncGRPOTrainer`)::

    from trainer_hooks.integrations.trl import ParityCallback

    trainer = GRPOTrainer(model=..., processing_class=tokenizer, reward_funcs=...,
                          callbacks=[ParityCallback(run="qwen-grpo", url="http://paritywatch:8000",
                                                    token=os.environ["PARITYWATCH_TOKEN"])])
    trainer.train()

Rollout side of TRL's `experimental.async_grpo` (the worker runs in a spawned child process, so
the child fingerprints the processor it really renders prompts with)::

    from trainer_hooks.integrations.trl import instrument_rollout_worker

    trainer = AsyncGRPOTrainer(..., callbacks=[ParityCallback(run=..., url=..., token=...)])
    instrument_rollout_worker(trainer.rollout_worker, run=..., url=..., token=...)  # before train()
    trainer.train()

Weight-sync attestation on the trainer side (optional; each tensor is hashed as the sync sends it)::

    callback = ParityCallback(run=..., url=..., token=...)
    trainer = GRPOTrainer(..., callbacks=[callback])      # or AsyncGRPOTrainer
    callback.attest_weight_syncs(trainer)                 # before train()

or, when you build the worker yourself, pass
``rollout_worker=ParityAsyncRolloutWorker(parity_monitor_kwargs={...}, **worker_kwargs)``.
"""

from __future__ import annotations

import importlib.util

from ._lazy import lazy_names

__all__ = ["ParityCallback", "ParityAsyncRolloutWorker", "instrument_rollout_worker", "instrument_weight_sync",
           "is_trl_available"]

_LAZY = {
    "ParityCallback": "trainer_hooks.integrations._trl_callback",
    "ParityAsyncRolloutWorker": "trainer_hooks.integrations._trl_async",
    "ParityRolloutLoop": "trainer_hooks.integrations._trl_async",
    "instrument_rollout_worker": "trainer_hooks.integrations._trl_async",
    "instrument_weight_sync": "trainer_hooks.integrations._trl_weights",
}


def is_trl_available() -> bool:
    """Whether TRL is installed, without importing it."""
    return importlib.util.find_spec("trl") is not None


def is_transformers_available() -> bool:
    return importlib.util.find_spec("transformers") is not None


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
