"""Bench: metric ingest throughput (points/s) and post latency, Paritywatch vs MLflow's log-batch.

    .venv/bin/python bench/ingest.py [--quick] [--duration S] [--clients 1,8,32] [--workers N]
                                     [--no-postgres] [--no-mlflow]

What it does, in one run, side by side:
  * Paritywatch: `paritywatch serve` (a subprocess, 1 uvicorn worker unless --workers) on a fresh
    SQLite file, then on a fresh scratch PostgreSQL database. For 1, 8 and 32 concurrent clients
    (--quick: 8) (threads, one keep-alive connection each) every client posts columnar batches
    (`POST /api/v1/runs/{id}/metrics`) with its own client_id, seq 0, 1, 2..., increasing steps and
    its own keys (`w<i>/metric_<j>`), back to back for `duration` seconds, at two batch sizes:
    the hooks' largest batch (20 keys x 500 steps = 10,000 points) and MLflow's (20 x 50 = 1,000).
    One run per client count and batch size.
  * MLflow, in the same run: `mlflow server --backend-store-uri sqlite:///...` from its own venv
    (scripts/setup_mlflow_env.sh: built once, cached outside the clone; MLflow pins its own
    sqlalchemy/alembic, so it never goes into .venv), 8 clients, each with its own MLflow run,
    posting `POST /api/2.0/mlflow/runs/log-batch` with 1,000 metrics (the endpoint's maximum) of
    the same 20 keys x 50 steps shape.

Figures: points/s = points accepted by the server in the timed window / window; p50/p99 post latency
(ms, client-side, request sent -> response read). The load generator shares the machine's cores with
the servers, so it spends as little CPU as it can, the same for both sides: bodies are pre-built
strings, and each client is one keep-alive `http.client` connection (httpx cost ~0.5 ms of CPU a
request here, a quarter of what a Paritywatch batch costs the server). Its CPU share is reported.
Targets (docs/design.md, Targets), both gated, SQLite, 8 clients each side, no errors:
  * same batch size (1,000 points a request on both sides): Paritywatch >= 50x MLflow;
  * each client's largest batch (hooks 10,000 points; MLflow 1,000, its API's cap): >= 100x.
Progress on stderr; the last stdout line is one JSON object.
"""
from __future__ import annotations

import argparse
import http.client
import inspect
import json
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx

from _common import (
    Server,
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
from trainer_hooks.monitor import ParityMonitor

KEYS = 20
# The hooks' largest batch, read from ParityMonitor's own default so the bench follows it.
HOOKS_BATCH_POINTS = inspect.signature(ParityMonitor).parameters["max_batch_points"].default
# batch sizes (steps per request, with KEYS keys): the hooks' largest batch and MLflow's log-batch cap
SHAPES = {"hooks": HOOKS_BATCH_POINTS // KEYS, "mlflow": 50}
MLFLOW_STEPS = SHAPES["mlflow"]
# Paritywatch SQLite / MLflow, 8 clients each: at the same batch size, and at each client's largest batch
TARGETS = {"same_batch": 50.0, "largest_batch": 100.0}


# ------------------------------------------------------------------ load generation
@dataclass
class Answer:
    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.content)


class Client:
    """One sender on its own keep-alive connection: builds its next body (cheaply: the values
    part is fixed) and posts it."""

    def __init__(self, idx: int, url: str, make_body, check, points_per_request: int) -> None:
        self.idx, self.make_body, self.check = idx, make_body, check
        parts = urlsplit(url)
        self.path = parts.path
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120.0)
        self.points_per_request = points_per_request
        self.seq = 0
        self.latencies: list[float] = []
        self.points = 0
        self.errors: list[str] = []

    def post(self, body: bytes) -> Answer:
        self.conn.request("POST", self.path, body, {"Content-Type": "application/json"})
        r = self.conn.getresponse()
        return Answer(r.status, r.read())

    def post_one(self, record: bool) -> None:
        body = self.make_body(self.idx, self.seq)
        self.seq += 1
        t = time.perf_counter()
        try:
            r = self.post(body)
            dt = time.perf_counter() - t
            ok, why = self.check(r)
        except (OSError, http.client.HTTPException) as exc:
            self.conn.close()  # reconnects on the next request
            dt, ok, why = time.perf_counter() - t, False, repr(exc)
        if not ok:
            if len(self.errors) < 5:
                self.errors.append(why)
            return
        if record:
            self.latencies.append(dt)
            self.points += self.points_per_request

    def close(self) -> None:
        self.conn.close()


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
        c.close()
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
def paritywatch_bodies(n_clients: int, n_steps: int):
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


def paritywatch_check(points_per_request: int):
    def check(r: Answer) -> tuple[bool, str]:
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
    Quick: 8 clients only, the ratios' basis (keeps it under 60 s)."""
    out: dict = {}
    with scratch_db(kind, "ingest") as db_url:
        progress(f"paritywatch/{kind}: starting the server ({workers} worker(s)) on a fresh database")
        with paritywatch_server(db_url, workers=workers, log_dir=Path(tempfile.gettempdir())) as srv:
            for shape in shapes:
                n_steps = SHAPES[shape]
                per_request = KEYS * n_steps
                for n in ([8] if quick else client_counts):
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
def mlflow_bodies(run_ids: list[str]):
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


MLFLOW_WARMUP_S = 3.0


def mlflow_check(r: Answer) -> tuple[bool, str]:
    return (True, "") if r.status_code == 200 else (False, f"{r.status_code} {r.text[:200]}")


def bench_mlflow(srv: Server, n_clients: int, duration: float, min_requests: int) -> dict:
    """Measure a launched `mlflow server` (waiting for it to answer first); stops it after."""
    progress("mlflow: waiting for `mlflow server` to answer")
    srv.wait_ready()
    try:
        api = f"{srv.url}/api/2.0/mlflow"
        per_request = KEYS * MLFLOW_STEPS

        def clients_(prefix: str) -> tuple[list[Client], list[str]]:  # each on a new run: no point logged twice
            run_ids = []
            for i in range(n_clients):
                r = httpx.post(f"{api}/runs/create", json={"experiment_id": "0", "run_name": f"{prefix}-{i}",
                                                            "start_time": int(time.time() * 1000)}, timeout=60)
                r.raise_for_status()
                run_ids.append(r.json()["run"]["info"]["run_id"])
            make_body = mlflow_bodies(run_ids)
            return [Client(i, f"{api}/runs/log-batch", make_body, mlflow_check, per_request)
                    for i in range(n_clients)], run_ids

        # /health answers once one of MLflow's workers is up while the others may still be importing:
        # measured at once, MLflow shares the CPU with its own start (that halved its figure here).
        progress(f"mlflow: warming up for {MLFLOW_WARMUP_S:.0f}s (not timed)")
        drive(clients_("warmup")[0], MLFLOW_WARMUP_S)
        clients, run_ids = clients_("bench")
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
    finally:
        srv.stop()


# ------------------------------------------------------------------ main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="1.5 s windows, 8 clients only (MLflow: >= 1 timed answer a client)")
    ap.add_argument("--duration", type=float, help="seconds per measurement (default 10, quick 1.5)")
    ap.add_argument("--clients", default="1,8,32", help="comma-separated client counts for Paritywatch")
    ap.add_argument("--workers", type=int, default=1, help="uvicorn workers for the Paritywatch server")
    ap.add_argument("--no-postgres", action="store_true")
    ap.add_argument("--no-mlflow", action="store_true", help="Paritywatch only (then no ratio, and met is false)")
    args = ap.parse_args()
    duration = args.duration or (1.5 if args.quick else 10.0)
    counts = [int(x) for x in args.clients.split(",")]
    if 8 not in counts:
        counts.append(8)
    shapes = list(SHAPES)  # both batch sizes: each is the basis of one gated ratio

    result: dict = {"bench": "ingest", "quick": args.quick,
                    "points_per_request": {shape: KEYS * SHAPES[shape] for shape in shapes} | {
                        "mlflow_log_batch": KEYS * MLFLOW_STEPS},
                    "seconds_per_measurement": duration, "server_workers": args.workers,
                    "cpu_cores": os.cpu_count()}
    notes: list[str] = []
    detail: dict = {}
    mlflow_dir = tempfile.TemporaryDirectory(prefix="paritywatch_bench_mlflow_")
    mlflow_srv = None
    if args.no_mlflow:
        notes.append("mlflow skipped (--no-mlflow): no ratio measured")
    elif not ensure_mlflow_venv():
        notes.append("mlflow skipped: scripts/setup_mlflow_env.sh could not build its environment")
        progress(notes[-1])
    else:
        mlflow_srv = mlflow_server(Path(mlflow_dir.name))
    kinds = ["sqlite", "postgresql"]
    if args.quick and mlflow_srv is not None:
        # MLflow's server needs 10-40 s to start its workers: in --quick it starts first, while
        # Paritywatch on PostgreSQL is measured (figures in no ratio); SQLite, the ratios' side, is
        # measured once MLflow answers, so its start does not share the CPU with either side of a ratio.
        progress(f"mlflow {mlflow_version()}: starting `mlflow server` on SQLite (its default workers) "
                 "while Paritywatch on PostgreSQL is measured")
        mlflow_srv.launch()
        kinds.reverse()
        notes.append("quick: MLflow's server started while Paritywatch on PostgreSQL was measured; SQLite "
                     "(the ratios) after MLflow answered")
    try:
        for kind in kinds:
            if kind == "postgresql" and (args.no_postgres or not pg_available()):
                notes.append("postgresql skipped")
                continue
            if kind == "sqlite" and mlflow_srv is not None and mlflow_srv.proc is not None:
                mlflow_srv.wait_ready()
            detail[kind] = bench_paritywatch(kind, shapes, counts, duration, args.workers, args.quick)
        if mlflow_srv is not None and mlflow_srv.proc is None:
            progress(f"mlflow {mlflow_version()}: starting `mlflow server` on SQLite (its default workers)")
            mlflow_srv.launch()
    except BaseException:
        if mlflow_srv is not None:
            mlflow_srv.stop()
        raise
    points = {kind: {shape: {n: r["points_per_s"] for n, r in by_n.items()} for shape, by_n in res.items()}
              for kind, res in detail.items()}
    latency = {kind: {shape: {n: {"p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"]} for n, r in by_n.items()}
                      for shape, by_n in res.items()} for kind, res in detail.items()}
    errors = sum(r["errors"] for res in detail.values() for by_n in res.values() for r in by_n.values())

    mlflow_pps = None
    if mlflow_srv is not None:
        # at least 4 timed answers per client (32 in all): MLflow answers a 1,000-metric batch in
        # ~0.5 s under this load, so a 1.5 s window alone read it from ~17 requests, low and noisy
        m = bench_mlflow(mlflow_srv, 8, duration, min_requests=4)
        detail["mlflow"] = m
        errors += m["errors"]
        mlflow_pps = m["points_per_s"] if m["points"] else None

    def ratio(shape: str) -> float | None:
        pw8 = points.get("sqlite", {}).get(shape, {}).get("8")
        return round(pw8 / mlflow_pps, 1) if pw8 and mlflow_pps else None

    ratios = {"same_batch": ratio("mlflow"), "largest_batch": ratio("hooks")}
    met = {name: bool(r is not None and r >= TARGETS[name]) for name, r in ratios.items()}
    result.update({
        "points_per_s": points,
        "latency_ms": latency,
        "mlflow_points_per_s": mlflow_pps,
        "mlflow_latency_ms": {"p50_ms": detail["mlflow"]["p50_ms"], "p99_ms": detail["mlflow"]["p99_ms"]}
        if "mlflow" in detail else None,
        "ratio_vs_mlflow_same_batch": ratios["same_batch"],
        "ratio_vs_mlflow_largest_batch": ratios["largest_batch"],
        "ratio_basis": {
            "same_batch": "paritywatch sqlite, 8 clients, 1,000-point batches / mlflow log-batch sqlite, 8 clients, "
                          "1,000 metrics",
            "largest_batch": f"paritywatch sqlite, 8 clients, {HOOKS_BATCH_POINTS:,}-point batches (the hooks' "
                             "largest) / mlflow log-batch sqlite, 8 clients, 1,000 metrics (its maximum)",
        },
        "errors": errors,
        "detail": detail,
        "notes": notes,
        "target": f"same batch >= {TARGETS['same_batch']:g}x and largest batch >= {TARGETS['largest_batch']:g}x, "
                  "no errors",
        "met_same_batch": met["same_batch"],
        "met_largest_batch": met["largest_batch"],
        "met": all(met.values()) and errors == 0,
    })
    mlflow_dir.cleanup()
    emit(result)


if __name__ == "__main__":
    main()
