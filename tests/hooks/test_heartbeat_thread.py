"""Liveness does not wait for deliveries: a metric batch the server is slow to answer must not
silence a process's heartbeats, or the backend reports a live process lost (a false
`heartbeat_lost`, seen on PostgreSQL with 17 processes: ingest answers took over 5 s)."""
from __future__ import annotations

import asyncio
import threading

from paritywatch.backend.settings import Settings
from tests.support.live import ThreadServer, wait_for
from trainer_hooks.monitor import ParityMonitor

HOLD_S = 30.0  # longer than the hooks' request timeout (10 s): the old worker thread beat only after it


def test_a_delivery_the_server_holds_does_not_silence_the_heartbeats(tmp_path) -> None:
    held, release = threading.Event(), threading.Event()
    with ThreadServer(Settings(database_url=f"sqlite:///{tmp_path / 'held.db'}")) as srv:
        store = srv.app.state.metrics
        ingest = store.ingest_batch_async

        async def held_ingest(*args, **kwargs):
            held.set()
            await asyncio.get_running_loop().run_in_executor(None, release.wait, HOLD_S)
            return await ingest(*args, **kwargs)

        store.ingest_batch_async = held_ingest
        try:
            with ParityMonitor("held", url=srv.url, spool_dir=tmp_path / "spool", heartbeat_interval_s=0.2) as monitor:
                monitor.log({"loss": 1.0}, 0)
                wait_for(held.is_set, timeout_s=10)  # the batch's POST now waits on the server
                beats = monitor.stats()["heartbeats"]
                # Without a heartbeat thread of its own: no beat until the POST times out (10 s).
                wait_for(lambda: monitor.stats()["heartbeats"] >= beats + 3, timeout_s=8)
                release.set()
                assert monitor.flush(15.0)
                assert monitor.stats()["sent_points"] == 1
        finally:
            release.set()
