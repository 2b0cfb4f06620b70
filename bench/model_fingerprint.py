"""Bench: `paritywatch fingerprint` of a model directory, cold, in a fresh process (< 1 s).

Run from the project root: `.venv/bin/python bench/model_fingerprint.py [--quick]`.
Progress on stderr; the last stdout line is one JSON object with the figures, target and `met`.
The directory is a tiny Qwen2 saved with save_pretrained (config.json with YaRN rope scaling,
generation_config.json, weights) plus a saved peft LoRA adapter: the model components read
config.json / adapter_config.json as JSON, so each run is a new interpreter that must not import
torch or transformers. Figures: the wall time of the whole command (interpreter start included),
of the fingerprint alone inside it (imports included), and of a bare interpreter start run
interleaved (the machine's load at the time).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

COLD_TARGET_S = 1.0
# One fresh interpreter: fingerprint the directory the way the CLI does, say what it imported.
CHILD = """
import json, sys, time
start = time.perf_counter()
from trainer_hooks.fingerprint.cli import load_fingerprint
fp = load_fingerprint(sys.argv[1])
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "components": sorted(fp["components"]),
                  "heavy": sorted(m for m in ("torch", "transformers", "numpy") if m in sys.modules)}))
"""


def log(msg: str) -> None:
    print(f"[bench model_fingerprint] {msg}", file=sys.stderr, flush=True)


def build_model_dir(out: Path) -> Path:
    """A weights-only model directory with a LoRA adapter's config beside its config.json."""
    import peft

    from tests.fixtures.models import tiny_qwen2

    model = tiny_qwen2(rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                                        "rope_theta": 10000.0})
    path = out / "model"
    model.save_pretrained(path)
    peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"])).save_pretrained(out / "lora")
    (path / "adapter_config.json").write_text((out / "lora" / "adapter_config.json").read_text())
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (same code paths)")
    runs = 3 if parser.parse_args().quick else 10
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model_dir(Path(tmp))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        walls, inner, child, bare = [], [], {}, []
        for i in range(runs):
            start = time.perf_counter()  # the interpreter alone, interleaved: this machine's load right now
            subprocess.run([sys.executable, "-c", "pass"], check=True, env=env, cwd=ROOT)
            bare.append(time.perf_counter() - start)
            start = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, env=env,
                                 check=True, cwd=ROOT)
            walls.append(time.perf_counter() - start)
            child = json.loads(out.stdout.strip().splitlines()[-1])
            inner.append(child["seconds"])
            log(f"run {i + 1}/{runs}: {walls[-1] * 1000:.0f} ms wall, {child['seconds'] * 1000:.1f} ms fingerprint")
    cold = statistics.median(walls)
    result = {"bench": "model_fingerprint", "runs": runs, "cold_process_ms": round(cold * 1000, 1),
              "fingerprint_ms": round(statistics.median(inner) * 1000, 2),
              "bare_interpreter_ms": round(statistics.median(bare) * 1000, 1), "components": child["components"],
              "heavy_imports": child["heavy"], "load_avg": round(os.getloadavg()[0], 2),
              "target_ms": COLD_TARGET_S * 1000,
              "met": cold < COLD_TARGET_S and not child["heavy"]
              and {"model_config", "lora_adapter"} <= set(child["components"])}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
