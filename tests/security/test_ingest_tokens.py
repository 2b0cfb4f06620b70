"""Issue 13.4: an ingest token reaches only its project; fingerprints are stored only under the
digest they hash to; steps cannot leap absurdly ahead. Both databases."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sqlalchemy import func, select

from paritywatch.backend.auth import create_token
from paritywatch.backend.main import create_app
from paritywatch.backend.models import Fingerprint
from paritywatch.backend.settings import Settings
from tests.support.live import local_client
from trainer_hooks.fingerprint.core import assemble

MISMATCH = {"steps": [1], "series": {"align/decode_mismatch_frac": [1.0]}}


@pytest.fixture
def api(db_url):
    app = create_app(Settings(database_url=db_url, run_background_workers=False), upgrade_schema=False)
    with local_client(app) as client:
        yield app, client


def _as(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def test_an_ingest_token_of_one_project_cannot_touch_another(api):
    app, client = api
    _, admin = create_token(app.state.db, "admin", ["admin"])
    _, mine = create_token(app.state.db, "team-a", ["ingest"], project="team-a")
    theirs = client.post("/api/v1/runs", json={"name": "big-run", "project": "team-b", "tags": {"owner": "b"}},
                         headers=_as(admin)).json()
    comp = client.post(f"/api/v1/runs/{theirs['id']}/components", json={"side": "trainer"}, headers=_as(admin)).json()
    rid, cid = theirs["id"], comp["id"]
    fp = assemble("tokenizer", {"chat_template": "{{ x }}"}, {})
    attempts = {
        "create a run": ("POST", "/api/v1/runs", {"name": "x", "project": "team-b"}),
        "retag a run": ("POST", "/api/v1/runs", {"name": "big-run", "project": "team-b", "tags": {"owner": "a"}}),
        "pause by mismatch metrics": ("POST", f"/api/v1/runs/{rid}/metrics", {"client_id": "a", "seq": 1, **MISMATCH}),
        "pin last_step": ("POST", f"/api/v1/runs/{rid}/metrics",
                          {"client_id": "a", "seq": 2, "steps": [2**40], "series": {"loss": [1.0]}}),
        "register a process": ("POST", f"/api/v1/runs/{rid}/components", {"side": "rollout", "worker_id": "evil"}),
        "heartbeat": ("POST", f"/api/v1/runs/{rid}/components/{cid}/heartbeat", None),
        "plant a fingerprint": ("POST", f"/api/v1/runs/{rid}/components/{cid}/fingerprint", fp),
        "read control": ("GET", f"/api/v1/runs/{rid}/control", None),
    }
    for what, (method, path, body) in attempts.items():
        r = client.request(method, path, json=body, headers=_as(mine))
        assert r.status_code == 403, (what, r.status_code, r.text)
        assert "team-a" in r.json()["error"]["message"], what
    run = client.get(f"/api/v1/runs/{rid}", headers=_as(admin)).json()
    assert run["control"]["state"] == "running" and run["last_step"] is None and run["tags"] == {"owner": "b"}
    assert [c["worker_id"] for c in run["components"]] == [comp["worker_id"]]
    # Its own project: everything works.
    own = client.post("/api/v1/runs", json={"name": "r", "project": "team-a"}, headers=_as(mine))
    assert own.status_code == 200
    r = client.post(f"/api/v1/runs/{own.json()['id']}/metrics", json={"client_id": "a", "seq": 3, "steps": [1],
                                                                       "series": {"loss": [0.5]}}, headers=_as(mine))
    assert r.status_code == 200


def test_only_ingest_tokens_are_bound_and_the_cli_binds_them(tmp_path):
    db = f"sqlite:///{tmp_path / 'cli.db'}"

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "paritywatch.backend.cli", *args, "--db", db], capture_output=True,
                              text=True, timeout=60)

    made = cli("token", "create", "--scope", "ingest", "--project", "team-a", "--json")
    assert made.returncode == 0 and json.loads(made.stdout)["project"] == "team-a"
    assert "team-a" in cli("token", "list").stdout
    refused = cli("token", "create", "--scope", "admin", "--project", "team-a")
    assert refused.returncode == 2 and "only ingest tokens" in refused.stderr


def test_a_forged_fingerprint_digest_is_refused(api):
    """Planting body B under the digest of A would make the real A read `same` later."""
    app, client = api
    _, ingest = create_token(app.state.db, "hooks", ["ingest"])
    rid = client.post("/api/v1/runs", json={"name": "fp"}, headers=_as(ingest)).json()["id"]
    cid = client.post(f"/api/v1/runs/{rid}/components", json={"side": "trainer"}, headers=_as(ingest)).json()["id"]
    real = assemble("tokenizer", {"chat_template": "{{ messages }}", "vocab": {"a": 1}}, {})
    planted = assemble("tokenizer", {"chat_template": "{{ nothing }}", "vocab": {"a": 1}}, {})
    forgeries = [
        {**planted, "digest": real["digest"]},  # another body under a real digest
        {**real, "components": {**real["components"],
                                "vocab": {**real["components"]["vocab"], "value": {"a": 2}}}},  # a value changed
        {**real, "components": {"vocab": real["components"]["vocab"]}},  # a component dropped
        {**real, "components": {**real["components"], "chat_template": {"digest": "0" * 64}}},  # no value
    ]
    path = f"/api/v1/runs/{rid}/components/{cid}/fingerprint"
    for body in forgeries:
        r = client.post(path, json=body, headers=_as(ingest))
        assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] in ("fingerprint_digest_mismatch", "validation_error")
    with app.state.db.read() as s:
        assert s.scalar(select(func.count()).select_from(Fingerprint)) == 0
    r = client.post(path, json={"digest": real["digest"]}, headers=_as(ingest))
    assert r.status_code == 404 and r.json()["error"]["code"] == "fingerprint_unknown"  # nothing was planted
    assert client.post(path, json=real, headers=_as(ingest)).json() == {"digest": real["digest"], "stored": True}


def test_a_real_tokenizer_fingerprint_is_accepted(api, tmp_path):
    """The server recomputes with the hooks' own hashing: what the hooks send passes, after JSON."""
    transformers = pytest.importorskip("transformers")
    from tests.fixtures.tokenizers import build_chatml_tokenizer
    from trainer_hooks.fingerprint import fingerprint_processor

    tok = transformers.AutoTokenizer.from_pretrained(build_chatml_tokenizer(tmp_path))
    fp = json.loads(json.dumps(fingerprint_processor(tok)))
    app, client = api
    _, ingest = create_token(app.state.db, "hooks", ["ingest"], project="default")
    client.headers.update(_as(ingest))
    rid = client.post("/api/v1/runs", json={"name": "real"}).json()["id"]
    cid = client.post(f"/api/v1/runs/{rid}/components", json={"side": "trainer"}).json()["id"]
    r = client.post(f"/api/v1/runs/{rid}/components/{cid}/fingerprint", json=fp)
    assert r.status_code == 200, r.text


def test_steps_absurdly_ahead_of_the_run_are_refused(api):
    app, client = api
    _, admin = create_token(app.state.db, "admin", ["admin"])
    client.headers.update(_as(admin))
    rid = client.post("/api/v1/runs", json={"name": "steps"}).json()["id"]

    def post(seq: int, step: int) -> int:
        body = {"client_id": "c", "seq": seq, "steps": [step], "series": {"loss": [1.0]}}
        return client.post(f"/api/v1/runs/{rid}/metrics", json=body).status_code

    assert post(1, 2**53) == 422  # a forged or nanosecond-clock step from a fresh run
    assert post(2, 1_000) == 200
    assert post(3, 1_000 + 2**30) == 200  # the bound: 2**30 past the last step
    assert post(4, 1_000 + 2**31 + 2**30) == 422
    assert client.get(f"/api/v1/runs/{rid}").json()["last_step"] == 1_000 + 2**30
