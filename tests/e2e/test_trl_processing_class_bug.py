"""The motivating bug end to end over real HTTP: TRL's AsyncGRPOTrainer built its rollout worker
without the user's processing_class, so the worker rendered prompts with the default template.

trainer (custom template) + worker (default) -> processor_mismatch alert naming chat_template,
run paused, one signed firing webhook, the worker's wait_if_paused() blocks; an admin resumes;
the worker re-registers with the right processor -> the alert resolves, a resolved event goes out.
"""
from __future__ import annotations

import threading
import time

import httpx
import pytest
from transformers import AutoTokenizer

from paritywatch.backend.settings import Settings
from paritywatch.backend.webhooks.signing import verify
from tests.fixtures.tokenizers import CUSTOM_TEMPLATE, build_chatml_tokenizer
from tests.support.live import ThreadServer, WebhookReceiver, settled_deliveries, wait_for
from trainer_hooks.monitor import ParityMonitor

FAST = dict(allow_loopback_webhooks=True, webhook_backoff_base_s=0.05, webhook_poll_interval_s=0.05,
            webhook_group_wait_s=0, webhook_group_interval_s=0, notify_interval_s=0.05)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_chatml_tokenizer(tmp_path_factory.mktemp("model"))


def user_processor(model_dir):
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = CUSTOM_TEMPLATE  # the user's processing_class, set after loading
    return tok


def monitor(srv, side, worker_id, tmp_path):
    return ParityMonitor(run="async-grpo", project="e2e", side=side, url=srv.url, worker_id=worker_id,
                         spool_dir=tmp_path / f"spool-{side}-{worker_id}", flush_interval_s=0.05,
                         poll_timeout_s=5)


def test_trl_processing_class_bug_end_to_end(db_url, model_dir, tmp_path):
    settings = Settings(database_url=db_url, **FAST)
    with ThreadServer(settings) as srv, WebhookReceiver() as rx, httpx.Client(base_url=srv.url, timeout=30) as api:
        hook = api.post("/api/v1/webhooks", json={"url": rx.url, "events": ["alert.firing", "alert.resolved"]}).json()
        secret = hook["secret"]
        trainer = monitor(srv, "trainer", "0", tmp_path)
        worker = monitor(srv, "rollout", "w0", tmp_path)
        try:
            trainer.register_processor(user_processor(model_dir)).result(timeout=30)
            # the bug: the worker loads the processor by model name
            worker.register_processor(AutoTokenizer.from_pretrained(model_dir)).result(timeout=30)

            def firing():
                return [a for a in api.get("/api/v1/alerts", params={"status": "open"}).json()["alerts"]
                        if a["kind"] == "processor_mismatch"]

            alert = wait_for(firing, timeout_s=30)[0]
            assert "chat_template" in alert["detail"]["components"]
            assert alert["severity"] == "error"
            run_id = alert["run_id"]
            assert api.get(f"/api/v1/runs/{run_id}/control").json()["state"] == "paused"

            event = wait_for(lambda: rx.accepted(), timeout_s=10)[0]
            verify(secret, event.headers, event.body, now=time.time())
            assert event.json["type"] == "alert.firing"
            assert "chat_template" in event.json["data"]["alert"]["detail"]["components"]

            # the hook blocks while paused ...
            released = threading.Event()
            threading.Thread(target=lambda: (worker.wait_if_paused(), released.set()), daemon=True).start()
            wait_for(lambda: worker.state == "paused", timeout_s=10)
            assert not released.wait(1.0)
            # ... until an admin resumes
            api.post(f"/api/v1/runs/{run_id}/control", json={"action": "resume", "reason": "fixing the worker"})
            assert released.wait(10)

            # the worker is fixed (processing_class passed through) and re-registers
            worker.register_processor(user_processor(model_dir)).result(timeout=30)
            wait_for(lambda: not firing(), timeout_s=30)
            resolved = api.get(f"/api/v1/runs/{run_id}/alerts").json()["alerts"][0]
            assert resolved["status"] == "resolved"
            settled_deliveries(srv.url, hook["id"], expected=2)  # the firing and the resolved event, sent
            assert [r.json["type"] for r in rx.accepted()] == ["alert.firing", "alert.resolved"]
        finally:
            trainer.close()
            worker.close()
