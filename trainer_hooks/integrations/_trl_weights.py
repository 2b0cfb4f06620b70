"""Trainer-side weight attestation at TRL's weight syncs (docs/design.md, "Weight-sync attestation").

TRL sends weights to vLLM in two places, both of which stream (name, tensor) pairs:

* `GRPOTrainer` (and RLOO, online DPO...): `trainer.vllm_generation.sync_weights()` walks
  `VLLMGeneration._iter_named_params()` (gathering each parameter under ZeRO-3, the vLLM names
  already fixed) and hands the pairs to `load_weights` (colocate) or the NCCL client (server), at
  the step `trainer.state.global_step`.
* `AsyncGRPOTrainer`: `trainer.weight_transfer.send_weights(iterator)` streams to the server; the
  version it publishes is `trainer.model_version + 1` (bumped after the send, and what the rollout
  worker is told).

Both get the iterator wrapped in `ParityMonitor.attest_stream`: each tensor is hashed while the
sync has it at hand (nothing is gathered twice), and the attestation is queued when the sync has
sent them all. Imported lazily through `trainer_hooks.integrations.trl`.
"""
from __future__ import annotations

from typing import Any, Callable


def instrument_weight_sync(trainer: Any, monitor: Any, **attest_options: Any) -> Any:
    """Attest, on the trainer side, the weights each TRL weight sync sends. `monitor`: a
    ParityMonitor, or a callable returning one or None (None: that rank does not attest; the
    `ParityCallback` builds its monitor on world process zero only). `attest_options` as for
    `ParityMonitor.attest_weights` (e.g. `mode="sampled"`). Returns the trainer."""
    monitor_of: Callable[[], Any] = monitor if callable(monitor) and not hasattr(monitor, "attest_stream") \
        else (lambda: monitor)
    generation = getattr(trainer, "vllm_generation", None)
    transfer = getattr(trainer, "weight_transfer", None)
    if generation is not None and hasattr(generation, "_iter_named_params"):
        _wrap_method(generation, "_iter_named_params",
                     lambda original: _attested(original, monitor_of, lambda: trainer.state.global_step, attest_options))
    elif transfer is not None and hasattr(transfer, "send_weights"):
        _wrap_method(transfer, "send_weights", lambda original: lambda iterator, *a, **kw: original(
            _attested(lambda: iterator, monitor_of, lambda: trainer.model_version + 1, attest_options)(), *a, **kw))
    else:
        raise ValueError("this trainer sends no weights to vLLM (no vllm_generation nor weight_transfer: "
                         "use_vllm=False?); nothing to attest")
    return trainer


def _wrap_method(obj: Any, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    original = getattr(obj, name)
    if getattr(original, "_paritywatch_attested", False):
        return  # instrumented already
    wrapped = wrap(original)
    wrapped._paritywatch_attested = True
    setattr(obj, name, wrapped)


def _attested(original: Callable[[], Any], monitor_of: Callable[[], Any], version_of: Callable[[], int],
              options: dict[str, Any]) -> Callable[[], Any]:
    """A stand-in for `original()` (an iterator of (name, tensor)) that attests what it yields.
    On the first server-mode sync TRL walks the parameters twice (their metadata, then the send):
    both passes attest the same version, and the later one replaces the first."""

    def iterate() -> Any:
        monitor = monitor_of()
        if monitor is None:
            return original()
        return monitor.attest_stream(original(), version=version_of(), **options)

    return iterate
