"""`paritywatch demo`: a simulated async GRPO run that reproduces the TRL processing_class bug.

A trainer process and several rollout-worker processes share a tiny random-weight Qwen2 model
and a real BPE tokenizer. The user's processor has a custom chat template set after loading;
one worker loads the processor "by model name" and gets the default template, exactly like
TRL's AsyncRolloutWorker did (huggingface/trl#5498). With --healthy every worker gets the
user's processor.
"""
