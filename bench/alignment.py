"""Bench: alignment metrics for a batch of 64 x 1,024 completion tokens on CPU (target < 10 ms).

Times the numeric part of `trainer_hooks.alignment.compute_alignment_metrics`: records whose
rollout log-probs and completion masks arrive as Python lists (as vLLM's JSON gives them), the
trainer's log-probs as one [64, 1024] array, padding and masking included, metrics dict out.
Once with numpy (trainer log-probs as an ndarray) and once with torch (as a CPU tensor, the
trainer's normal case). The tokenizer-bound checks (re-render, decode) are not in this figure.

    .venv/bin/python bench/alignment.py [--quick]

Progress on stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from trainer_hooks.alignment import RolloutRecord, compute_alignment_metrics

BATCH, TOKENS, TARGET_MS = 64, 1024, 10.0


def make_batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    rollout = np.log(rng.uniform(0.05, 1.0, size=(BATCH, TOKENS)))
    trainer = rollout + rng.normal(0.0, 0.02, size=(BATCH, TOKENS))
    records = []
    for i in range(BATCH):
        mask = [1] * TOKENS
        mask[TOKENS // 2 : TOKENS // 2 + 32] = [0] * 32  # a spliced tool output
        records.append(
            RolloutRecord(
                prompt_ids=[1, 2, 3],
                completion_ids=rng.integers(0, 1000, TOKENS).tolist(),
                rollout_logprobs=rollout[i].tolist(),
                completion_mask=mask,
                policy_version=5,
            )
        )
    return records, trainer


def time_backend(records, trainer_logprobs, backend: str, repeats: int) -> dict:
    compute_alignment_metrics(records, trainer_logprobs=trainer_logprobs, backend=backend)  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        metrics = compute_alignment_metrics(
            records, trainer_logprobs=trainer_logprobs, trainer_policy_version=6, backend=backend
        )
        samples.append((time.perf_counter() - start) * 1000)
    assert "align/kl_k3" in metrics
    return {"median_ms": round(statistics.median(samples), 3), "p90_ms": round(_p90(samples), 3)}


def _p90(samples: list[float]) -> float:
    return sorted(samples)[int(0.9 * (len(samples) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, same sizes and code paths")
    args = parser.parse_args()
    repeats = 20 if args.quick else 200

    print(f"building a batch of {BATCH} x {TOKENS} tokens", file=sys.stderr)
    records, trainer = make_batch()
    figures = {"bench": "alignment", "batch": BATCH, "tokens_per_seq": TOKENS, "repeats": repeats}

    print(f"numpy: {repeats} runs", file=sys.stderr)
    numpy_times = time_backend(records, trainer, "numpy", repeats)
    figures["numpy_median_ms"], figures["numpy_p90_ms"] = numpy_times["median_ms"], numpy_times["p90_ms"]

    try:
        import torch
    except ImportError:
        print("torch not installed: torch timing skipped", file=sys.stderr)
        torch_median = None
    else:
        # 64k-element ops gain nothing from intra-op threads, and on 2 shared cores spinning threads lose badly.
        torch.set_num_threads(1)
        figures["torch_threads"] = 1
        print(f"torch: {repeats} runs", file=sys.stderr)
        torch_times = time_backend(records, torch.from_numpy(trainer).float(), "torch", repeats)
        figures["torch_median_ms"], figures["torch_p90_ms"] = torch_times["median_ms"], torch_times["p90_ms"]
        torch_median = torch_times["median_ms"]

    medians = [m for m in (figures["numpy_median_ms"], torch_median) if m is not None]
    figures["target"] = f"< {TARGET_MS:g} ms"
    figures["met"] = max(medians) < TARGET_MS
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
