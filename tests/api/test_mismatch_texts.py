"""What a processor_mismatch says (issue 29, follow-up of 29.6): the alert title, the pause reason,
the alert detail that webhooks and the taint record read name the components that differ, with the
behaviour probes as their evidence, never "chat_template, behavior". Real tokenizers, both engines."""
from __future__ import annotations

import json

import pytest

from tests.api.test_taint import API, Job, api, app  # noqa: F401 - fixtures
from tests.fixtures import tokenizers as builders


@pytest.fixture(scope="module")
def fingerprints(tmp_path_factory):
    """(trainer, worker): the same ChatML tokenizer, the worker with TRL-bug's custom template."""
    from transformers import AutoTokenizer

    from trainer_hooks.fingerprint import fingerprint_processor

    root = tmp_path_factory.mktemp("tokenizers")
    dirs = (builders.build_chatml_tokenizer(root, name="trainer"),
            builders.build_chatml_tokenizer(root, name="worker", chat_template=builders.CUSTOM_TEMPLATE))
    return [json.loads(json.dumps(fingerprint_processor(AutoTokenizer.from_pretrained(d)))) for d in dirs]


def test_a_template_mismatch_names_the_template_with_the_renders_as_evidence(api, fingerprints):  # noqa: F811
    trainer_fp, worker_fp = fingerprints
    job = Job(api, "evidence", workers=2)
    job.fingerprint(job.trainer, trainer_fp)  # replaces Job's placeholder fingerprint
    job.fingerprint(job.workers[0], trainer_fp)
    job.train(0, 9)
    job.fingerprint(job.workers[1], worker_fp)

    [alert] = api.get(f"{API}/runs/{job.id}/alerts", params={"status": "firing"}).json()["alerts"]
    assert alert["kind"] == "processor_mismatch" and alert["severity"] == "error"
    evidence = alert["detail"]["evidence"]["chat_template"]
    assert evidence.startswith("rendered differently in ") and evidence.endswith(" probe conversations")
    assert alert["title"] == f"1 rollout worker(s) differ from the trainer in chat_template ({evidence})"
    assert alert["detail"]["components"] == ["chat_template"]  # what webhooks list and taint keys on
    control = job.get()["control"]
    assert (control["state"], control["reason"]) == ("paused", f"processor mismatch: chat_template ({evidence})")

    job.control("resume")  # resumed without a fix: the steps it trains are tainted
    job.train(10, 14)
    [taint] = job.taint()["ranges"]
    assert taint["cause"] == "processor:chat_template"
    assert taint["summary"] == f"steps 10–14 (still open): chat_template differs ({evidence}) on 1 of 2 rollout workers"
