"""Alerts people can trust (issue 12): how many notifications one simulated incident-heavy run sends.

A 256-worker run, simulated over real HTTP against a `paritywatch serve` subprocess: 1 trainer and
256 rollout workers each post a metric batch every second, heartbeat every 2 s and long-poll the run's
control state (25 s, like the hooks). Then:

1. 200 workers register mismatching processors (two different wrong ones: the model's default chat
   template, and one whose generation prompt has an extra newline) one after another over 10 s;
   the first bad registration pauses the run (we time how long each of the 257 processes takes to
   see the pause, from the moment the first bad fingerprint is sent);
2. a rule on `reward/flap` (keep_firing_for 2) sees its metric cross the threshold 50 times;
3. 100 workers fall silent together (they stop without closing);
4. the run finishes: the other workers and then the trainer close.

A local receiver (one webhook, every event type, its grouping set on the webhook) counts what
arrives. Targets: <= 2 notifications each for the mismatch group, the silent workers and the
flapping rule (firing, then resolved), 0 set off by the finish (but the one `run.ended_tainted`
its record calls for: the simulated processes post steps through the pause, so the run trains
while the mismatch is open), 0 duplicate deliveries, and the pause seen by every process within
p99 < 1 s.

    .venv/bin/python bench/alerts.py [--quick] [--db sqlite|postgresql]
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import allow_loopback_webhooks, emit, median, paritywatch_server, percentile, progress, scratch_db

import httpx

WORKERS, BAD, SILENT, FLAPS = 256, 200, 100, 50
POST_LATENCY_S: dict[str, list[float]] = {"metrics": [], "heartbeat": []}
TARGET_PAUSE_P99_S = 1.0


@dataclass
class Timings:
    heartbeat_s: float  # how often each simulated process heartbeats (the hooks' default is 10 s)
    heartbeat_timeout_s: float
    group_wait_s: float
    group_interval_s: float
    register_over_s: float
    flap_rate: float  # batches a second

    @classmethod
    def for_mode(cls, quick: bool) -> "Timings":
        # The hooks heartbeat every 10 s against a 60 s timeout; the clock here is shorter, the
        # ratio alike. The silent workers' last heartbeats spread over one heartbeat interval and
        # the sweep runs every 0.5 s: a group wait well above that holds them all in one message.
        return cls(2.0, 8.0, 5.0, 6.0, 10.0, 20.0) if quick else cls(2.5, 15.0, 6.0, 20.0, 10.0, 5.0)


# ------------------------------------------------------------------ a small HTTP/1.1 client
class Conn:
    """One keep-alive connection on asyncio streams: the load generator must cost far less than
    the server it measures (httpx's AsyncClient with 500 connections would not)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else b""
        for attempt in range(3):
            try:
                if self.writer is None:
                    self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
                head = (f"{method} /api/v1{path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(data)}\r\n\r\n")
                self.writer.write(head.encode() + data)
                await self.writer.drain()
                status = int((await self.reader.readline()).split()[1])
                length = 0
                while (line := await self.reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode("latin-1").partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                payload = await self.reader.readexactly(length)
                return status, (json.loads(payload) if payload else {})
            except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                self.close()
                if attempt == 2:
                    raise
                await asyncio.sleep(0.2)
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None


# ------------------------------------------------------------------ the receiver
class Receiver:
    """Counts what the webhook gets."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, dict]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                receiver.events.append((time.monotonic(), self.headers.get("webhook-id", ""), json.loads(body)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of_kind(self, kind: str) -> list[dict]:
        return [e for _, _, e in self.events if e["type"].startswith("alert.")
                and (e["data"].get("group", {}).get("labels", {}).get("kind") == kind)]


# ------------------------------------------------------------------ simulated processes
@dataclass
class Process:
    side: str
    worker_id: str
    keys: list[str]
    component_id: int = 0
    client_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    seq: int = 0
    silent: bool = False
    closed: bool = False
    paused_at: float | None = None
    errors: int = 0


async def post_loop(p: Process, url: str, run_id: int, stop: asyncio.Event, heartbeat_s: float) -> None:
    """A metric batch every second and a heartbeat every `heartbeat_s`, until the process falls
    silent, closes or the run ends."""
    conn = Conn(url)
    await asyncio.sleep(random.random())
    next_heartbeat = time.monotonic()
    try:
        while not (stop.is_set() or p.silent or p.closed):
            p.seq += 1
            t0 = time.monotonic()
            status, _ = await conn.request("POST", f"/runs/{run_id}/metrics", {
                "client_id": p.client_id, "seq": p.seq, "steps": [p.seq],
                "series": {k: [random.random() * (0.0 if k.startswith("align/") else 1.0)] for k in p.keys}})
            POST_LATENCY_S["metrics"].append(time.monotonic() - t0)
            p.errors += status != 200
            if time.monotonic() >= next_heartbeat:
                next_heartbeat += heartbeat_s
                t1 = time.monotonic()
                hb, _ = await conn.request("POST", f"/runs/{run_id}/components/{p.component_id}/heartbeat")
                POST_LATENCY_S["heartbeat"].append(time.monotonic() - t1)
                p.errors += hb != 200
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
    finally:
        conn.close()


async def control_loop(p: Process, url: str, run_id: int, stop: asyncio.Event) -> None:
    """The hooks' long-poll (25 s, as ParityMonitor's poll_timeout_s): notes when this process
    first sees the run paused."""
    conn = Conn(url)
    version = 0
    await asyncio.sleep(random.random())
    try:
        while not (stop.is_set() or p.silent or p.closed):
            status, control = await conn.request("GET", f"/runs/{run_id}/control/wait?after_version={version}&timeout=25")
            if status != 200:
                p.errors += 1
                await asyncio.sleep(0.2)
                continue
            version = control["version"]
            if control["state"] == "paused" and p.paused_at is None:
                p.paused_at = time.monotonic()
    finally:
        conn.close()


async def gather_limited(coros, limit: int = 32):
    sem = asyncio.Semaphore(limit)

    async def run(c):
        async with sem:
            return await c

    return await asyncio.gather(*(run(c) for c in coros))


async def post_fingerprint(url: str, run_id: int, p: Process, fp: dict) -> None:
    conn = Conn(url)
    path = f"/runs/{run_id}/components/{p.component_id}/fingerprint"
    status, _ = await conn.request("POST", path, {"digest": fp["digest"]})
    if status == 404:  # the server does not have it yet: the full object, as the hooks do
        status, _ = await conn.request("POST", path, fp)
    conn.close()
    assert status == 200, status


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def scenario(url: str, run_id: int, t: Timings, fps: tuple[dict, dict, dict], rx: Receiver,
                   server_pid: int) -> dict:
    good_fp, bad_x, bad_y = fps
    trainer = Process("trainer", "trainer-0", ["loss", "align/kl_k3", "align/decode_mismatch_frac"])
    rollouts = [Process("rollout", f"rollout-{i:03d}", [f"rollout/{k}" for k in ("reward", "len", "entropy", "tps")])
                for i in range(WORKERS)]
    everyone = [trainer, *rollouts]

    async def register(p: Process) -> None:
        conn = Conn(url)
        status, body = await conn.request("POST", f"/runs/{run_id}/components",
                                          {"side": p.side, "worker_id": p.worker_id, "host": "sim", "pid": 1})
        conn.close()
        assert status == 200, body
        p.component_id = body["id"]

    progress(f"registering 1 trainer + {WORKERS} rollout workers")
    await gather_limited(register(p) for p in everyone)
    good = rollouts[: WORKERS - BAD]
    bad = rollouts[WORKERS - BAD:]
    await post_fingerprint(url, run_id, trainer, good_fp)
    await gather_limited(post_fingerprint(url, run_id, p, good_fp) for p in good)
    stop = asyncio.Event()
    loops = [asyncio.create_task(post_loop(p, url, run_id, stop, t.heartbeat_s)) for p in everyone]
    loops += [asyncio.create_task(control_loop(p, url, run_id, stop)) for p in everyone]
    await asyncio.sleep(3.0)  # every process posting and long-polling
    steady = {k: {"p50": round(median(v) * 1e3, 1), "p99": round(percentile(v, 99) * 1e3, 1)} for k, v in POST_LATENCY_S.items()}
    progress(f"steady state, before the registrations: {steady}")
    POST_LATENCY_S["metrics"].clear()
    POST_LATENCY_S["heartbeat"].clear()

    progress(f"{BAD} workers register mismatching processors over {t.register_over_s:g} s")
    t0 = time.monotonic()
    cpu0 = cpu_seconds(server_pid), time.process_time()
    posts = []  # asyncio holds tasks weakly: keep them, or one may be collected mid-flight
    for i, p in enumerate(bad):
        target = t0 + i * t.register_over_s / BAD
        await asyncio.sleep(max(0.0, target - time.monotonic()))
        posts.append(asyncio.create_task(post_fingerprint(url, run_id, p, bad_x if i % 2 == 0 else bad_y)))
    deadline = time.monotonic() + 15
    while any(p.paused_at is None for p in everyone) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.gather(*posts)
    pause_s = [p.paused_at - t0 for p in everyone if p.paused_at is not None]
    wall = time.monotonic() - t0
    load = {"server_cpu_cores": round((cpu_seconds(server_pid) - cpu0[0]) / wall, 2),
            "loadgen_cpu_cores": round((time.process_time() - cpu0[1]) / wall, 2),
            "machine_load_avg": round(os.getloadavg()[0], 1),
            "metrics_post_ms": {"p50": round(median(POST_LATENCY_S["metrics"]) * 1e3, 1),
                                "p99": round(percentile(POST_LATENCY_S["metrics"], 99) * 1e3, 1)},
            "heartbeat_ms": {"p50": round(median(POST_LATENCY_S["heartbeat"]) * 1e3, 1),
                             "p99": round(percentile(POST_LATENCY_S["heartbeat"], 99) * 1e3, 1)}}
    progress(f"while {len(everyone)} processes post a batch every second: {load}")
    progress(f"pause seen by {len(pause_s)}/{len(everyone)} processes: p50 {median(pause_s) * 1e3:.0f} ms, "
             f"p99 {percentile(pause_s, 99) * 1e3:.0f} ms")

    progress(f"the flapping rule crosses its threshold {FLAPS} times; {SILENT} workers fall silent together")
    for p in rollouts[:SILENT]:
        p.silent = True
    silent_at = time.monotonic()
    conn = Conn(url)
    for i in range(2 * FLAPS):
        await conn.request("POST", f"/runs/{run_id}/metrics", {"client_id": "flapper", "seq": i, "steps": [i],
                                                               "series": {"reward/flap": [0.9 if i % 2 else 0.1]}})
        await asyncio.sleep(1.0 / t.flap_rate)
    conn.close()
    deadline = silent_at + t.heartbeat_timeout_s + t.group_wait_s + 10
    while not rx.of_kind("heartbeat_lost") and time.monotonic() < deadline:
        await asyncio.sleep(0.1)

    progress("the run finishes: the other workers, then the trainer, close")
    finished_after = time.monotonic()
    rx_before_finish = len(rx.events)

    async def close(p: Process) -> dict:
        p.closed = True
        c = Conn(url)
        status, body = await c.request("POST", f"/runs/{run_id}/components/{p.component_id}/close", {"reason": "done"})
        c.close()
        assert status == 200, body
        return body

    await gather_limited(close(p) for p in rollouts[SILENT:])
    final = await close(trainer)
    stop.set()
    for task in loops:  # a long-poll would otherwise run out its 25 s
        task.cancel()
    await asyncio.gather(*loops, return_exceptions=True)
    deadline = time.monotonic() + t.group_interval_s + 10
    kinds = ("processor_mismatch", "heartbeat_lost", "metric_threshold")
    while time.monotonic() < deadline and not all(
            any(e["type"] == "alert.resolved" for e in rx.of_kind(k)) for k in kinds):
        await asyncio.sleep(0.2)
    await asyncio.sleep(2.0)  # anything more, late, would be counted too
    return {"pause_s": pause_s, "processes": len(everyone), "load": load, "final_state": final["control"]["state"],
            "finished_after": finished_after, "events_before_finish": rx_before_finish,
            "errors": sum(p.errors for p in everyone)}


def fingerprints() -> tuple[dict, dict, dict]:
    """The trainer's processor (custom template), the model's default one, and one whose
    generation prompt has an extra newline: real tokenizers, fingerprinted like the hooks do."""
    from paritywatch.demo.model_dir import DEFAULT_TEMPLATE, build_model_dir, load_processor
    from trainer_hooks.fingerprint import fingerprint_processor

    model_dir = build_model_dir(Path(tempfile.gettempdir()) / "paritywatch-bench-model")
    other = copy.copy(load_processor(model_dir, custom_template=False))
    other.chat_template = DEFAULT_TEMPLATE.replace("<|im_start|>assistant\n{% endif %}", "<|im_start|>assistant\n\n{% endif %}")
    return (fingerprint_processor(load_processor(model_dir, custom_template=True)),
            fingerprint_processor(load_processor(model_dir, custom_template=False)),
            fingerprint_processor(other))


def count(rx: Receiver, result: dict) -> dict:
    ids = Counter(i for _, i, _ in rx.events)
    after_finish = [e for at, _, e in rx.events if at >= result["finished_after"]]
    return {
        "mismatch": len(rx.of_kind("processor_mismatch")),
        "silent_workers": len(rx.of_kind("heartbeat_lost")),
        "flapping_rule": len(rx.of_kind("metric_threshold")),
        # what the finish itself set off: anything after it that is not an announced group resolving,
        # nor the one run.ended_tainted its record calls for (counted apart: the simulated processes
        # keep posting steps through the pause, so the run did train steps while the mismatch was open)
        "finished_run": sum(1 for e in after_finish if e["type"] not in ("alert.resolved", "run.ended_tainted")),
        "ended_tainted": [e["data"]["taint"]["steps"] for _, _, e in rx.events if e["type"] == "run.ended_tainted"],
        "duplicates": sum(n - 1 for n in ids.values()),
        "run_control": [e["data"]["control"]["state"] for _, _, e in rx.events if e["type"] == "run.control"],
        "total": len(rx.events),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter group intervals and flapping (under 60 s)")
    ap.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite")
    args = ap.parse_args()
    t = Timings.for_mode(args.quick)
    allow_loopback_webhooks()
    os.environ.update({
        "PARITYWATCH_WEBHOOK_POLL_INTERVAL_S": "0.05",
        "PARITYWATCH_NOTIFY_INTERVAL_S": "0.1", "PARITYWATCH_HEARTBEAT_TIMEOUT_S": str(t.heartbeat_timeout_s),
        "PARITYWATCH_HEARTBEAT_CHECK_INTERVAL_S": "0.5",
    })
    progress("fingerprinting three real processors (the trainer's and two wrong ones)")
    fps = fingerprints()
    rx = Receiver()
    with scratch_db(args.db, "alerts") as db_url, paritywatch_server(db_url) as srv, \
            httpx.Client(base_url=srv.url + "/api/v1", timeout=30) as api:
        api.post("/webhooks", json={"url": rx.url, "group_wait_s": t.group_wait_s,
                                    "group_interval_s": t.group_interval_s}).raise_for_status()
        run_id = api.post("/runs", json={"name": "bench-alerts", "project": "bench"}).json()["id"]
        api.post(f"/runs/{run_id}/rules", json={"key": "reward/flap", "comparison": "<", "threshold": 0.5,
                                                 "keep_firing_for": 2}).raise_for_status()
        result = asyncio.run(scenario(srv.url, run_id, t, fps, rx, srv.proc.pid))
        alerts = api.get(f"/runs/{run_id}/alerts", params={"limit": 1000}).json()["alerts"]
        taint = api.get(f"/runs/{run_id}/taint").json()
        tracebacks = srv.log_path.read_text(errors="replace").count("Traceback")
    rx.server.shutdown()
    counts = count(rx, result)
    pause = result["pause_s"]
    p99 = percentile(pause, 99)
    progress(f"notifications: {counts}")
    met = (counts["mismatch"] <= 2 and counts["silent_workers"] <= 2 and counts["flapping_rule"] <= 2
           and counts["finished_run"] == 0 and counts["duplicates"] == 0 and result["final_state"] == "finished"
           and counts["ended_tainted"] == ([taint["steps"]] if taint["tainted"] else [])
           and len(pause) == result["processes"] and p99 < TARGET_PAUSE_P99_S and tracebacks == 0)
    emit({
        "bench": "alerts", "quick": args.quick, "db": args.db, "workers": WORKERS, "bad_workers": BAD,
        "silent_workers": SILENT, "flaps": FLAPS, "timings": vars(t),
        "notifications": counts,
        "alerts": dict(Counter(a["kind"] for a in alerts)), "final_state": result["final_state"],
        "tainted_steps": taint["steps"],
        "pause_ms": {"p50": round(median(pause) * 1e3, 1), "p99": round(p99 * 1e3, 1), "seen_by": len(pause),
                     "processes": result["processes"]},
        "during_registrations": result["load"],
        "http_errors": result["errors"], "server_tracebacks": tracebacks,
        "target": "<= 2 notifications each for the mismatch group, the silent workers and the flapping rule; "
                  "0 for the finished run besides one run.ended_tainted when its record is tainted; 0 duplicates; "
                  "pause p99 < 1000 ms while 257 processes post every second",
        "met": met,
    })


if __name__ == "__main__":
    main()
