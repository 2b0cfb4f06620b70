"""Prometheus /metrics and the live event stream."""
import json
import threading

import httpx

from paritywatch.backend.settings import Settings
from tests.support.live import ThreadServer


def test_prometheus_metrics(client):
    run = client.post("/api/v1/runs", json={"name": "r"}).json()
    client.post(f"/api/v1/runs/{run['id']}/metrics",
                json={"client_id": "c", "seq": 1, "steps": [1, 2], "series": {"align/kl_k3": [0.5, 0.6]}})
    client.post(f"/api/v1/runs/{run['id']}/control", json={"action": "pause"})
    text = client.get("/metrics").text
    assert 'paritywatch_runs{state="paused"} 1' in text
    assert 'paritywatch_alerts_open{severity="warning"} 1' in text  # built-in kl_k3 rule
    assert "paritywatch_ingest_points_total 2" in text
    assert "# TYPE paritywatch_ingest_batches_total counter" in text


def test_stream_sends_the_run_summary_and_its_changes(sqlite_url):
    with ThreadServer(Settings(database_url=sqlite_url)) as srv, httpx.Client(base_url=srv.url, timeout=30) as api:
        rid = api.post("/api/v1/runs", json={"name": "streamed"}).json()["id"]
        events: list[dict] = []
        connected, done = threading.Event(), threading.Event()

        def read():
            with httpx.stream("GET", f"{srv.url}/api/v1/runs/{rid}/stream", timeout=10) as r:
                assert r.headers["content-type"].startswith("text/event-stream")
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))
                        connected.set()  # the summary came: the stream is subscribed
                        if len(events) == 2:
                            done.set()
                            return

        t = threading.Thread(target=read, daemon=True)
        t.start()
        assert connected.wait(10)
        api.post(f"/api/v1/runs/{rid}/control", json={"action": "pause", "reason": "look"})
        assert done.wait(10)
        assert events[0]["control"]["state"] == "running"
        assert events[1]["control"]["state"] == "paused" and events[1]["control"]["reason"] == "look"
