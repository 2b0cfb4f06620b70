"""Paritywatch hooks: live inside training and rollout processes.

    from trainer_hooks import ParityMonitor
    monitor = ParityMonitor(run="grpo-qwen", side="trainer")   # PARITYWATCH_URL / _TOKEN from env
    monitor.register_processor(tokenizer, generation_config=model.generation_config)
    monitor.log({"loss": 0.3}, step=10)                       # enqueue only: never blocks, never raises
    monitor.wait_if_paused()                                   # at a step boundary
    monitor.attest_weights(model, version=step)                # each weight sync, on both sides

Imports only the standard library, httpx and urllib3; transformers / torch / vllm load lazily.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["ParityMonitor", "fingerprint_processor", "diff_fingerprints", "assert_processor_consistent",
           "compute_alignment_metrics", "RolloutRecord"]
__version__ = "0.1.0"

if TYPE_CHECKING:  # pragma: no cover
    from trainer_hooks.alignment import RolloutRecord, compute_alignment_metrics
    from trainer_hooks.fingerprint import assert_processor_consistent, diff_fingerprints, fingerprint_processor
    from trainer_hooks.monitor import ParityMonitor

_LAZY = {
    "ParityMonitor": "trainer_hooks.monitor",
    "fingerprint_processor": "trainer_hooks.fingerprint",
    "diff_fingerprints": "trainer_hooks.fingerprint",
    "assert_processor_consistent": "trainer_hooks.fingerprint",
    "compute_alignment_metrics": "trainer_hooks.alignment",
    "RolloutRecord": "trainer_hooks.alignment",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trainer_hooks' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
