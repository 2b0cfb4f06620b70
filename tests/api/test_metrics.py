import random

import pytest
from sqlalchemy import func, select

from paritywatch.backend.models import IngestBatch, MetricChunk, MetricKey, MetricRollup
from tests.api.conftest import new_run


def post(client, run_id, seq, steps, series, client_id="c1"):
    return client.post(
        f"/api/v1/runs/{run_id}/metrics",
        json={"client_id": client_id, "seq": seq, "steps": steps, "series": series},
    )


def count_rows(app, model) -> int:
    with app.state.db.read() as s:
        return s.scalar(select(func.count()).select_from(model))


def count_points(app) -> int:
    """Raw points stored (they are packed in chunks: the sum of the chunks' counts)."""
    with app.state.db.read() as s:
        return int(s.scalar(select(func.coalesce(func.sum(MetricChunk.count), 0))))


def test_same_batch_twice_is_stored_once(client, app):
    run = new_run(client)
    body = ([1, 2, 3], {"loss": [1.0, 0.5, 0.25], "align/kl_k3": [0.0, 0.001, 0.002]})
    first = post(client, run["id"], 7, *body).json()
    again = post(client, run["id"], 7, *body).json()
    assert first == {"accepted": 6, "skipped_nonfinite": 0, "duplicate": False}
    assert again["duplicate"] is True and again["accepted"] == 0
    assert count_points(app) == 6 and count_rows(app, MetricChunk) == 2
    keys = {k["key"]: k for k in client.get(f"/api/v1/runs/{run['id']}/metrics").json()["keys"]}
    assert keys["loss"]["count"] == 3 and keys["loss"]["last_value"] == 0.25


def test_rejected_batch_leaves_no_rows(client, app):
    run = new_run(client)
    # the second series is one value short: the whole batch must be refused
    r = post(client, run["id"], 1, [1, 2], {"ok": [1.0, 2.0], "short": [1.0]})
    assert r.status_code == 422 and "short" in r.json()["error"]["message"]
    r = post(client, run["id"], 2, [1, 2], {"ok": [1.0, 2.0], "x" * 201: [1.0, 2.0]})
    assert r.status_code == 422
    for model in (MetricChunk, MetricKey, MetricRollup, IngestBatch):
        assert count_rows(app, model) == 0, model
    # and the refused (client, seq) was not burned: the corrected batch is accepted
    assert post(client, run["id"], 1, [1, 2], {"ok": [1.0, 2.0]}).json()["accepted"] == 2


def test_a_batch_of_more_rows_than_one_statement_takes_is_stored_whole(client, app):
    """SQLite writes a batch's chunks and roll-ups as multi-row statements of at most
    ROWS_PER_STATEMENT rows (backend/store/metric_sql.py): a batch of many keys spans several."""
    from paritywatch.backend.store.metric_sql import ROWS_PER_STATEMENT

    run = new_run(client)
    n_keys = 2 * ROWS_PER_STATEMENT + 7
    series = {f"k{i:04d}": [float(i), float(i) + 0.5] for i in range(n_keys)}
    assert post(client, run["id"], 1, [10, 20], series).json()["accepted"] == 2 * n_keys
    assert count_points(app) == 2 * n_keys and count_rows(app, MetricChunk) == n_keys
    # per key: one 16-step bucket for each step (two sparse chunks' points), one at levels 2-4
    assert count_rows(app, MetricRollup) == n_keys * 5
    got = client.get(f"/api/v1/runs/{run['id']}/series", params={"key": f"k{n_keys - 1:04d}"}).json()
    assert got["buckets"]["max"] == [n_keys - 1.0, n_keys - 0.5]


def test_nonfinite_and_null_values_are_skipped_and_counted(client):
    run = new_run(client)
    raw = '{"client_id":"c","seq":1,"steps":[1,2,3,4],"series":{"x":[1.0,NaN,Infinity,-Infinity],"y":[null,2,3,4]}}'
    r = client.post(f"/api/v1/runs/{run['id']}/metrics", content=raw, headers={"content-type": "application/json"})
    assert r.json() == {"accepted": 4, "skipped_nonfinite": 4, "duplicate": False}


def test_limits(client, app):
    run = new_run(client)
    r = post(client, run["id"], 1, [-1], {"x": [1.0]})
    assert r.status_code == 422
    r = post(client, run["id"], 1, [2**53 + 1], {"x": [1.0]})
    assert r.status_code == 422
    steps = list(range(30_000))
    r = post(client, run["id"], 1, steps, {"a": [0.0] * 30_000, "b": [0.0] * 30_000})
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
    big = client.post(f"/api/v1/runs/{run['id']}/metrics", content=b"[" + b"1," * 2_000_000 + b"1]",
                      headers={"content-type": "application/json"})
    assert big.status_code == 413
    assert count_points(app) == 0 and count_rows(app, MetricChunk) == 0
    assert post(client, 999, 1, [1], {"x": [1.0]}).status_code == 404


def test_huge_steps_and_unicode_keys(client, app, monkeypatch):
    run = new_run(client)
    # A first step this far ahead is refused by default (PARITYWATCH_MAX_STEP_AHEAD = 2**30)...
    refused = post(client, run["id"], 1, [2**53], {"κλ/∆ 🚀": [1.5]})
    assert refused.status_code == 422 and "MAX_STEP_AHEAD" in refused.json()["error"]["message"]
    monkeypatch.setattr(app.state.metrics, "max_step_ahead", 2**53)  # ...and stored exactly once allowed
    assert post(client, run["id"], 2, [2**53], {"κλ/∆ 🚀": [1.5]}).status_code == 200
    r = client.get(f"/api/v1/runs/{run['id']}/series", params={"key": "κλ/∆ 🚀"}).json()
    assert r["buckets"]["step"] == [2**53] and r["buckets"]["last"] == [1.5]


def brute_force(points, lo, width, origin):
    out = {}
    for step, v in points:
        tb = (step - origin) // width
        b = out.setdefault(tb, [v, v, step, v, 0])
        b[0], b[1] = min(b[0], v), max(b[1], v)
        if step >= b[2]:
            b[2], b[3] = step, v
        b[4] += 1
    return out


@pytest.mark.parametrize("lo,hi,points", [(None, None, 100), (123, 45_678, 37), (5, 70_000, 1000), (0, 50, 1000)])
def test_downsample_matches_brute_force(client, lo, hi, points):
    run = new_run(client)
    rng = random.Random(0)
    steps = sorted(rng.sample(range(3, 80_000), 20_000))
    values = [rng.uniform(-5, 5) for _ in steps]
    for i in range(0, len(steps), 5_000):  # several batches, as a client would send them
        assert post(client, run["id"], i, steps[i:i + 5000], {"s": values[i:i + 5000]}).status_code == 200
    params = {"key": "s", "points": points}
    if lo is not None:
        params.update(step_min=lo, step_max=hi)
    got = client.get(f"/api/v1/runs/{run['id']}/series", params=params).json()
    lo_, hi_ = (steps[0], steps[-1]) if lo is None else (lo, hi)
    b = got["buckets"]
    assert len(b["step"]) <= points
    in_range = [(s, v) for s, v in zip(steps, values) if lo_ <= s <= hi_]
    assert sum(b["count"]) == len(in_range)
    # buckets are [origin + k*width, origin + (k+1)*width), origin <= lo aligned to the roll-up unit
    assert got["origin"] <= lo_
    expected = sorted(brute_force(in_range, lo_, got["bucket_width"], got["origin"]).items())
    assert [e[1][0] for e in expected] == pytest.approx(b["min"])
    assert [e[1][1] for e in expected] == pytest.approx(b["max"])
    assert [e[1][3] for e in expected] == pytest.approx(b["last"])
    assert [e[1][4] for e in expected] == b["count"]


def test_series_of_unknown_key_is_404(client):
    run = new_run(client)
    r = client.get(f"/api/v1/runs/{run['id']}/series", params={"key": "nope"})
    assert r.status_code == 404


def test_concurrent_batches_commit_independently(client, app):
    """Batches written together (SQLite group commit) still succeed or fail one by one."""
    import threading

    from paritywatch.backend.errors import NotFound
    from paritywatch.backend.store.metrics import prepare_batch

    run = new_run(client)
    store = app.state.metrics
    results: dict = {}

    def send(i: int) -> None:
        run_id = run["id"] if i % 3 else 999_999  # every third batch: a run that does not exist
        batch = prepare_batch([i * 10 + j for j in range(10)], {f"k{i % 4}": [float(j) for j in range(10)]}, 1000, 200)
        try:
            results[i] = store.ingest(run_id, f"c{i % 5}", i, batch)
        except NotFound:
            results[i] = "404"

    threads = [threading.Thread(target=send, args=(i,)) for i in range(60)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(i for i, r in results.items() if r == "404") == [i for i in range(60) if i % 3 == 0]
    stored = [i for i, r in results.items() if r is True]
    assert len(stored) == 40
    assert count_points(app) == 400 and count_rows(app, IngestBatch) == 40
    # a replay of any of them (the same batch again) stores nothing
    again = prepare_batch([10 + j for j in range(10)], {"k1": [float(j) for j in range(10)]}, 1000, 200)
    assert store.ingest(run["id"], "c1", 1, again) is False
    assert count_points(app) == 400


def test_a_batch_whose_request_is_cancelled_while_queued_is_not_written(client, app):
    """The ingest route awaits the group-commit writer (Database.run_raw_async). A request
    cancelled while its batch still waits in the queue (server shutdown, client gone) writes
    nothing, and the writer goes on with the next batches (a cancelled future must not fail it)."""
    import asyncio
    import threading

    from paritywatch.backend.store.metrics import prepare_batch

    run = new_run(client)
    store, db = app.state.metrics, app.state.db
    entered, release = threading.Event(), threading.Event()

    def hold(_cur):
        entered.set()
        assert release.wait(30)

    async def scenario() -> tuple[bool, bool]:
        held = asyncio.ensure_future(db.run_raw_async(hold))  # occupies the writer
        assert await asyncio.to_thread(entered.wait, 30)
        queued = asyncio.ensure_future(store.ingest_batch_async(run["id"], "gone", 0, prepare_batch([1], {"k": [1.0]}, 1000, 200)))
        await asyncio.sleep(0)  # one turn of the loop: it queues its job behind the held one
        assert db.writer_backlog() == 1
        queued.cancel()
        # Once the task has ended, its cancellation has reached the writer's future (asyncio
        # cancels the wrapped future from a loop callback that runs before the task's own).
        await asyncio.wait([queued])
        release.set()
        await held
        after = await store.ingest_batch_async(run["id"], "next", 0, prepare_batch([2], {"k": [2.0]}, 1000, 200))
        return queued.cancelled(), after.stored

    cancelled, next_stored = asyncio.run(scenario())
    assert cancelled and next_stored
    with app.state.db.read() as s:
        clients = set(s.scalars(select(IngestBatch.client_id)))
    assert clients == {"next"} and count_points(app) == 1


def test_unsorted_and_overlapping_batches_read_back_exactly(client):
    run = new_run(client)
    rng = random.Random(1)
    points = {}
    batches = []
    for b in range(12):  # unsorted steps, spanning chunk windows, later batches overwrite no step
        steps = rng.sample(range(b * 3000, b * 3000 + 9000), 400)
        steps = [s for s in steps if s not in points][:300]
        vals = [rng.uniform(-1, 1) for _ in steps]
        points.update(zip(steps, vals))
        batches.append((steps, vals))
    for seq, (steps, vals) in enumerate(reversed(batches)):
        assert post(client, run["id"], seq, steps, {"s": vals}).status_code == 200
    pts = sorted(points.items())
    for lo, hi, n in [(None, None, 20_000), (4_095, 4_097, 10), (100, 30_000, 333)]:
        params = {"key": "s", "points": n}
        if lo is not None:
            params.update(step_min=lo, step_max=hi)
        got = client.get(f"/api/v1/runs/{run['id']}/series", params=params).json()
        lo_, hi_ = (pts[0][0], pts[-1][0]) if lo is None else (lo, hi)
        in_range = [(s, v) for s, v in pts if lo_ <= s <= hi_]
        expected = sorted(brute_force(in_range, lo_, got["bucket_width"], got["origin"]).items())
        b = got["buckets"]
        assert [e[1][4] for e in expected] == b["count"]
        assert [e[1][0] for e in expected] == b["min"]
        assert [e[1][1] for e in expected] == b["max"]
        assert [e[1][3] for e in expected] == b["last"]


def test_dense_and_sparse_batches_of_one_series_read_back_exactly(client):
    """Big batches skip the 16-step roll-ups (their raw chunks stand in); a series mixing them
    with small batches still counts every point once, at every bucket width."""
    run = new_run(client)
    rng = random.Random(3)
    pts, step = [], 0
    for seq in range(60):
        n = rng.choice([1, 5, 60, 255, 256, 1200, 3000])
        steps = list(range(step, step + n, 2))  # every other step: buckets hold points of two batches
        vals = [rng.uniform(-3, 3) for _ in steps]
        assert post(client, run["id"], seq, steps, {"s": vals}).status_code == 200
        pts += list(zip(steps, vals))
        step += n - (n // 3) if seq % 4 else n  # some batches interleave with the previous one
    pts.sort(key=lambda p: p[0])
    hi = pts[-1][0]
    for lo, top, n in [(0, hi, 1000), (17, 20_000, 999), (4_000, 9_000, 100), (0, hi, 40), (0, hi, 20_000)]:
        got = client.get(f"/api/v1/runs/{run['id']}/series",
                         params={"key": "s", "points": n, "step_min": lo, "step_max": top}).json()
        in_range = [(s, v) for s, v in pts if lo <= s <= top]
        expected = sorted(brute_force(in_range, lo, got["bucket_width"], got["origin"]).items())
        b = got["buckets"]
        assert [e[1][4] for e in expected] == b["count"], (lo, top, n, got["bucket_width"])
        assert [e[1][0] for e in expected] == b["min"]
        assert [e[1][1] for e in expected] == b["max"]


@pytest.mark.parametrize("whose", ["nobody", "another run"])
def test_batch_naming_a_component_the_run_does_not_have_is_404_and_writes_nothing(client, app, whose):
    """Issue 17.4: the docs promise 404 for an unknown component; it used to be stored (200)."""
    run, other = new_run(client, "a"), new_run(client, "b")
    foreign = client.post(f"/api/v1/runs/{other['id']}/components", json={"side": "rollout"}).json()["id"]
    component_id = 987_654 if whose == "nobody" else foreign
    body = {"client_id": "c", "seq": 1, "component_id": component_id, "steps": [1, 2], "series": {"loss": [1.0, 0.5]}}
    r = client.post(f"/api/v1/runs/{run['id']}/metrics", json=body)
    assert r.status_code == 404, r.text
    assert r.json()["error"]["code"] == "not_found" and str(component_id) in r.json()["error"]["message"]
    for model in (MetricChunk, MetricKey, MetricRollup, IngestBatch):
        assert count_rows(app, model) == 0, model
    # the refused (client, seq) is not burned: with the run's own component the batch is stored
    own = client.post(f"/api/v1/runs/{run['id']}/components", json={"side": "trainer"}).json()["id"]
    r = client.post(f"/api/v1/runs/{run['id']}/metrics", json={**body, "component_id": own})
    assert r.status_code == 200 and r.json()["accepted"] == 2


def test_a_batch_with_more_keys_than_points_is_refused_even_without_steps(client, app):
    """Issue 26: with no steps a batch had no points, so a million empty series passed the cap
    (and cost seconds of checks). Each key counts as at least one point."""
    run = new_run(client)
    cap = app.state.settings.max_points_per_batch
    keys = {f"k{i}": [] for i in range(cap + 1)}
    r = client.post(f"/api/v1/runs/{run['id']}/metrics", json={"client_id": "c", "seq": 0, "steps": [], "series": keys})
    assert r.status_code == 413 and "keys" in r.json()["error"]["message"]
    # at the points cap (and within the cap on new keys a batch may create): accepted
    fewer = dict(list(keys.items())[:min(cap, app.state.settings.max_new_keys_per_batch)])
    r = client.post(f"/api/v1/runs/{run['id']}/metrics", json={"client_id": "c", "seq": 1, "steps": [], "series": fewer})
    assert r.status_code == 200 and r.json()["accepted"] == 0


def test_check_batch_counts_each_key_as_a_point():
    """The rule itself, below the request guard's shape check (which also refuses such a body
    once it is past 64 KB)."""
    from paritywatch.backend.errors import TooLarge
    from paritywatch.backend.store.metric_validation import check_batch

    with pytest.raises(TooLarge, match="11 keys"):
        check_batch([], {f"k{i}": [] for i in range(11)}, 10, 200)
    check_batch([], {f"k{i}": [] for i in range(10)}, 10, 200)


def ingest_in_one_group(app, sent: list) -> list:
    """Ingest `sent` ((run_id, client_id, seq, PreparedBatch, component_id), ...) as one group of the
    group-commit writer: they queue behind a job that holds it. Their results or exceptions, in order."""
    import asyncio
    import threading

    store, db = app.state.metrics, app.state.db
    entered, release = threading.Event(), threading.Event()

    def hold(_cur):
        entered.set()
        assert release.wait(30)

    async def go() -> list:
        held = asyncio.ensure_future(db.run_raw_async(hold))
        assert await asyncio.to_thread(entered.wait, 30)
        jobs = [asyncio.ensure_future(store.ingest_batch_async(run_id, cid, seq, b, component_id=comp))
                for run_id, cid, seq, b, comp in sent]
        await asyncio.sleep(0)
        assert db.writer_backlog() == len(jobs)
        release.set()
        await held
        return await asyncio.gather(*jobs, return_exceptions=True)

    return asyncio.run(go())


def test_batches_merged_in_one_group_commit_store_what_they_store_one_by_one(client, app):
    """Every batch of a run updates the same roll-up buckets and key stats; the group-commit writer
    merges those rows over its whole group, once before the commit (Database.merge_at_commit). A
    run fed 12 overlapping batches in one group stores what a run fed them one at a time does, and a
    batch of the group that fails (an unknown component) adds nothing to the merge."""

    from paritywatch.backend.store.metrics import prepare_batch

    rng = random.Random(7)
    batches = []
    for b in range(12):  # interleaved steps, like workers logging the same training steps
        steps = sorted(rng.sample(range(0, 5000), 200))
        batches.append((steps, {"loss": [rng.uniform(-1, 1) for _ in steps], f"w{b % 3}/kl": [float(b)] * len(steps)}))
    one_by_one, grouped = new_run(client, "one-by-one"), new_run(client, "grouped")
    for seq, (steps, series) in enumerate(batches):
        assert post(client, one_by_one["id"], seq, steps, series).status_code == 200

    sent = [(grouped["id"], "c1", seq, prepare_batch(steps, series, 10_000, 200), None)
            for seq, (steps, series) in enumerate(batches)]
    sent.insert(5, (grouped["id"], "c2", 0, prepare_batch([1, 2], {"loss": [99.0, 99.0]}, 10_000, 200), 999_999))
    results = ingest_in_one_group(app, sent)
    assert [type(r).__name__ for r in results].count("NotFound") == 1
    assert all(r.stored for r in results if not isinstance(r, Exception))

    def stored(run_id: int) -> tuple:
        keys = {k["key"]: (k["count"], k["first_step"], k["last_step"], k["last_value"])
                for k in client.get(f"/api/v1/runs/{run_id}/metrics").json()["keys"]}
        series = {key: client.get(f"/api/v1/runs/{run_id}/series", params={"key": key, "points": points}).json()["buckets"]
                  for key in keys for points in (20, 300)}  # coarse buckets read roll-ups
        return keys, series

    assert stored(grouped["id"]) == stored(one_by_one["id"])


def test_each_batch_of_a_group_gets_its_own_answer_and_a_refused_one_leaves_no_claim(client, app, monkeypatch):
    """The group-commit writer runs a group without savepoints and, on PostgreSQL, sends the
    batches' claims together (db.FirstThen); a batch that fails makes it roll the group back and
    run it again with a savepoint a batch. A group of new batches and a replay commits as sent; a
    group holding a new batch, a replay with other content, a batch too far ahead, one the ledger
    cannot take (seq over 2**63) and one naming an unknown component gives each its own answer,
    stores the good one once, and leaves no claim of the refused ones (their (client, seq) stores a
    valid batch later)."""

    from paritywatch.backend.errors import Conflict, Invalid, NotFound
    from paritywatch.backend.store.metrics import prepare_batch

    store = app.state.metrics
    monkeypatch.setattr(store, "max_step_ahead", 1_000)
    run = new_run(client)
    assert post(client, run["id"], 0, [1, 2], {"loss": [1.0, 2.0]}, client_id="p").status_code == 200

    def batch(steps, value=0.5):
        return prepare_batch(steps, {"loss": [value] * len(steps)}, 10_000, 200)

    stored_again = prepare_batch([1, 2], {"loss": [1.0, 2.0]}, 10_000, 200)
    rid = run["id"]
    results = ingest_in_one_group(app, [(rid, "a", 0, batch([3, 4]), None), (rid, "p", 0, stored_again, None),
                                        (rid, "a", 1, batch([5]), None), (rid, "a", 2, batch([6]), None)])
    assert [r.stored for r in results] == [True, False, True, True]

    other, far, big, unknown, a2 = ingest_in_one_group(app, [
        (rid, "p", 0, batch([1, 2], 9.0), None), (rid, "far", 0, batch([50_000]), None),
        (rid, "big", 2**63, batch([6]), None), (rid, "c", 0, batch([7]), 999_999), (rid, "a", 3, batch([8]), None)])
    assert isinstance(other, Conflict) and isinstance(far, Invalid) and isinstance(unknown, NotFound)
    assert isinstance(big, Exception) and not isinstance(big, (Conflict, Invalid, NotFound))
    assert a2.stored
    # nothing of the refused ones is claimed: their (client, seq) takes a valid batch now
    assert store.ingest(run["id"], "far", 0, batch([9])) is True
    assert store.ingest(run["id"], "c", 0, batch([10])) is True
    assert count_rows(app, IngestBatch) == 7
    keys = client.get(f"/api/v1/runs/{run['id']}/metrics").json()["keys"]
    assert [(k["key"], k["count"], k["last_step"]) for k in keys] == [("loss", 9, 10)]
