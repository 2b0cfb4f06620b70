"""Bench: fingerprint of the 128k-vocab DeepSeek tokenizer (< 1 s) and a cached call (< 1 ms).

Run from the project root: `.venv/bin/python bench/fingerprint.py [--quick]`.
Progress on stderr; the last stdout line is one JSON object with the figures, targets and `met`.
Each cold measurement uses a freshly loaded tokenizer object, so nothing is served from the cache.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

COLD_TARGET_S = 1.0
CACHED_TARGET_S = 0.001


def log(msg: str) -> None:
    print(f"[bench fingerprint] {msg}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (same code paths)")
    args = parser.parse_args()
    cold_runs, cached_runs = (2, 200) if args.quick else (5, 2000)

    from transformers import AutoTokenizer

    from tests.fixtures.tokenizers import deepseek_tokenizer_dir
    from trainer_hooks.fingerprint import fingerprint_processor

    path = deepseek_tokenizer_dir()
    cold, size = [], 0
    for i in range(cold_runs):
        tok = AutoTokenizer.from_pretrained(path)  # a new object: a cold fingerprint
        start = time.perf_counter()
        fp = fingerprint_processor(tok)
        cold.append(time.perf_counter() - start)
        log(f"cold run {i + 1}/{cold_runs}: {cold[-1] * 1000:.0f} ms")
    size = len(json.dumps(fp, ensure_ascii=False).encode())
    cached = []
    for _ in range(cached_runs):
        start = time.perf_counter()
        fingerprint_processor(tok)
        cached.append(time.perf_counter() - start)
    log(f"cached: median {statistics.median(cached) * 1e6:.0f} µs over {cached_runs} calls")

    cold_median, cached_median = statistics.median(cold), statistics.median(cached)
    print(json.dumps({
        "bench": "fingerprint", "tokenizer": "deepseek-tokenizer (128k BPE)",
        "vocab_size": len(fp["components"]["vocab"]["value"]),
        "cold_s_median": round(cold_median, 4), "cold_s_max": round(max(cold), 4),
        "cached_ms_median": round(cached_median * 1000, 4), "fingerprint_bytes": size,
        "target": "cold < 1 s, cached < 1 ms",
        "met": cold_median < COLD_TARGET_S and cached_median < CACHED_TARGET_S,
    }))


if __name__ == "__main__":
    main()
