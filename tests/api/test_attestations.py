"""Weight-sync attestation through the API: stored, compared version by version, and the alerts
it raises (mismatch, stale, backwards), on SQLite and PostgreSQL. The digests are the hooks' own
(trainer_hooks/attest.py) over small numpy arrays."""
from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest

from paritywatch.backend.models import utcnow
from tests.api.conftest import new_run
from trainer_hooks.attest import AttestOptions, digest_weights

API = "/api/v1"


def weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"model.layers.{i}.{part}.weight": rng.standard_normal((8, 4), dtype=np.float32)
            for i in range(2) for part in ("q_proj", "mlp.up_proj")}


def perturbed(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    w = weights(seed)
    w[name] = w[name].copy()
    w[name][3, 1] += 1e-3
    return w


def component(client, rid: int, side: str, worker_id: str) -> int:
    return client.post(f"{API}/runs/{rid}/components", json={"side": side, "worker_id": worker_id}).json()["id"]


def attest(client, rid: int, cid: int, w: dict, version: int, **opts) -> dict:
    r = client.post(f"{API}/runs/{rid}/components/{cid}/attestations",
                    json=digest_weights(w, version, AttestOptions(**opts)))
    assert r.status_code == 200, r.text
    return r.json()


def open_alerts(client, rid: int) -> list[dict]:
    return client.get(f"{API}/runs/{rid}/alerts", params={"status": "open"}).json()["alerts"]


@pytest.fixture
def run(client):
    rid = new_run(client)["id"]
    return rid, component(client, rid, "trainer", "t"), component(client, rid, "rollout", "w1"), \
        component(client, rid, "rollout", "w2")


def test_equal_weights_raise_nothing_and_compare_same(client, run):
    rid, trainer, w1, w2 = run
    for version in (1, 2):
        attest(client, rid, trainer, weights(version), version)
        attest(client, rid, w1, weights(version), version)
        attest(client, rid, w2, weights(version), version)
    assert open_alerts(client, rid) == []
    page = client.get(f"{API}/runs/{rid}/attestations/versions").json()
    assert [v["version"] for v in page["versions"]] == [2, 1]
    assert {w["verdict"] for v in page["versions"] for w in v["workers"]} == {"same"}
    assert client.get(f"{API}/runs/{rid}/control").json()["state"] == "running"


def test_a_perturbed_tensor_is_named_and_pauses_the_run(client, run):
    rid, trainer, w1, w2 = run
    bad = "model.layers.1.mlp.up_proj.weight"
    attest(client, rid, trainer, weights(), 5)
    attest(client, rid, w1, weights(), 5)
    attest(client, rid, w2, perturbed(bad), 5)
    [alert] = open_alerts(client, rid)
    assert alert["kind"] == "weights_mismatch" and alert["severity"] == "error"
    assert bad in alert["title"] and "w2" in alert["title"]
    assert alert["detail"]["tensors"]["differing"] == [bad] and alert["detail"]["tensors"]["differing_count"] == 1
    assert alert["detail"]["worker_id"] == "w2" and alert["detail"]["why"]
    control = client.get(f"{API}/runs/{rid}/control").json()
    assert control["state"] == "paused" and bad in control["reason"]
    version = client.get(f"{API}/runs/{rid}/attestations/versions").json()["versions"][0]
    verdicts = {w["worker_id"]: w for w in version["workers"]}
    assert verdicts["w1"]["verdict"] == "same" and verdicts["w2"]["verdict"] == "differs"
    assert verdicts["w2"]["tensors"]["differing"] == [bad]
    attest(client, rid, w2, weights(), 5)  # the worker reloads the right weights
    assert open_alerts(client, rid) == []


def test_the_trainer_attesting_after_the_workers_is_compared_too(client, run):
    rid, trainer, w1, _ = run
    attest(client, rid, w1, perturbed("model.layers.0.q_proj.weight"), 3)
    assert open_alerts(client, rid) == []  # nothing to compare with yet
    attest(client, rid, trainer, weights(), 3)
    assert [a["kind"] for a in open_alerts(client, rid)] == ["weights_mismatch"]


def test_missing_tensors_are_a_mismatch(client, run):
    rid, trainer, w1, _ = run
    attest(client, rid, trainer, weights(), 1)
    partial = weights()
    del partial["model.layers.0.q_proj.weight"]
    attest(client, rid, w1, partial, 1)
    [alert] = open_alerts(client, rid)
    assert alert["detail"]["tensors"]["missing"] == ["model.layers.0.q_proj.weight"]


def test_different_settings_are_a_warning_not_a_false_mismatch(client, run):
    rid, trainer, w1, _ = run
    attest(client, rid, trainer, weights(), 1)
    attest(client, rid, w1, weights(), 1, mode="sampled", chunk_bytes=16, chunks=4)
    [alert] = open_alerts(client, rid)
    assert alert["severity"] == "warning" and "different settings" in alert["title"]
    assert client.get(f"{API}/runs/{rid}/control").json()["state"] == "running"


def test_a_settings_warning_that_becomes_a_mismatch_pauses(client, run):
    rid, trainer, w1, _ = run
    attest(client, rid, trainer, weights(), 1)
    attest(client, rid, w1, weights(), 1, mode="sampled", chunk_bytes=16, chunks=4)
    assert client.get(f"{API}/runs/{rid}/control").json()["state"] == "running"
    attest(client, rid, w1, perturbed("model.layers.0.q_proj.weight"), 1)  # now comparable, and different
    [alert] = open_alerts(client, rid)
    assert alert["severity"] == "error" and "model.layers.0.q_proj.weight" in alert["title"]
    assert client.get(f"{API}/runs/{rid}/control").json()["state"] == "paused"


def test_a_worker_left_behind_is_stale(client, run):
    rid, trainer, w1, w2 = run
    for version in (1, 2):
        attest(client, rid, trainer, weights(version), version)
        attest(client, rid, w1, weights(version), version)
    attest(client, rid, w2, weights(1), 1)
    assert open_alerts(client, rid) == []  # one version behind: in flight (attest_max_lag = 1)
    attest(client, rid, trainer, weights(3), 3)
    attest(client, rid, w1, weights(3), 3)
    [alert] = open_alerts(client, rid)
    assert alert["kind"] == "weights_stale" and alert["detail"]["worker_id"] == "w2"
    assert alert["detail"]["missed_versions"] == [2, 3] and alert["detail"]["why"]
    attest(client, rid, w2, weights(3), 3)
    assert open_alerts(client, rid) == []


def test_a_version_past_its_grace_is_stale_and_a_closed_worker_is_not(client, app, run):
    rid, trainer, w1, w2 = run
    attest(client, rid, trainer, weights(1), 1)
    attest(client, rid, w1, weights(1), 1)
    attest(client, rid, w2, weights(1), 1)
    attest(client, rid, trainer, weights(2), 2)
    client.post(f"{API}/runs/{rid}/components/{w2}/close", json={"reason": "done"})
    engine = app.state.engine
    engine.sweep_attestations(now=utcnow() + timedelta(seconds=app.state.settings.attest_grace_s / 2))
    assert open_alerts(client, rid) == []
    engine.sweep_attestations(now=utcnow() + timedelta(seconds=app.state.settings.attest_grace_s + 5))
    [alert] = open_alerts(client, rid)
    assert alert["kind"] == "weights_stale" and alert["detail"]["worker_id"] == "w1"
    assert "grace" in alert["detail"]["why"]


def test_a_worker_going_back_to_older_weights(client, run):
    rid, trainer, w1, _ = run
    for version in (1, 2):
        attest(client, rid, trainer, weights(version), version)
        stored = attest(client, rid, w1, weights(version), version)
    assert stored["backwards_from"] is None
    stored = attest(client, rid, w1, weights(1), 1)
    assert stored["backwards_from"] == 2
    [alert] = open_alerts(client, rid)
    assert alert["kind"] == "weights_backwards" and alert["detail"]["previous_version"] == 2
    attest(client, rid, w1, weights(2), 2)
    assert open_alerts(client, rid) == []


def test_a_trainer_resumed_from_a_checkpoint_takes_its_workers_back_quietly(client, run):
    rid, trainer, w1, _ = run
    for version in (10, 0):
        attest(client, rid, trainer, weights(version), version)
        attest(client, rid, w1, weights(version), version)
    assert open_alerts(client, rid) == []


def test_ignore_on_mismatch(client, run):
    rid, trainer, w1, _ = run
    client.put(f"{API}/runs/{rid}/settings", json={"on_mismatch": "ignore"})
    attest(client, rid, trainer, weights(), 1)
    attest(client, rid, w1, perturbed("model.layers.0.q_proj.weight"), 1)
    assert open_alerts(client, rid) == []


def test_lists_are_paginated_and_strict(client, run):
    rid, trainer, w1, _ = run
    for version in range(5):
        attest(client, rid, trainer, weights(), version)
    first = client.get(f"{API}/runs/{rid}/attestations", params={"limit": 2}).json()
    assert [a["version"] for a in first["attestations"]] == [4, 3] and first["next_cursor"]
    rest = client.get(f"{API}/runs/{rid}/attestations", params={"limit": 10, "cursor": first["next_cursor"]}).json()
    assert [a["version"] for a in rest["attestations"]] == [2, 1, 0] and rest["next_cursor"] is None
    only = client.get(f"{API}/runs/{rid}/attestations", params={"version": 3}).json()["attestations"]
    assert [(a["version"], a["side"], a["settings"]["algo"]) for a in only] == [(3, "trainer", only[0]["settings"]["algo"])]
    versions = client.get(f"{API}/runs/{rid}/attestations/versions", params={"limit": 3}).json()
    assert [v["version"] for v in versions["versions"]] == [4, 3, 2]
    more = client.get(f"{API}/runs/{rid}/attestations/versions", params={"cursor": versions["next_cursor"]}).json()
    assert [v["version"] for v in more["versions"]] == [1, 0]
    assert client.get(f"{API}/runs/{rid}/attestations", params={"versoin": 3}).status_code == 422


def test_malformed_attestations_are_422(client, run):
    rid, trainer, _, _ = run
    good = digest_weights(weights(), 1)
    path = f"{API}/runs/{rid}/components/{trainer}/attestations"
    forged = {**good, "tensors": [{**good["tensors"][0], "digest": "0" * 32}] + good["tensors"][1:]}
    for body in (forged, {**good, "version": -1}, {**good, "version": True}, {**good, "algo": "md5"},
                 {**good, "tensors": []}, {**good, "tensors": good["tensors"] + good["tensors"][:1]}):
        r = client.post(path, json=body)
        assert r.status_code == 422, body
    assert client.post(f"{API}/runs/{rid}/components/999999/attestations", json=good).status_code == 404
