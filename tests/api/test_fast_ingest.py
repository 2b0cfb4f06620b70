"""The metric batch fast path (backend/api/fast_ingest.py) answers exactly as the FastAPI route
does: the same requests, sent to an app with it and to one without it, get the same status,
headers and bytes, and leave the same rows."""
from __future__ import annotations

import json

import pytest

import paritywatch.backend.api.fast_ingest as fast_ingest
from paritywatch.backend.api.fast_ingest import MetricBatchFastPath
from paritywatch.backend.main import create_app
from paritywatch.backend.settings import Settings
from tests.api.conftest import make_token
from tests.support.live import local_client

JSON = {"content-type": "application/json"}


def batch(seq: int, steps: list, series: dict, **extra) -> bytes:
    return json.dumps({"client_id": "c1", "seq": seq, "steps": steps, "series": series, **extra}).encode()


# (what, path after /api/v1, body, headers): in order; each app starts empty and gets them all.
REQUESTS = [
    ("a batch", "/runs/1/metrics", batch(0, [1, 2, 3], {"loss": [1.0, 0.5, 0.25], "lr": [1e-4] * 3}), JSON),
    ("the same batch again", "/runs/1/metrics", batch(0, [1, 2, 3], {"loss": [1.0, 0.5, 0.25], "lr": [1e-4] * 3}), JSON),
    ("non-finite and null values", "/runs/1/metrics",
     b'{"client_id":"c1","seq":1,"steps":[4,5],"series":{"loss":[NaN,null],"lr":[Infinity,2.0]}}', JSON),
    ("unsorted steps", "/runs/1/metrics", batch(2, [9, 7, 8], {"loss": [3.0, 1.0, 2.0]}), JSON),
    ("no body", "/runs/1/metrics", b"", JSON),
    ("not JSON", "/runs/1/metrics", b"{not json", JSON),
    ("a JSON list", "/runs/1/metrics", b"[1, 2]", JSON),
    ("a text body", "/runs/1/metrics", batch(3, [1], {"x": [1.0]}), {"content-type": "text/plain"}),
    ("a missing field", "/runs/1/metrics", json.dumps({"client_id": "c1", "seq": 3, "steps": [1]}).encode(), JSON),
    ("an unknown field", "/runs/1/metrics", batch(3, [1], {"x": [1.0]}, extra=1), JSON),
    ("a value as text", "/runs/1/metrics", batch(3, [1], {"x": ["1.0"]}), JSON),
    ("a step as true", "/runs/1/metrics", batch(3, [True], {"x": [1.0]}), JSON),
    ("a negative step", "/runs/1/metrics", batch(3, [-1], {"x": [1.0]}), JSON),
    ("a series longer than its steps", "/runs/1/metrics", batch(3, [1], {"x": [1.0, 2.0]}), JSON),
    ("a bad key", "/runs/1/metrics", batch(3, [1], {"": [1.0]}), JSON),
    ("too many points", "/runs/1/metrics", batch(3, list(range(600)), {"x": [0.0] * 600}), JSON),
    ("a step far ahead", "/runs/1/metrics", batch(3, [10**12], {"x": [1.0]}), JSON),
    ("a component the run does not have", "/runs/1/metrics", batch(3, [1], {"x": [1.0]}, component_id=99), JSON),
    ("a run that does not exist", "/runs/7/metrics", batch(3, [1], {"x": [1.0]}), JSON),
    ("a run id past 64 bits", "/runs/99999999999999999999/metrics", batch(3, [1], {"x": [1.0]}), JSON),
    ("a run id that is not a number", "/runs/one/metrics", batch(3, [1], {"x": [1.0]}), JSON),
    ("a query string", "/runs/1/metrics?x=1", batch(3, [1], {"x": [1.0]}), JSON),
    ("a trailing slash", "/runs/1/metrics/", batch(3, [1], {"x": [1.0]}), JSON),
    ("the next batch", "/runs/1/metrics", batch(4, [10, 11], {"loss": [0.1, 0.2], "new/key": [1.0, 2.0]}), JSON),
]


def make_app(tmp_path, name: str, fast_path: bool):
    settings = Settings(database_url=f"sqlite:///{tmp_path / name}.db", host="127.0.0.1", open_mode=True,
                        max_points_per_batch=500, max_step_ahead=1_000_000)
    app = create_app(settings)
    if not fast_path:  # before the first request builds the middleware stack
        app.user_middleware = [m for m in app.user_middleware if m.cls is not MetricBatchFastPath]
        assert len(app.user_middleware) == 2
    return app


def answers(client, requests, extra_headers=None) -> list[tuple]:
    out = []
    for what, path, body, headers in requests:
        r = client.post("/api/v1" + path, content=body, headers={**headers, **(extra_headers or {})})
        kept = sorted((k, v) for k, v in r.headers.items() if k not in ("date", "server"))
        out.append((what, r.status_code, kept, r.content))
    return out


def stored(client) -> list:
    keys = client.get("/api/v1/runs/1/metrics").json()["keys"]
    return [(k["key"], k["count"], client.get("/api/v1/runs/1/series", params={"key": k["key"]}).json()["buckets"])
            for k in keys]


@pytest.fixture
def counted(monkeypatch):
    """Calls of the shared ingest code made by the fast path (the route calls it by its own name)."""
    calls = []
    real = fast_ingest.ingest_metric_batch

    async def counting(*args, **kwargs):
        calls.append(args[1])
        return await real(*args, **kwargs)

    monkeypatch.setattr(fast_ingest, "ingest_metric_batch", counting)
    return calls


def test_the_fast_path_answers_every_request_as_the_route_does(tmp_path, counted):
    results, rows = {}, {}
    for name in ("route", "fast"):
        with local_client(make_app(tmp_path, name, fast_path=name == "fast")) as client:
            assert client.post("/api/v1/runs", json={"name": "r", "project": "p"}).json()["id"] == 1
            results[name] = answers(client, REQUESTS)
            rows[name] = stored(client)
    for route, fast in zip(results["route"], results["fast"]):
        assert fast == route, route[0]
    statuses = {what: status for what, status, _, _ in results["fast"]}
    assert statuses["a batch"] == 200 and statuses["a run that does not exist"] == 404
    assert statuses["too many points"] == 413 and statuses["a text body"] == 415 and statuses["a query string"] == 422
    assert rows["fast"] == rows["route"] and [k for k, _, _ in rows["fast"]] == ["loss", "lr", "new/key"]
    # The fast path took every POST to a run's metrics that the guard let through (not the text
    # body), and nothing else (not the query string, the long or odd run ids, the trailing slash).
    taken = [what for what, path, _, headers in REQUESTS
             if fast_ingest.BATCH_PATH.fullmatch("/api/v1" + path) and headers is JSON]
    assert len(counted) == len(taken) == len(REQUESTS) - 5


def test_tokens_are_checked_the_same_way(tmp_path, counted):
    """Who may post: an ingest token of the run's project may; one bound to another project, a
    read token, an unknown token and no token may not (the guard answers some before the fast
    path sees the request, the shared authorisation the rest)."""
    results = {}
    for name in ("route", "fast"):
        app = make_app(tmp_path, name, fast_path=name == "fast")
        with local_client(app) as client:
            client.post("/api/v1/runs", json={"name": "r", "project": "p"})
            admin = make_token(app, "admin")
            from paritywatch.backend.auth import create_token

            _, mine = create_token(app.state.db, "mine", ["ingest"], project="p")
            _, theirs = create_token(app.state.db, "theirs", ["ingest"], project="q")
            reader = make_token(app, "read")
            body = [("batch", "/runs/1/metrics", batch(0, [1], {"x": [1.0]}), JSON)]
            results[name] = [answers(client, body, {"Authorization": f"Bearer {secret}"})
                             for secret in (theirs, reader, "pw_not_a_token", mine)]
            results[name].append(answers(client, body))  # no token, now that tokens exist
            counts = client.get("/api/v1/runs/1/metrics", headers={"Authorization": f"Bearer {admin}"}).json()["keys"]
            results[name].append([(k["key"], k["count"]) for k in counts])
    assert results["fast"] == results["route"]
    statuses = [r[0][1] for r in results["fast"][:5]]
    assert statuses == [403, 403, 401, 200, 401]
    assert results["fast"][5] == [("x", 1)]
    assert counted == [1]  # the token of the run's project (the other project's stops at the authorisation)
