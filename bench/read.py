"""Bench: downsampled read of a 1M-point series into 1,000 buckets (min/max/last), SQLite and PostgreSQL.

    .venv/bin/python bench/read.py [--quick] [--points N] [--reads N] [--no-postgres]

For each database (fresh SQLite file, fresh scratch PostgreSQL database):
  1. seeds ONE series of 1,000,000 points (--quick: 100,000) THROUGH THE API: `paritywatch serve` as a
     subprocess, `POST /api/v1/runs/{id}/metrics` in batches of 50,000 steps (so the multi-resolution
     roll-ups are built by the real ingest path);
  2. times `GET /api/v1/runs/{id}/series?key=...&points=1000` over HTTP: one warm-up, then >= 20 reads
     (default 30), median and p90 (client-side, includes HTTP and JSON);
  3. times the same read in-process (`MetricStore.series`, no HTTP) for the breakdown;
  4. as the reference, in the same run: the plain GROUP BY over the raw points of the series (unpacked
     into a scratch row-per-point table first, untimed) with
     the same bucket width and origin (min, max, last, count),
     median of 5 (--quick: 3), and the ratio reference / API read;
  5. checks the API's buckets against the reference (count, min, max, last per bucket).
Target: median API read < 100 ms on both databases (docs/design.md, Targets).
Progress on stderr; the last stdout line is one JSON object.
"""
from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx

from _common import emit, median, paritywatch_server, percentile, pg_available, progress, scratch_db

KEY = "align/kl_k3"
BUCKETS = 1000
SEED_BATCH = 50_000
TARGET_MS = 100.0


def seed(srv_url: str, n_points: int) -> tuple[int, float]:
    run = httpx.post(f"{srv_url}/api/v1/runs", json={"name": "read-bench", "project": "bench"}, timeout=30)
    run.raise_for_status()
    run_id = run.json()["id"]
    rng = random.Random(7)
    x = 0.0
    t0 = time.perf_counter()
    with httpx.Client(timeout=300) as http:
        for seq, start in enumerate(range(0, n_points, SEED_BATCH)):
            steps = list(range(start, min(n_points, start + SEED_BATCH)))
            values = []
            for _ in steps:
                x += rng.gauss(0, 0.01)
                values.append(x)
            r = http.post(f"{srv_url}/api/v1/runs/{run_id}/metrics",
                          json={"client_id": "read-bench-seeder", "seq": seq, "steps": steps, "series": {KEY: values}})
            r.raise_for_status()
            assert r.json()["accepted"] == len(steps), r.text
            if seq % 5 == 4:
                progress(f"  seeded {steps[-1] + 1:,} / {n_points:,} points")
    return run_id, time.perf_counter() - t0


def time_api(srv_url: str, run_id: int, reads: int) -> tuple[list[float], dict]:
    samples = []
    with httpx.Client(timeout=60) as http:
        url = f"{srv_url}/api/v1/runs/{run_id}/series"
        params = {"key": KEY, "points": BUCKETS}
        answer = http.get(url, params=params)  # warm-up
        answer.raise_for_status()
        for _ in range(reads):
            t = time.perf_counter()
            r = http.get(url, params=params)
            r.json()
            samples.append(time.perf_counter() - t)
            r.raise_for_status()
    return samples, answer.json()


def time_store(db_url: str, run_id: int, reads: int) -> list[float]:
    from paritywatch.backend.db import Database
    from paritywatch.backend.store.metrics import MetricStore

    db = Database(db_url)
    try:
        store = MetricStore(db)
        def read() -> None:  # one read transaction, as the route's
            with db.read() as s:
                store.series(s, run_id, KEY, BUCKETS, None, None)

        read()
        samples = []
        for _ in range(reads):
            t = time.perf_counter()
            read()
            samples.append(time.perf_counter() - t)
        return samples
    finally:
        db.dispose()


def reference_group_by(db_url: str, run_id: int, origin: int, width: int, reps: int) -> tuple[list[float], dict]:
    """The plain GROUP BY over the raw points, same buckets; timed in-process on a driver connection.

    The store keeps raw points packed (`metric_chunks`), so the reference first unpacks the series
    into a scratch one-row-per-point table `bench_raw_points (series_id, step, value)` indexed on
    (series_id, step), the layout a row-per-point store would have (not timed), then times the
    GROUP BY over it, and drops it."""
    from sqlalchemy import text

    from paritywatch.backend.db import Database
    from paritywatch.backend.store.metric_packing import decode_chunks

    db = Database(db_url)
    pg = db.dialect == "postgresql"
    last = "(array_agg(value ORDER BY step DESC))[1]" if pg else "value"  # SQLite: bare column beside max()
    sql = text(
        f"SELECT (step - :o) / :w AS tb, min(value), max(value), max(step), {last}, count(*) "
        "FROM bench_raw_points WHERE series_id = :sid GROUP BY tb ORDER BY tb"
    )
    try:
        with db.write() as s:
            sid = s.execute(text("SELECT id FROM metric_keys WHERE run_id = :r AND key = :k"),
                            {"r": run_id, "k": KEY}).scalar_one()
            st, vs = decode_chunks(s.execute(
                text("SELECT steps, vals FROM metric_chunks WHERE series_id = :sid ORDER BY batch_id"), {"sid": sid}))
            s.execute(text("DROP TABLE IF EXISTS bench_raw_points"))
            s.execute(text("CREATE TABLE bench_raw_points (series_id INTEGER NOT NULL, step BIGINT NOT NULL, "
                           "value DOUBLE PRECISION NOT NULL)"))
            ins = text("INSERT INTO bench_raw_points (series_id, step, value) VALUES (:sid, :st, :v)")
            rows = [{"sid": sid, "st": a, "v": b} for a, b in zip(st.tolist(), vs.tolist())]
            for i in range(0, len(rows), 100_000):
                s.execute(ins, rows[i:i + 100_000])
            s.execute(text("CREATE INDEX ix_bench_raw_points ON bench_raw_points (series_id, step)"))
        if pg:
            with db.engine.connect() as c:
                c.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE bench_raw_points")
        with db.read() as s:
            rows = s.execute(sql, {"o": origin, "w": width, "sid": sid}).all()  # warm-up (page cache)
            samples = []
            for _ in range(reps):
                t = time.perf_counter()
                rows = s.execute(sql, {"o": origin, "w": width, "sid": sid}).all()
                samples.append(time.perf_counter() - t)
        with db.write() as s:
            s.execute(text("DROP TABLE bench_raw_points"))
        ref = {"min": [r[1] for r in rows], "max": [r[2] for r in rows], "last": [r[4] for r in rows],
               "count": [int(r[5]) for r in rows]}
        return samples, ref
    finally:
        db.dispose()


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-12) for x, y in zip(a, b))


def bench_db(kind: str, n_points: int, reads: int, ref_reps: int) -> dict:
    with scratch_db(kind, "read") as db_url:
        progress(f"{kind}: starting the server on a fresh database")
        with paritywatch_server(db_url) as srv:
            progress(f"{kind}: seeding {n_points:,} points of one series through the API ({SEED_BATCH:,} a batch)")
            run_id, seed_s = seed(srv.url, n_points)
            progress(f"{kind}: seeded in {seed_s:.1f}s ({n_points / seed_s:,.0f} points/s); {reads} API reads")
            api, answer = time_api(srv.url, run_id, reads)
            progress(f"{kind}: API read median {median(api) * 1000:.1f} ms; in-process store reads")
            store = time_store(db_url, run_id, reads)
            width, origin = answer["bucket_width"], answer["origin"]
            progress(f"{kind}: reference GROUP BY over raw points (width {width}), {ref_reps} runs")
            ref, ref_rows = reference_group_by(db_url, run_id, origin, width, ref_reps)
        b = answer["buckets"]
        matches = all(same(b[k], ref_rows[k]) for k in ("min", "max", "last", "count"))
        api_ms, ref_ms = median(api) * 1000, median(ref) * 1000
        res = {
            "points": n_points,
            "buckets_returned": len(b["step"]),
            "bucket_width": width,
            "read_median_ms": round(api_ms, 2),
            "read_p90_ms": round(percentile(api, 90) * 1000, 2),
            "reads": len(api),
            "store_read_median_ms": round(median(store) * 1000, 2),
            "group_by_raw_median_ms": round(ref_ms, 1),
            "group_by_raw_runs": len(ref),
            "ratio_group_by_vs_read": round(ref_ms / api_ms, 1) if api_ms else None,
            "matches_group_by": matches,
            "seed": {"via": "API, POST /metrics", "batch_points": SEED_BATCH, "seconds": round(seed_s, 1),
                     "points_per_s": round(n_points / seed_s)},
        }
        progress(f"{kind}: read {api_ms:.1f} ms (store {res['store_read_median_ms']} ms), GROUP BY {ref_ms:.1f} ms, "
                 f"x{res['ratio_group_by_vs_read']}, buckets match: {matches}")
        return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100,000 points, 20 reads, 3 reference runs")
    ap.add_argument("--points", type=int, help="points in the series (default 1,000,000; quick 100,000)")
    ap.add_argument("--reads", type=int, help="timed API reads (default 30; quick 20; at least 20)")
    ap.add_argument("--no-postgres", action="store_true")
    args = ap.parse_args()
    n_points = args.points or (100_000 if args.quick else 1_000_000)
    reads = max(20, args.reads or (20 if args.quick else 30))
    ref_reps = 3 if args.quick else 5

    results: dict = {}
    notes: list[str] = []
    for kind in ("sqlite", "postgresql"):
        if kind == "postgresql" and (args.no_postgres or not pg_available()):
            notes.append("postgresql skipped")
            continue
        results[kind] = bench_db(kind, n_points, reads, ref_reps)

    met = bool(results) and all(
        r["read_median_ms"] < TARGET_MS and r["matches_group_by"] for r in results.values()
    ) and "sqlite" in results and "postgresql" in results
    emit({
        "bench": "read",
        "quick": args.quick,
        "points": n_points,
        "buckets": BUCKETS,
        "read_median_ms": {k: r["read_median_ms"] for k, r in results.items()},
        "group_by_raw_median_ms": {k: r["group_by_raw_median_ms"] for k, r in results.items()},
        "ratio_group_by_vs_read": {k: r["ratio_group_by_vs_read"] for k, r in results.items()},
        "detail": results,
        "notes": notes,
        "target": f"median < {TARGET_MS:g} ms on sqlite and postgresql",
        "met": met,
    })


if __name__ == "__main__":
    main()
