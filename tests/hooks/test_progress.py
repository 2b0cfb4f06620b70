"""What heartbeats say about a process (issue 16): its policy version and throughput, from the
real hooks to the real backend's workers view; and the pure rate bookkeeping."""
from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from tests.hooks.conftest import Backend
from tests.support.live import wait_for
from trainer_hooks.monitor import ParityMonitor
from trainer_hooks.progress import Progress

_wait_for = partial(wait_for, timeout_s=30.0, interval_s=0.1)


def _workers(backend: Backend, run_id: int) -> dict[str, dict]:
    return {w["worker_id"]: w for w in backend.get(f"/runs/{run_id}/workers")["workers"]}


def test_versions_reach_the_workers_view_and_a_lagging_worker_shows_its_lag(backend: Backend, spool_dir: Path) -> None:
    common = dict(url=backend.url, spool_dir=spool_dir, heartbeat_interval_s=60.0)  # only early beats in time
    with ParityMonitor("progress", side="trainer", worker_id="t0", **common) as trainer, \
            ParityMonitor("progress", side="rollout", worker_id="r0", **common) as rollout:
        run_id = backend.run_id("progress")
        _wait_for(lambda: set(_workers(backend, run_id)) == {"t0", "r0"})
        rollout.set_policy_version(3)
        trainer.set_policy_version(3)
        _wait_for(lambda: _workers(backend, run_id)["r0"]["lag"] == 0)
        trainer.set_policy_version(7)  # the trainer moves on, the worker does not sync
        rollout.add_samples(5)
        rows = _wait_for(lambda: (w := _workers(backend, run_id))["r0"]["lag"] == 4 and w)
        assert rows["r0"]["lagging"] and rows["t0"]["policy_version"] == 7
        trainer.set_policy_version(True)  # not a version: ignored (logged once), never raised
        trainer.set_policy_version(-1)
        assert trainer.stats()["internal_errors"] >= 2


def test_rates_cover_the_interval_since_the_last_beat() -> None:
    now = [100.0]
    progress = Progress(clock=lambda: now[0])
    now[0] = 110.0
    assert progress.heartbeat_body(points_delivered=500) == {"points_per_s": 50.0}  # no samples counted: none sent
    progress.add_samples(30)
    progress.set_policy_version(4)
    now[0] = 120.0
    assert progress.heartbeat_body(points_delivered=600) == {"policy_version": 4, "points_per_s": 10.0, "samples_per_s": 3.0}
    now[0] = 130.0
    assert progress.heartbeat_body(points_delivered=600) == {"policy_version": 4, "points_per_s": 0.0, "samples_per_s": 0.0}
    assert progress.set_policy_version(4) is False and progress.set_policy_version(5) is True
    for bad in (True, 1.0, "3", -1, 2**53 + 1):
        with pytest.raises((TypeError, ValueError)):
            progress.set_policy_version(bad)
