"""Bench: fingerprint of the 128k-vocab DeepSeek tokenizer (< 1 s) and a cached call (< 1 ms).

Run from the project root: `.venv/bin/python bench/fingerprint.py [--quick]`.
Progress on stderr; the last stdout line is one JSON object with the figures, targets and `met`.
Each cold measurement uses a freshly loaded tokenizer object, so nothing is served from the cache.
The shipped DeepSeek files carry no chat template: a Qwen3-style one (tools, reasoning,
enable_thinking) is attached so every chat probe renders, as it does for a real chat model;
`behavior_probes_ms` is the share of all probes; the same tokenizer without a template is measured
interleaved, as the in-run reference. The machine's load average is reported with the figures.
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

    from tests.fixtures.chat_templates import QWEN3_STYLE_TEMPLATE
    from tests.fixtures.tokenizers import deepseek_tokenizer_dir
    from trainer_hooks.fingerprint import components, fingerprint_processor

    path = deepseek_tokenizer_dir()
    kwargs = {"enable_thinking": False}

    def cold_fingerprint(template: str | None) -> tuple[float, dict]:
        tok = AutoTokenizer.from_pretrained(path)  # a new object: a cold fingerprint
        tok.chat_template = template
        start = time.perf_counter()
        fp = fingerprint_processor(tok, chat_template_kwargs=kwargs if template else None)
        return time.perf_counter() - start, fp

    cold_fingerprint(QWEN3_STYLE_TEMPLATE)  # warm-up, untimed: the first render imports and compiles Jinja
    # Interleaved with the same tokenizer without a template (the text probes only): the reference
    # measured in this run, so load from other processes hits both alike.
    cold, reference, chat = [], [], []
    for i in range(cold_runs):
        seconds, _ = cold_fingerprint(None)
        reference.append(seconds)
        seconds, fp = cold_fingerprint(QWEN3_STYLE_TEMPLATE)
        cold.append(seconds)
        tok = AutoTokenizer.from_pretrained(path)
        start = time.perf_counter()
        components.tokenizer_behavior(tok, QWEN3_STYLE_TEMPLATE, kwargs)
        chat.append(time.perf_counter() - start)
        log(f"cold run {i + 1}/{cold_runs}: {cold[-1] * 1000:.0f} ms with the template, {reference[-1] * 1000:.0f} ms "
            f"without (all behavior probes {chat[-1] * 1000:.1f} ms)")
    renders = fp["components"]["behavior"]["value"]["chat"]
    assert all("text" in r for r in renders.values()), "every chat probe must render in this bench"
    size = len(json.dumps(fp, ensure_ascii=False).encode())
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = QWEN3_STYLE_TEMPLATE
    fingerprint_processor(tok, chat_template_kwargs=kwargs)
    cached = []
    for _ in range(cached_runs):
        start = time.perf_counter()
        fingerprint_processor(tok, chat_template_kwargs=kwargs)
        cached.append(time.perf_counter() - start)
    log(f"cached: median {statistics.median(cached) * 1e6:.0f} µs over {cached_runs} calls")

    cold_median, cached_median = statistics.median(cold), statistics.median(cached)
    print(json.dumps({
        "bench": "fingerprint", "tokenizer": "deepseek-tokenizer (128k BPE) + Qwen3-style chat template",
        "vocab_size": len(fp["components"]["vocab"]["value"]), "chat_renders": len(renders),
        "cold_s_median": round(cold_median, 4), "cold_s_max": round(max(cold), 4),
        "cold_s_median_without_template": round(statistics.median(reference), 4),
        "template_vs_without_ratio": round(cold_median / statistics.median(reference), 3),
        "behavior_probes_ms_median": round(statistics.median(chat) * 1000, 2),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "cached_ms_median": round(cached_median * 1000, 4), "fingerprint_bytes": size,
        "target": "cold < 1 s, cached < 1 ms",
        "met": cold_median < COLD_TARGET_S and cached_median < CACHED_TARGET_S,
    }))


if __name__ == "__main__":
    main()
