"""Weight-sync attestation for a monitor: digests on the caller's thread, the upload queued.

`attest.py` computes the digests (its hashing libraries load on first use, so it is imported
lazily here); this room turns the monitor's arguments into options, hashes a whole state dict or a
stream of tensors on their way to the sync, and queues the attestation for the worker thread.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Mapping

from .guard import Guard, guarded

Attestation = dict[str, Any]


class WeightAttester:
    """`submit` queues an attestation (the worker's `submit_attestation`); `is_open()` and
    `rearm()` as the monitor's: enabled and not closed, and a forked child re-armed."""

    def __init__(self, submit: Callable[[Attestation], Any], is_open: Callable[[], bool],
                 rearm: Callable[[], None], guard: Guard) -> None:
        self._submit = submit
        self._is_open = is_open
        self._rearm = rearm
        self._guard = guard

    def attest(self, model_or_state_dict: Any, version: int, **options: Any) -> Attestation | None:
        from .attest import digest_weights

        if not self._is_open():
            return None
        return self.submit(digest_weights(model_or_state_dict, version, attest_options(**options)))

    def stream(self, named_tensors: Iterable[tuple[str, Any]], version: int,
               options: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
        digest = self._stream_digest(version, options)
        hashing = digest is not None
        try:
            for name, tensor in named_tensors:
                if hashing:
                    hashing = self._stream_add(digest, name, tensor)
                yield name, tensor
            if hashing:
                self._stream_finish(digest)
        finally:  # a sync that stopped half-way attests nothing, and leaves no hashing threads behind
            if digest is not None:
                digest.close()

    # The stream's steps guard themselves: the host's loop, not a monitor method, is on the stack.

    @guarded(default=None)
    def _stream_digest(self, version: int, options: Mapping[str, Any]) -> Any:
        from .attest import WeightsDigest

        if not self._is_open():
            return None
        return WeightsDigest(version, attest_options(**options))

    @guarded(default=False)
    def _stream_add(self, digest: Any, name: str, tensor: Any) -> bool:
        digest.add([(name, tensor)])
        return True

    @guarded(default=None)
    def _stream_finish(self, digest: Any) -> Attestation | None:
        return self.submit(digest.result())

    def submit(self, attestation: Attestation) -> Attestation:
        """Queue `attestation` (computed here or by an integration); its summary, without the tensors."""
        from .attest import summary

        self._rearm()
        self._submit(attestation)
        return summary(attestation)


def attest_options(*, mode: str = "full", algo: str = "", threads: int = 0, block_bytes: int | None = None,
                   chunk_bytes: int | None = None, chunks: int | None = None) -> Any:
    """AttestOptions from `attest_weights` arguments (None: the default), checked."""
    from .attest import AttestOptions  # lazy: hashing libraries load on first use

    sizes = {k: v for k, v in (("block_bytes", block_bytes), ("chunk_bytes", chunk_bytes), ("chunks", chunks))
             if v is not None}
    return AttestOptions(algo=algo, mode=mode, threads=threads, **sizes).checked()
