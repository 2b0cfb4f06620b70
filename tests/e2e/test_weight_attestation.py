"""Weight-sync attestation across real processes: the trainer (this process) and two rollout
worker processes (tests/e2e/attest_process.py), each with a real ParityMonitor posting over HTTP to
a real backend, sync a tiny random Qwen2 through files. All equal: nothing. One worker loads a
version with one tensor changed: an alert naming that tensor (and its notification), the run
paused. A worker that stays on an old version: an alert saying so."""
from __future__ import annotations

import queue
import subprocess
import sys
import threading

import httpx
import pytest
import torch

from paritywatch.backend.settings import Settings
from tests.e2e.tiny_qwen2 import tiny_qwen2
from tests.support.live import ROOT, ThreadServer, WebhookReceiver, wait_for
from trainer_hooks.monitor import ParityMonitor

NOTIFY_FAST = dict(allow_loopback_webhooks=True, webhook_poll_interval_s=0.05, webhook_group_wait_s=0,
                   webhook_group_interval_s=0, notify_interval_s=0.05)
PERTURBED = "model.layers.1.mlp.down_proj.weight"


class RolloutProcess:
    def __init__(self, url: str, worker_id: str, spool: str):
        self.worker_id = worker_id
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.e2e.attest_process", url, "sync", worker_id, spool],
                                     cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self._next() == "ready"

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def _next(self) -> str:
        return self.lines.get(timeout=180)  # imports torch and transformers: slow on a loaded machine

    def load(self, path, version: int, perturb: str | None = None) -> None:
        self.proc.stdin.write(f"load {path} {version} {perturb or ''}\n")
        self.proc.stdin.flush()
        assert self._next() == f"attested {version} True"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("close\n")
            self.proc.stdin.flush()
            self.proc.wait(60)


@pytest.fixture
def stack(db_url, tmp_path):
    with ThreadServer(Settings(database_url=db_url, **NOTIFY_FAST)) as srv, WebhookReceiver() as rx, \
            httpx.Client(base_url=f"{srv.url}/api/v1", timeout=30) as api:
        assert api.post("/webhooks", json={"url": rx.url, "events": ["alert.firing", "alert.resolved"]}).is_success
        workers = [RolloutProcess(srv.url, w, str(tmp_path / f"spool-{w}")) for w in ("w1", "w2")]
        try:
            with ParityMonitor("sync", project="attest", side="trainer", url=srv.url, worker_id="trainer",
                               spool_dir=tmp_path / "spool-trainer", flush_interval_s=0.1) as trainer:
                yield api, rx, trainer, workers
        finally:
            for w in workers:
                w.close()


def open_alerts(api: httpx.Client, run_id: int) -> list[dict]:
    return api.get(f"/runs/{run_id}/alerts", params={"status": "open"}).json()["alerts"]


def test_weight_sync_attestation_between_a_trainer_and_two_rollout_processes(stack, tmp_path):
    api, rx, trainer, (w1, w2) = stack
    model = tiny_qwen2(seed=0)

    def publish(version: int):
        """A training step changed the weights; the trainer attests them, then "sends" them."""
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * torch.randn_like(p))
        path = tmp_path / f"v{version}.pt"
        torch.save(model.state_dict(), path)
        assert trainer.attest_weights(model, version=version)["tensor_count"] == len(model.state_dict())
        assert trainer.flush(30)
        return path

    v1 = publish(1)
    w1.load(v1, 1)
    w2.load(v1, 1)
    run_id = api.get("/runs", params={"project": "attest"}).json()["runs"][0]["id"]
    [compared] = api.get(f"/runs/{run_id}/attestations/versions").json()["versions"]
    assert compared["trainer"]["worker_id"] == "trainer"
    assert sorted((w["worker_id"], w["verdict"]) for w in compared["workers"]) == [("w1", "same"), ("w2", "same")]
    assert open_alerts(api, run_id) == []  # all equal: nothing (evaluated inside each attestation's request)

    v2 = publish(2)
    w1.load(v2, 2, perturb=PERTURBED)  # a transfer that corrupted one tensor
    w2.load(v2, 2)
    [alert] = open_alerts(api, run_id)
    assert alert["kind"] == "weights_mismatch" and alert["detail"]["worker_id"] == "w1"
    assert alert["detail"]["differing_tensors"] == [PERTURBED] and PERTURBED in alert["title"]
    control = api.get(f"/runs/{run_id}/control").json()
    assert control["state"] == "paused" and PERTURBED in control["reason"]
    firing = wait_for(lambda: [r.json for r in rx.accepted() if r.json["type"] == "alert.firing"], timeout_s=30)
    assert PERTURBED in firing[0]["data"]["summary"] and "w1" in firing[0]["data"]["summary"]
    assert api.post(f"/runs/{run_id}/control", json={"action": "resume", "reason": "reloaded"}).is_success

    v3 = publish(3)
    w1.load(v3, 3)  # the corrupted worker reloads: its alert resolves; w2 stays on version 2
    assert open_alerts(api, run_id) == []  # one version behind is a sync in flight
    v4 = publish(4)
    w1.load(v4, 4)
    [alert] = open_alerts(api, run_id)
    assert alert["kind"] == "weights_stale" and alert["detail"]["worker_id"] == "w2"
    assert alert["detail"]["worker_version"] == 2 and alert["detail"]["missed_versions"] == [3, 4]
    assert "version 2" in alert["title"]
