"""Framework metric packs over real HTTP into a real backend: each pack's rules fire on that
framework's real metric names just past its documented level, and stay silent just inside it."""
from __future__ import annotations

import httpx
import pytest

from paritywatch.backend.detect.packs import PACKS, PackRule
from paritywatch.backend.settings import Settings
from tests.support.live import ThreadServer, wait_for
from trainer_hooks import ParityMonitor


@pytest.fixture
def server(db_url):
    with ThreadServer(Settings(database_url=db_url), upgrade_schema=False) as srv:
        yield srv


@pytest.fixture
def api(server):
    with httpx.Client(base_url=server.url + "/api/v1", timeout=30) as c:
        yield c


def inside_and_past(rule: PackRule) -> tuple[float, float]:
    """A value just inside the documented level and one just past it (the level itself for an
    inclusive comparison)."""
    margin = max(abs(rule.threshold) * 0.05, 1e-5)
    above = rule.comparison.startswith(">")
    inside = rule.threshold - margin if above else rule.threshold + margin
    if rule.comparison in (">=", "<="):
        return inside, rule.threshold
    return inside, rule.threshold + margin if above else rule.threshold - margin


class Poster:
    def __init__(self, api: httpx.Client, run_id: int):
        self.api, self.run_id, self.seq, self.step = api, run_id, 0, 0

    def post(self, series: dict[str, float]) -> None:
        self.seq += 1
        self.step += 1
        r = self.api.post(f"/runs/{self.run_id}/metrics", json={
            "client_id": "pack-test", "seq": self.seq, "steps": [self.step], "series": {k: [v] for k, v in series.items()}})
        assert r.status_code == 200, r.text


def open_rule_alerts(api: httpx.Client, run_id: int) -> set[tuple[int, str]]:
    alerts = api.get(f"/runs/{run_id}/alerts", params={"status": "open"}).json()["alerts"]
    return {(a["detail"]["rule_id"], a["detail"]["key"]) for a in alerts}


@pytest.mark.parametrize("pack", list(PACKS))
def test_each_pack_rule_fires_past_its_documented_level_and_only_then(api, pack):
    run = api.post("/runs", json={"name": f"{pack}-run", "packs": [pack]}).json()
    assert run["packs"] == [pack]
    rules = [r for r in api.get(f"/runs/{run['id']}/rules").json()["rules"] if r["pack"] == pack]
    assert len(rules) == len(PACKS[pack].rules)
    poster = Poster(api, run["id"])
    for spec, rule in zip(PACKS[pack].rules, sorted(rules, key=lambda r: r["id"])):
        assert (spec.key, spec.threshold, spec.kind) == (rule["key"], rule["threshold"], rule["kind"])
        if spec.kind != "threshold":  # the moe pack's start level: tests/e2e/test_divergence_rules.py
            continue
        inside, past = inside_and_past(spec)
        for _ in range(spec.consecutive + 1):
            poster.post({spec.key: inside})
        assert open_rule_alerts(api, run["id"]) == set(), f"{spec.key}={inside} is inside {spec.comparison} {spec.threshold}"
        for _ in range(spec.consecutive - 1):
            poster.post({spec.key: past})
        assert open_rule_alerts(api, run["id"]) == set(), f"{spec.key} fired before {spec.consecutive} evaluations"
        poster.post({spec.key: past})
        assert open_rule_alerts(api, run["id"]) == {(rule["id"], spec.key)}, f"{spec.key}={past}"
        poster.post({spec.key: inside})  # back inside: resolved, ready for the next rule
        assert open_rule_alerts(api, run["id"]) == set()


def test_a_run_without_the_pack_gets_a_suggestion_and_one_setting_enables_it(api):
    run = api.post("/runs", json={"name": "verl-like"}).json()
    assert run["suggested_packs"] == []
    poster = Poster(api, run["id"])
    poster.post({"rollout_corr/kl": 0.5, "rollout_corr/chi2_token": 0.2, "loss": 1.0})
    assert open_rule_alerts(api, run["id"]) == set()  # no pack: its keys are not watched
    suggested = api.get(f"/runs/{run['id']}").json()["suggested_packs"]
    assert [(s["pack"], s["keys"]) for s in suggested] == [("verl", ["rollout_corr/chi2_token", "rollout_corr/kl"])]
    assert "enable the verl pack" in suggested[0]["message"]

    settings = api.put(f"/runs/{run['id']}/settings", json={"packs": ["verl"]})
    assert settings.status_code == 200 and settings.json()["packs"] == ["verl"]
    detail = api.get(f"/runs/{run['id']}").json()
    assert detail["packs"] == ["verl"] and detail["suggested_packs"] == []
    poster.post({"rollout_corr/kl": 0.5})
    alerts = api.get(f"/runs/{run['id']}/alerts", params={"status": "open"}).json()["alerts"]
    assert [(a["detail"]["key"], a["detail"]["pack"]) for a in alerts] == [("rollout_corr/kl", "verl")]

    api.put(f"/runs/{run['id']}/settings", json={"packs": []}).raise_for_status()
    assert [r for r in api.get(f"/runs/{run['id']}/rules").json()["rules"] if r["pack"]] == []
    # Its rules are gone, so nothing could ever resolve their alert: turning the pack off does.
    assert api.get(f"/runs/{run['id']}/alerts", params={"status": "open"}).json()["alerts"] == []
    events = api.get(f"/alerts/{alerts[0]['id']}/events").json()["events"]
    assert [(e["action"], e["note"]) for e in events][-1] == ("resolved", "its framework pack was turned off")


def test_a_project_pack_applies_to_every_run_of_the_project(api):
    assert api.put("/projects/lab/settings", json={"packs": ["slime"]}).json() == {"packs": ["slime"]}
    assert api.put("/projects/lab/settings", json={"packs": ["nope"]}).status_code == 422
    run = api.post("/runs", json={"name": "any", "project": "lab"}).json()
    assert run["packs"] == ["slime"]
    Poster(api, run["id"]).post({"train/train_rollout_logprob_abs_diff": 0.2})
    assert [k for _, k in open_rule_alerts(api, run["id"])] == ["train/train_rollout_logprob_abs_diff"]
    other = api.post("/runs", json={"name": "elsewhere"}).json()
    assert other["packs"] == []


def test_the_trl_callback_forwards_trls_own_keys_into_the_trl_pack(server, api, tmp_path):
    """TRL's GRPOTrainer logs these exact names (trl/trainer/grpo_trainer.py); the callback forwards
    them unchanged, and the monitor's `packs=` enables the pack on the run it creates."""
    from trainer_hooks.integrations.trl import ParityCallback

    monitor = ParityMonitor(run="trl-pack", side="trainer", url=server.url, packs=["trl"], spool_dir=tmp_path)
    callback = ParityCallback(monitor=monitor)

    class State:
        is_world_process_zero, global_step = True, 0

    state = State()
    for step, ratio in enumerate([1.0, 1.02, 2.0], start=1):  # trl#4159: the ratio sat at 2.0
        state.global_step = step
        callback.on_log(None, state, None, logs={
            "sampling/sampling_logp_difference/mean": 0.015, "sampling/sampling_logp_difference/max": 0.4,
            "sampling/importance_sampling_ratio/min": 0.9, "sampling/importance_sampling_ratio/mean": ratio,
            "sampling/importance_sampling_ratio/max": 1.3, "loss": 0.1})
    assert monitor.flush(30)
    run = wait_for(lambda: next((r for r in api.get("/runs").json()["runs"] if r["name"] == "trl-pack"), None), 30)
    assert run["packs"] == ["trl"]
    alerts = wait_for(lambda: api.get(f"/runs/{run['id']}/alerts", params={"status": "open"}).json()["alerts"], 30)
    assert [(a["detail"]["key"], a["detail"]["value"], a["step"]) for a in alerts] == [
        ("sampling/importance_sampling_ratio/mean", 2.0, 3)]
    monitor.close()


def test_unknown_pack_is_refused_on_both_sides(api):
    assert api.post("/runs", json={"name": "x", "packs": ["verl", "nope"]}).status_code == 422
    with pytest.raises(ValueError, match="unknown pack"):
        ParityMonitor(run="x", packs=["nope"], enabled=False)
