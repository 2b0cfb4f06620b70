"""Bench: `paritywatch diff` of two small tokenizer folders, as a person runs it (< 2 s warm).

Run from the project root: `.venv/bin/python bench/diff_cli.py [--quick]`.
Progress on stderr; the last stdout line is one JSON object with the figures, the target and `met`.

Every figure is a whole process, started the way a shell starts it (wall clock, interleaved runs):
- `reference`: the interpreter starting and importing the CLI module (`python -c "import
  paritywatch.backend.cli"`), the floor any `paritywatch` command pays on this machine now;
- `old_floor`: the same plus `from transformers import AutoProcessor, AutoTokenizer` with torch
  importable, what every diff paid before the cache (the load and the probes came on top);
- `cold`: `paritywatch diff A B --no-cache`: both folders loaded (torch hidden: tokenizers only)
  and fingerprinted;
- `warm`: `paritywatch diff A B` again: both fingerprints from the on-disk cache (the target).
A (ChatML) and B (the same tokenizer with TRL-bug's custom template) differ: every run must exit 2
with the same JSON verdict, cold and warm. The cache lives in a temporary folder for the bench.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import PARITYWATCH, ROOT, VENV_PY, emit, progress

TARGET_S = 2.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (same code paths)")
    args = parser.parse_args()
    rounds = 3 if args.quick else 8

    from tests.fixtures import tokenizers as builders

    with tempfile.TemporaryDirectory(prefix="paritywatch_bench_diff_") as tmp:
        a = builders.build_chatml_tokenizer(tmp, name="a")
        b = builders.build_chatml_tokenizer(tmp, name="b", chat_template=builders.CUSTOM_TEMPLATE)
        env = {**os.environ, "PARITYWATCH_FINGERPRINT_CACHE": str(Path(tmp) / "cache"),
               "TOKENIZERS_PARALLELISM": "false"}
        commands = {
            "reference": [str(VENV_PY), "-c", "import paritywatch.backend.cli"],
            "old_floor": [str(VENV_PY), "-c", "import paritywatch.backend.cli; "
                                              "from transformers import AutoProcessor, AutoTokenizer"],
            "cold": [str(PARITYWATCH), "diff", str(a), str(b), "--json", "--no-cache"],
            "warm": [str(PARITYWATCH), "diff", str(a), str(b), "--json"],
        }
        seconds: dict[str, list[float]] = {name: [] for name in commands}
        verdicts: set[tuple[int, str]] = set()
        _timed(commands["warm"], env)  # untimed: fills the cache (and the OS file cache)
        for i in range(rounds):
            for name, command in commands.items():
                took, code, out = _timed(command, env)
                seconds[name].append(took)
                if name in ("cold", "warm"):
                    verdicts.add((code, out))
            progress(f"round {i + 1}/{rounds}: " + ", ".join(f"{n} {s[-1]:.2f} s" for n, s in seconds.items()))

    median = {name: statistics.median(s) for name, s in seconds.items()}
    [(code, _)] = verdicts if len(verdicts) == 1 else [(None, None)]
    emit({
        "bench": "diff_cli", "folders": "two ChatML tokenizers (600-token BPE), templates differ",
        "rounds": rounds, "load_avg_1m": round(os.getloadavg()[0], 2), "cpu_count": os.cpu_count(),
        **{f"{name}_s_median": round(m, 3) for name, m in median.items()},
        **{f"{name}_s_max": round(max(seconds[name]), 3) for name in ("cold", "warm")},
        "warm_vs_reference_ratio": round(median["warm"] / median["reference"], 2),
        "cold_vs_old_floor_ratio": round(median["cold"] / median["old_floor"], 2),
        "exit_code": code, "same_verdict_cold_and_warm": len(verdicts) == 1,
        "target": f"warm diff < {TARGET_S:g} s, exit 2, one verdict cold and warm",
        "met": median["warm"] < TARGET_S and len(verdicts) == 1 and code == 2,
    })


def _timed(command: list[str], env: dict) -> tuple[float, int, str]:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - start
    if done.returncode not in (0, 2):
        sys.exit(f"{command[:3]} exited {done.returncode}: {done.stderr[-2000:]}")
    return took, done.returncode, done.stdout


if __name__ == "__main__":
    main()
