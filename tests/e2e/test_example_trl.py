"""examples/trl_grpo.py for a few steps against a live backend: TRL's real GRPOTrainer with the
callback. The run is paused before training starts: the trainer must hold until resumed."""
from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from tests.support.live import ROOT, ProcessServer, first_within, wait_for


@pytest.mark.slow
def test_trl_example_reports_fingerprint_metrics_and_obeys_pause(tmp_path):
    with ProcessServer(f"sqlite:///{tmp_path / 'ex.db'}") as srv, httpx.Client(base_url=srv.url, timeout=30) as api:
        run = api.post("/api/v1/runs", json={"name": "trl-example", "project": "ci"}).json()
        api.post(f"/api/v1/runs/{run['id']}/control", json={"action": "pause", "reason": "hold the first step"})
        env = {**os.environ, "PARITYWATCH_URL": srv.url, "PARITYWATCH_SPOOL_DIR": str(tmp_path / "spool"),
               "PARITYWATCH_EXAMPLE_MODEL": str(tmp_path)}
        proc = subprocess.Popen([sys.executable, "examples/trl_grpo.py", "--steps", "3", "--run", "trl-example",
                                 "--project", "ci", "--output-dir", str(tmp_path / "out")],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            def trainer_fingerprint():
                comps = api.get(f"/api/v1/runs/{run['id']}").json()["components"]
                return [c for c in comps if c["side"] == "trainer" and c["fingerprint_digest"]]

            trainer = wait_for(trainer_fingerprint, timeout_s=180, interval_s=0.5)[0]
            # paused: no step may run (watched for 3 s; a step or an exit fails the test at once)
            ran = first_within(lambda: api.get(f"/api/v1/runs/{run['id']}").json()["last_step"] is not None
                               or proc.poll() is not None, window_s=3)
            assert not ran, "the trainer ran a step (or ended) while the run was paused"
            api.post(f"/api/v1/runs/{run['id']}/control", json={"action": "resume"})
            output, _ = proc.communicate(timeout=300)
            assert proc.returncode == 0, output[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
        fp = api.get(f"/api/v1/fingerprints/{trainer['fingerprint_digest']}").json()
        assert fp["components"]["chat_template"]["value"]  # the processing_class's template
        keys = {k["key"]: k for k in api.get(f"/api/v1/runs/{run['id']}/metrics").json()["keys"]}
        assert {"kl", "entropy", "reward", "loss"} <= set(keys), sorted(keys)
        assert keys["reward"]["last_step"] == 3
