"""`paritywatch demo` against a running backend: the buggy worker is caught, --healthy is quiet."""
from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from tests.support.live import ROOT, ProcessServer


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    db = tmp_path_factory.mktemp("demo") / "demo.db"
    with ProcessServer(f"sqlite:///{db}") as srv:
        yield srv


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("demo-model") / "model"


def run_demo(url: str, model_dir, *extra: str) -> dict:  # noqa: ANN001
    cmd = [sys.executable, "-m", "backend.cli", "demo", "--url", url, "--duration", "45", "--workers", "2",
           "--model-dir", str(model_dir), *extra]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "dashboard:" in out.stderr  # progress and the URL are shown
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_buggy_worker_is_caught_and_the_run_paused(backend, model_dir):
    summary = run_demo(backend.url, model_dir)
    assert summary["run_state"] == "paused"
    mismatch = [a for a in summary["alerts"] if a["kind"] == "processor_mismatch"]
    assert mismatch and "chat_template" in mismatch[0]["components"]
    assert summary["dashboard"].startswith(backend.url)
    # and through the API
    run = httpx.get(f"{backend.url}/api/v1/runs/{summary['run_id']}").json()
    assert run["control"]["actor"] == "paritywatch" and "chat_template" in run["control"]["reason"]
    parity = httpx.get(f"{backend.url}/api/v1/runs/{summary['run_id']}/parity").json()
    verdicts = sorted(g["verdict"] for g in parity["groups"])
    assert verdicts == ["error", "same"]  # one good worker, one buggy


@pytest.mark.slow
def test_healthy_run_raises_nothing(backend, model_dir):
    summary = run_demo(backend.url, model_dir, "--healthy")
    assert summary["alerts"] == []
    assert summary["run_state"] == "running"
    keys = {k["key"] for k in httpx.get(f"{backend.url}/api/v1/runs/{summary['run_id']}/metrics").json()["keys"]}
    assert {"align/prompt_rerender_mismatch_frac", "align/kl_k3", "train/loss"} <= keys
    values = httpx.get(f"{backend.url}/api/v1/runs/{summary['run_id']}/series",
                       params={"key": "align/prompt_rerender_mismatch_frac"}).json()["buckets"]["max"]
    assert values and max(values) == 0.0
