"""The workers view's API (issue 16): versions and lag from heartbeats, fingerprint groups, alerts
per process, filters and keyset paging; one metric split by the process that posted it. Both
engines (db_url)."""
from __future__ import annotations

import uuid

from tests.api.conftest import new_run
from tests.api.test_fingerprints import fake_fp

API = "/api/v1"


def register(client, run_id: int, side: str, worker_id: str, host: str = "node-0") -> int:
    r = client.post(f"{API}/runs/{run_id}/components", json={"side": side, "worker_id": worker_id, "host": host})
    assert r.status_code == 200, r.text
    return r.json()["id"]


def beat(client, run_id: int, component_id: int, **body):
    path = f"{API}/runs/{run_id}/components/{component_id}/heartbeat"
    return client.post(path, json=body) if body else client.post(path)


def fingerprint(client, run_id: int, component_id: int, fp: dict) -> None:
    r = client.post(f"{API}/runs/{run_id}/components/{component_id}/fingerprint", json=fp)
    assert r.status_code == 200, r.text


def all_pages(client, run_id: int, **params) -> tuple[list[dict], int, dict]:
    rows, pages, cursor, first = [], 0, None, None
    while True:
        r = client.get(f"{API}/runs/{run_id}/workers", params={**params, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        body = r.json()
        first = first or body
        rows += body["workers"]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            return rows, pages, first


def by_worker(rows: list[dict]) -> dict[str, dict]:
    return {r["worker_id"]: r for r in rows}


def seeded_run(client) -> tuple[int, dict[str, int], dict, dict]:
    """A trainer at version 10; rollout workers w00..w10 like it (w07 stuck at version 4), w11
    with another processor and no version, w12 with no fingerprint."""
    run_id = new_run(client, "workers")["id"]
    client.put(f"{API}/runs/{run_id}/settings", json={"on_mismatch": "alert"})
    good, bad = fake_fp("{{ messages }}"), fake_fp("{{ messages | tojson }}")
    ids = {"trainer-0": register(client, run_id, "trainer", "trainer-0")}
    fingerprint(client, run_id, ids["trainer-0"], good)
    for i in range(13):
        name = f"w{i:02d}"
        ids[name] = register(client, run_id, "rollout", name, host=f"node-{1 + i // 4}")
        if i < 11:
            fingerprint(client, run_id, ids[name], good)
        elif i == 11:
            fingerprint(client, run_id, ids[name], bad)
    assert beat(client, run_id, ids["trainer-0"], policy_version=10, points_per_s=12.5).status_code == 200
    for i in range(11):
        version = 4 if i == 7 else 9 + i % 2
        assert beat(client, run_id, ids[f"w{i:02d}"], policy_version=version, samples_per_s=3.0).status_code == 200
    return run_id, ids, good, bad


def test_lag_groups_alerts_and_paging(client):
    run_id, ids, good, bad = seeded_run(client)
    rows, pages, first = all_pages(client, run_id, limit=5)
    assert pages == 3 and len(rows) == 14
    assert [r["component_id"] for r in rows] == sorted(ids.values())  # registration order, no repeats
    assert first["trainer_policy_version"] == 10
    assert first["counts"] == {"live": 14, "closed": 0, "lost": 0, "ended": 0, "total": 14}
    workers = by_worker(rows)
    assert workers["w07"]["policy_version"] == 4 and workers["w07"]["lag"] == 6 and workers["w07"]["lagging"]
    assert workers["w00"]["lag"] == 1 and not workers["w00"]["lagging"]
    assert workers["w01"]["lag"] == 0
    assert workers["w11"]["lag"] is None and workers["w11"]["policy_version"] is None
    assert workers["trainer-0"]["lag"] is None and workers["trainer-0"]["points_per_s"] == 12.5
    assert workers["w03"]["samples_per_s"] == 3.0
    # groups: the trainer's fingerprint is A, the other one B; w12 has none
    groups = {g["label"]: g for g in first["groups"]}
    assert groups["A"]["digest"] == good["digest"] and groups["A"]["processes"] == 12 and groups["A"]["same_as_trainer"]
    assert groups["B"]["digest"] == bad["digest"] and groups["B"]["processes"] == 1 and not groups["B"]["same_as_trainer"]
    assert workers["w11"]["group"] == "B" and workers["w00"]["group"] == "A" and workers["w12"]["group"] is None
    # the mismatch alert is w11's, and only w11's
    assert [a["kind"] for a in workers["w11"]["alerts"]] == ["processor_mismatch"]
    assert all(not workers[w]["alerts"] for w in workers if w != "w11")


def test_a_beat_without_a_version_keeps_it_and_the_trainer_moving_on_raises_lag(client):
    run_id, ids, _, _ = seeded_run(client)
    assert beat(client, run_id, ids["w00"]).status_code == 200  # an old hook: no body
    assert beat(client, run_id, ids["trainer-0"], policy_version=12).status_code == 200
    workers = by_worker(all_pages(client, run_id)[0])
    assert workers["w00"]["policy_version"] == 9 and workers["w00"]["lag"] == 3 and workers["w00"]["lagging"]
    assert workers["w00"]["samples_per_s"] is None  # rates are the last interval's: none reported


def test_filters(client):
    run_id, ids, _, bad = seeded_run(client)
    assert client.post(f"{API}/runs/{run_id}/components/{ids['w01']}/close").status_code == 200

    def names(**params) -> list[str]:
        return [r["worker_id"] for r in all_pages(client, run_id, **params)[0]]

    assert names(state="closed") == ["w01"]
    assert names(side="trainer") == ["trainer-0"]
    assert names(fingerprint=bad["digest"]) == ["w11"]
    assert names(fingerprint="missing") == ["w12"]
    assert names(q="W1") == ["w10", "w11", "w12"]  # case-insensitive substring of worker id or host
    assert names(q="node-4") == ["w12"]
    assert names(q="%") == [] and names(q="_") == []  # LIKE wildcards are literal
    assert names(side="rollout", state="live", q="w0") == [f"w{i:02d}" for i in range(10) if i != 1]
    first = all_pages(client, run_id, state="closed")[2]
    assert first["counts"]["total"] == 14 and first["counts"]["closed"] == 1  # counts ignore the filter


def test_strict_parameters_and_bodies(client):
    run_id, ids, _, _ = seeded_run(client)
    for params in ({"sort": "lag"}, {"state": "dead"}, {"side": "both"}, {"fingerprint": "abc"}, {"limit": 0},
                   {"limit": 1001}, {"cursor": "nope"}):
        assert client.get(f"{API}/runs/{run_id}/workers", params=params).status_code == 422, params
    for body in ({"policy_version": -1}, {"policy_version": 2**53 + 1}, {"policy_version": 1.5},
                 {"policy_version": True}, {"samples_per_s": -1}, {"step": 3}):
        assert beat(client, run_id, ids["w00"], **body).status_code == 422, body
    assert client.get(f"{API}/runs/999999/workers").status_code == 404


def post_batch(client, run_id: int, steps: list[int], series: dict, component_id: int | None = None) -> None:
    body = {"client_id": uuid.uuid4().hex, "seq": 1, "steps": steps, "series": series}
    if component_id is not None:
        body["component_id"] = component_id
    r = client.post(f"{API}/runs/{run_id}/metrics", json=body)
    assert r.status_code == 200, r.text


def test_series_split_by_sender_ranks_the_bad_replica_first(client):
    run_id = new_run(client, "per-worker")["id"]
    workers = {f"r{i}": register(client, run_id, "rollout", f"r{i}") for i in range(6)}
    steps = list(range(0, 100))
    for i, (name, cid) in enumerate(workers.items()):
        level = 0.5 if name == "r4" else 0.01 + 0.001 * i
        for lo in (0, 50):  # two batches each, as a worker posts over time
            post_batch(client, run_id, steps[lo:lo + 50], {"rollout/kl": [level] * 50}, cid)
    post_batch(client, run_id, [100, 101], {"rollout/kl": [0.02, 0.02]})  # names no process
    r = client.get(f"{API}/runs/{run_id}/workers/series", params={"key": "rollout/kl", "top": 2, "points": 10})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["step_min"] == 0 and out["step_max"] == 101 and out["bucket_width"] == 11
    assert out["workers_with_points"] == 6 and out["unattributed_points"] == 2
    assert sum(out["aggregate"]["count"]) == 6 * 100 + 2
    top, second = out["workers"]
    assert top["worker_id"] == "r4" and top["mean"] == 0.5 and top["points"] == 100
    assert top["score"] > 10 * max(second["score"], 1e-9)
    assert top["buckets"]["mean"] == [0.5] * len(top["buckets"]["step"])
    assert sum(top["buckets"]["count"]) == 100
    assert abs(out["workers_median"] - 0.0125) < 1e-9
    # a narrower range reads only its points
    r = client.get(f"{API}/runs/{run_id}/workers/series", params={"key": "rollout/kl", "step_min": 90, "step_max": 95})
    assert sum(r.json()["aggregate"]["count"]) == 6 * 6
    assert client.get(f"{API}/runs/{run_id}/workers/series", params={"key": "nope"}).status_code == 404
    assert client.get(f"{API}/runs/{run_id}/workers/series", params={"key": "rollout/kl", "top": 0}).status_code == 422


def test_a_lost_worker_is_lost_with_its_heartbeat_alert(client, app):
    from datetime import timedelta

    from paritywatch.backend.control import run_state
    from paritywatch.backend.models import Component, utcnow

    run_id = new_run(client, "lost-one")["id"]
    ids = {w: register(client, run_id, side, w) for side, w in (("trainer", "t0"), ("rollout", "r0"), ("rollout", "r1"))}
    with app.state.db.write() as s:  # r0 went silent an hour ago; the others just beat
        s.get(Component, ids["r0"]).last_heartbeat = utcnow() - timedelta(hours=1)
    with app.state.effects.write(app.state.db) as s:
        assert run_state.sweep(s, 60.0)["lost"] == 1
    rows, _, first = all_pages(client, run_id)
    workers = by_worker(rows)
    assert workers["r0"]["state"] == "lost" and [a["kind"] for a in workers["r0"]["alerts"]] == ["heartbeat_lost"]
    assert workers["r1"]["state"] == "live" and workers["r1"]["alerts"] == []
    assert first["counts"] == {"live": 2, "closed": 0, "lost": 1, "ended": 0, "total": 3}
    assert [r["worker_id"] for r in all_pages(client, run_id, state="lost")[0]] == ["r0"]
