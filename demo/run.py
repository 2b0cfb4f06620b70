"""Orchestrates `paritywatch demo`: backend (unless --url), model directory, trainer + workers,
progress in the terminal, one JSON summary line at the end."""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx

from demo.model_dir import build_model_dir
from demo.processes import Job, rollout_main, trainer_main

PROJECT = "demo"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def add_demo_command(sub) -> None:  # noqa: ANN001
    p = sub.add_parser("demo", help="run the dashboard with a simulated async GRPO run (the TRL bug)",
                       description=("Start the backend on SQLite and a simulated async GRPO run: one trainer and "
                                    "several rollout-worker processes with a real tokenizer and a tiny random-weight "
                                    "model. One worker loads the default processor (TRL's processing_class bug): "
                                    "Paritywatch raises a processor_mismatch alert and pauses the run. --healthy "
                                    "gives every worker the right processor."))
    p.add_argument("--healthy", action="store_true", help="every worker uses the user's processor: no alert")
    p.add_argument("--duration", type=float, default=None,
                   help="stop after this many seconds and exit (default: run until Ctrl-C, dashboard stays up)")
    p.add_argument("--workers", type=int, default=3, help="rollout worker processes (default 3)")
    p.add_argument("--steps", type=int, default=500, help="trainer steps (default 500)")
    p.add_argument("--url", help="use a running backend instead of starting one")
    p.add_argument("--db", help="database URL for the started backend (default: ./paritywatch.db)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8321)
    p.add_argument("--model-dir", default=None, help="where to build the tiny model (default: a cache folder)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    server = None
    url = args.url
    if not url:
        server, url = _start_server(args)
    token = os.environ.get("PARITYWATCH_TOKEN")
    api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"} if token else {}, timeout=10)
    procs: list = []
    try:
        model_dir = Path(args.model_dir or Path.home() / ".cache" / "paritywatch" / "demo-model")
        log(f"building the tiny model and tokenizer in {model_dir} ...")
        build_model_dir(model_dir)
        run_name = f"async-grpo-{'healthy' if args.healthy else 'buggy'}-{datetime.now():%Y%m%d-%H%M%S}"
        job = Job(url=url, run=run_name, project=PROJECT, model_dir=str(model_dir), token=token)
        procs = _start_processes(job, args)
        log(f"run {PROJECT}/{run_name}: 1 trainer + {args.workers} rollout workers"
            f"{'' if args.healthy else ' (the last one loads the processor by model name: the TRL bug)'}")
        run_id = _wait_for_run(api, run_name)
        dashboard = f"{url}/#/runs/{run_id}"
        log(f"dashboard: {dashboard}")
        summary = _watch(api, run_id, run_name, dashboard, procs, args.duration)
        print(json.dumps(summary), flush=True)
        if args.duration is None and server is not None:
            log("the dashboard stays up; Ctrl-C to quit")
            server.wait()
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        _stop_processes(api, procs)
        api.close()
        if server is not None and server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()


def _start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    url = f"http://{args.host}:{args.port}"
    try:
        httpx.get(f"{url}/healthz", timeout=1)
        raise SystemExit(f"something already listens on {url}: stop it, or pass --url {url} to use it")
    except httpx.HTTPError:
        pass
    cmd = [sys.executable, "-m", "backend.cli", "serve", "--host", args.host, "--port", str(args.port),
           "--log-level", "warning"]
    if args.db:
        cmd += ["--db", args.db]
    server = subprocess.Popen(cmd)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit("the backend failed to start (see above)")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return server, url
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit("the backend did not answer within 60 s")


def _start_processes(job: Job, args: argparse.Namespace) -> list:
    ctx = mp.get_context("spawn")
    records_q = ctx.Queue(maxsize=64)
    weights_qs = [ctx.Queue(maxsize=2) for _ in range(args.workers)]
    procs = [ctx.Process(target=trainer_main, args=(job, records_q, weights_qs, args.steps, 0), name="trainer", daemon=True)]
    for i in range(args.workers):
        buggy = not args.healthy and i == args.workers - 1
        procs.append(ctx.Process(target=rollout_main, args=(job, f"worker-{i}", buggy, records_q, weights_qs[i], 100 + i),
                                 name=f"rollout-{i}", daemon=True))
    for p in procs:
        p.start()
    # Process.start() drops its args: keep the queues alive, or their semaphores vanish before
    # the spawned children unpickle them.
    procs[0].paritywatch_queues = (records_q, weights_qs)
    return procs


def _wait_for_run(api: httpx.Client, name: str) -> int:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        runs = api.get("/api/v1/runs", params={"project": PROJECT}).json()["runs"]
        for r in runs:
            if r["name"] == name:
                return r["id"]
        time.sleep(0.3)
    raise SystemExit("the demo processes did not register within 120 s")


def _watch(api: httpx.Client, run_id: int, name: str, dashboard: str, procs: list, duration: float | None) -> dict:
    started = time.monotonic()
    last_line = ""
    while True:
        run = api.get(f"/api/v1/runs/{run_id}").json()
        alerts = api.get(f"/api/v1/runs/{run_id}/alerts", params={"status": "open"}).json()["alerts"]
        line = (f"step {run['last_step'] or 0:>4} | state {run['control']['state']:<8} | "
                f"{len(run['components'])} components | {len(alerts)} open alert(s)"
                + (f" — {alerts[0]['title']}" if alerts else ""))
        if line != last_line:
            log(line)
            last_line = line
        trainer_done = not procs[0].is_alive()
        if (duration is not None and time.monotonic() - started >= duration) or trainer_done:
            return _summary(api, run_id, name, dashboard)
        if duration is None and run["control"]["state"] == "paused" and alerts:
            return _summary(api, run_id, name, dashboard)
        time.sleep(1.0)


def _summary(api: httpx.Client, run_id: int, name: str, dashboard: str) -> dict:
    run = api.get(f"/api/v1/runs/{run_id}").json()
    alerts = api.get(f"/api/v1/runs/{run_id}/alerts").json()["alerts"]
    return {
        "run": name,
        "run_id": run_id,
        "run_state": run["control"]["state"],
        "alerts": [{"kind": a["kind"], "severity": a["severity"], "status": a["status"],
                    "components": a["detail"].get("components", [])} for a in alerts],
        "dashboard": dashboard,
    }


def _stop_processes(api: httpx.Client, procs: list) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    if procs:
        records_q, weights_qs = procs[0].paritywatch_queues
        for q in (records_q, *weights_qs):
            q.close()
            q.cancel_join_thread()
