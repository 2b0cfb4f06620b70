"""Bench: metric ingest throughput (points/s) and post latency, Paritywatch vs MLflow's log-batch.

    .venv/bin/python bench/ingest.py [--quick] [--duration S] [--clients 1,8,32] [--workers N]
                                     [--no-postgres] [--no-mlflow]

What it does, in one run, side by side:
  * Paritywatch: `paritywatch serve` (a subprocess, 1 uvicorn worker unless --workers) on a fresh
    SQLite file, then on a fresh scratch PostgreSQL database. For 1, 8 and 32 concurrent clients
    (threads, one httpx.Client each) every client posts columnar batches
    (`POST /api/v1/runs/{id}/metrics`) of 20 keys x 50 steps = 1,000 points, with its own client_id,
    seq 0, 1, 2..., increasing steps and its own keys (`w<i>/metric_<j>`), back to back for
    `duration` seconds. One run per client count.
  * MLflow: `mlflow server --backend-store-uri sqlite:///...` from `.venv-mlflow` (created once and
    cached; MLflow pins its own sqlalchemy/alembic, so it never goes into .venv), 8 clients, each
    with its own MLflow run, posting `POST /api/2.0/mlflow/runs/log-batch` with 1,000 metrics
    (the endpoint's maximum) of the same 20 keys x 50 steps shape.

Figures: points/s = points accepted by the server in the timed window / window; p50/p99 post latency
(ms, client-side, request sent -> response read). Bodies are pre-built strings so the load generator
spends little CPU, but it shares the machine's cores with the server; its CPU share is reported.
Target: Paritywatch SQLite 8 clients >= 100x MLflow 8 clients (DESIGN.md, Targets), each posting
the largest batch its own client sends (hooks: 10,000 points; MLflow: 1,000, its API's cap). The
same-size ratio (1,000 points each) is reported next to it.
Progress on stderr; the last stdout line is one JSON object.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402

from _common import (  # noqa: E402
    ensure_mlflow_venv,
    emit,
    median,
    mlflow_server,
    mlflow_version,
    paritywatch_server,
    percentile,
    pg_available,
    progress,
    scratch_db,
)
from trainer_hooks.monitor import ParityMonitor  # noqa: E402

KEYS = 20
# The hooks' largest batch, read from ParityMonitor's own default so the bench follows it.
HOOKS_BATCH_POINTS = inspect.signature(ParityMonitor).parameters["max_batch_points"].default
# batch sizes (steps per request, with KEYS keys): the hooks' largest batch and MLflow's log-batch cap
SHAPES = {"hooks": HOOKS_BATCH_POINTS // KEYS, "mlflow": 50}
MLFLOW_STEPS = SHAPES["mlflow"]
TARGET_RATIO = 100.0


# ------------------------------------------------------------------ load generation
class Client:
    """One sender: builds its next body (cheaply: the values part is fixed) and posts it."""

    def __init__(self, idx: int, url: str, make_body, check, points_per_request: int) -> None:  # noqa: ANN001
        self.idx, self.url, self.make_body, self.check = idx, url, make_body, check
        self.points_per_request = points_per_request
        self.http = httpx.Client(timeout=120.0, headers={"content-type": "application/json"})
        self.seq = 0
        self.latencies: list[float] = []
        self.points = 0
        self.errors: list[str] = []

    def post_one(self, record: bool) -> None:
        body = self.make_body(self.idx, self.seq)
        self.seq += 1
        t = time.perf_counter()
        try:
            r = self.http.post(self.url, content=body)
            dt = time.perf_counter() - t
            ok, why = self.check(r)
        except httpx.HTTPError as exc:
            dt, ok, why = time.perf_counter() - t, False, repr(exc)
        if not ok:
            if len(self.errors) < 5:
                self.errors.append(why)
            return
        if record:
            self.latencies.append(dt)
            self.points += self.points_per_request


def drive(clients: list[Client], duration: float, min_requests: int = 0) -> dict:
    """Warm every client up with one post, then all post back to back for `duration` seconds
    (and until each has `min_requests` timed answers: slow servers still give a fair sample)."""
    t0_deadline = [0.0, 0.0]
    cpu = [os.times()]

    def open_window() -> None:  # runs once, when every client is warm, before any is released
        t0_deadline[0] = time.perf_counter()
        t0_deadline[1] = t0_deadline[0] + duration
        cpu[0] = os.times()

    start_barrier = threading.Barrier(len(clients) + 1, action=open_window)
    finished: list[float] = []
    lock = threading.Lock()

    def worker(c: Client) -> None:
        c.post_one(record=False)  # creates its keys and opens the connection
        start_barrier.wait()
        while time.perf_counter() < t0_deadline[1] or len(c.latencies) < min_requests:
            c.post_one(record=True)
        with lock:
            finished.append(time.perf_counter())

    threads = [threading.Thread(target=worker, args=(c,), daemon=True) for c in clients]
    for t in threads:
        t.start()
    start_barrier.wait()
    t0 = t0_deadline[0]
    for t in threads:
        t.join()
    cpu0, cpu1 = cpu[0], os.times()
    wall = max(finished) - t0
    for c in clients:
        c.http.close()
    lat = [x for c in clients for x in c.latencies]
    points = sum(c.points for c in clients)
    errors = [e for c in clients for e in c.errors]
    client_cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    return {
        "clients": len(clients),
        "points_per_s": round(points / wall, 1) if wall > 0 else 0.0,
        "requests": len(lat),
        "points": points,
        "seconds": round(wall, 2),
        "p50_ms": round(median(lat) * 1000, 2) if lat else None,
        "p99_ms": round(percentile(lat, 99) * 1000, 2) if lat else None,
        "errors": len(errors),
        "error_sample": errors[:3],
        "loadgen_cpu_share": round(client_cpu / wall, 2) if wall > 0 else None,  # in cores
    }


# ------------------------------------------------------------------ Paritywatch
def paritywatch_bodies(n_clients: int, n_steps: int):  # noqa: ANN201
    """Per client a fixed `series` JSON fragment; seq and steps vary per request."""
    rng = random.Random(1234)
    client_ids = [str(uuid.uuid4()) for _ in range(n_clients)]
    series = []
    for i in range(n_clients):
        s = {f"w{i:02d}/metric_{j:02d}": [rng.random() for _ in range(n_steps)] for j in range(KEYS)}
        series.append(json.dumps(s, separators=(",", ":")))

    def make_body(i: int, seq: int) -> bytes:
        base = seq * n_steps
        steps = ",".join(str(base + k) for k in range(n_steps))
        return (f'{{"client_id":"{client_ids[i]}","seq":{seq},"steps":[{steps}],"series":{series[i]}}}').encode()

    return make_body


def paritywatch_check(points_per_request: int):  # noqa: ANN201
    def check(r: httpx.Response) -> tuple[bool, str]:
        if r.status_code != 200:
            return False, f"{r.status_code} {r.text[:200]}"
        j = r.json()
        if j.get("duplicate") or j.get("accepted") != points_per_request:
            return False, f"unexpected answer {j}"
        return True, ""

    return check


def bench_paritywatch(kind: str, shapes: list[str], client_counts: list[int], duration: float,
                      workers: int, quick: bool = False) -> dict:
    """{shape: {clients: figures}}, every measurement on a run of its own, one server per database.
    Quick: the same-size (mlflow) shape at 8 clients only, the ratio's basis (keeps it under 60 s)."""
    out: dict = {}
    with scratch_db(kind, "ingest") as db_url:
        progress(f"paritywatch/{kind}: starting the server ({workers} worker(s)) on a fresh database")
        with paritywatch_server(db_url, workers=workers, log_dir=Path(tempfile.gettempdir())) as srv:
            for shape in shapes:
                n_steps = SHAPES[shape]
                per_request = KEYS * n_steps
                for n in ([8] if quick and shape != "hooks" else client_counts):
                    run = httpx.post(f"{srv.url}/api/v1/runs", json={"name": f"ingest-{shape}-{n}", "project": "bench"},
                                     timeout=30)
                    run.raise_for_status()
                    url = f"{srv.url}/api/v1/runs/{run.json()['id']}/metrics"
                    make_body, check = paritywatch_bodies(n, n_steps), paritywatch_check(per_request)
                    clients = [Client(i, url, make_body, check, per_request) for i in range(n)]
                    progress(f"paritywatch/{kind}: {shape} batches ({per_request:,} points), "
                             f"{n} client(s) x {duration:.0f}s")
                    res = drive(clients, duration)
                    progress(f"paritywatch/{kind}: {shape}, {n} client(s): {res['points_per_s']:,.0f} points/s, "
                             f"p50 {res['p50_ms']} ms, p99 {res['p99_ms']} ms, errors {res['errors']}")
                    out.setdefault(shape, {})[str(n)] = res
    return out


# ------------------------------------------------------------------ MLflow
def mlflow_bodies(run_ids: list[str]):  # noqa: ANN201
    rng = random.Random(99)
    values = [[[rng.random() for _ in range(MLFLOW_STEPS)] for _ in range(KEYS)] for _ in run_ids]
    ts = int(time.time() * 1000)

    def make_body(i: int, seq: int) -> bytes:
        base = seq * MLFLOW_STEPS
        metrics = [
            {"key": f"metric_{j:02d}", "value": values[i][j][k], "timestamp": ts + base + k, "step": base + k}
            for j in range(KEYS)
            for k in range(MLFLOW_STEPS)
        ]
        return json.dumps({"run_id": run_ids[i], "metrics": metrics}, separators=(",", ":")).encode()

    return make_body


def mlflow_check(r: httpx.Response) -> tuple[bool, str]:
    return (True, "") if r.status_code == 200 else (False, f"{r.status_code} {r.text[:200]}")


def bench_mlflow(n_clients: int, duration: float, min_requests: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="paritywatch_bench_mlflow_") as d:
        progress(f"mlflow {mlflow_version()}: starting `mlflow server` on SQLite (its default workers)")
        with mlflow_server(Path(d)) as srv:
            api = f"{srv.url}/api/2.0/mlflow"
            run_ids = []
            for i in range(n_clients):
                r = httpx.post(f"{api}/runs/create", json={"experiment_id": "0", "run_name": f"bench-{i}",
                                                            "start_time": int(time.time() * 1000)}, timeout=60)
                r.raise_for_status()
                run_ids.append(r.json()["run"]["info"]["run_id"])
            make_body = mlflow_bodies(run_ids)
            per_request = KEYS * MLFLOW_STEPS
            clients = [Client(i, f"{api}/runs/log-batch", make_body, mlflow_check, per_request)
                       for i in range(n_clients)]
            progress(f"mlflow: {n_clients} client(s) x {duration:.0f}s, log-batch of {per_request} metrics")
            res = drive(clients, duration, min_requests=min_requests)
            progress(f"mlflow: {res['points_per_s']:,.0f} points/s, p50 {res['p50_ms']} ms, p99 {res['p99_ms']} ms, "
                     f"errors {res['errors']}")
            # Sanity: the points really landed.
            got = httpx.get(f"{api}/metrics/get-history", params={"run_id": run_ids[0], "metric_key": "metric_00"},
                            timeout=60)
            res["stored_check_points_metric_00_client0"] = len(got.json().get("metrics", [])) if got.status_code == 200 else None
            res["mlflow_version"] = mlflow_version()
            return res


# ------------------------------------------------------------------ main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="1.5 s windows (MLflow: >= 2 answers a client); skips MLflow if .venv-mlflow is not cached yet")
    ap.add_argument("--duration", type=float, help="seconds per measurement (default 10, quick 2)")
    ap.add_argument("--clients", default="1,8,32", help="comma-separated client counts for Paritywatch")
    ap.add_argument("--shapes", default="hooks,mlflow",
                    help=f"Paritywatch batch sizes: hooks ({HOOKS_BATCH_POINTS:,} points), mlflow (1,000 points)")
    ap.add_argument("--workers", type=int, default=1, help="uvicorn workers for the Paritywatch server")
    ap.add_argument("--no-postgres", action="store_true")
    ap.add_argument("--no-mlflow", action="store_true")
    args = ap.parse_args()
    duration = args.duration or (1.5 if args.quick else 10.0)
    counts = [int(x) for x in args.clients.split(",")]
    if 8 not in counts:
        counts.append(8)
    shapes = [x for x in args.shapes.split(",") if x]
    unknown = sorted(set(shapes) - set(SHAPES))
    if unknown:
        ap.error(f"unknown shape(s) {unknown}; choose from {sorted(SHAPES)}")
    if "hooks" not in shapes:
        shapes.insert(0, "hooks")  # the target's basis

    result: dict = {"bench": "ingest", "quick": args.quick,
                    "points_per_request": {shape: KEYS * SHAPES[shape] for shape in shapes} | {
                        "mlflow_log_batch": KEYS * MLFLOW_STEPS},
                    "seconds_per_measurement": duration, "server_workers": args.workers,
                    "cpu_cores": os.cpu_count()}
    notes: list[str] = []
    detail: dict = {}
    for kind in ("sqlite", "postgresql"):
        if kind == "postgresql" and (args.no_postgres or not pg_available()):
            notes.append("postgresql skipped")
            continue
        detail[kind] = bench_paritywatch(kind, shapes, counts, duration, args.workers, args.quick)
    points = {kind: {shape: {n: r["points_per_s"] for n, r in by_n.items()} for shape, by_n in res.items()}
              for kind, res in detail.items()}
    latency = {kind: {shape: {n: {"p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"]} for n, r in by_n.items()}
                      for shape, by_n in res.items()} for kind, res in detail.items()}
    errors = sum(r["errors"] for res in detail.values() for by_n in res.values() for r in by_n.values())

    mlflow_pps = None
    if args.no_mlflow:
        notes.append("mlflow skipped (--no-mlflow)")
    elif not ensure_mlflow_venv(create=not args.quick):
        notes.append("mlflow skipped: .venv-mlflow is not cached yet and --quick does not create it "
                     "(run once without --quick)")
        progress(notes[-1])
    else:
        m = bench_mlflow(8, duration, min_requests=2 if args.quick else 3)
        detail["mlflow"] = m
        mlflow_pps = m["points_per_s"] if m["errors"] == 0 or m["points"] else None

    def ratio(shape: str) -> float | None:
        pw8 = points.get("sqlite", {}).get(shape, {}).get("8")
        return round(pw8 / mlflow_pps, 1) if pw8 and mlflow_pps else None

    headline = ratio("hooks")
    result.update({
        "points_per_s": points,
        "latency_ms": latency,
        "mlflow_points_per_s": mlflow_pps,
        "mlflow_latency_ms": {"p50_ms": detail["mlflow"]["p50_ms"], "p99_ms": detail["mlflow"]["p99_ms"]}
        if "mlflow" in detail else None,
        "ratio_vs_mlflow": headline,
        "ratio_basis": f"paritywatch sqlite, 8 clients, hooks batches ({HOOKS_BATCH_POINTS:,} points) / "
                       "mlflow log-batch sqlite, 8 clients (1,000 metrics, its maximum)",
        "ratio_vs_mlflow_same_batch": ratio("mlflow") if "mlflow" in shapes else None,
        "errors": errors,
        "detail": detail,
        "notes": notes,
        "target": f">= {TARGET_RATIO:g}",
        "met": bool(headline is not None and headline >= TARGET_RATIO and errors == 0),
    })
    emit(result)


if __name__ == "__main__":
    main()
