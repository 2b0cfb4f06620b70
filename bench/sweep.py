"""Heartbeat sweep cost vs history: a database holding 10,000 ended runs sweeps as fast as an empty one.

Two scratch databases of the same engine, each with one live run of 1 trainer + 16 rollout processes
heartbeating; the second also holds 10,000 ended runs (finished, stopped, crashed) with 17 processes
each, closed, lost, and (a realistic leftover) rollouts of finished runs that never closed and are
still `live`. The sweep (`run_state.sweep`, one transaction, exactly what the server runs every
few seconds) is timed alternately on both databases, so load on the machine hits both alike.

Figures: median sweep time of each database, `ratio` = with history / empty (target <= 1.5), and,
for reference, the same ratio for the query the sweep used before it looked at live runs only
(every process of every run not stopped): `reference_ratio`.

    .venv/bin/python bench/sweep.py [--quick] [--runs N] [--no-postgres]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, pg_available, progress, scratch_db

from sqlalchemy import insert, select, text

from paritywatch.backend import migrate
from paritywatch.backend.control import run_state
from paritywatch.backend.alerts.effects import Effects
from paritywatch.backend.db import Database
from paritywatch.backend.models import Component, Run, utcnow

TARGET_RATIO = 1.5
PROCESSES = 17
TIMEOUT_S = 60.0
ENDED = ("finished", "stopped", "crashed")


def seed_live_run(db: Database) -> None:
    now = utcnow()
    with db.write() as s:
        run = Run(project="bench", name="live", tags={}, config={})
        s.add(run)
        s.flush()
        s.add_all(Component(run_id=run.id, side="trainer" if i == 0 else "rollout", worker_id=f"w{i}",
                            last_heartbeat=now, started_at=now) for i in range(PROCESSES))


def seed_history(db: Database, runs: int) -> None:
    """`runs` ended runs with PROCESSES processes each, in bulk (executemany)."""
    old = utcnow() - timedelta(days=3)
    with db.write() as s:
        first = (s.scalar(select(Run.id).order_by(Run.id.desc()).limit(1)) or 0) + 1
        for start in range(0, runs, 2000):
            chunk = range(start, min(runs, start + 2000))
            s.execute(insert(Run), [dict(id=first + i, project="history", name=f"old-{i}", tags={}, config={},
                                         created_at=old, control_state=ENDED[i % 3], control_version=2,
                                         control_updated_at=old, on_mismatch="pause") for i in chunk])
            rows = []
            for i in chunk:
                state = ENDED[i % 3]
                for p in range(PROCESSES):
                    # finished runs keep one rollout that never closed: still "live", never swept
                    status = ("live" if state == "finished" and p == PROCESSES - 1 else
                              "lost" if state == "crashed" else "closed")
                    rows.append(dict(run_id=first + i, side="trainer" if p == 0 else "rollout", worker_id=f"w{p}",
                                     host="", pid=0, started_at=old, last_heartbeat=old, status=status))
            s.execute(insert(Component), rows)


def settle(kind: str, db: Database) -> None:
    """What a database that grew over weeks looks like: statistics gathered (PostgreSQL) and the
    WAL of the bulk load checkpointed (SQLite; else every read first searches a huge WAL index)."""
    if kind == "postgresql":
        with db.write() as s:
            s.execute(text("ANALYZE"))
        return
    raw = db.engine.raw_connection()
    try:
        raw.cursor().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        raw.close()


def reference_query(db: Database) -> None:
    """What the sweep read before: every process of every run that is not stopped."""
    with db.read() as s:
        s.execute(text("SELECT components.id, components.last_heartbeat FROM components JOIN runs "
                       "ON runs.id = components.run_id WHERE runs.control_state != 'stopped'")).all()


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(kind: str, history: int, repeats: int, reference_repeats: int) -> dict:
    effects = Effects()
    with scratch_db(kind, "sweep_empty") as empty_url, scratch_db(kind, "sweep_history") as full_url:
        dbs = {}
        for label, url in (("empty", empty_url), ("history", full_url)):
            migrate.upgrade(url)
            dbs[label] = Database(url)
            seed_live_run(dbs[label])
        t0 = time.monotonic()
        seed_history(dbs["history"], history)
        progress(f"{kind}: seeded {history:,} ended runs ({history * PROCESSES:,} processes) in {time.monotonic() - t0:.1f} s")
        settle(kind, dbs["history"])
        samples = {"empty": [], "history": []}
        reference = {"empty": [], "history": []}
        def sweep(db):  # one transaction, as the server's heartbeat loop runs it
            with effects.write(db) as s:
                return run_state.sweep(s, TIMEOUT_S)

        for label in dbs:  # warm-up: connections, statement caches
            sweep(dbs[label])
        for i in range(repeats):
            for label in (("empty", "history") if i % 2 == 0 else ("history", "empty")):
                db = dbs[label]
                samples[label].append(timed(lambda db=db: sweep(db)))
                if i < reference_repeats:  # the old query is slow with history: a few samples say enough
                    reference[label].append(timed(lambda db=db: reference_query(db)))
        out = sweep(dbs["history"])
        assert out == {"runs": 1, "lost": 0, "changed": 0}, out  # it looked at the live run only
        for db in dbs.values():
            db.dispose()
    med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    ref = {k: statistics.median(v) * 1e3 for k, v in reference.items()}
    ratio = med["history"] / med["empty"]
    progress(f"{kind}: sweep median {med['empty']:.2f} ms empty, {med['history']:.2f} ms with history "
             f"(ratio {ratio:.2f}); the old query: {ref['empty']:.2f} -> {ref['history']:.2f} ms")
    return {"sweep_ms": {k: round(v, 3) for k, v in med.items()}, "ratio": round(ratio, 3),
            "reference_ms": {k: round(v, 3) for k, v in ref.items()},
            "reference_ratio": round(ref["history"] / ref["empty"], 1), "repeats": repeats}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (same 10,000 runs of history)")
    ap.add_argument("--runs", type=int, default=10_000, help="ended runs in the history database")
    ap.add_argument("--no-postgres", action="store_true")
    args = ap.parse_args()
    repeats, reference_repeats = (60, 3) if args.quick else (300, 10)
    results, notes = {}, []
    for kind in ("sqlite", "postgresql"):
        if kind == "postgresql" and (args.no_postgres or not pg_available()):
            notes.append("postgresql skipped")
            continue
        results[kind] = measure(kind, args.runs, repeats, reference_repeats)
    emit({
        "bench": "sweep", "quick": args.quick, "history_runs": args.runs, "processes_per_run": PROCESSES,
        "ratio": {k: r["ratio"] for k, r in results.items()},
        "reference_ratio": {k: r["reference_ratio"] for k, r in results.items()},
        "detail": results, "notes": notes,
        "target": f"sweep time with {args.runs:,} ended runs / empty database <= {TARGET_RATIO}",
        "met": bool(results) and all(r["ratio"] <= TARGET_RATIO for r in results.values()),
    })


if __name__ == "__main__":
    main()
