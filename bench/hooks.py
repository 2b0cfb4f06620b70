"""Benchmark: the cost of `ParityMonitor.log()` inside a training loop (docs/design.md: <= 10 us median).

Starts `paritywatch serve` on a free port with a temporary SQLite file (or uses --url), builds a
monitor, times every `log()` call of a tight loop, then checks every point reached the backend.
Also times `compute_alignment_metrics` on a synthetic 64 x 1,024 batch when it is importable.

    .venv/bin/python bench/hooks.py [--quick] [--calls N] [--url URL]

Progress goes to stderr; the last stdout line is one JSON object with the figures.
"""
from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer_hooks.monitor import ParityMonitor  # noqa: E402

LOG_TARGET_US = 10.0
ALIGNMENT_TARGET_MS = 10.0


def progress(message: str) -> None:
    print(f"[bench hooks] {message}", file=sys.stderr, flush=True)


def start_backend(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cli = ROOT / ".venv" / "bin" / "paritywatch"
    command = [str(cli)] if cli.exists() else [sys.executable, "-m", "paritywatch.backend.cli"]
    command += ["serve", "--db", f"sqlite:///{workdir / 'bench.db'}", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("backend did not start")


def time_log_calls(monitor: ParityMonitor, calls: int) -> list[int]:
    """Per-call durations in ns of a tight loop logging 4 metrics a step (timer overhead included)."""
    metrics = {"loss": 0.0, "lr": 1e-5, "grad_norm": 1.0, "align/kl_k3": 0.001}
    timer = time.perf_counter_ns
    log = monitor.log
    durations = [0] * calls
    for step in range(calls):
        metrics["loss"] = 1.0 / (step + 1)
        start = timer()
        log(metrics, step)
        durations[step] = timer() - start
        if step and step % 20_000 == 0:
            progress(f"{step} log() calls")
    return durations


def timer_overhead_ns() -> int:
    timer = time.perf_counter_ns
    samples = []
    for _ in range(10_000):
        start = timer()
        samples.append(timer() - start)
    return int(statistics.median(samples))


def delivered_points(url: str, run_name: str, key: str) -> int:
    client = httpx.Client(base_url=url + "/api/v1", timeout=10)
    run_id = client.post("/runs", json={"name": run_name}).json()["id"]
    keys = client.get(f"/runs/{run_id}/metrics").json()["keys"]
    return next((k["count"] for k in keys if k["key"] == key), 0)


# ------------------------------------------------------------------ alignment metrics timing
# The per-batch alignment metrics (trainer_hooks.alignment, a colleague's module) are timed here
# on a synthetic 64 x 1,024 batch, numeric part only (no processor). bench/alignment.py owns the
# detailed figures; this keeps the hooks' total per-step cost in one place.

def time_alignment_ms(repeats: int) -> float | None:
    try:
        import numpy as np

        from trainer_hooks.alignment import RolloutRecord, compute_alignment_metrics
    except ImportError as exc:
        progress(f"alignment metrics not timed: {exc}")
        return None
    rng = np.random.default_rng(0)
    batch, length = 64, 1024
    rollout = rng.normal(-1.0, 0.5, size=(batch, length)).clip(max=0.0)
    trainer = rollout + rng.normal(0.0, 0.01, size=(batch, length))
    records = [
        RolloutRecord(prompt_ids=list(range(32)), completion_ids=rng.integers(0, 32_000, length).tolist(),
                      rollout_logprobs=rollout[i].tolist(), policy_version=3, finish_reason="length")
        for i in range(batch)
    ]
    compute_alignment_metrics(records, trainer_logprobs=trainer, trainer_policy_version=4)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        compute_alignment_metrics(records, trainer_logprobs=trainer, trainer_policy_version=4)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, under 60 s on 2 cores")
    parser.add_argument("--calls", type=int, default=None, help="log() calls to time (default 100k, quick 20k)")
    parser.add_argument("--url", default=None, help="use this backend instead of starting one")
    args = parser.parse_args()
    calls = args.calls or (20_000 if args.quick else 100_000)

    workdir = Path(tempfile.mkdtemp(prefix="paritywatch-bench-"))
    proc = None
    try:
        if args.url:
            url = args.url.rstrip("/")
        else:
            progress("starting the backend")
            proc, url = start_backend(workdir)
        run_name = f"bench-hooks-{int(time.time())}"
        monitor = ParityMonitor(run_name, url=url, spool_dir=workdir / "spool", max_queue=max(100_000, calls))
        overhead = timer_overhead_ns()
        progress(f"timing {calls} log() calls (timer overhead {overhead} ns, included)")
        durations = time_log_calls(monitor, calls)
        progress("flushing to the backend")
        flushed = monitor.flush(timeout=120)
        monitor.close()
        delivered = delivered_points(url, run_name, "loss")
        progress("timing alignment metrics")
        alignment_ms = time_alignment_ms(repeats=10 if args.quick else 30)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)

    ordered = sorted(durations)
    median_us = ordered[len(ordered) // 2] / 1000
    result = {
        "bench": "hooks",
        "calls": calls,
        "log_median_us": round(median_us, 3),
        "log_p99_us": round(ordered[int(len(ordered) * 0.99)] / 1000, 3),
        "log_max_us": round(ordered[-1] / 1000, 1),
        "timer_overhead_us": round(overhead / 1000, 3),
        "delivered_points": delivered,
        "all_delivered": flushed and delivered == calls,
        "target": f"log() median <= {LOG_TARGET_US} us",
        "met": median_us <= LOG_TARGET_US and delivered == calls,
        "alignment_ms_64x1024": None if alignment_ms is None else round(alignment_ms, 3),
        "alignment_target": f"< {ALIGNMENT_TARGET_MS} ms",
        "alignment_met": None if alignment_ms is None else alignment_ms < ALIGNMENT_TARGET_MS,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
