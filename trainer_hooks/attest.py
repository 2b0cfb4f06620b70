"""Weight-sync attestation: a digest per tensor of the weights a process holds for a version
(docs/design.md, "Weight-sync attestation").

The trainer attests the tensors it is about to send; each rollout worker attests the tensors it
loaded. Equal digests under equal names mean equal bytes; the backend names the tensors that
differ. Pure computation, no I/O: `ParityMonitor.attest_weights` sends the result.

A tensor's digest covers its dtype, its shape and its bytes in row-major order. Its bytes are
hashed in blocks of `block_bytes` (each block with the algorithm, then the block digests with it
again), so one large tensor is spread over several threads and the digest does not depend on how
many threads there were. `xxh3_128` (the `xxhash` package) runs at memory speed and releases the
GIL in `update()` for buffers over 64 KiB (not in its constructor, so blocks go through update);
without it, `sha256` from the standard library (about 4x slower). CPU tensors are read in
place (a zero-copy view of their bytes; bf16 and other dtypes numpy lacks are viewed as uint8);
a tensor on an accelerator is copied to the host one block at a time, so the copy stays bounded.

Sampled mode, for models too large to hash at every sync: of each tensor larger than
`chunks * chunk_bytes`, only `chunks` chunks of `chunk_bytes` are hashed: the first, the last,
and the rest at offsets drawn from a generator seeded with the tensor's name, dtype, shape and
the version. Both sides draw the same offsets; a different version samples other bytes, so a
corruption that persists is found over a few syncs. The payload says it is sampled.
"""
from __future__ import annotations

import hashlib
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from . import contract

DEFAULT_BLOCK_BYTES = 16 << 20
DEFAULT_CHUNK_BYTES = 64 << 10
DEFAULT_CHUNKS = 16


def default_algo() -> str:
    try:
        import xxhash  # noqa: F401
    except ImportError:
        return "sha256"
    return "xxh3_128"


def _hasher(algo: str) -> Callable[[], Any]:
    if algo == "xxh3_128":
        import xxhash

        return xxhash.xxh3_128
    if algo == "sha256":
        return hashlib.sha256
    raise ValueError(f"algo must be one of {contract.ATTEST_ALGOS}, not {algo!r}")


@dataclass(frozen=True)
class AttestOptions:
    algo: str = ""  # "": xxh3_128 when xxhash is installed, else sha256
    mode: str = "full"  # full | sampled
    block_bytes: int = DEFAULT_BLOCK_BYTES
    chunk_bytes: int = DEFAULT_CHUNK_BYTES  # sampled mode only
    chunks: int = DEFAULT_CHUNKS  # sampled mode only
    threads: int = 0  # 0: min(8, cpu count)

    def checked(self) -> "AttestOptions":
        algo = self.algo or default_algo()
        _hasher(algo)
        if self.mode not in contract.ATTEST_MODES:
            raise ValueError(f"mode must be one of {contract.ATTEST_MODES}, not {self.mode!r}")
        if self.block_bytes < 4096 or self.chunk_bytes < 1 or self.chunks < 2:
            raise ValueError("block_bytes >= 4096, chunk_bytes >= 1 and chunks >= 2")
        threads = self.threads or min(8, os.cpu_count() or 1)
        return AttestOptions(algo, self.mode, self.block_bytes, self.chunk_bytes, self.chunks, threads)

    def settings(self) -> dict[str, Any]:
        """What both sides must agree on for their digests to be comparable."""
        sample = {"chunk_bytes": self.chunk_bytes, "chunks": self.chunks} if self.mode == "sampled" else None
        return {"algo": self.algo, "mode": self.mode, "block_bytes": self.block_bytes, "sample": sample}


# --------------------------------------------------------------------------- tensors as bytes

@dataclass
class TensorBytes:
    """One tensor's identity and a way to read a byte range of it without copying the whole."""

    name: str
    dtype: str
    shape: list[int]
    nbytes: int
    read: Callable[[int, int], Any]  # (offset, length) -> a buffer


def named_tensors(weights: Any) -> list[tuple[str, Any]]:
    """(name, tensor) pairs of a model (its state_dict), a mapping, or an iterable of pairs (what
    vLLM's `load_weights` takes)."""
    if hasattr(weights, "state_dict") and callable(weights.state_dict):
        weights = weights.state_dict()
    items = weights.items() if isinstance(weights, Mapping) else weights
    pairs = [(str(name), tensor) for name, tensor in items]
    seen: set[str] = set()
    for name, _ in pairs:
        if name in seen:
            raise ValueError(f"tensor name {name!r} appears twice")
        if not 0 < len(name) <= contract.MAX_TENSOR_NAME_LENGTH:
            raise ValueError(f"tensor names are 1..{contract.MAX_TENSOR_NAME_LENGTH} characters")
        seen.add(name)
    if len(pairs) > contract.MAX_ATTEST_TENSORS:
        raise ValueError(f"at most {contract.MAX_ATTEST_TENSORS} tensors per attestation (got {len(pairs)})")
    return pairs


def tensor_bytes(name: str, tensor: Any) -> TensorBytes:
    """Torch tensors (any device), numpy arrays, bytes-like objects, and TensorBytes (a source
    read by range without loading it whole, e.g. a memory-mapped checkpoint; its name is used)."""
    if isinstance(tensor, TensorBytes):
        return tensor
    module = type(tensor).__module__
    if module.startswith("torch"):
        return _torch_bytes(name, tensor)
    if module.startswith("numpy"):
        import numpy as np

        array = np.ascontiguousarray(tensor)
        flat = array.reshape(-1).view(np.uint8)
        return TensorBytes(name, str(array.dtype), list(array.shape), flat.nbytes,
                           lambda off, n: memoryview(flat[off:off + n]))
    view = memoryview(tensor).cast("B")
    return TensorBytes(name, "uint8", [view.nbytes], view.nbytes, lambda off, n: view[off:off + n])


def _torch_bytes(name: str, tensor: Any) -> TensorBytes:
    import torch

    t = tensor.detach()
    dtype, shape = str(t.dtype).removeprefix("torch."), list(t.shape)
    if not t.is_contiguous():
        t = t.contiguous()  # a copy: the digest is over row-major bytes whatever the strides
    flat = t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8, device=t.device)
    if flat.device.type == "cpu":
        array = flat.numpy()  # shares memory: no copy

        def read(off: int, n: int) -> Any:
            return memoryview(array[off:off + n])
    else:
        def read(off: int, n: int) -> Any:  # one block at a time through host memory
            return memoryview(flat[off:off + n].cpu().numpy())
    return TensorBytes(name, dtype, shape, flat.numel(), read)


# --------------------------------------------------------------------------- digests

def sample_offsets(tb: TensorBytes, version: int, chunk_bytes: int, chunks: int) -> list[int] | None:
    """Where sampled mode reads `tb`: None when the tensor is small enough to hash whole."""
    if tb.nbytes <= chunk_bytes * chunks:
        return None
    seed = hashlib.sha256(f"{tb.name}|{tb.dtype}|{tb.shape}|{version}".encode()).digest()
    rng = random.Random(seed)
    last = tb.nbytes - chunk_bytes
    return sorted({0, last, *(rng.randrange(0, last + 1) for _ in range(chunks - 2))})


def _ranges(tb: TensorBytes, offsets: list[int] | None, opts: AttestOptions) -> list[tuple[int, int]]:
    if offsets is not None:
        return [(off, opts.chunk_bytes) for off in offsets]
    return [(off, min(opts.block_bytes, tb.nbytes - off)) for off in range(0, tb.nbytes, opts.block_bytes)] or [(0, 0)]


class WeightsDigest:
    """Digests of tensors as they come (a sync that streams tensors hashes each while it is at
    hand, e.g. gathered), then the attestation payload. `add` hashes the blocks of the tensors it
    is given on a thread pool; `result` returns the payload and frees the pool."""

    def __init__(self, version: int, options: AttestOptions | None = None) -> None:
        self.opts = (options or AttestOptions()).checked()
        self.version = contract.weights_version_value(version)
        self.entries: list[dict[str, Any]] = []
        self.bytes_hashed = 0
        self._names: set[str] = set()
        self._new = _hasher(self.opts.algo)
        self._pool: ThreadPoolExecutor | None = None
        self._started = time.perf_counter()

    def add(self, weights: Any) -> None:
        """Hash a model, a mapping or an iterable of (name, tensor) pairs (see `named_tensors`)."""
        pairs = named_tensors(weights)
        for name, _ in pairs:
            if name in self._names:
                raise ValueError(f"tensor name {name!r} appears twice")
            self._names.add(name)
        if len(self._names) > contract.MAX_ATTEST_TENSORS:
            raise ValueError(f"at most {contract.MAX_ATTEST_TENSORS} tensors per attestation")
        self.entries.extend(self.digest(pairs))

    def digest(self, pairs: list[tuple[str, Any]]) -> list[dict[str, Any]]:
        """The entries of these tensors (counted in bytes_hashed, not recorded)."""
        tensors = [tensor_bytes(name, t) for name, t in pairs]
        sampled = self.opts.mode == "sampled"
        plans = [_ranges(tb, sample_offsets(tb, self.version, self.opts.chunk_bytes, self.opts.chunks)
                         if sampled else None, self.opts) for tb in tensors]
        jobs = [(i, off, n) for i, plan in enumerate(plans) for off, n in plan]
        parts = self._hash_all(tensors, jobs)
        entries, position = [], 0
        for tb, plan in zip(tensors, plans):
            h = self._new(f"{tb.dtype}|{','.join(map(str, tb.shape))}|{tb.nbytes}|".encode())
            for part in parts[position:position + len(plan)]:
                h.update(part)
            position += len(plan)
            entries.append({"name": tb.name, "dtype": tb.dtype, "shape": tb.shape, "bytes": tb.nbytes,
                            "digest": h.hexdigest()})
        self.bytes_hashed += sum(n for _, _, n in jobs)
        return entries

    def _hash_all(self, tensors: list[TensorBytes], jobs: list[tuple[int, int, int]]) -> list[bytes]:
        def hash_range(job: tuple[int, int, int]) -> bytes:
            index, off, n = job
            h = self._new()
            h.update(tensors[index].read(off, n))  # update(), not the constructor: xxhash releases the GIL there
            return h.digest()

        if len(jobs) == 1 or self.opts.threads == 1:
            return [hash_range(job) for job in jobs]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.opts.threads, thread_name_prefix="paritywatch-attest")
        return list(self._pool.map(hash_range, jobs, chunksize=max(1, len(jobs) // (self.opts.threads * 8))))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def result(self) -> dict[str, Any]:
        self.close()
        return payload(self.version, self.opts, self.entries, self.bytes_hashed,
                       time.perf_counter() - self._started)


def payload(version: int, opts: AttestOptions, entries: list[dict[str, Any]], bytes_hashed: int,
            seconds: float) -> dict[str, Any]:
    """The attestation as the server takes it, from tensor entries hashed with `opts`."""
    if not entries:
        raise ValueError("no tensors to attest")
    return {
        "version": contract.weights_version_value(version),
        **opts.settings(),
        "tensors": entries,
        "digest": contract.weights_digest((e["name"], e["digest"]) for e in entries),
        "bytes_total": sum(e["bytes"] for e in entries),
        "bytes_hashed": bytes_hashed,
        "seconds": round(seconds, 6),
    }


def digest_weights(weights: Any, version: int, options: AttestOptions | None = None) -> dict[str, Any]:
    """The attestation payload for `weights` at `version` (the body of the attestations route)."""
    digest = WeightsDigest(version, options)
    try:
        digest.add(weights)
        return digest.result()
    finally:
        digest.close()


def summary(attestation: Mapping[str, Any]) -> dict[str, Any]:
    """The attestation without its tensor list: what a caller logs or returns across an RPC."""
    return {k: v for k, v in attestation.items() if k != "tensors"} | {"tensor_count": len(attestation["tensors"])}


def iter_digests(attestation: Mapping[str, Any]) -> Iterable[tuple[str, str]]:
    return ((e["name"], e["digest"]) for e in attestation["tensors"])
