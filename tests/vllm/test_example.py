"""examples/vllm_rollout_worker.py, run as a script against a live backend."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from paritywatch.backend.settings import Settings
from tests.support.live import ROOT, ThreadServer, wait_for
from trainer_hooks.monitor import ParityMonitor


# The suite runs at nice 19 beside the main suite: a starved engine start took over 240 s once in CI
# (the whole vLLM suite of 12 tests takes about 2 minutes). The bound is a hang guard, not a speed check.
@pytest.mark.timeout(600)
def test_rollout_worker_example_reaches_the_backend(tiny_model_dir, hf_tokenizer, hf_generation_config,
                                                    sqlite_url, tmp_path):
    records_out = tmp_path / "records.jsonl"
    with ThreadServer(Settings(database_url=sqlite_url)) as srv, httpx.Client(base_url=srv.url, timeout=30) as api:
        trainer = ParityMonitor(run="example-vllm", project="vllm-example", side="trainer", url=srv.url,
                                worker_id="t0", spool_dir=tmp_path / "spool-t", flush_interval_s=0.05)
        try:
            trainer.register_processor(hf_tokenizer, hf_generation_config).result(timeout=30)
            cmd = [sys.executable, str(ROOT / "examples" / "vllm_rollout_worker.py"), "--model", str(tiny_model_dir),
                   "--run", "example-vllm", "--project", "vllm-example", "--url", srv.url, "--worker-id", "w0",
                   "--trainer-model", str(tiny_model_dir), "--steps", "2", "--max-tokens", "6",
                   "--max-model-len", "512", "--dtype", "float32", "--eager", "--records-out", str(records_out),
                   "--prompts", "What is 2 + 2?", "Hello world!", "Café 中文"]
            env = {**os.environ, "PARITYWATCH_SPOOL_DIR": str(tmp_path / "spool-w"), "PYTHONPATH": str(ROOT)}
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=480)
            assert proc.returncode == 0, proc.stderr[-4000:]
            assert "step 1: 6 sequences" in proc.stdout

            run = api.get("/api/v1/runs", params={"project": "vllm-example"}).json()["runs"][0]
            run = api.get(f"/api/v1/runs/{run['id']}").json()
            rollout = [c for c in run["components"] if c["side"] == "rollout"]
            assert [c["worker_id"] for c in rollout] == ["w0"]
            assert rollout[0]["fingerprint_digest"]

            def parity():
                body = api.get(f"/api/v1/runs/{run['id']}/parity").json()
                return body if body["groups"] else None

            group = wait_for(parity, timeout_s=60)["groups"][0]
            assert group["verdict"] in ("same", "info"), group["diff"]  # same processor, same generation config
            keys = {k["key"]: k for k in api.get(f"/api/v1/runs/{run['id']}/metrics").json()["keys"]}
            for key in ("align/prompt_rerender_mismatch_frac", "align/decode_mismatch_frac",
                        "rollout/num_sequences", "rollout/logprob_mean"):
                assert key in keys, sorted(keys)
            series = api.get(f"/api/v1/runs/{run['id']}/series",
                             params={"key": "align/prompt_rerender_mismatch_frac", "points": 10}).json()
            assert series["buckets"]["max"] == [0.0, 0.0]
            records = [json.loads(line) for line in records_out.read_text().splitlines()]
            assert len(records) == 12 and all(len(r["rollout_logprobs"]) == len(r["completion_ids"]) for r in records)
        finally:
            trainer.close()
