"""Mismatch posted -> webhook received, and -> a waiting hook sees the pause (docs/design.md: p99 < 1 s).
The webhook has no group wait (an alert group's first message otherwise waits for the rest of it).

Each trial: a fresh run whose trainer registered the user's processor (custom chat template) and
whose hook (a real ParityMonitor, long-polling the control state) is running; then a rollout
worker posts the default processor's fingerprint (the TRL bug). We time, from that post, the
signed webhook's arrival at a local receiver and the moment the hook's state turns 'paused'.

    .venv/bin/python bench/latency.py [--quick] [--db sqlite|postgresql] [--trials N]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import allow_loopback_webhooks, emit, median, paritywatch_server, percentile, progress, scratch_db

import httpx

TARGET_S = 1.0


def fingerprints() -> tuple[dict, dict]:
    from paritywatch.demo.model_dir import build_model_dir, load_processor
    from trainer_hooks.fingerprint import fingerprint_processor

    model_dir = build_model_dir(Path(tempfile.gettempdir()) / "paritywatch-bench-model")
    return (fingerprint_processor(load_processor(model_dir, custom_template=True)),
            fingerprint_processor(load_processor(model_dir, custom_template=False)))


def trial(api: httpx.Client, url: str, i: int, trainer_fp: dict, worker_fp: dict, received: list, spool: Path) -> tuple[float, float]:
    from trainer_hooks.monitor import ParityMonitor

    run = api.post("/api/v1/runs", json={"name": f"latency-{i}", "project": "bench"}).json()
    trainer = api.post(f"/api/v1/runs/{run['id']}/components", json={"side": "trainer"}).json()
    api.post(f"/api/v1/runs/{run['id']}/components/{trainer['id']}/fingerprint", json=trainer_fp).raise_for_status()
    worker = api.post(f"/api/v1/runs/{run['id']}/components", json={"side": "rollout", "worker_id": "w"}).json()
    hook = ParityMonitor(run=run["id"], side="trainer", url=url, worker_id="hook", spool_dir=spool / str(i))
    try:
        _wait(lambda: hook.state == "running", 10)
        seen_before = len(received)
        t0 = time.monotonic()
        api.post(f"/api/v1/runs/{run['id']}/components/{worker['id']}/fingerprint", json=worker_fp).raise_for_status()
        paused_at = _wait(lambda: hook.state == "paused", 10, poll_s=0.0005)
        webhook_at = _wait(lambda: len(received) > seen_before and received[seen_before], 10)
        return webhook_at - t0, paused_at - t0
    finally:
        hook.close(timeout=1)


def _wait(pred, timeout_s: float, poll_s: float = 0.001) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value if isinstance(value, float) else time.monotonic()
        time.sleep(poll_s)
    raise TimeoutError("trial did not complete in time")


def receiver() -> tuple[str, list, object]:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    received: list[float] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("content-length", 0)))
            received.append(time.monotonic())
            self.send_response(204)
            self.end_headers()

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/hook", received, server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10 trials instead of 50")
    ap.add_argument("--trials", type=int, default=None)
    ap.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite")
    args = ap.parse_args()
    trials = args.trials or (10 if args.quick else 50)
    allow_loopback_webhooks()
    progress("fingerprinting the demo processors (custom and default chat template)")
    trainer_fp, worker_fp = fingerprints()
    hook_url, received, rx = receiver()
    webhook_s: list[float] = []
    paused_s: list[float] = []
    with scratch_db(args.db, "latency") as db_url, paritywatch_server(db_url) as srv, \
            httpx.Client(base_url=srv.url, timeout=10) as api, tempfile.TemporaryDirectory() as spool:
        # No group wait: this measures the first message of a new incident, not the grouping delay.
        api.post("/api/v1/webhooks", json={"url": hook_url, "events": ["alert.firing"], "group_wait_s": 0}).raise_for_status()
        for i in range(trials):
            w, p = trial(api, srv.url, i, trainer_fp, worker_fp, received, Path(spool))
            webhook_s.append(w)
            paused_s.append(p)
            if (i + 1) % 10 == 0:
                progress(f"{i + 1}/{trials} trials: webhook p50 {median(webhook_s) * 1e3:.0f} ms, "
                         f"hook paused p50 {median(paused_s) * 1e3:.0f} ms")
    rx.shutdown()
    p99_w, p99_p = percentile(webhook_s, 99), percentile(paused_s, 99)
    emit({
        "bench": "latency", "db": args.db, "trials": trials,
        "webhook_ms": {"p50": round(median(webhook_s) * 1e3, 1), "p99": round(p99_w * 1e3, 1)},
        "hook_paused_ms": {"p50": round(median(paused_s) * 1e3, 1), "p99": round(p99_p * 1e3, 1)},
        "target": "p99 < 1000 ms for both", "met": max(p99_w, p99_p) < TARGET_S,
    })


if __name__ == "__main__":
    main()
