"""`paritywatch serve` keeps an idle connection open longer than a hook does (trainer_hooks/contract.py,
"connections"): the hook always drops it first. With uvicorn's default the server closed it at
5 s, the hook's own expiry, and a beat sent at that moment was reset: the hook then reported the
backend unreachable and the run UNPROTECTED."""
from __future__ import annotations

from tests.support.live import ProcessServer, RawHttp, first_within
from trainer_hooks.contract import HOOK_KEEPALIVE_S


def test_an_idle_connection_outlives_the_hooks_keep_alive(tmp_path):
    with ProcessServer(f"sqlite:///{tmp_path / 'keepalive.db'}") as srv, RawHttp(srv.port) as conn:
        assert conn.request("GET", "/healthz")[0] == 200
        assert first_within(conn.closed_by_server, window_s=HOOK_KEEPALIVE_S + 1.5, interval_s=0.1) is None
        assert conn.request("GET", "/healthz")[0] == 200  # the same connection, reused after the idle time
