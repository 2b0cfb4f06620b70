"""TRL's AsyncGRPOTrainer with both Paritywatch hooks (needs GPUs and a vLLM server).

    # 1. a vLLM server for generation (TRL's async GRPO talks to it over HTTP)
    CUDA_VISIBLE_DEVICES=1 trl vllm-serve --model Qwen/Qwen3-0.6B
    # 2. the trainer
    PARITYWATCH_URL=http://paritywatch:8321 PARITYWATCH_TOKEN=pw_... \
        CUDA_VISIBLE_DEVICES=0 python examples/async_grpo.py --model Qwen/Qwen3-0.6B

Two hooks, one per side:
- trainer side: `ParityCallback` fingerprints the `processing_class` the trainer scores with,
  forwards AsyncGRPO's metrics (ratio, buffer_qsize, queue_wait_time_s, weight_sync_time_s...),
  and blocks at step boundaries while the run is paused;
- rollout side: `instrument_rollout_worker` makes TRL's rollout worker (a spawned child process)
  fingerprint the processor it really renders prompts with. That is the side TRL issue 5498 got
  wrong: the worker loaded `AutoTokenizer.from_pretrained(model_name)` instead of the user's
  tokenizer. With a custom chat template below, an affected TRL version raises a
  processor_mismatch alert on `chat_template` and Paritywatch pauses the run.

Not trained in CI (no GPU, no CUDA vLLM there): tests/integrations/test_examples_api.py runs this
script on CPU up to `trainer.train()` against the installed TRL, with a tiny local model.
"""
from __future__ import annotations

import argparse

CUSTOM_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)


def accuracy_reward(completions, answer, **_kwargs) -> list[float]:
    return [float(str(a) in c[-1]["content"]) for c, a in zip(completions, answer)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="Qwen/Qwen3-0.6B")
    ap.add_argument("--vllm-url", default="http://localhost:8000")
    ap.add_argument("--run", default="async-grpo-qwen3")
    ap.add_argument("--max-steps", type=int, default=200)
    args = ap.parse_args()

    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    from trainer_hooks.integrations.trl import ParityCallback, instrument_rollout_worker

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.chat_template = CUSTOM_TEMPLATE  # the user's processing_class, customised after loading
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": a + b}
         for a in range(20) for b in range(20)]
    )
    config = AsyncGRPOConfig(
        output_dir=f"{args.run}-out", vllm_server_base_url=args.vllm_url, max_steps=args.max_steps,
        logging_steps=1, report_to="none",
    )
    trainer = AsyncGRPOTrainer(
        model=args.model, reward_funcs=accuracy_reward, args=config, train_dataset=dataset,
        processing_class=tokenizer, callbacks=[ParityCallback(run=args.run, project="async-grpo")],
    )
    # Before train(): the worker process starts at train begin and must carry the hook.
    instrument_rollout_worker(trainer.rollout_worker, run=args.run, project="async-grpo")
    trainer.train()


if __name__ == "__main__":
    main()
