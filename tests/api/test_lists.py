"""Lists and query strings (issues 17.4 and 13.5): strict filters, one pagination for every
list, optional alert notes, and bounded reads (page sizes, run config and tags, series decode)."""
from __future__ import annotations

import pytest

from paritywatch.backend.alerts import lifecycle
from paritywatch.backend.models import Run
from tests.api.conftest import new_run


def fire_alerts(app, run_id: int, n: int) -> list[int]:
    with app.state.db.write() as s:
        run = s.get(Run, run_id)
        return [lifecycle.fire(s, run, "metric_threshold", "warning", f"k{i}", f"alert {i}", {})[0].id for i in range(n)]


def pages(client, path: str, field: str, **params) -> list[list[dict]]:
    """Every page of a list, following next_cursor."""
    out, cursor = [], None
    for _ in range(100):
        r = client.get(path, params={**params, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        body = r.json()
        out.append(body[field])
        cursor = body["next_cursor"]
        if cursor is None:
            return out
    raise AssertionError("next_cursor never ended")


def assert_error(r, status: int, *words: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["status"] == status and err["code"] and err["message"]
    for w in words:
        assert w in r.text, (w, r.text)


def test_runs_are_paginated_newest_first_without_gaps_or_repeats(client):
    ids = [new_run(client, f"r{i}")["id"] for i in range(7)]
    got = pages(client, "/api/v1/runs", "runs", limit=3)
    assert [len(p) for p in got] == [3, 3, 1]
    assert [r["id"] for p in got for r in p] == ids[::-1]
    # a run created between two page reads does not shift the next page
    first = client.get("/api/v1/runs", params={"limit": 3}).json()
    new_run(client, "late")
    second = client.get("/api/v1/runs", params={"limit": 3, "cursor": first["next_cursor"]}).json()
    assert [r["id"] for r in second["runs"]] == ids[::-1][3:6]
    # the default page is 100, the maximum 500
    assert client.get("/api/v1/runs").json()["next_cursor"] is None
    assert_error(client.get("/api/v1/runs", params={"limit": 501}), 422, "limit")
    assert_error(client.get("/api/v1/runs", params={"limit": 0}), 422, "limit")


def test_alerts_events_keys_audit_and_deliveries_page_alike(client, app):
    run = new_run(client)
    rid = run["id"]
    alert_ids = fire_alerts(app, rid, 5)
    assert [a["id"] for p in pages(client, "/api/v1/alerts", "alerts", limit=2) for a in p] == alert_ids[::-1]
    assert [a["id"] for p in pages(client, f"/api/v1/runs/{rid}/alerts", "alerts", limit=4, status="open")
            for a in p] == alert_ids[::-1]
    for note in ("a", "b", "c"):
        client.post(f"/api/v1/alerts/{alert_ids[0]}/acknowledge", json={"note": note})
    client.post(f"/api/v1/alerts/{alert_ids[0]}/resolve", json={"note": "done"})
    events = pages(client, f"/api/v1/alerts/{alert_ids[0]}/events", "events", limit=1)
    assert [e["action"] for p in events for e in p] == ["fired", "acknowledged", "resolved"]
    for action in ("pause", "resume", "pause", "resume", "stop"):
        assert client.post(f"/api/v1/runs/{rid}/control", json={"action": action, "reason": "t"}).status_code == 200
    audit = pages(client, f"/api/v1/runs/{rid}/control/audit", "events", limit=2)
    assert [len(p) for p in audit] == [2, 2, 1]
    assert [e["version"] for p in audit for e in p] == [2, 3, 4, 5, 6]  # oldest first
    client.post(f"/api/v1/runs/{rid}/metrics", json={"client_id": "c", "seq": 0, "steps": [1],
                                                       "series": {k: [1.0] for k in ("d", "a", "c", "b", "e")}})
    keys = pages(client, f"/api/v1/runs/{rid}/metrics", "keys", limit=2)
    assert [k["key"] for p in keys for k in p] == ["a", "b", "c", "d", "e"]


def test_webhook_deliveries_are_paginated(client, app):
    app.state.settings.allow_loopback_webhooks = True
    hook = client.post("/api/v1/webhooks", json={"url": "http://127.0.0.1:9/hook"}).json()
    queued = [client.post(f"/api/v1/webhooks/{hook['id']}/test").json()["delivery_id"] for _ in range(5)]
    got = pages(client, f"/api/v1/webhooks/{hook['id']}/deliveries", "deliveries", limit=2)
    assert [d["id"] for p in got for d in p] == queued[::-1]
    assert_error(client.get(f"/api/v1/webhooks/{hook['id']}/deliveries", params={"limit": 5000}), 422, "limit")


@pytest.mark.parametrize("path,params", [
    ("/api/v1/runs", {"projcet": "typo"}),
    ("/api/v1/alerts", {"stauts": "open"}),
    ("/api/v1/runs/{rid}/alerts", {"severity": "error"}),
    ("/api/v1/runs/{rid}/metrics", {"prefix": "align/"}),
    ("/api/v1/runs/{rid}/series", {"key": "loss", "point": "10"}),
    ("/api/v1/runs/{rid}", {"verbose": "1"}),
])
def test_unknown_query_parameters_are_422_not_ignored(client, path, params):
    """A typo in a filter used to be ignored silently (the list came back unfiltered)."""
    rid = new_run(client)["id"]
    client.post(f"/api/v1/runs/{rid}/metrics", json={"client_id": "c", "seq": 0, "steps": [1], "series": {"loss": [1.0]}})
    name = next(iter(params)) if len(params) == 1 else "point"
    r = client.get(path.format(rid=rid), params=params)
    assert_error(r, 422, name, "unknown query parameter")
    assert r.json()["error"]["details"][0]["loc"] == ["query", name]


@pytest.mark.parametrize("path,params,word", [
    ("/api/v1/alerts", {"status": "bogus"}, "status"),
    ("/api/v1/runs/{rid}/alerts", {"status": "firing,open"}, "status"),
    ("/api/v1/runs", {"cursor": "not-a-cursor"}, "cursor"),
    ("/api/v1/alerts", {"limit": "many"}, "limit"),
    ("/api/v1/runs/{rid}/metrics", {"cursor": "eyJwIjogMX0"}, "cursor"),  # an id cursor on a name-ordered list
])
def test_bad_filter_values_are_422_in_the_one_error_shape(client, path, params, word):
    rid = new_run(client)["id"]
    assert_error(client.get(path.format(rid=rid), params=params), 422, word)


@pytest.mark.parametrize("action", ["acknowledge", "resolve"])
@pytest.mark.parametrize("body", ["none", "empty object", "note"])
def test_alert_actions_take_an_optional_body(client, app, action, body):
    """Issue 17.4: the docs make the note optional; a POST with no body used to be a 422."""
    rid = new_run(client)["id"]
    alert_id = fire_alerts(app, rid, 1)[0]
    kwargs = {"none": {}, "empty object": {"json": {}}, "note": {"json": {"note": "looked at it"}}}[body]
    r = client.post(f"/api/v1/alerts/{alert_id}/{action}", **kwargs)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == {"acknowledge": "acknowledged", "resolve": "resolved"}[action]
    event = client.get(f"/api/v1/alerts/{alert_id}/events").json()["events"][-1]
    assert event["note"] == ("looked at it" if body == "note" else None)
    assert_error(client.post(f"/api/v1/alerts/{alert_id}/{action}", json={"notes": "typo"}), 422, "notes")


def test_run_config_and_tags_are_bounded_even_when_merged(client, app):
    app.state.settings.max_run_config_bytes = 1000
    assert_error(client.post("/api/v1/runs", json={"name": "big", "config": {"blob": "x" * 2000}}), 413, "1,000")
    assert client.get("/api/v1/runs").json()["runs"] == []  # refused whole
    new_run(client, "grow", config={"a": "x" * 600})
    # each post is small, the merged config is not
    assert_error(client.post("/api/v1/runs", json={"name": "grow", "config": {"b": "y" * 600}}), 413, "config")
    assert_error(client.post("/api/v1/runs", json={"name": "t", "tags": {"k": "v" * 1001}}), 422, "tags")
    assert_error(client.post("/api/v1/runs", json={"name": "t", "tags": {"": "v"}}), 422, "tags")
    new_run(client, "tagged", tags={f"t{i}": "v" for i in range(60)})
    assert_error(client.post("/api/v1/runs", json={"name": "tagged", "tags": {f"u{i}": "v" for i in range(60)}}),
                 422, "at most 100 tags")
    assert len(client.get("/api/v1/runs", params={"limit": 5}).json()["runs"][0]["tags"]) == 60


def test_a_series_read_that_would_decode_too_many_raw_points_is_refused_with_advice(client, app):
    rid = new_run(client)["id"]
    steps = list(range(0, 40_000))
    for seq, i in enumerate(range(0, len(steps), 10_000)):
        r = client.post(f"/api/v1/runs/{rid}/metrics", json={"client_id": "c", "seq": seq, "steps": steps[i:i + 10_000],
                                                              "series": {"s": [1.0] * 10_000}})
        assert r.status_code == 200
    app.state.settings.max_read_raw_points = 5_000
    # 16-step buckets: the dense chunks have no level-1 roll-ups, their 40,000 raw points would be decoded
    r = client.get(f"/api/v1/runs/{rid}/series", params={"key": "s", "points": 2_000})
    assert_error(r, 422, "5,000 raw points", "fewer")
    # the advice works: fewer points come from roll-ups alone
    r = client.get(f"/api/v1/runs/{rid}/series", params={"key": "s", "points": 100})
    assert r.status_code == 200 and sum(r.json()["buckets"]["count"]) == 40_000
    assert_error(client.get(f"/api/v1/runs/{rid}/series", params={"key": "s", "points": 20_001}), 422, "points")
