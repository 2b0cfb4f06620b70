"""Lost points are counted exactly, by reason, and the server shows each process's count as its
stats() say it (issue 26.5: "spool drops under-reported, client 12,060, server 4,000": every process
reported its total under one key, so the run showed whichever process posted last, and batches the
server refused were counted nowhere it could see)."""
from __future__ import annotations

import logging
import signal
from pathlib import Path

import pytest

from tests.hooks.conftest import Backend
from tests.support.live import wait_for
from trainer_hooks import ParityMonitor
from trainer_hooks.contract import dropped_points_key


def test_each_process_reports_exactly_what_it_lost_whatever_the_reason(own_backend: Backend, spool_dir: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="paritywatch")
    own_backend.stop(signal.SIGKILL)
    # backend away, no room in the spool: the batches are dropped
    spool_full = ParityMonitor("losses", url=own_backend.url, spool_dir=spool_dir / "a", spool_max_bytes=1,
                               worker_id="rollout-1", side="rollout", flush_interval_s=0.05, max_backoff_s=0.5)
    for step in range(10):
        spool_full.log({"loss": 1.0, "kl": 0.0}, step)
    wait_for(lambda: spool_full.stats()["spool_dropped_points"] == 20)
    own_backend.start()

    # logging faster than a tick drains: the queue's overflow is dropped at once
    queue_full = ParityMonitor("losses", url=own_backend.url, spool_dir=spool_dir / "b", max_queue=50,
                               worker_id="rollout-2", side="rollout")
    accepted = sum(queue_full.log({"reward": 0.5}, step) for step in range(500))
    # a batch the server refuses (a step beyond the step-ahead limit): counted, reported at an accepted step
    refused = ParityMonitor("losses", url=own_backend.url, spool_dir=spool_dir / "c", worker_id="trainer-0")
    refused.log({"loss": 1.0}, 0)
    assert refused.flush(20.0)
    refused.log({"loss": 1.0, "kl": 2.0}, 2**31)

    monitors = (spool_full, queue_full, refused)
    wait_for(lambda: all(m.stats()["dropped_points"] for m in monitors), timeout_s=20.0)
    for monitor in monitors:
        assert monitor.flush(30.0), monitor.stats()
        monitor.close()
    stats = [m.stats() for m in monitors]
    assert stats[0]["spool_dropped_points"] == 20
    assert stats[1]["queue_dropped_points"] == 500 - accepted > 0
    assert stats[2]["rejected_points"] == 2
    for s in stats:
        assert s["dropped_points"] == s["queue_dropped_points"] + s["spool_dropped_points"] + s["rejected_points"]

    shown = own_backend.last_values(own_backend.run_id("losses"))
    assert {worker: shown.get(dropped_points_key(worker)) for worker in ("rollout-1", "rollout-2", "trainer-0")} \
        == {"rollout-1": 20.0, "rollout-2": float(500 - accepted), "trainer-0": 2.0}
    assert shown["reward"] is not None and "kl" not in shown  # the refused batch stored nothing

    said = [r.getMessage() for r in caplog.records]
    for reason in ("the queue (max_queue=50) was full", "found no room in the spool",
                   "the server refused a metric batch (HTTP 422"):
        assert sum(reason in m for m in said) == 1, (reason, said)  # each said, once
