"""The demo's trainer and rollout-worker processes (started with multiprocessing 'spawn').

Each rollout worker samples a GRPO group (GROUP_SIZE completions of one prompt, one `generate`
call) and ships it to the trainer, which scores the group's ids with its own processor and
weights, logs `align/*` next to the usual training keys and takes a policy-gradient step."""
from __future__ import annotations

import ctypes
import queue
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paritywatch.demo.model_dir import quiet_progress_bars

MAX_NEW_TOKENS = 12  # sampling is most of a step's CPU: short completions keep the demo at several steps/s
GROUP_SIZE = 8  # completions per prompt: one group is one trainer batch
SYNC_EVERY = 2  # trainer steps between weight syncs: gives real staleness and off-policy drift
WARMUP_STEPS = 50
LEARNING_RATE = 2e-5  # small enough that a few steps of staleness stay far below the kl_k3 warning
RECORDS_QUEUE_SLOTS = 2
REPORT_WRONG_PROCESSOR_AFTER = RECORDS_QUEUE_SLOTS + 1  # groups
POLL_S = 0.5  # how often a blocked loop looks at the demo's stop event


@dataclass
class Job:
    url: str
    run: str
    project: str
    model_dir: str
    token: str | None = None


@dataclass
class Channels:
    """What the demo shares with its processes. `stop`: leave the loop and close the monitor
    (a clean goodbye). `join`: set when a held-back worker may join the run (None: join at once).
    `entered`: this process's own flag, 1 once it is about to open its monitor (before that it
    has nothing to close, and the demo stopping terminates it rather than wait for its imports)."""
    records: Any  # multiprocessing Queue of groups (lists of record dicts)
    stop: Any  # multiprocessing Event
    join: Any = None
    entered: Any = None  # multiprocessing RawValue("b"): no lock a terminated process could leave held


def eos_ids(gen_cfg) -> list[int]:
    eos = gen_cfg.eos_token_id
    return [eos] if isinstance(eos, int) else list(eos or [])


def _as_demo_child() -> None:
    """Ctrl-C in the terminal reaches the whole process group: the demo itself stops its children
    in order (workers, then the backend), so they ignore SIGINT. If the demo dies without
    cleaning up (SIGKILL), Linux sends them SIGTERM (PR_SET_PDEATHSIG)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    set_parent_death_signal()


def set_parent_death_signal() -> None:
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _monitor(job: Job, side: str, worker_id: str):
    from trainer_hooks.monitor import ParityMonitor

    return ParityMonitor(run=job.run, project=job.project, side=side, url=job.url, token=job.token,
                         worker_id=worker_id)


def _load_model(model_dir: str):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    quiet_progress_bars()
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.eval()
    return model


def _enter_run(channels: Channels) -> bool:
    """Flag this process as one to let close (not terminate), then look at the stop event: the demo
    sets `stop` before it reads the flags, so either it waits for this process or this process
    sees `stop` and leaves without opening a monitor."""
    if channels.entered is not None:
        channels.entered.value = 1
    return not channels.stop.is_set()


def _wait_for_join(channels: Channels) -> bool:
    """A worker held back (already loaded, not yet part of the run) waits here; False on stop."""
    while channels.join is not None and not channels.join.is_set():
        if channels.stop.wait(POLL_S):
            return False
    return not channels.stop.is_set()


def rollout_main(job: Job, worker_id: str, buggy: bool, channels: Channels, weights_q, seed: int) -> None:
    """Render prompts with *this* process's processor, sample groups, and ship them to the trainer."""
    _as_demo_child()
    import torch
    from transformers import GenerationConfig

    from paritywatch.demo.model_dir import PROMPTS, load_processor

    torch.manual_seed(seed)
    rng = random.Random(seed)
    # The bug: the worker loads the processor by model name instead of the user's processing_class.
    tok = load_processor(Path(job.model_dir), custom_template=not buggy)
    gen_cfg = GenerationConfig.from_pretrained(job.model_dir)
    model = _load_model(job.model_dir)
    if not (_wait_for_join(channels) and _enter_run(channels)):
        return
    # The wrong worker reports its processor only once its first groups are in the trainer's
    # hands (REPORT_WRONG_PROCESSOR_AFTER puts into a 2-slot queue: the first has been taken),
    # as a worker instrumented lazily would: the demo then shows both detectors, the alignment
    # metrics jumping on its batches and the fingerprint diff.
    report_after = REPORT_WRONG_PROCESSOR_AFTER if buggy else 0
    version, sent, reported = 0, 0, False
    with _monitor(job, "rollout", worker_id) as monitor:
        while not (monitor.should_stop or channels.stop.is_set()):
            if not reported and (sent >= report_after or monitor.state == "paused"):
                monitor.register_processor(tok, generation_config=gen_cfg)  # fingerprints in the background
                reported = True
            if not monitor.wait_if_paused(timeout=POLL_S):
                continue
            version = _take_latest_weights(model, weights_q, version)
            monitor.set_policy_version(version)
            messages = [{"role": "user", "content": rng.choice(PROMPTS)}]
            group = _sample_group(model, tok, gen_cfg, messages, version)
            if _put(channels, monitor, group):
                sent += 1
                monitor.add_samples(len(group))


def _put(channels: Channels, monitor, group: list[dict]) -> bool:
    """Hand a group to the trainer; False (dropped) when the demo stops or the run is paused."""
    while not (channels.stop.is_set() or monitor.state == "paused" or monitor.should_stop):
        try:
            channels.records.put(group, timeout=POLL_S)
            return True
        except queue.Full:
            continue
    return False


def _take_latest_weights(model, weights_q, version: int) -> int:
    """The newest weights the trainer sent, if any. Tensors cross the queue as handles served by
    the trainer's process: once it has exited (the run finished) they cannot be opened, and the
    worker keeps the weights it has rather than die with a traceback."""
    latest = None
    while True:
        try:
            latest = weights_q.get_nowait()
        except queue.Empty:
            break
        except (OSError, EOFError):  # the trainer is gone
            break
    if latest is not None:
        version, state = latest
        model.load_state_dict(state)
    return version


def _sample_group(model, tok, gen_cfg, messages, version: int) -> list[dict]:
    """GROUP_SIZE completions of one prompt in one `generate` call (same prompt: no padding)."""
    import torch

    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = tok(text, add_special_tokens=False)["input_ids"]
    inputs = torch.tensor([prompt_ids] * GROUP_SIZE)
    with torch.no_grad():
        out = model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=MAX_NEW_TOKENS,
                             do_sample=True, temperature=1.0, top_k=0, top_p=1.0, eos_token_id=gen_cfg.eos_token_id,
                             pad_token_id=gen_cfg.pad_token_id, return_dict_in_generate=True, output_logits=True)
    new_ids = out.sequences[:, len(prompt_ids):]
    logprobs = torch.log_softmax(torch.stack(out.logits, dim=1).float(), -1).gather(2, new_ids[..., None])[..., 0]
    eos = set(eos_ids(gen_cfg))
    group = []
    for ids, lps in zip(new_ids.tolist(), logprobs.tolist()):
        end = next((i + 1 for i, t in enumerate(ids) if t in eos), len(ids))  # generate pads after eos
        group.append({"messages": messages, "prompt_ids": prompt_ids, "completion_ids": ids[:end],
                      "rollout_logprobs": lps[:end], "policy_version": version,
                      "finish_reason": "stop" if end < len(ids) or ids[-1] in eos else "length"})
    return group


def trainer_main(job: Job, channels: Channels, weights_qs, steps: int, seed: int) -> None:
    """Score the rollout's ids with the trainer's processor and weights, log align/* and the
    training keys, audit each sample (sample audit), take a GRPO-style step; obey pause / stop at
    every step boundary."""
    _as_demo_child()
    import torch
    from transformers import GenerationConfig

    from paritywatch.demo.model_dir import load_processor
    from trainer_hooks.alignment import RolloutRecord, compute_alignment_metrics, render_prompts

    torch.manual_seed(seed)
    tok = load_processor(Path(job.model_dir), custom_template=True)  # the user's processing_class
    gen_cfg = GenerationConfig.from_pretrained(job.model_dir)
    model = _load_model(job.model_dir)
    model.train()
    optim = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    if not _enter_run(channels):
        return
    with _monitor(job, "trainer", "0") as monitor:
        monitor.register_processor(tok, generation_config=gen_cfg)
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            batch = _collect(channels, monitor)
            if batch is None:
                break
            logps = _score(model, batch)
            records = [RolloutRecord(**r) for r in batch]
            trainer_logprobs = [lp.detach().tolist() for lp in logps]
            rendered = render_prompts(records, tok)  # once, for the metrics and the per-sample audit
            metrics = compute_alignment_metrics(records, tok, trainer_logprobs=trainer_logprobs, rendered=rendered,
                                                trainer_eos_ids=eos_ids(gen_cfg), trainer_policy_version=step // SYNC_EVERY)
            monitor.audit_rollout_batch(records, tok, trainer_logprobs, step, rendered=rendered,
                                        trainer_eos_ids=eos_ids(gen_cfg))
            for group in optim.param_groups:  # linear warm-up, then constant
                group["lr"] = LEARNING_RATE * min(1.0, step / WARMUP_STEPS)
            metrics.update(_train_step(model, optim, logps, batch, tok))
            metrics["step_time_s"] = time.perf_counter() - t0
            monitor.log(metrics, step=step)
            if step % SYNC_EVERY == 0:
                _broadcast(model, weights_qs, step // SYNC_EVERY)
                monitor.set_policy_version(step // SYNC_EVERY)


def _collect(channels: Channels, monitor) -> list[dict] | None:
    """The next group, waiting while the run is paused; None when the run or the demo stops."""
    while not (monitor.should_stop or channels.stop.is_set()):
        if not monitor.wait_if_paused(timeout=POLL_S):
            continue
        try:
            return channels.records.get(timeout=POLL_S)
        except queue.Empty:
            continue
    return None


def _score(model, batch: list[dict]) -> list:
    """Per-token log-probs of each completion under the trainer's weights (one forward pass)."""
    import torch

    width = max(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in batch)
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    for i, r in enumerate(batch):
        seq = r["prompt_ids"] + r["completion_ids"]
        ids[i, :len(seq)] = torch.tensor(seq)
    logp = torch.log_softmax(model(ids).logits.float(), -1)
    out = []
    for i, r in enumerate(batch):
        start, n = len(r["prompt_ids"]), len(r["completion_ids"])
        targets = torch.tensor(r["completion_ids"])
        out.append(logp[i, start - 1:start - 1 + n].gather(1, targets[:, None])[:, 0])
    return out


def _train_step(model, optim, logps, batch, tok) -> dict[str, float]:
    """GRPO-style: group-relative advantages. Reward: how many digits a completion holds
    (something a tiny model can learn)."""
    import torch

    rewards = torch.tensor([sum(ch.isdigit() for ch in tok.decode(r["completion_ids"])) / 10 for r in batch])
    advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
    loss = -torch.stack([a * lp.mean() for a, lp in zip(advantages.tolist(), logps)]).mean()
    optim.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optim.step()
    return {"loss": loss.item(), "reward": rewards.mean().item(), "reward_std": rewards.std().item(),
            "grad_norm": grad_norm.item(), "learning_rate": optim.param_groups[0]["lr"],
            "completions/mean_length": sum(len(r["completion_ids"]) for r in batch) / len(batch)}


def _broadcast(model, weights_qs, version: int) -> None:
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for q in weights_qs:
        try:
            q.put_nowait((version, state))
        except queue.Full:  # a worker that has not read them yet (held back, or busy): newest wins
            try:
                q.get_nowait()
                q.put_nowait((version, state))
            except (queue.Empty, queue.Full):
                pass
