"""Build the demo's "model on disk": a trained BPE tokenizer with a default ChatML template,
a generation config, and a random-weight 2-layer Qwen2. Offline, seeded, a few seconds."""
from __future__ import annotations

import json
from pathlib import Path

DEFAULT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The user's processing_class: a system prompt injected and a reasoning prefix, set after loading.
CUSTOM_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a careful math tutor.<|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "You are a careful math tutor. Think step by step.",
    "What is 17 times 23? Let me think: 17 * 23 = 391.",
    "Solve for x: 2x + 3 = 11, so x = 4.",
    "The derivative of x squared is 2x; the integral of 2x is x squared plus C.",
    "Prime numbers: 2, 3, 5, 7, 11, 13, 17, 19, 23, 29.",
    "<think> reasoning </think> The answer is 42.",
    "user assistant system tool call result",
] * 20
PROMPTS = [
    "What is 12 plus 30?", "Is 91 prime?", "Differentiate x squared.", "Solve 3x = 12.",
    "What is 7 times 8?", "Name a prime above 20.", "Integrate 2x.", "What is 100 minus 58?",
]


def build_model_dir(path: Path, seed: int = 0) -> Path:
    """Write tokenizer + generation_config + tiny Qwen2 weights to `path` (reused if present)."""
    path = Path(path)
    if (path / "model.safetensors").exists() and (path / "generation_config.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    tok = _train_tokenizer()
    tok.save_pretrained(path)
    _save_model(path, tok, seed)
    _save_generation_config(path, tok)  # after the model: save_pretrained writes its own
    return path


def _train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    raw.train_from_iterator(CORPUS, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  bos_token=None, unk_token=None)
    tok.chat_template = DEFAULT_TEMPLATE
    return tok


def _save_generation_config(path: Path, tok) -> None:
    eos = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    cfg = {"eos_token_id": eos, "pad_token_id": eos[1], "temperature": 1.0, "top_p": 1.0, "do_sample": True}
    (path / "generation_config.json").write_text(json.dumps(cfg, indent=2))


def quiet_progress_bars() -> None:
    """The demo's console is its status lines: transformers' bars ('Writing model shards' here,
    'Loading weights' in each process) garbled them. Called in every process that saves or loads."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _save_model(path: Path, tok, seed: int) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    quiet_progress_bars()
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=512,
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    Qwen2ForCausalLM(config).save_pretrained(path)


def load_processor(path: Path, custom_template: bool):
    """custom_template=True is the user's processing_class; False is 'loaded by model name'."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if custom_template:
        tok.chat_template = CUSTOM_TEMPLATE  # set after loading: what TRL users do
    return tok
