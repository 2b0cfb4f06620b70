"""Per-sample audit (trainer_hooks/audit.py) on real tokenizers trained offline (tests/fixtures):
an off-by-one log-prob list, a trainer template that drops `<think>` from earlier turns, finish
reasons, and the bounds (top-k samples, token windows, token length)."""
from __future__ import annotations

import pytest

from tests.fixtures.tokenizers import build_chatml_tokenizer
from trainer_hooks import contract
from trainer_hooks.alignment import RolloutRecord
from trainer_hooks.audit import audit_batch

THINK = ("<think>", "</think>")
# Qwen3-style: the reasoning of earlier assistant turns is dropped when the conversation is rendered
# again (NVIDIA-NeMo/RL#2822). The rollout rendered it with the reasoning kept (the plain ChatML template).
DROPS_THINK_TEMPLATE = (
    "{% for message in messages %}{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CONVERSATION = [
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "<think>\nadd them\n</think>\nIt is 4."},
    {"role": "user", "content": "And 3 + 3?"},
]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    from transformers import AutoTokenizer

    def load(**options):
        return AutoTokenizer.from_pretrained(build_chatml_tokenizer(tmp_path_factory.mktemp("tok"), **options))

    rollout = load(extra_special_tokens=THINK)
    trainer = load(extra_special_tokens=THINK, chat_template=DROPS_THINK_TEMPLATE)
    return rollout, trainer


def render(tok, messages) -> list[int]:
    return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]


def record(tok, messages=None, answer="It is 6.", *, eos=True, logprobs_delta=0, finish="stop") -> RolloutRecord:
    messages = messages or [{"role": "user", "content": "What is 3 + 3?"}]
    completion = tok.encode(answer, add_special_tokens=False) + ([tok.eos_token_id] if eos else [])
    return RolloutRecord(messages=messages, prompt_ids=render(tok, messages), completion_ids=completion,
                         rollout_logprobs=[-0.5] * (len(completion) + logprobs_delta), finish_reason=finish)


def test_an_off_by_one_logprob_list_is_a_length_mismatch_with_the_tokens_where_pairs_end(tokenizers) -> None:
    rollout, _ = tokenizers
    good, shifted = record(rollout), record(rollout, logprobs_delta=-1)
    audit = audit_batch([good, shifted], rollout, step=7)
    assert audit["step"] == 7
    assert audit["counts"]["samples"] == 2 and audit["counts"]["length_mismatch"] == 1
    [sample] = audit["samples"]
    n = len(shifted.completion_ids)
    assert sample["index"] == 1 and sample["length_mismatch"] is True
    assert (sample["n_ids"], sample["n_rollout_logprobs"]) == (n, n - 1)
    [window] = sample["windows"]
    assert window["kind"] == "length" and window["at"] == n - 1 and window["trainer"] is None
    # The id without a log-prob is the eos token, shown as its text at position at - start.
    assert window["rollout"][window["at"] - window["start"]] == "<|im_end|>"


def test_trainer_logprob_rows_of_the_wrong_length_are_caught_too(tokenizers) -> None:
    rollout, _ = tokenizers
    records = [record(rollout), record(rollout)]
    rows = [[-0.1] * len(records[0].completion_ids), [-0.1] * (len(records[1].completion_ids) + 1)]
    audit = audit_batch(records, rollout, trainer_logprobs=rows)
    [sample] = audit["samples"]
    assert sample["index"] == 1 and sample["n_trainer_logprobs"] == len(records[1].completion_ids) + 1
    # A padded [batch, T] array says nothing about per-sample lengths: not a mismatch.
    numpy = pytest.importorskip("numpy")
    assert audit_batch(records, rollout, trainer_logprobs=numpy.zeros((2, 50)))["counts"]["length_mismatch"] == 0


def test_a_rerender_that_drops_think_shows_the_first_mismatch_with_both_sides_tokens(tokenizers) -> None:
    rollout, trainer = tokenizers
    sample_record = record(rollout, CONVERSATION)
    audit = audit_batch([record(rollout), sample_record], trainer, window=3)
    assert audit["counts"]["rerender_checked"] == 2 and audit["counts"]["rerender_mismatch"] == 1
    [sample] = audit["samples"]
    [window] = sample["windows"]
    rollout_ids, trainer_ids = sample_record.prompt_ids, render(trainer, CONVERSATION)
    at = next(i for i, (a, b) in enumerate(zip(rollout_ids, trainer_ids)) if a != b)
    assert sample["rerender_first_diff"] == window["at"] == at
    assert (sample["prompt_len"], sample["rendered_len"]) == (len(rollout_ids), len(trainer_ids))
    assert window["kind"] == "rerender" and window["start"] == at - 3
    assert window["rollout"][3] == "<think>"  # what the rollout sampled from
    assert "<think>" not in window["trainer"]  # what the trainer scores
    assert len(window["rollout"]) == len(window["trainer"]) == 7  # 3 before, the mismatch, 3 after


def test_finish_reasons_eos_length_and_another_stop(tokenizers) -> None:
    rollout, _ = tokenizers
    records = [
        record(rollout, eos=True, finish="stop"),
        record(rollout, eos=False, finish="length"),
        record(rollout, eos=False, finish="stop"),  # a stop id the trainer does not count as eos
        record(rollout, eos=False, finish="stop_string"),  # the vLLM adapter's stop string
        record(rollout, eos=False, finish=None),
    ]
    audit = audit_batch(records, rollout)
    counts = audit["counts"]
    assert (counts["finish_eos"], counts["finish_length"], counts["finish_stop"], counts["finish_unknown"]) == (1, 1, 2, 1)
    # A cut is worth showing; clean samples are not.
    assert [(s["index"], s["finish"], s["windows"]) for s in audit["samples"]] == [(1, "length", [])]


def test_bounded_to_top_k_worst_first_and_clean_batches_send_no_samples(tokenizers) -> None:
    rollout, trainer = tokenizers
    records = [record(rollout, eos=False, finish="length") for _ in range(10)]
    records += [record(rollout, CONVERSATION) for _ in range(10)]
    records += [record(rollout, logprobs_delta=1) for _ in range(10)]
    audit = audit_batch(records, trainer, top_k=4)
    assert audit["counts"]["samples"] == 30 and len(audit["samples"]) == 4
    assert all(s["length_mismatch"] for s in audit["samples"])  # the worst kind first
    assert audit_batch(records, trainer, top_k=10_000)["samples"].__len__() == 30  # <= AUDIT_MAX_SAMPLES
    assert audit_batch([record(rollout) for _ in range(5)], rollout)["samples"] == []


def test_token_strings_are_raw_text_cut_to_the_contract_length(tmp_path) -> None:
    from transformers import AutoTokenizer

    long_token = "<" + "a" * 100 + ">"
    tok = AutoTokenizer.from_pretrained(build_chatml_tokenizer(tmp_path, extra_special_tokens=(long_token,)))
    shifted = record(tok, answer="<script>" + long_token, logprobs_delta=-1)
    [sample] = audit_batch([shifted], tok, window=contract.AUDIT_MAX_WINDOW)["samples"]
    tokens = sample["windows"][0]["rollout"]
    assert "<script>" in "".join(tokens)  # the hooks send text as it is; the dashboard shows it as text
    assert long_token[:contract.AUDIT_MAX_TOKEN_CHARS - 1] + "…" in tokens
    assert all(len(t) <= contract.AUDIT_MAX_TOKEN_CHARS for t in tokens)
