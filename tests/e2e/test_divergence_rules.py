"""The built-in rules on what batch averages hide, end to end: hooks in the trainer post over real
HTTP to a live backend, and each failure class raises its alert with why and where to look while a
healthy twin with realistic noise stays quiet (docs/design.md, section 5).

- a corrupted log-prob transport (ai-dynamo/dynamo#11640): k1 plausible, Pearson low;
- correction masks hiding a bug (NVIDIA-NeMo/RL#4243): a token mask would drop a large share;
- a model-definition difference (PrimeIntellect-ai/prime-rl#2802): k3 high from step 0 and flat;
- a stale prefix cache (NVIDIA-NeMo/RL#4018): k3 climbs and resets on each engine restart;
- an MoE model: the `moe` pack judges k3 at MoE levels and rules on the router flip rate
  (NVIDIA/Megatron-LM#4168), measured on a transformers Qwen2-MoE.
"""
from __future__ import annotations

import httpx
import numpy as np
import pytest

from paritywatch.backend.settings import Settings
from tests.support.live import ThreadServer
from trainer_hooks import contract
from trainer_hooks.alignment import RolloutRecord
from trainer_hooks.monitor import ParityMonitor

STEPS = 24  # rollout batches a run logs
BATCH, TOKENS = 16, 96


@pytest.fixture
def live(db_url):
    with ThreadServer(Settings(database_url=db_url)) as srv, httpx.Client(base_url=srv.url, timeout=30) as api:
        yield srv, api


def alerts_of(api: httpx.Client, name: str, status: str | None = None) -> list[dict]:
    """Every alert the run raised (a run whose trainer closed is finished, and its alerts resolve)."""
    runs = {r["name"]: r["id"] for r in api.get("/api/v1/runs").json()["runs"]}
    params = {"status": status} if status else {}
    return api.get(f"/api/v1/runs/{runs[name]}/alerts", params=params).json()["alerts"]


def by_rule(alerts: list[dict]) -> dict[tuple[str, str], dict]:
    return {(a["detail"].get("rule_key"), a["detail"].get("kind")): a for a in alerts}


def trainer_logprobs(rng: np.random.Generator, shape=(BATCH, TOKENS)) -> np.ndarray:
    """Sampled-token log-probs of a policy at temperature 1: mostly confident, a tail of unlikely tokens."""
    return np.log(rng.beta(4, 1, size=shape).clip(1e-6, 1.0))


def healthy_rollout(rng: np.random.Generator, trainer: np.ndarray) -> np.ndarray:
    """Another engine's log-probs of the same tokens: bf16-sized noise with a heavy tail."""
    return trainer + rng.standard_t(3, trainer.shape) * 0.01


def records(rollout: np.ndarray) -> list[RolloutRecord]:
    return [RolloutRecord(prompt_ids=[1, 2], completion_ids=list(range(3, 3 + rollout.shape[1])),
                          rollout_logprobs=row.tolist(), finish_reason="length") for row in rollout]


def run_batches(srv, tmp_path, name: str, make_rollout, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    with ParityMonitor(name, url=srv.url, spool_dir=tmp_path / name, audit_top_k=0) as monitor:
        for step in range(STEPS):
            trainer = trainer_logprobs(rng)
            assert monitor.log_rollout_batch(records(make_rollout(rng, trainer)), trainer_logprobs=trainer,
                                             step=step, audit=False)
        assert monitor.flush(30)


def test_a_corrupted_log_prob_transport_is_seen_by_pearson_and_a_healthy_twin_stays_quiet(live, tmp_path):
    srv, api = live

    def corrupted(rng, trainer):
        # the log-probs arrive assigned to the wrong positions: their mean is intact
        return np.stack([rng.permutation(row) for row in healthy_rollout(rng, trainer)])

    run_batches(srv, tmp_path, "transport-bad", corrupted)
    run_batches(srv, tmp_path, "transport-good", healthy_rollout)
    bad = by_rule(alerts_of(api, "transport-bad"))
    pearson = bad[("align/logprob_pearson", "threshold")]
    assert pearson["detail"]["value"] < 0.9 and "ai-dynamo/dynamo#11640" in pearson["detail"]["why"]
    assert "< 0.9" in pearson["title"]
    assert alerts_of(api, "transport-good") == []


def test_a_correction_masking_a_large_share_of_tokens_alerts_and_a_healthy_twin_stays_quiet(live, tmp_path):
    srv, api = live

    def half_shifted(rng, trainer):
        # a bug moves a third of the tokens' log-probs by ~1 nat: a mask at [0.5, 5] drops them
        rollout = healthy_rollout(rng, trainer)
        return rollout + np.where(rng.random(rollout.shape) < 0.3, rng.choice([-1.2, 1.2], rollout.shape), 0.0)

    run_batches(srv, tmp_path, "mask-bad", half_shifted)
    run_batches(srv, tmp_path, "mask-good", healthy_rollout, seed=1)
    masked = by_rule(alerts_of(api, "mask-bad"))[("align/is_masked_frac", "threshold")]
    assert masked["detail"]["value"] > 0.1 and "NVIDIA-NeMo/RL#4243" in masked["detail"]["why"]
    assert alerts_of(api, "mask-good") == []


def log_k3(srv, tmp_path, name: str, values: np.ndarray, packs=None) -> None:
    with ParityMonitor(name, url=srv.url, spool_dir=tmp_path / name, packs=packs) as monitor:
        for step, value in enumerate(values):
            monitor.log({"align/kl_k3": float(value)}, step=step)
        assert monitor.flush(30)


def test_k3_high_from_step_0_and_flat_is_a_model_definition_difference_a_late_rise_is_not(live, tmp_path):
    srv, api = live
    rng = np.random.default_rng(2)
    log_k3(srv, tmp_path, "yarn-dropped", 0.030 + rng.normal(0, 0.002, 60))  # prime-rl#2802's level
    log_k3(srv, tmp_path, "healthy", np.abs(0.0015 + rng.normal(0, 0.0004, 60)))  # its ~0.0015 floor
    log_k3(srv, tmp_path, "later-drift", np.concatenate([np.full(30, 0.0015), np.linspace(0.0015, 0.03, 30)]))
    start = by_rule(alerts_of(api, "yarn-dropped"))[("align/kl_k3", "baseline")]
    assert start["kind"] == "metric_trend" and "started at 0.0" in start["title"]
    assert "high from the start" in start["title"] and "rope/YaRN" in start["detail"]["why"]
    assert start["detail"]["baseline_steps"] == [0, 9]
    assert alerts_of(api, "healthy") == []
    # a mismatch that grows later is a drift (the level rule sees it), not the model's definition
    assert set(by_rule(alerts_of(api, "later-drift"))) == {("align/kl_k3", "threshold")}


def test_a_stale_prefix_cache_saw_tooth_alerts_below_any_level_and_a_healthy_twin_stays_quiet(live, tmp_path):
    srv, api = live
    rng = np.random.default_rng(3)
    steps = np.arange(1300)
    climb = 0.0015 + 0.0075 * ((steps % 400) / 400)  # restarts at 400, 800, 1200; never above 0.01
    log_k3(srv, tmp_path, "stale-cache", climb + rng.normal(0, 0.0004, len(steps)))
    log_k3(srv, tmp_path, "healthy-long", np.abs(0.0015 + rng.normal(0, 0.0004, len(steps))))
    [saw] = alerts_of(api, "stale-cache")
    assert saw["detail"]["kind"] == "sawtooth" and saw["detail"]["teeth"] >= 2
    assert "climbs and resets" in saw["title"] and "prefix cache" in saw["detail"]["why"]
    assert all(min(s % 400, 400 - s % 400) <= 25 for s in saw["detail"]["resets_at_steps"])
    assert alerts_of(api, "healthy-long") == []


@pytest.fixture(scope="module")
def routed_experts():
    """Expert choices of a random-weight Qwen2-MoE (transformers), [tokens, layers, top_k]: the
    trainer's fp32 forward, an engine's bf16 forward without routing replay, and a replayed one."""
    import copy

    import torch
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    torch.manual_seed(0)
    config = Qwen2MoeConfig(vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=16,
                            shared_expert_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
                            num_key_value_heads=2, num_experts=256, num_experts_per_tok=8)
    model = Qwen2MoeForCausalLM(config).eval()
    ids = torch.randint(0, 128, (4, 64))

    def experts(m):
        with torch.no_grad():
            logits = m(input_ids=ids, output_router_logits=True).router_logits
        return torch.stack([torch.topk(layer.float(), 8, dim=-1).indices for layer in logits], dim=1).numpy()

    trainer = experts(model)
    return trainer, experts(copy.deepcopy(model).to(torch.bfloat16)), trainer.copy()


def test_moe_runs_are_judged_at_moe_levels_and_router_flips_alert(live, tmp_path, routed_experts):
    from trainer_hooks.sample_identity import router_flip_rate

    srv, api = live
    trainer, bf16_engine, replayed = routed_experts
    flips = router_flip_rate(bf16_engine, trainer)
    assert flips > 0.05, flips  # this model in bf16 against fp32 (the precondition of the bad run)
    assert router_flip_rate(replayed, trainer) == 0.0
    rng = np.random.default_rng(4)
    moe_k3 = 0.03 + rng.normal(0, 0.003, 40)  # inside the MoE range 1e-3 to 1e-1 (LMSYS 2026-01-16)
    log_k3(srv, tmp_path, "moe-healthy", moe_k3, packs=["moe"])
    log_k3(srv, tmp_path, "moe-as-dense", moe_k3)  # the same run without saying it is MoE
    with ParityMonitor("moe-no-replay", url=srv.url, spool_dir=tmp_path / "flip", packs=["moe"]) as monitor:
        for step in range(5):
            monitor.log({contract.MOE_ROUTER_FLIP_RATE_KEY: flips, "align/kl_k3": 0.03}, step=step)
        assert monitor.flush(30)
    assert alerts_of(api, "moe-healthy") == []
    assert set(by_rule(alerts_of(api, "moe-as-dense"))) == {("align/kl_k3", "threshold"), ("align/kl_k3", "baseline")}
    [flip] = alerts_of(api, "moe-no-replay")
    assert flip["detail"]["rule_key"] == "moe/router_flip_rate" and flip["detail"]["pack"] == "moe"
    assert "NVIDIA/Megatron-LM#4168" in flip["detail"]["why"] and "routing replay" in flip["detail"]["why"]
    # turning the pack on for a run alerting at dense levels hands k3 to the pack's level: the open
    # dense alert resolves at the next batch
    with ParityMonitor("moe-late", url=srv.url, spool_dir=tmp_path / "late") as monitor:
        monitor.log({"align/kl_k3": 0.03}, step=1)
        assert monitor.flush(30)
        assert [a["detail"]["kind"] for a in alerts_of(api, "moe-late", "open")] == ["threshold"]
        runs = {r["name"]: r["id"] for r in api.get("/api/v1/runs").json()["runs"]}
        api.put(f"/api/v1/runs/{runs['moe-late']}/settings", json={"packs": ["moe"]}).raise_for_status()
        monitor.log({"align/kl_k3": 0.03}, step=2)
        assert monitor.flush(30)
        [alert] = alerts_of(api, "moe-late")
        assert alert["status"] == "resolved" and alert["detail"]["kind"] == "threshold"
