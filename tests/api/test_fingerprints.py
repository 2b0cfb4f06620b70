from sqlalchemy import func, select

from paritywatch.backend.models import Fingerprint
from tests.api.conftest import new_run
from trainer_hooks.fingerprint.core import assemble


def fake_fp(template: str) -> dict:
    """A fingerprint with one component, hashed as the hooks hash (the server recomputes it)."""
    return assemble("tokenizer", {"chat_template": template}, {})


def test_fingerprints_are_content_addressed(client, app):
    rid = new_run(client)["id"]
    fp = fake_fp("{{ messages }}")
    comps = [client.post(f"/api/v1/runs/{rid}/components", json={"side": "rollout", "worker_id": str(i)}).json()
             for i in range(5)]
    first = client.post(f"/api/v1/runs/{rid}/components/{comps[0]['id']}/fingerprint", json=fp).json()
    assert first == {"digest": fp["digest"], "stored": True}
    for comp in comps[1:]:
        # workers that know the server has it send only the digest
        r = client.post(f"/api/v1/runs/{rid}/components/{comp['id']}/fingerprint", json={"digest": fp["digest"]})
        assert r.json() == {"digest": fp["digest"], "stored": False}
    with app.state.db.read() as s:
        assert s.scalar(select(func.count()).select_from(Fingerprint)) == 1
    run = client.get(f"/api/v1/runs/{rid}").json()
    assert {c["fingerprint_digest"] for c in run["components"]} == {fp["digest"]}
    assert client.get(f"/api/v1/fingerprints/{fp['digest']}").json() == fp


def test_unknown_digest_asks_for_the_full_object(client):
    rid = new_run(client)["id"]
    comp = client.post(f"/api/v1/runs/{rid}/components", json={"side": "trainer"}).json()
    r = client.post(f"/api/v1/runs/{rid}/components/{comp['id']}/fingerprint", json={"digest": "a" * 64})
    assert r.status_code == 404 and r.json()["error"]["code"] == "fingerprint_unknown"


def test_malformed_fingerprints_are_422(client):
    rid = new_run(client)["id"]
    comp = client.post(f"/api/v1/runs/{rid}/components", json={"side": "trainer"}).json()
    url = f"/api/v1/runs/{rid}/components/{comp['id']}/fingerprint"
    for body in ({}, {"digest": "xyz"}, {"digest": "a" * 64, "fingerprint_version": "1", "components": {}},
                 {"digest": "a" * 64, "fingerprint_version": 1, "components": []}):
        assert client.post(url, json=body).status_code == 422, body
