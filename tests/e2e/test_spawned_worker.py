"""The TRL bug across a real process boundary: the parent (trainer) sets a custom chat template on
its processor; a child started with multiprocessing 'spawn' loads the processor by model name, as
TRL's AsyncRolloutWorker did. Both register with a real backend over HTTP."""
from __future__ import annotations

import multiprocessing as mp

import httpx
from transformers import AutoTokenizer

from paritywatch.backend.settings import Settings
from tests.fixtures.tokenizers import CUSTOM_TEMPLATE, build_chatml_tokenizer
from tests.support.live import ThreadServer, wait_for
from trainer_hooks.monitor import ParityMonitor


def rollout_child(url: str, model_dir: str, spool: str) -> None:
    from transformers import AutoTokenizer

    from trainer_hooks.monitor import ParityMonitor

    tok = AutoTokenizer.from_pretrained(model_dir)  # "by model name": the default template
    with ParityMonitor(run="spawn-bug", project="e2e", side="rollout", url=url, worker_id="child",
                       spool_dir=spool) as monitor:
        monitor.register_processor(tok).result(timeout=60)
        monitor.flush(10)


def test_spawned_worker_loading_by_name_differs_in_chat_template(sqlite_url, tmp_path):
    from tests.conftest import _empty_all_tables

    _empty_all_tables(sqlite_url)
    model_dir = build_chatml_tokenizer(tmp_path)
    with ThreadServer(Settings(database_url=sqlite_url)) as srv, httpx.Client(base_url=srv.url, timeout=30) as api:
        tok = AutoTokenizer.from_pretrained(model_dir)
        tok.chat_template = CUSTOM_TEMPLATE  # the user's processing_class
        with ParityMonitor(run="spawn-bug", project="e2e", side="trainer", url=srv.url, worker_id="parent",
                           spool_dir=tmp_path / "spool-parent") as trainer:
            trainer.register_processor(tok).result(timeout=60)
            child = mp.get_context("spawn").Process(target=rollout_child,
                                                    args=(srv.url, str(model_dir), str(tmp_path / "spool-child")))
            child.start()
            child.join(120)
            assert child.exitcode == 0

            def both_fingerprinted():
                runs = api.get("/api/v1/runs", params={"project": "e2e"}).json()["runs"]
                comps = runs[0]["components"] if runs else []
                done = [c for c in comps if c["fingerprint_digest"]]
                return (runs[0]["id"], done) if len(done) == 2 else None

            run_id, comps = wait_for(both_fingerprinted, timeout_s=30)
            sides = {c["side"]: c for c in comps}
            assert sides["rollout"]["worker_id"] == "child"
            assert sides["trainer"]["fingerprint_digest"] != sides["rollout"]["fingerprint_digest"]
            group = api.get(f"/api/v1/runs/{run_id}/parity").json()["groups"][0]
            assert group["verdict"] == "error"
            assert "chat_template" in {c["name"] for c in group["diff"]["components"] if c["severity"] == "error"}
