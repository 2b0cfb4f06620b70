"""Issue 13.5 (streams) and 15.3: live streams come from one shared poll per process, are bounded
per token and in age, and end within seconds when their token is revoked."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from sqlalchemy import event

from paritywatch.backend.auth import list_tokens, revoke_token
from paritywatch.backend.db import Database
from paritywatch.backend.settings import Settings
from tests.support.live import ThreadServer, make_tokens, wait_for


POLL_S = 0.2
OBSERVE_S = 2.0


class StreamReader(threading.Thread):
    """Follows one event stream; records its events and when it ended."""

    def __init__(self, url: str, token: str):
        super().__init__(daemon=True)
        self.url, self.token = url, token
        self.events: list[tuple[str, dict]] = []
        self.status: int | None = None
        self.ended = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            with httpx.stream("GET", self.url, headers={"Authorization": f"Bearer {self.token}"},
                              timeout=httpx.Timeout(30, read=60)) as r:
                self.status = r.status_code
                name = "message"
                for line in r.iter_lines():
                    if self.stop.is_set():
                        return
                    if line.startswith("event:"):
                        name = line[6:].strip()
                    elif line.startswith("data:"):
                        self.events.append((name, json.loads(line[5:])))
        except httpx.HTTPError:
            pass
        finally:
            self.ended.set()


@pytest.fixture
def server(sqlite_db):
    tokens = make_tokens(sqlite_db)
    settings = Settings(database_url=sqlite_db, stream_auth_check_s=0.5, stream_poll_interval_s=POLL_S,
                        max_streams_per_token=60, run_background_workers=False)
    with ThreadServer(settings) as srv:
        api = httpx.Client(base_url=srv.url + "/api/v1", headers={"Authorization": f"Bearer {tokens['admin']}"})
        yield srv, tokens, api


def test_a_revoked_token_ends_its_open_stream_within_seconds(server, sqlite_db):
    srv, tokens, api = server
    run_id = api.post("/runs", json={"name": "watched"}).json()["id"]
    reader = StreamReader(f"{srv.url}/api/v1/runs/{run_id}/stream", tokens["read"])
    reader.start()
    wait_for(lambda: reader.events, timeout_s=10)
    other = Database(sqlite_db)  # revoked from elsewhere, as `paritywatch token revoke` does
    try:
        [token] = [t for t in list_tokens(other) if t.scopes == "read"]
        assert revoke_token(other, token.id)
    finally:
        other.dispose()
    assert reader.ended.wait(5), "the stream of a revoked token stayed open"
    assert reader.events[-1] == ("end", {"reason": "token revoked"})
    r = httpx.get(f"{srv.url}/api/v1/runs/{run_id}/stream", headers={"Authorization": f"Bearer {tokens['read']}"})
    assert r.status_code == 401


def test_streams_are_bounded_per_token_and_in_age(sqlite_db):
    tokens = make_tokens(sqlite_db)
    settings = Settings(database_url=sqlite_db, max_streams_per_token=2, stream_max_age_s=1.0,
                        stream_poll_interval_s=0.1, run_background_workers=False)
    with ThreadServer(settings) as srv:
        api = httpx.Client(base_url=srv.url + "/api/v1", headers={"Authorization": f"Bearer {tokens['admin']}"})
        run_id = api.post("/runs", json={"name": "r"}).json()["id"]
        url = f"{srv.url}/api/v1/runs/{run_id}/stream"
        readers = [StreamReader(url, tokens["read"]) for _ in range(2)]
        for reader in readers:
            reader.start()
        wait_for(lambda: all(r.events for r in readers), timeout_s=10)
        r = httpx.get(url, headers={"Authorization": f"Bearer {tokens['read']}"})
        assert r.status_code == 429 and "2 open streams" in r.json()["error"]["message"]
        for reader in readers:  # the maximum age ends them; the dashboard reconnects
            assert reader.ended.wait(10)
            assert reader.events[-1][0] == "end" and "maximum stream age" in reader.events[-1][1]["reason"]


def test_fifty_dashboards_share_one_poll(server):
    """50 open streams on 5 runs: the database sees the same few queries per poll as one stream
    would cause (before: each stream ran 4 queries every 0.5 s)."""
    srv, tokens, api = server
    runs = [api.post("/runs", json={"name": f"r{i}"}).json()["id"] for i in range(5)]
    statements: list[str] = []
    engine = srv.app.state.db.engine
    listener = lambda conn, cursor, stmt, *rest: statements.append(stmt)  # noqa: E731
    event.listen(engine, "before_cursor_execute", listener)
    readers = [StreamReader(f"{srv.url}/api/v1/runs/{runs[i % 5]}/stream", tokens["read"]) for i in range(50)]
    try:
        for reader in readers:
            reader.start()
        wait_for(lambda: all(r.events for r in readers), timeout_s=30)
        start_count, started = len(statements), time.monotonic()
        threading.Event().wait(OBSERVE_S)  # a measurement window, not a synchronisation
        window, elapsed = statements[start_count:], time.monotonic() - started
        polls = elapsed / POLL_S + 1
        # One shared poll reads alerts twice (open ones by severity, and their version); 50
        # streams polling on their own would read them 2 * 50 times per tick.
        alert_queries = sum(1 for s in window if "FROM alerts" in s)
        assert alert_queries <= 2 * polls + 2, (alert_queries, elapsed)
        assert len(window) <= 6 * polls + 6, (len(window), elapsed)
        api.post(f"/runs/{runs[0]}/control", json={"action": "pause"})  # and they still see changes
        wait_for(lambda: all(any(e[1].get("control", {}).get("state") == "paused" for e in r.events)
                             for r in readers[::5]), timeout_s=10)
    finally:
        event.remove(engine, "before_cursor_execute", listener)
        for reader in readers:
            reader.stop.set()
