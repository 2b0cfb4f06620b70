"""A minimal async-RL rollout worker on vLLM, hooked to Paritywatch.

It loads the policy in a ``vllm.LLM``, registers the engine's processor (tokenizer + the
generation config vLLM applies) as the run's rollout side, then for each step: waits while the
run is paused, renders and samples the prompts with ``llm.chat`` (sampled-token log-probs on),
turns the outputs into ``RolloutRecord``s and logs the per-batch alignment metrics against the
trainer's processor (``--trainer-model``; the engine's own tokenizer otherwise) plus a few rollout
stats. ``--records-out`` also writes the records as JSON lines, the shape a trainer receives.

Usage (a backend from ``paritywatch serve`` at the default URL)::

    python examples/vllm_rollout_worker.py --model Qwen/Qwen2.5-0.5B-Instruct --run grpo-demo \\
        --url http://127.0.0.1:8321 --steps 3 --prompts "What is 2 + 2?" "Name a prime."

The trainer of the same run registers its processor with ``ParityMonitor(run=..., side="trainer")``
(or ``ParityCallback``); the backend then compares the two fingerprints (docs/vllm.md).
On CPU set ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB) for small models.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="model directory or hub name vLLM loads")
    p.add_argument("--run", default="vllm-rollout-demo")
    p.add_argument("--project", default="default")
    p.add_argument("--url", default=None, help="Paritywatch backend (default: PARITYWATCH_URL or :8321)")
    p.add_argument("--worker-id", default=None)
    p.add_argument("--trainer-model", default=None, help="the trainer's processor, for the alignment metrics")
    p.add_argument("--prompts", nargs="+", default=["What is 2 + 2?", "Say hello in French."])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--num-generations", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--eager", action="store_true", help="no torch.compile (fast start for tiny models)")
    p.add_argument("--records-out", default=None, help="append the records as JSON lines")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from vllm import LLM, SamplingParams

    from trainer_hooks import ParityMonitor
    from trainer_hooks.integrations.vllm import records_from_request_outputs, register_llm, watch_llm_sampling

    extra = {"enforce_eager": True, "compilation_config": {"mode": 0}} if args.eager else {}
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len, seed=0, **extra)
    trainer_processor = llm.get_tokenizer()
    if args.trainer_model:
        from transformers import AutoTokenizer

        trainer_processor = AutoTokenizer.from_pretrained(args.trainer_model)

    monitor = ParityMonitor(run=args.run, project=args.project, side="rollout", url=args.url,
                            worker_id=args.worker_id)
    try:
        register_llm(monitor, llm).result(timeout=60)  # the rollout's fingerprint reaches the backend
        watch_llm_sampling(monitor, llm)  # and the sampling parameters each request is served with
        conversations = [[{"role": "user", "content": p}] for p in args.prompts]
        params = SamplingParams(n=args.num_generations, max_tokens=args.max_tokens, logprobs=0, seed=0)
        for step in range(args.steps):
            monitor.wait_if_paused()  # blocks while a mismatch (or an admin) paused the run
            if monitor.should_stop:
                break
            outputs = llm.chat(conversations, params, use_tqdm=False)
            records = records_from_request_outputs(outputs, messages=conversations, policy_version=step)
            monitor.log_rollout_batch(records, processor=trainer_processor, step=step)
            lengths = [len(r.completion_ids) for r in records]
            logps = [v for r in records for v in (r.rollout_logprobs or [])]
            monitor.log({"rollout/num_sequences": len(records),
                         "rollout/completion_len_mean": sum(lengths) / len(lengths),
                         "rollout/logprob_mean": sum(logps) / len(logps) if logps else math.nan}, step)
            if args.records_out:
                with open(args.records_out, "a", encoding="utf-8") as fh:
                    for record in records:
                        fh.write(json.dumps(dataclasses.asdict(record), ensure_ascii=False) + "\n")
            print(f"step {step}: {len(records)} sequences, mean completion {sum(lengths) / len(lengths):.1f} tokens",
                  flush=True)
        monitor.flush(10)
    finally:
        monitor.close()
    return 0


if __name__ == "__main__":  # vLLM may spawn its engine core: keep the guard
    raise SystemExit(main())
