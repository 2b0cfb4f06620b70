"""A run with hundreds of processes for the workers view, seeded over the HTTP API (browser test,
bench/dashboard.py and scripts/screenshot_workers.py):

- a trainer at policy version TRAINER_VERSION;
- rollout workers one version behind at most, except LAGGING (stuck TRAINER_VERSION - 9 versions
  back), DIFFERENT (another processor: its own fingerprint group, a processor_mismatch alert) and
  CLOSED (said goodbye);
- each heartbeat carries a version and a throughput; `metric_workers` of them post a per-worker
  metric (`rollout/kl`), DIFFERENT far above the others.
"""
from __future__ import annotations

import math
import uuid
from dataclasses import dataclass

import httpx

TRAINER_VERSION = 120
LAGGING = "rollout-042"
DIFFERENT = "rollout-317"
CLOSED = "rollout-500"
METRIC = "rollout/kl"


@dataclass
class WorkersRun:
    run_id: int
    ids: dict[str, int]


def worker_name(i: int) -> str:
    return f"rollout-{i:03d}"


def seed_workers_run(base_url: str, name: str, workers: int = 511, *, token: str | None = None,
                     good_fp: dict | None = None, bad_fp: dict | None = None, metric_workers: int = 24,
                     steps: int = 200) -> WorkersRun:
    """1 trainer + `workers` rollout workers (512 processes by default). `good_fp`/`bad_fp`: real
    fingerprints for a readable diff; without them two one-component ones are made up."""
    from trainer_hooks.fingerprint.core import assemble

    good = good_fp or assemble("tokenizer", {"chat_template": "{{ messages }}"}, {})
    bad = bad_fp or assemble("tokenizer", {"chat_template": "{{ messages | tojson }}"}, {})
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=base_url.rstrip("/") + "/api/v1", headers=headers, timeout=60) as http:
        def post(path: str, body: dict | None = None) -> dict:
            res = http.post(path, json=body)
            res.raise_for_status()
            return res.json() if res.content else {}

        run_id = post("/runs", {"name": name, "project": "async-grpo"})["id"]
        http.put(f"/runs/{run_id}/settings", json={"on_mismatch": "alert"}).raise_for_status()
        ids = {"trainer-0": post(f"/runs/{run_id}/components", {"side": "trainer", "worker_id": "trainer-0",
                                                                 "host": "trainer-node", "pid": 1000})["id"]}
        _fingerprint(http, run_id, ids["trainer-0"], good)
        for i in range(workers):
            worker = worker_name(i)
            cid = ids[worker] = post(f"/runs/{run_id}/components", {"side": "rollout", "worker_id": worker,
                                                                    "host": f"gpu-node-{i // 8:02d}", "pid": 2000 + i})["id"]
            _fingerprint(http, run_id, cid, bad if worker == DIFFERENT else good)
        # Every heartbeat after every registration: each process's last one is then as recent as the
        # seed allows (registering 512 processes and their fingerprints took over a minute on a
        # loaded CI machine, longer than the heartbeat timeout, and the first ones read as lost).
        post(f"/runs/{run_id}/components/{ids['trainer-0']}/heartbeat",
             {"policy_version": TRAINER_VERSION, "points_per_s": 420.0})
        for i in range(workers):
            worker = worker_name(i)
            version = TRAINER_VERSION - 9 if worker == LAGGING else TRAINER_VERSION - (i % 2)
            post(f"/runs/{run_id}/components/{ids[worker]}/heartbeat",
                 {"policy_version": version, "samples_per_s": round(6 + 2 * math.sin(i), 2), "points_per_s": 40.0})
        if CLOSED in ids:
            post(f"/runs/{run_id}/components/{ids[CLOSED]}/close", {"reason": "scaled down"})
        metric_senders = [worker_name(i) for i in range(min(workers, metric_workers))]
        if DIFFERENT in ids and DIFFERENT not in metric_senders:
            metric_senders.append(DIFFERENT)
        for worker in metric_senders:
            _post_worker_metric(http, run_id, ids[worker], worker, steps)
    return WorkersRun(run_id, ids)


def _fingerprint(http: httpx.Client, run_id: int, component_id: int, fp: dict) -> None:
    path = f"/runs/{run_id}/components/{component_id}/fingerprint"
    res = http.post(path, json={"digest": fp["digest"]})
    if res.status_code == 404:
        res = http.post(path, json=fp)
    res.raise_for_status()


def _post_worker_metric(http: httpx.Client, run_id: int, component_id: int, worker: str, steps: int) -> None:
    """The worker's own KL estimate: ~1e-3 with some noise; DIFFERENT's jumps after half the run."""
    phase = (component_id % 17) / 3
    values = [1e-3 * (1 + 0.3 * math.sin(s / 9 + phase))
              + (0.02 if worker == DIFFERENT and s >= steps // 2 else 0.0) for s in range(steps)]
    body = {"client_id": uuid.uuid4().hex, "seq": 1, "component_id": component_id,
            "steps": list(range(steps)), "series": {METRIC: values}}
    http.post(f"/runs/{run_id}/metrics", json=body).raise_for_status()
