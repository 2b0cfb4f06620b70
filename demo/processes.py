"""The demo's trainer and rollout-worker processes (started with multiprocessing 'spawn')."""
from __future__ import annotations

import queue
import random
import time
from dataclasses import dataclass
from pathlib import Path

MAX_NEW_TOKENS = 24
BATCH_SIZE = 8
SYNC_EVERY = 2  # trainer steps between weight syncs: gives real staleness and off-policy drift


@dataclass
class Job:
    url: str
    run: str
    project: str
    model_dir: str
    token: str | None = None


def eos_ids(gen_cfg) -> list[int]:  # noqa: ANN001
    eos = gen_cfg.eos_token_id
    return [eos] if isinstance(eos, int) else list(eos or [])


def _monitor(job: Job, side: str, worker_id: str):
    from trainer_hooks.monitor import ParityMonitor

    return ParityMonitor(run=job.run, project=job.project, side=side, url=job.url, token=job.token,
                         worker_id=worker_id)


def _load_model(model_dir: str):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.eval()
    return model


def rollout_main(job: Job, worker_id: str, buggy: bool, records_q, weights_q, seed: int) -> None:
    """Render prompts with *this* process's processor, sample, and ship records to the trainer."""
    import torch
    from transformers import GenerationConfig

    from demo.model_dir import PROMPTS, load_processor

    torch.manual_seed(seed)
    rng = random.Random(seed)
    # The bug: the worker loads the processor by model name instead of the user's processing_class.
    tok = load_processor(Path(job.model_dir), custom_template=not buggy)
    gen_cfg = GenerationConfig.from_pretrained(job.model_dir)
    model = _load_model(job.model_dir)
    version = 0
    with _monitor(job, "rollout", worker_id) as monitor:
        monitor.register_processor(tok, generation_config=gen_cfg)
        while not monitor.should_stop:
            monitor.wait_if_paused()
            version = _take_latest_weights(model, weights_q, version)
            messages = [{"role": "user", "content": rng.choice(PROMPTS)}]
            record = _sample(model, tok, gen_cfg, messages, version)
            try:
                records_q.put(record, timeout=1.0)
            except queue.Full:
                continue


def _take_latest_weights(model, weights_q, version: int) -> int:  # noqa: ANN001
    latest = None
    while True:
        try:
            latest = weights_q.get_nowait()
        except queue.Empty:
            break
    if latest is not None:
        version, state = latest
        model.load_state_dict(state)
    return version


def _sample(model, tok, gen_cfg, messages, version: int) -> dict:  # noqa: ANN001
    import torch

    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = tok(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=MAX_NEW_TOKENS, do_sample=True,
                             temperature=1.0, top_k=0, top_p=1.0, eos_token_id=gen_cfg.eos_token_id,
                             pad_token_id=gen_cfg.pad_token_id, return_dict_in_generate=True, output_logits=True)
    completion = out.sequences[0, len(prompt_ids):].tolist()
    logprobs = [torch.log_softmax(step_logits[0].float(), -1)[tid].item()
                for step_logits, tid in zip(out.logits, completion)]
    eos = set(eos_ids(gen_cfg))
    return {"messages": messages, "prompt_ids": prompt_ids, "completion_ids": completion,
            "rollout_logprobs": logprobs, "policy_version": version,
            "finish_reason": "stop" if completion and completion[-1] in eos else "length"}


def trainer_main(job: Job, records_q, weights_qs, steps: int, seed: int) -> None:
    """Score the rollout's ids with the trainer's processor and weights, log align/* and take a
    REINFORCE step; obey pause / stop at every step boundary."""
    import torch
    from transformers import GenerationConfig

    from demo.model_dir import load_processor
    from trainer_hooks.alignment import RolloutRecord, compute_alignment_metrics

    torch.manual_seed(seed)
    tok = load_processor(Path(job.model_dir), custom_template=True)  # the user's processing_class
    gen_cfg = GenerationConfig.from_pretrained(job.model_dir)
    model = _load_model(job.model_dir)
    model.train()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    with _monitor(job, "trainer", "0") as monitor:
        monitor.register_processor(tok, generation_config=gen_cfg)
        for step in range(1, steps + 1):
            monitor.wait_if_paused()
            if monitor.should_stop:
                break
            t0 = time.perf_counter()
            batch = _collect(records_q, BATCH_SIZE, monitor)
            if batch is None:
                break
            logps = [_score(model, r["prompt_ids"], r["completion_ids"]) for r in batch]
            records = [RolloutRecord(**r) for r in batch]
            metrics = compute_alignment_metrics(records, tok, trainer_logprobs=[lp.detach().tolist() for lp in logps],
                                                trainer_eos_ids=eos_ids(gen_cfg), trainer_policy_version=step // SYNC_EVERY)
            loss, reward = _reinforce(logps, batch, tok)
            optim.zero_grad()
            loss.backward()
            optim.step()
            metrics.update({"train/loss": loss.item(), "train/reward_mean": reward,
                            "train/step_time_s": time.perf_counter() - t0})
            monitor.log(metrics, step=step)
            if step % SYNC_EVERY == 0:
                _broadcast(model, weights_qs, step // SYNC_EVERY)


def _collect(records_q, n: int, monitor) -> list[dict] | None:  # noqa: ANN001
    batch: list[dict] = []
    while len(batch) < n:
        if monitor.should_stop:
            return None
        monitor.wait_if_paused(timeout=0.5)
        try:
            batch.append(records_q.get(timeout=0.5))
        except queue.Empty:
            continue
    return batch


def _score(model, prompt_ids: list[int], completion_ids: list[int]):  # noqa: ANN001
    import torch

    ids = torch.tensor([prompt_ids + completion_ids])
    logits = model(ids).logits[0, len(prompt_ids) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion_ids)[:, None])[:, 0]


def _reinforce(logps, batch, tok):  # noqa: ANN001
    """Reward: how many digits the completion holds (something a tiny model can learn)."""
    import torch

    rewards = [sum(ch.isdigit() for ch in tok.decode(r["completion_ids"])) / 10 for r in batch]
    baseline = sum(rewards) / len(rewards)
    loss = -torch.stack([(r - baseline) * lp.sum() for r, lp in zip(rewards, logps)]).mean()
    return loss, baseline


def _broadcast(model, weights_qs, version: int) -> None:  # noqa: ANN001
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for q in weights_qs:
        try:
            q.put_nowait((version, state))
        except queue.Full:
            pass
