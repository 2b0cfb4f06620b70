"""A bucket's `last` is the value of its highest step; when several points share that step, the one
written last (the later batch; within a batch, the later position). Checked against brute force
at every bucket width the reader plans (raw points, 16-step roll-ups with dense chunks' raw points
beside them, coarser roll-ups), on SQLite and PostgreSQL, with many equal steps."""
from __future__ import annotations

import random

import pytest

from tests.api.conftest import new_run


def brute_force(points_in_write_order, origin: int, width: int) -> dict[int, list]:
    """{bucket: [min, max, last_step, last_value, count]}; a later point at an equal step wins."""
    out: dict[int, list] = {}
    for step, v in points_in_write_order:
        b = out.setdefault((step - origin) // width, [v, v, step, v, 0])
        b[0], b[1] = min(b[0], v), max(b[1], v)
        if step >= b[2]:
            b[2], b[3] = step, v
        b[4] += 1
    return out


def write_batches_with_ties(client, run_id: int, rng: random.Random) -> list[tuple[int, float]]:
    """Dense batches (whole 4096-step windows: no 16-step roll-ups) and sparse ones, most of them
    rewriting steps already written, some repeating a step inside one batch. Returns every point
    in the order it was written."""
    written: list[tuple[int, float]] = []
    seq = 0

    def post(steps: list[int]) -> None:
        nonlocal seq
        values = [round(rng.uniform(-10, 10), 3) for _ in steps]
        r = client.post(f"/api/v1/runs/{run_id}/metrics",
                        json={"client_id": "ties", "seq": seq, "steps": steps, "series": {"s": values}})
        assert r.status_code == 200, r.text
        seq += 1
        # the server sorts a batch by step, stably: equal steps keep their order in the batch
        written.extend(sorted(zip(steps, values), key=lambda p: p[0]))

    span = 3 * 4096
    for _ in range(40):
        kind = rng.random()
        if kind < 0.2:  # dense: every other step of a 4096-step window, all of them ties later
            w = rng.randrange(3) * 4096
            post(list(range(w, w + 4096, rng.choice([1, 2]))))
        elif kind < 0.6:  # sparse: a few steps that other batches also write
            post(sorted(rng.sample(range(span), rng.randint(1, 60))))
        else:  # sparse, hitting bucket ends (the steps that decide `last`) and repeating steps
            ends = [rng.randrange(span // 16) * 16 + 15 for _ in range(rng.randint(1, 20))]
            steps = ends + rng.sample(ends, min(3, len(ends)))
            rng.shuffle(steps)
            post(steps)
    return written


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bucket_last_is_the_latest_written_point_of_the_highest_step(client, seed):
    run = new_run(client, name=f"ties-{seed}")
    rng = random.Random(seed)
    written = write_batches_with_ties(client, run["id"], rng)
    steps = sorted({s for s, _ in written})
    lo, hi = steps[0], steps[-1]
    # points -> bucket width: 1 (raw), 16..240 (16-step roll-ups + dense raw), 256+, 4096+
    for points, step_min, step_max in [(20_000, lo, hi), (700, lo, hi), (100, lo, hi), (40, lo, hi),
                                       (2, lo, hi), (333, 17, 10_001), (61, 4_000, 8_300)]:
        got = client.get(f"/api/v1/runs/{run['id']}/series",
                         params={"key": "s", "points": points, "step_min": step_min, "step_max": step_max}).json()
        in_range = [(s, v) for s, v in written if step_min <= s <= step_max]
        expected = sorted(brute_force(in_range, got["origin"], got["bucket_width"]).items())
        b = got["buckets"]
        where = f"points={points} width={got['bucket_width']}"
        assert b["count"] == [e[4] for _, e in expected], where
        assert b["min"] == [e[0] for _, e in expected], where
        assert b["max"] == [e[1] for _, e in expected], where
        assert b["last"] == [e[3] for _, e in expected], where
