"""TRL's GRPOTrainer with Paritywatch's callback, on CPU with a tiny model.

    PARITYWATCH_URL=http://127.0.0.1:8321 python examples/trl_grpo.py --steps 5

The callback fingerprints the trainer's `processing_class` (and generation config) when training
begins, forwards TRL's logged metrics, blocks at step boundaries while the run is paused in the
dashboard, and turns a stop into save + stop. With your own model, pass --model PATH; without,
the demo's tiny random-weight Qwen2 and its trained tokenizer are built offline.
"""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path


def digit_reward(completions, **_kwargs) -> list[float]:
    """Reward completions that contain digits: a signal even a random tiny model can follow."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / 10 for t in texts]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model directory (default: build the demo's tiny Qwen2)")
    ap.add_argument("--run", default="trl-grpo-example")
    ap.add_argument("--project", default="examples")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--output-dir", default=None)
    args = ap.parse_args(argv)

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from trainer_hooks.integrations.trl import ParityCallback

    model_dir = args.model or _tiny_model()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    prompts = [[{"role": "user", "content": q}] for q in ("What is 2+2?", "Count to five.", "Is 7 prime?", "3*4=?")]
    config = GRPOConfig(
        output_dir=args.output_dir or tempfile.mkdtemp(prefix="grpo-"), max_steps=args.steps,
        per_device_train_batch_size=4, num_generations=4, max_completion_length=16, learning_rate=1e-5, beta=0.04,
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, bf16=False, seed=0,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=digit_reward, args=config, processing_class=tokenizer,
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts * 8]),
        # URL and token default to PARITYWATCH_URL / PARITYWATCH_TOKEN.
        callbacks=[ParityCallback(run=args.run, project=args.project)],
    )
    trainer.train()


def _tiny_model() -> str:
    from paritywatch.demo.model_dir import build_model_dir

    return str(build_model_dir(Path(os.environ.get("PARITYWATCH_EXAMPLE_MODEL", tempfile.gettempdir())) / "paritywatch-tiny-qwen2"))


if __name__ == "__main__":
    main()
