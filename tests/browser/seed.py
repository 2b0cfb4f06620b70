"""Seed a running Paritywatch server over its HTTP API (used by the browser tests and by hand).

    .venv/bin/python -m tests.browser.seed http://127.0.0.1:8411
"""
from __future__ import annotations

import math
import sys
import tempfile
import uuid
from pathlib import Path

import httpx

# A chat template that tries to run script in the dashboard: it must show up as text.
MALICIOUS_TEMPLATE = (
    "<script>window.__pwned = 'script';</script><img src=x onerror=\"window.__pwned = 'img'\">"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MAX_BATCH = 50_000


class Seeder:
    def __init__(self, base_url: str, token: str | None = None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=base_url.rstrip("/") + "/api/v1", headers=headers, timeout=60)
        self.client_id = uuid.uuid4().hex
        self.seq = 0

    def post(self, path: str, body: dict) -> dict:
        res = self.http.post(path, json=body)
        res.raise_for_status()
        return res.json() if res.content else {}

    def run(self, name: str, project: str = "grpo-qwen", **tags: str) -> dict:
        return self.post("/runs", {"name": name, "project": project, "tags": tags})

    def component(self, run_id: int, side: str, worker_id: str, host: str = "node-0") -> dict:
        return self.post(f"/runs/{run_id}/components", {"side": side, "worker_id": worker_id, "host": host, "pid": 4242})

    def fingerprint(self, run_id: int, component_id: int, fp: dict) -> dict:
        res = self.http.post(f"/runs/{run_id}/components/{component_id}/fingerprint", json={"digest": fp["digest"]})
        if res.status_code == 404:
            res = self.http.post(f"/runs/{run_id}/components/{component_id}/fingerprint", json=fp)
        res.raise_for_status()
        return res.json()

    def metrics(self, run_id: int, steps: list[int], series: dict[str, list[float]]) -> None:
        """POST columnar batches of at most MAX_BATCH points each."""
        per = max(1, MAX_BATCH // max(1, len(series)))
        for i in range(0, len(steps), per):
            self.seq += 1
            body = {"client_id": self.client_id, "seq": self.seq, "steps": steps[i:i + per],
                    "series": {k: v[i:i + per] for k, v in series.items()}}
            self.post(f"/runs/{run_id}/metrics", body)


def processor_fingerprints(workdir: Path) -> tuple[dict, dict]:
    """(trainer, rollout) fingerprints of two real tokenizers whose chat templates (and eos) differ."""
    from transformers import AutoTokenizer

    from tests.fixtures.tokenizers import CUSTOM_TEMPLATE, build_chatml_tokenizer
    from trainer_hooks.fingerprint import fingerprint_processor

    trainer_dir = build_chatml_tokenizer(workdir, chat_template=CUSTOM_TEMPLATE, name="trainer",
                                         generation_config={"eos_token_id": [2, 3]})
    rollout_dir = build_chatml_tokenizer(workdir, chat_template=MALICIOUS_TEMPLATE, name="rollout",
                                         extra_special_tokens=("<think>",), generation_config={"eos_token_id": [2]})
    fps = []
    for d in (trainer_dir, rollout_dir):
        tok = AutoTokenizer.from_pretrained(str(d))
        fps.append(fingerprint_processor(tok, model_dir=d))
    return fps[0], fps[1]


def chatml_fingerprint(workdir: Path, template: str, name: str, **options) -> dict:
    """The fingerprint of the test suite's trained ChatML BPE tokenizer with `template` (`options`:
    those of build_chatml_tokenizer)."""
    from transformers import AutoTokenizer

    from tests.fixtures.tokenizers import build_chatml_tokenizer
    from trainer_hooks.fingerprint import fingerprint_processor

    return fingerprint_processor(AutoTokenizer.from_pretrained(build_chatml_tokenizer(workdir, chat_template=template,
                                                                                      name=name, **options)))


def spread_arrivals(db_url: str, run_id: int, every_s: float) -> None:
    """Batch k of the run arrived (k + 1) * every_s seconds after the run was created. Set in the
    database: a wall-time axis needs batches that arrived over minutes, not within the seeding second."""
    from datetime import timedelta

    from sqlalchemy import create_engine, select, update
    from sqlalchemy.orm import Session

    from paritywatch.backend.models import IngestBatch, Run

    engine = create_engine(db_url)
    try:
        with Session(engine) as s, s.begin():
            created = s.scalar(select(Run.created_at).where(Run.id == run_id))
            ids = s.scalars(select(IngestBatch.id).where(IngestBatch.run_id == run_id).order_by(IngestBatch.id)).all()
            for k, batch_id in enumerate(ids):
                s.execute(update(IngestBatch).where(IngestBatch.id == batch_id)
                          .values(received_at=created + timedelta(seconds=every_s * (k + 1))))
    finally:
        engine.dispose()


def silence_component(db_url: str, component_id: int, seconds: float) -> None:
    """The process's last heartbeat was `seconds` ago, as if it had been killed then (set in the
    database: the heartbeat timeout is a minute, a test does not wait for it)."""
    from datetime import timedelta

    from sqlalchemy import create_engine, update
    from sqlalchemy.orm import Session

    from paritywatch.backend.models import Component, utcnow

    engine = create_engine(db_url)
    try:
        with Session(engine) as s, s.begin():
            s.execute(update(Component).where(Component.id == component_id)
                      .values(last_heartbeat=utcnow() - timedelta(seconds=seconds)))
    finally:
        engine.dispose()


def wave(n: int, phase: float = 0.0, scale: float = 1.0) -> list[float]:
    return [scale * (math.sin(i / 500 + phase) * 0.4 + math.exp(-i / max(1, n / 4)) + 0.05 * math.sin(i / 7)) for i in range(n)]


def seed_mismatch_run(s: Seeder, name: str, fps: tuple[dict, dict], same_workers: int = 31, steps: int = 2000) -> dict:
    """A run: 1 trainer, `same_workers` rollout workers like it, 1 worker with the other processor."""
    trainer_fp, rollout_fp = fps
    run = s.run(name, model="Qwen2.5-7B")
    trainer = s.component(run["id"], "trainer", "trainer-rank0")
    s.fingerprint(run["id"], trainer["id"], trainer_fp)
    for i in range(same_workers):
        c = s.component(run["id"], "rollout", f"vllm-{i:02d}", host=f"node-{1 + i // 8}")
        s.fingerprint(run["id"], c["id"], trainer_fp)
    bad = s.component(run["id"], "rollout", "vllm-default-tok", host="node-9")
    s.fingerprint(run["id"], bad["id"], rollout_fp)
    xs = list(range(steps))
    s.metrics(run["id"], xs, {
        "align/prompt_rerender_mismatch_frac": [0.0 if i < steps // 2 else 1 / 32 for i in xs],
        "align/kl_k3": [abs(v) * 1e-3 for v in wave(steps)],
        "align/is_ratio_mean": [1 + v * 0.01 for v in wave(steps, 1.0)],
        "loss": wave(steps, 0.5, 2.0),
        "reward/mean": [0.2 + 0.6 * (1 - math.exp(-i / 600)) for i in xs],
        "rollout/staleness_mean": [1 + (i % 3) for i in xs],
    })
    return run


def seed_clean_run(s: Seeder, name: str, fp: dict, workers: int = 4, project: str = "grpo-llama") -> dict:
    run = s.run(name, project=project)
    t = s.component(run["id"], "trainer", "trainer-rank0")
    s.fingerprint(run["id"], t["id"], fp)
    for i in range(workers):
        c = s.component(run["id"], "rollout", f"vllm-{i}")
        s.fingerprint(run["id"], c["id"], fp)
    xs = list(range(500))
    s.metrics(run["id"], xs, {"loss": wave(500), "align/kl_k3": [1e-4] * 500})
    return run


def seed_big_run(s: Seeder, name: str, points: int, keys: tuple[str, ...] = ("loss", "align/kl_k3")) -> dict:
    run = s.run(name, project="scale")
    xs = list(range(points))
    s.metrics(run["id"], xs, {k: wave(points, i) for i, k in enumerate(keys)})
    return run


if __name__ == "__main__":  # pragma: no cover - manual seeding for a person looking at the UI
    seeder = Seeder(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8411")
    fingerprints = processor_fingerprints(Path(tempfile.mkdtemp()))
    print(seed_mismatch_run(seeder, "grpo-qwen7b-math", fingerprints)["id"])
    print(seed_clean_run(seeder, "grpo-llama8b-code", fingerprints[0])["id"])
    print(seed_big_run(seeder, "long-run-200k", 200_000)["id"])
