"""Per-sample audits (issue 14.3) on SQLite and PostgreSQL: real hooks with real tokenizers posting
over real HTTP, the worst samples read back page by page, the sample_audit alert's lifecycle (one
alert per cause, refreshed rather than fired again per batch, resolved after clean batches,
notified once), strict input, and retention."""
from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from sqlalchemy import func, select

from paritywatch.backend.background.janitor import Janitor
from paritywatch.backend.main import create_app
from paritywatch.backend.models import SampleAudit, SampleAuditSample, utcnow
from paritywatch.backend.settings import Settings
from tests.api.conftest import new_run
from tests.support.live import ThreadServer, WebhookReceiver, first_within, local_client, wait_for
from tests.unit.test_audit import CONVERSATION, DROPS_THINK_TEMPLATE, THINK, record
from trainer_hooks import contract
from trainer_hooks.monitor import ParityMonitor

FAST = dict(allow_loopback_webhooks=True, webhook_backoff_base_s=0.05, webhook_backoff_cap_s=0.2,
            webhook_poll_interval_s=0.05, webhook_group_wait_s=0, webhook_group_interval_s=0, notify_interval_s=0.05,
            audit_clear_batches=3)


def audit_body(client_id: str, seq: int, *, step: int | None = 0, length_mismatch: bool = False,
               rerender: bool = False, samples: int = 8, component_id: int | None = None, token: str = "x") -> dict:
    """An audit as the hooks send it: `samples` audited, the failing ones listed."""
    listed = []
    if length_mismatch:
        listed.append({"index": 3, "finish": "eos", "n_ids": 10, "n_rollout_logprobs": 9, "length_mismatch": True,
                       "prompt_len": 5, "windows": [{"kind": "length", "at": 9, "start": 5,
                                                     "rollout": ["a", token, "b", "c", "<|im_end|>"]}]})
    if rerender:
        listed.append({"index": 5, "finish": "length", "n_ids": 10, "length_mismatch": False, "prompt_len": 20,
                       "rendered_len": 18, "rerender_first_diff": 12,
                       "windows": [{"kind": "rerender", "at": 12, "start": 10, "rollout": ["\n", "u", "<think>"],
                                    "trainer": ["\n", "u", "It"]}]})
    counts = {"samples": samples, "length_mismatch": int(length_mismatch), "rerender_checked": samples,
              "rerender_mismatch": int(rerender), "finish_eos": samples - 1, "finish_length": 1}
    return {"client_id": client_id, "seq": seq, "step": step, "component_id": component_id, "counts": counts,
            "samples": listed}


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    from transformers import AutoTokenizer

    from tests.fixtures.tokenizers import build_chatml_tokenizer

    rollout = AutoTokenizer.from_pretrained(build_chatml_tokenizer(tmp_path_factory.mktemp("r"), extra_special_tokens=THINK))
    trainer = AutoTokenizer.from_pretrained(build_chatml_tokenizer(
        tmp_path_factory.mktemp("t"), extra_special_tokens=THINK, chat_template=DROPS_THINK_TEMPLATE))
    return rollout, trainer


def sample_alerts(api: httpx.Client, run_id: int, status: str | None = None) -> dict[str, dict]:
    alerts = api.get(f"/api/v1/runs/{run_id}/alerts").json()["alerts"]
    return {a["dedup_key"]: a for a in alerts if a["kind"] == "sample_audit" and (status is None or a["status"] == status)}


def test_hooks_post_audits_over_http_the_worst_samples_read_back_and_alerts_follow_the_batches(db_url, tokenizers,
                                                                                               tmp_path) -> None:
    rollout, trainer = tokenizers
    bad = [record(rollout), record(rollout, logprobs_delta=-1), record(rollout, CONVERSATION),
           record(rollout, eos=False, finish="length")]
    with ThreadServer(Settings(database_url=db_url, **FAST)) as srv, httpx.Client(base_url=srv.url, timeout=30) as api, \
            ParityMonitor("audited", url=srv.url, spool_dir=tmp_path / "spool", audit_top_k=2) as monitor:
        assert monitor.log_rollout_batch(bad, trainer, step=5)
        assert monitor.flush(30)
        [run] = api.get("/api/v1/runs").json()["runs"]
        run_id = run["id"]
        [audit] = api.get(f"/api/v1/runs/{run_id}/audits").json()["audits"]
        assert audit["step"] == 5 and audit["worker_id"] == run["components"][0]["worker_id"]
        assert audit["counts"] == {"samples": 4, "length_mismatch": 1, "rerender_checked": 4, "rerender_mismatch": 1,
                                   "finish_eos": 3, "finish_length": 1, "finish_stop": 0, "finish_unknown": 0,
                                   "ids_checked": 0, "ids_mismatch": 0, "truncated": 0, "finish_lost": 0,
                                   "eos_ignored": 0, "images_checked": 0, "images_mismatch": 0}
        length, rerender = audit["samples"]  # top 2 of 3 findings, worst first; the cut is left out
        assert (length["index"], length["rank"], length["length_mismatch"]) == (1, 0, True)
        assert (rerender["index"], rerender["rank"], rerender["windows"][0]["kind"]) == (2, 1, "rerender")
        window = rerender["windows"][0]
        mark = window["at"] - window["start"]
        assert window["rollout"][mark] == "<think>" and "<think>" not in window["trainer"]
        assert window["rollout_shown"] == [t.replace(" ", "␣").replace("\n", "\\n") for t in window["rollout"]]

        # one alert per cause, saying why and what to do
        alerts = wait_for(lambda: (a := sample_alerts(api, run_id, "firing")) and len(a) == 2 and a)
        assert set(alerts) == {"sample_audit:length_parity", "sample_audit:rerender"}
        parity = alerts["sample_audit:length_parity"]
        assert parity["severity"] == "error" and "1 of 4 samples" in parity["title"]
        assert "wrong tokens" in parity["detail"]["why"] and parity["detail"]["action"]
        assert parity["detail"]["example"]["n_rollout_logprobs"] == parity["detail"]["example"]["n_ids"] - 1

        # another bad batch refreshes the open alerts; clean batches (audit_clear_batches=3) resolve them
        assert monitor.audit_rollout_batch(bad, trainer, step=6) and monitor.flush(30)
        again = sample_alerts(api, run_id)
        assert {k: a["id"] for k, a in again.items()} == {k: a["id"] for k, a in alerts.items()}
        assert again["sample_audit:length_parity"]["detail"]["failing_batches"] == 2
        clean = [record(rollout), record(rollout)]
        for step in (7, 8):
            assert monitor.audit_rollout_batch(clean, trainer, step=step) and monitor.flush(30)
        assert len(sample_alerts(api, run_id, "firing")) == 2  # a bad batch is still in the window
        assert monitor.audit_rollout_batch(clean, trainer, step=9) and monitor.flush(30)
        assert sample_alerts(api, run_id, "firing") == {}
        assert monitor.stats()["audits_posted"] == 5 and monitor.stats()["audits_dropped"] == 0

        # paged samples: newest batch first, worst first, every listed sample exactly once
        seen, cursor = [], None
        while True:
            page = api.get(f"/api/v1/runs/{run_id}/audits/samples",
                           params={"limit": 1, **({"cursor": cursor} if cursor else {})}).json()
            seen += [(s["step"], s["rank"]) for s in page["samples"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == [(6, 0), (6, 1), (5, 0), (5, 1)]
        failing = api.get(f"/api/v1/runs/{run_id}/audits", params={"failing": "true"}).json()["audits"]
        assert [a["step"] for a in failing] == [6, 5]
        one = api.get(f"/api/v1/runs/{run_id}/audits/samples", params={"audit_id": failing[1]["id"]}).json()
        assert [s["step"] for s in one["samples"]] == [5, 5]


def test_bad_batches_notify_once_per_incident_not_per_batch(db_url) -> None:
    with ThreadServer(Settings(database_url=db_url, **FAST)) as srv, httpx.Client(base_url=srv.url, timeout=30) as api, \
            WebhookReceiver() as rx:
        api.post("/api/v1/webhooks", json={"url": rx.url, "events": ["alert.firing", "alert.resolved"]})
        run_id = api.post("/api/v1/runs", json={"name": "paged"}).json()["id"]
        for seq in range(6):
            body = audit_body("c", seq, step=seq, length_mismatch=True, rerender=seq != 3)
            assert api.post(f"/api/v1/runs/{run_id}/audits", json=body).status_code == 200
        [message] = rx.wait_accepted(1)
        data = message.json["data"]
        assert data["status"] == "firing" and data["group"]["labels"]["kind"] == "sample_audit"
        assert data["counts"]["firing"] == 2 and "sample_audit" in data["summary"]
        assert {a["detail"]["cause"] for a in data["alerts"]} == {"length_parity", "rerender"}
        assert first_within(lambda: len(rx.accepted()) > 1, window_s=2.0) is None  # six batches, one page
        for seq in range(6, 9):
            api.post(f"/api/v1/runs/{run_id}/audits", json=audit_body("c", seq, step=seq))
        resolved = rx.wait_accepted(2)[1].json["data"]  # the last bad batch (seq 5) had both causes
        assert resolved["status"] == "resolved" and resolved["counts"]["resolved"] == 2


def test_posting_is_idempotent_strict_and_bounded(client) -> None:
    run_id = new_run(client, "strict")["id"]
    url = f"/api/v1/runs/{run_id}/audits"
    first = client.post(url, json=audit_body("c", 0, length_mismatch=True))
    assert first.status_code == 200 and first.json()["duplicate"] is False
    assert client.post(url, json=audit_body("c", 0, length_mismatch=True)).json() == {"id": None, "duplicate": True}
    assert len(client.get(url).json()["audits"]) == 1
    assert len(sample_alerts(client, run_id)) == 1

    def rejected(**change) -> int:
        body = audit_body("c", 1, length_mismatch=True)
        for path, value in change.items():
            target = body
            *parents, leaf = path.split("__")
            for p in parents:
                target = target[int(p)] if isinstance(target, list) else target[p]
            target[leaf] = value
        return client.post(url, json=body).status_code

    long_token = "y" * (contract.AUDIT_MAX_TOKEN_CHARS + 1)
    assert rejected(extra=1) == 422
    assert rejected(samples__0__windows__0__rollout=[long_token]) == 422
    assert rejected(samples__0__windows__0__rollout=["t"] * (4 * contract.AUDIT_MAX_WINDOW)) == 422
    assert rejected(samples__0__finish="maybe") == 422
    assert rejected(counts__length_mismatch=99) == 422  # more than the batch's samples
    assert rejected(samples=[audit_body("c", 1, length_mismatch=True)["samples"][0]] * (contract.AUDIT_MAX_SAMPLES + 1),
                    counts__samples=1000) == 422
    assert rejected(step="5") == 422  # strict: a string is not a step
    assert rejected(component_id=999_999) == 404
    assert client.get(url, params={"limit": 5, "colour": "red"}).status_code == 422
    assert client.get(f"{url}/samples", params={"audit": 1}).status_code == 422
    assert client.get(url, params={"limit": 1000}).status_code == 422
    assert client.post("/api/v1/runs/999999/audits", json=audit_body("c", 9)).status_code == 404
    # a run being deleted refuses audits like metric batches
    assert client.delete(f"/api/v1/runs/{run_id}").status_code == 204
    assert client.post(url, json=audit_body("c", 2)).status_code == 404
    assert client.get(url).status_code == 404


def test_retention_drops_audits_received_before_the_cutoff_with_their_samples(db_url, settings) -> None:
    settings = settings.model_copy(update={"run_background_workers": False, "retention_raw_days": 7})
    app = create_app(settings, upgrade_schema=False)
    with local_client(app) as client:
        run_id = new_run(client, "kept-briefly")["id"]
        for seq in range(5):
            body = audit_body("c", seq, step=seq, length_mismatch=True, rerender=True)
            assert client.post(f"/api/v1/runs/{run_id}/audits", json=body).status_code == 200
        with app.state.db.write() as s:
            s.execute(SampleAudit.__table__.update().where(SampleAudit.seq < 3)
                      .values(received_at=utcnow() - timedelta(days=10)))
        Janitor(app.state.db, app.state.metrics, settings).run_once()
        steps = [a["step"] for a in client.get(f"/api/v1/runs/{run_id}/audits").json()["audits"]]
        assert steps == [4, 3]
        with app.state.db.read() as s:
            assert s.scalar(select(func.count()).select_from(SampleAuditSample)) == 2 * 2


def test_identity_truncation_eos_and_image_causes_alert_over_http_and_a_healthy_twin_stays_quiet(db_url, tmp_path) -> None:
    """The hooks on the trainer side with real processors: a LlavaProcessor (its image tokens and
    pixel values) and a generation config listing two eos ids. One run gets a batch with each new
    cause; its healthy twin, the same samples trained as sampled, raises nothing."""
    from transformers import AutoProcessor, GenerationConfig

    from tests.fixtures.tokenizers import build_multimodal_processor
    from tests.unit.test_audit import identity_record, sampled
    from trainer_hooks.sample_identity import image_features

    processor = AutoProcessor.from_pretrained(build_multimodal_processor(tmp_path, image_size=32))
    tok = processor.tokenizer
    image_id, endoftext = tok.convert_tokens_to_ids("<image>"), tok.convert_tokens_to_ids("<|endoftext|>")
    generation_config = GenerationConfig(eos_token_id=[tok.eos_token_id, endoftext])
    image = __import__("numpy").random.default_rng(1).integers(0, 256, (40, 48, 3), dtype="uint8")
    with_image = processor(text=["<image>Describe it."], images=[image], return_tensors="np")
    seen = image_features(with_image, image_id)
    without = image_features(processor(text=["Describe it."], return_tensors="np"), image_id)  # no features
    assert seen["images"] == 1 and seen["image_tokens"] > 1 and without["images"] == 0

    ids = sampled(tok, "It is 6, and 7.", split="6,", eos=tok.eos_token_id)
    past_eos = sampled(tok, "It is 6.", eos=endoftext) + sampled(tok, " More.", eos=tok.eos_token_id)
    records = [identity_record(tok, ids, images=seen), identity_record(tok, ids, images=seen),
               identity_record(tok, past_eos), identity_record(tok, ids[:-1], finish=None, digest=False),
               identity_record(tok, ids, images=seen)]
    retokenized = tok.encode(tok.decode(ids), add_special_tokens=False)
    bad_ids = [retokenized, ids[:4], past_eos, ids[:-1], ids]
    bad_images = [seen, seen, None, None, without]
    good_ids = [ids, ids, past_eos[:past_eos.index(endoftext) + 1], ids[:-1], ids]
    good = [identity_record(tok, ids, images=seen), identity_record(tok, ids, images=seen),
            identity_record(tok, good_ids[2]), identity_record(tok, ids[:-1], finish="length"),
            identity_record(tok, ids, images=seen)]
    with ThreadServer(Settings(database_url=db_url, **FAST)) as srv, httpx.Client(base_url=srv.url, timeout=30) as api:
        with ParityMonitor("identity-bad", url=srv.url, spool_dir=tmp_path / "s1", audit_top_k=8) as monitor:
            monitor.register_processor(processor, generation_config=generation_config).result(60)
            assert monitor.log_rollout_batch(records, trainer_ids=bad_ids, trainer_images=bad_images, step=3)
            assert monitor.flush(30)
        with ParityMonitor("identity-good", url=srv.url, spool_dir=tmp_path / "s2") as twin:
            twin.register_processor(processor, generation_config=generation_config).result(60)
            assert twin.log_rollout_batch(good, trainer_ids=good_ids, trainer_images=[seen, seen, None, None, seen],
                                          step=3)
            assert twin.flush(30)
        runs = {r["name"]: r["id"] for r in api.get("/api/v1/runs").json()["runs"]}
        expected = {"token_identity": "error", "truncation": "warning", "eos_ignored": "error",
                    "finish_lost": "warning", "image_features": "error"}
        alerts = wait_for(lambda: (a := sample_alerts(api, runs["identity-bad"])) and len(a) == len(expected) and a)
        assert {k.split(":")[1]: a["severity"] for k, a in alerts.items()} == expected
        for key, alert in alerts.items():
            assert alert["detail"]["why"] and alert["detail"]["action"] and "#" in alert["detail"]["why"], key
        assert "(rollout 1 image 32x32" in alerts["sample_audit:image_features"]["title"]
        assert "trainer no image features" in alerts["sample_audit:image_features"]["title"]
        assert "(4 of" in alerts["sample_audit:truncation"]["title"]
        [audit] = api.get(f"/api/v1/runs/{runs['identity-bad']}/audits", params={"failing": "true"}).json()["audits"]
        shown = {s["index"]: s for s in audit["samples"]}
        assert shown[0]["windows"][0]["kind"] == "ids" and shown[2]["windows"][0]["kind"] == "eos"
        assert shown[4]["trainer_images"] == {"images": 0, "grid": [], "image_tokens": 0}
        # the healthy twin: audited, clean, no alert
        [clean] = api.get(f"/api/v1/runs/{runs['identity-good']}/audits").json()["audits"]
        assert clean["samples"] == [] or all(s["finish"] == "length" for s in clean["samples"])
        assert clean["counts"]["ids_checked"] == 5 and clean["counts"]["images_checked"] == 3
        assert sample_alerts(api, runs["identity-good"]) == {}
        assert api.get(f"/api/v1/runs/{runs['identity-good']}/audits", params={"failing": "true"}).json()["audits"] == []
