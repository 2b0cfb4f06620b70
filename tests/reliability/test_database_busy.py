"""A busy or absent database is a 503 with Retry-After on a connection that stays open, wherever
the error arises: identifying the caller (the request guard, before the routes) or in a route.
Before, these errors reached Starlette's catch-all, which sent the 503 and then re-raised: uvicorn
logged "Exception in ASGI application" and closed the connection, so a hook often read a reset
instead of the 503 (all hooks at once, each printing that its run was UNPROTECTED)."""
from __future__ import annotations

import sqlite3

import httpx
import pytest
from sqlalchemy.exc import OperationalError

from paritywatch.backend.control import run_state
from paritywatch.backend.settings import Settings
from tests.support.live import RawHttp, ThreadServer


def locked(*_args, **_kwargs):
    raise OperationalError("UPDATE components ...", {}, sqlite3.OperationalError("database is locked"))


def break_caller_lookup(srv: ThreadServer, monkeypatch) -> None:
    monkeypatch.setattr(srv.app.state.open_mode, "cached", lambda: None)
    monkeypatch.setattr(srv.app.state.open_mode, "is_open", locked)


def break_heartbeat_route(srv: ThreadServer, monkeypatch) -> None:
    monkeypatch.setattr(run_state, "heartbeat", locked)


@pytest.mark.parametrize("fault", [break_caller_lookup, break_heartbeat_route], ids=["identifying", "route"])
def test_a_busy_database_is_a_503_with_retry_after_and_the_connection_stays_open(tmp_path, monkeypatch, fault):
    with ThreadServer(Settings(database_url=f"sqlite:///{tmp_path / 'busy.db'}")) as srv:
        with httpx.Client(base_url=srv.url, timeout=30) as api:
            run_id = api.post("/api/v1/runs", json={"name": "busy"}).json()["id"]
            comp = api.post(f"/api/v1/runs/{run_id}/components", json={"side": "trainer", "worker_id": "t0"}).json()
        beat = f"/api/v1/runs/{run_id}/components/{comp['id']}/heartbeat"
        body = b'{"samples_per_s": 1.0}'
        with RawHttp(srv.port) as conn:
            with monkeypatch.context() as m:
                fault(srv, m)
                for _ in range(3):
                    status, headers, answer = conn.request("POST", beat, body)
                    assert (status, headers.get("retry-after")) == (503, "1"), answer
                    assert b'"code": "unavailable"' in answer.replace(b'":"', b'": "')
            status, _, answer = conn.request("POST", beat, body)  # the database is back: same connection
            assert status == 200, answer
