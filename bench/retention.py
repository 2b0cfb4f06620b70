"""Run deletion under live ingest: deleting a big run must not push a live run's ingest p99 over its target.

docs/design.md target (ingest at scale): post latency p99 < 250 ms. Here one run of 10M points
(`--quick`: 500k) is seeded, then a live run is fed by N rollout posters (real HTTP clients, one
columnar batch a second each, as in bench/load.py), its p99 measured for a baseline window, then
`DELETE /api/v1/runs/{big}` is sent and the p99 is measured again until the background purge has
removed the last row (`GET /api/v1/run-deletions` shows `finished_at`). Afterwards the live run
must hold exactly what was acknowledged and no row of the deleted run may remain.

    .venv/bin/python bench/retention.py            # 10M points, 64 posters, SQLite then PostgreSQL
    .venv/bin/python bench/retention.py --quick    # 500k points, 32 posters, both (under 60 s)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, paritywatch_server, percentile, pg_available, progress, scratch_db
from load import ROLLOUT_KEYS, RawHTTP

import httpx

TARGET_P99_MS = 250.0
SEED_KEYS = [f"train/metric_{i}" for i in range(10)]
# 1,000-point batches of 100-point (dense) chunks: retention folds each into level 1 as it drops it,
# the costlier of its two paths
SEED_STEPS_PER_BATCH = 100


def seed_big_run(db_url: str, points: int) -> tuple[int, dict]:
    """A run of `points` points written through the ingest path (MetricStore), before the server
    starts; returns its id and its row counts."""
    from sqlalchemy import text

    from paritywatch.backend import migrate
    from paritywatch.backend.db import Database
    from paritywatch.backend.models import Run
    from paritywatch.backend.store.metrics import MetricStore, prepare_batch

    migrate.upgrade(db_url)
    db = Database(db_url)
    try:
        with db.write() as s:
            run = Run(name="big-old-run", project="bench")
            s.add(run)
            s.flush()
            run_id = run.id
        store = MetricStore(db)
        per_batch = len(SEED_KEYS) * SEED_STEPS_PER_BATCH
        batches = points // per_batch
        values = [0.5] * SEED_STEPS_PER_BATCH
        started = time.monotonic()
        for seq in range(batches):
            steps = list(range(seq * SEED_STEPS_PER_BATCH, (seq + 1) * SEED_STEPS_PER_BATCH))
            store.ingest(run_id, "seed", seq, prepare_batch(steps, {k: values for k in SEED_KEYS}, 100_000, 200))
            if seq and seq % max(1, batches // 10) == 0:
                progress(f"  seeded {seq * per_batch:,} points ({seq * per_batch / (time.monotonic() - started):,.0f}/s)")
        with db.read() as s:
            counts = {t: s.execute(text(f"SELECT count(*) FROM {t}")).scalar()
                      for t in ("metric_chunks", "metric_rollups", "ingest_batches")}
        return run_id, counts
    finally:
        db.dispose()


class LiveLoad:
    """`workers` posters, one batch a second each, into one run, in a thread of their own, until
    stop(). Every answered post is kept as (start time, latency ms)."""

    def __init__(self, url: str, run_id: int, workers: int, points_per_post: int):
        self.url, self.run_id = url, run_id
        self.workers, self.steps = workers, max(1, points_per_post // len(ROLLOUT_KEYS))
        self.samples: list[tuple[float, float]] = []
        self.acknowledged = 0
        self.status_5xx = self.other_errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="live-load")

    def start(self) -> "LiveLoad":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    async def _main(self) -> None:
        await asyncio.gather(*(self._poster(i) for i in range(self.workers)))

    async def _poster(self, index: int) -> None:
        client = RawHTTP(self.url + "/api/v1", None)
        client_id, seq = uuid.uuid4().hex, 0
        await asyncio.sleep(index / self.workers)  # spread over the second, like real workers
        next_at = time.monotonic()
        try:
            while not self._stop.is_set():
                base = index * 10**9 + seq * self.steps
                body = {"client_id": client_id, "seq": seq, "steps": list(range(base, base + self.steps)),
                        "series": {k: [0.25] * self.steps for k in ROLLOUT_KEYS}}
                payload = json.dumps(body, separators=(",", ":")).encode()
                while not self._stop.is_set():  # the same (client_id, seq) until acknowledged
                    t0 = time.monotonic()
                    try:
                        status, answer = await client.post(f"/runs/{self.run_id}/metrics", payload)
                    except OSError:
                        self.other_errors += 1
                        await asyncio.sleep(0.2)
                        continue
                    if status == 200:
                        self.samples.append((t0, (time.monotonic() - t0) * 1000))
                        if not json.loads(answer)["duplicate"]:
                            self.acknowledged += self.steps * len(ROLLOUT_KEYS)
                        break
                    if status >= 500:
                        self.status_5xx += 1
                    else:
                        self.other_errors += 1
                    await asyncio.sleep(0.2)
                seq += 1
                next_at += 1.0
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        finally:
            await client.close()

    def latencies(self, start: float, end: float) -> list[float]:
        return [ms for t0, ms in self.samples if start <= t0 < end]


def wait_deleted(url: str, run_id: int, timeout: float) -> float | None:
    """Seconds until the deletion of `run_id` has finished (None: not within `timeout`)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        deletions = httpx.get(f"{url}/api/v1/run-deletions", timeout=30).json()["deletions"]
        if any(d["run_id"] == run_id and d["finished_at"] for d in deletions):
            return time.monotonic() - started
        time.sleep(0.25)
    return None


def leftover_rows(db_url: str, run_id: int) -> int:
    """Rows of the deleted run still anywhere (chunks and roll-ups of series no key owns count too)."""
    from sqlalchemy import text

    from paritywatch.backend.db import Database

    db = Database(db_url)
    try:
        with db.read() as s:
            return sum(s.execute(text(sql), {"r": run_id}).scalar() for sql in (
                "SELECT count(*) FROM runs WHERE id = :r",
                "SELECT count(*) FROM metric_keys WHERE run_id = :r",
                "SELECT count(*) FROM ingest_batches WHERE run_id = :r",
                "SELECT count(*) FROM metric_chunks WHERE series_id NOT IN (SELECT id FROM metric_keys)",
                "SELECT count(*) FROM metric_rollups WHERE series_id NOT IN (SELECT id FROM metric_keys)",
            ))
    finally:
        db.dispose()


def one_database(kind: str, points: int, workers: int, points_per_post: int, baseline_s: float) -> dict:
    with scratch_db(kind, "retention") as db_url:
        progress(f"{kind}: seeding a run of {points:,} points")
        t = time.monotonic()
        big_id, rows = seed_big_run(db_url, points)
        progress(f"{kind}: seeded in {time.monotonic() - t:.1f} s: {rows}")
        with paritywatch_server(db_url) as server:
            live_id = httpx.post(server.url + "/api/v1/runs", json={"name": "live"}, timeout=30).json()["id"]
            progress(f"{kind}: live run fed by {workers} posters x {points_per_post} points/s; "
                     f"{baseline_s:.0f} s baseline, then DELETE the big run")
            load = LiveLoad(server.url, live_id, workers, points_per_post).start()
            time.sleep(2.0)  # warm-up: connections open, keys created
            base_start = time.monotonic()
            time.sleep(baseline_s)
            delete_at = time.monotonic()
            r = httpx.delete(f"{server.url}/api/v1/runs/{big_id}", params={"reason": "bench"}, timeout=30)
            delete_answer_ms = (time.monotonic() - delete_at) * 1000
            assert r.status_code == 204, r.text
            purge_s = wait_deleted(server.url, big_id, timeout=max(120.0, points / 20_000))
            done_at = time.monotonic()
            time.sleep(1.0)
            load.stop()
            stored = sum(k["count"] for k in httpx.get(f"{server.url}/api/v1/runs/{live_id}/metrics",
                                                       timeout=60).json()["keys"])
            log_text = server.log_path.read_text(errors="replace")
        base, during = load.latencies(base_start, delete_at), load.latencies(delete_at, done_at)
        res = {
            "points_deleted": points, "rows_deleted": rows, "purge_s": round(purge_s, 1) if purge_s else None,
            "points_deleted_per_s": round(points / purge_s) if purge_s else None,
            "delete_answer_ms": round(delete_answer_ms, 1),
            "baseline": {"posts": len(base), "p50_ms": round(percentile(base, 50), 1), "p99_ms": round(percentile(base, 99), 1)},
            "during_delete": {"posts": len(during), "p50_ms": round(percentile(during, 50), 1),
                              "p99_ms": round(percentile(during, 99), 1),
                              "max_ms": round(max(during), 1) if during else None},
            "status_5xx": load.status_5xx, "other_errors": load.other_errors,
            "live_points_acknowledged": load.acknowledged, "live_points_stored": stored,
            "leftover_rows_of_deleted_run": leftover_rows(db_url, big_id),
            "database_locked_in_log": log_text.count("database is locked"),
            "tracebacks_in_log": log_text.count("Traceback"),
        }
    progress(f"{kind}: purge {res['purge_s']} s; live p99 {res['baseline']['p99_ms']} ms before, "
             f"{res['during_delete']['p99_ms']} ms during ({res['during_delete']['posts']} posts); "
             f"leftover rows {res['leftover_rows_of_deleted_run']}")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="500k points, 32 posters (under 60 s)")
    ap.add_argument("--points", type=int, help="points of the deleted run (default 10M, quick 500k)")
    ap.add_argument("--workers", type=int, help="live posters (default 64, quick 32)")
    ap.add_argument("--points-per-post", type=int, default=600)
    ap.add_argument("--baseline", type=float, help="baseline seconds (default 15, quick 4)")
    ap.add_argument("--no-postgres", action="store_true")
    args = ap.parse_args()
    points = args.points or (500_000 if args.quick else 10_000_000)
    workers = args.workers or (32 if args.quick else 64)
    baseline = args.baseline or (4.0 if args.quick else 15.0)
    results, notes = {}, []
    for kind in ("sqlite", "postgresql"):
        if kind == "postgresql" and (args.no_postgres or not pg_available()):
            notes.append("postgresql skipped")
            continue
        results[kind] = one_database(kind, points, workers, args.points_per_post, baseline)
    met = bool(results) and all(
        r["purge_s"] is not None and r["during_delete"]["posts"] > 0 and r["during_delete"]["p99_ms"] < TARGET_P99_MS
        and r["status_5xx"] == 0 and r["leftover_rows_of_deleted_run"] == 0 and r["database_locked_in_log"] == 0
        and r["live_points_stored"] == r["live_points_acknowledged"]
        for r in results.values())
    emit({
        "bench": "retention", "quick": args.quick, "points_deleted": points, "live_posters": workers,
        "live_points_per_s": workers * args.points_per_post, "cpu_cores": os.cpu_count(),
        "p99_ms_during_delete": {k: r["during_delete"]["p99_ms"] for k, r in results.items()},
        "p99_ms_baseline": {k: r["baseline"]["p99_ms"] for k, r in results.items()},
        "purge_s": {k: r["purge_s"] for k, r in results.items()},
        "p99_ratio_during_vs_baseline": {k: round(r["during_delete"]["p99_ms"] / r["baseline"]["p99_ms"], 2)
                                         for k, r in results.items() if r["baseline"]["p99_ms"]},
        "detail": results, "notes": notes,
        "target": f"live ingest p99 < {TARGET_P99_MS:g} ms while a {points:,}-point run is deleted; the purge "
                  "finishes, no row of it left, no 5xx, the live run keeps every acknowledged point",
        "met": met,
    })


if __name__ == "__main__":
    main()
