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
    # No finish reason and no eos at the end: it may have been cut unseen (worse than a cut the engine
    # reported); a cut is worth showing; clean samples are not.
    assert counts["finish_lost"] == 1
    assert [(s["index"], s["finish"], s["finish_lost"], s["windows"]) for s in audit["samples"]] == [
        (4, "unknown", True, []), (1, "length", False, [])]


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


# ------------------------------------------------------------------ token identity, truncation, eos, images

def sampled(tok, text: str, *, split: str | None = None, eos: int | None = None) -> list[int]:
    """Ids as an engine may sample them: `split` spelled one character per token (a valid but
    non-canonical tokenization, which decode -> encode merges back), then an optional eos."""
    ids = []
    for part in ([text] if split is None else text.partition(split)):
        if part == split and split:
            ids += [i for ch in part for i in tok.encode(ch, add_special_tokens=False)]
        elif part:
            ids += tok.encode(part, add_special_tokens=False)
    return ids + ([eos] if eos is not None else [])


def identity_record(tok, ids: list[int], *, digest: bool = True, **fields) -> RolloutRecord:
    messages = [{"role": "user", "content": "What is 3 + 3?"}]
    return RolloutRecord(messages=messages, prompt_ids=render(tok, messages), completion_ids=list(ids),
                         rollout_logprobs=[-0.5] * len(ids), finish_reason=fields.pop("finish", "stop"),
                         completion_ids_digest=contract.token_ids_digest(ids) if digest else None, **fields)


def test_trained_ids_that_post_processing_re_tokenized_are_caught_where_they_part(tokenizers) -> None:
    rollout, _ = tokenizers
    ids = sampled(rollout, "It is 6.", split="6.", eos=rollout.eos_token_id)
    # The trainer decodes the completion and tokenizes the text again (huggingface/trl#7039's shape)
    retokenized = rollout.encode(rollout.decode(ids), add_special_tokens=False)
    assert retokenized != ids and len(retokenized) < len(ids)
    healthy = identity_record(rollout, ids)
    audit = audit_batch([healthy, identity_record(rollout, ids)], rollout, trainer_ids=[ids, retokenized])
    assert audit["counts"]["ids_checked"] == 2 and audit["counts"]["ids_mismatch"] == 1
    [sample] = audit["samples"]
    at = next(i for i, (a, b) in enumerate(zip(ids, retokenized)) if a != b)
    assert (sample["index"], sample["ids_mismatch"], sample["ids_first_diff"], sample["truncated"]) == (1, True, at, False)
    [window] = sample["windows"]
    assert window["kind"] == "ids" and window["at"] == at
    mark = at - window["start"]
    assert window["rollout"][mark] != window["trainer"][mark]  # the tokens where they part, both sides
    # healthy twin: the trainer trains on the sampled ids, which hash to the sampling-time digest
    clean = audit_batch([healthy], rollout, trainer_ids=[list(ids)])
    assert clean["counts"]["ids_mismatch"] == 0 and clean["samples"] == []


def test_a_digest_taken_where_the_ids_were_sampled_shows_a_record_rewritten_on_the_way(tokenizers) -> None:
    rollout, _ = tokenizers
    ids = sampled(rollout, "It is 6.", eos=rollout.eos_token_id)
    stripped = identity_record(rollout, ids)
    stripped.completion_ids = ids[:-1]  # a post-processor dropped the eos after sampling
    stripped.rollout_logprobs = stripped.rollout_logprobs[:-1]
    audit = audit_batch([stripped, identity_record(rollout, ids)], rollout)
    assert audit["counts"]["ids_checked"] == 2 and audit["counts"]["ids_mismatch"] == 1
    assert audit["samples"][0]["index"] == 0 and audit["samples"][0]["ids_first_diff"] is None  # only the digest knows


def test_a_prefix_is_a_truncation_unless_only_eos_was_dropped(tokenizers) -> None:
    rollout, _ = tokenizers
    ids = sampled(rollout, "It is 6, and 7 and 8 and 9.", eos=rollout.eos_token_id)
    records = [identity_record(rollout, ids), identity_record(rollout, ids)]
    audit = audit_batch(records, rollout, trainer_ids=[ids[:5], ids[:-1]])
    cut, stripped = sorted(audit["samples"], key=lambda s: s["index"])
    assert (cut["truncated"], cut["ids_mismatch"], cut["n_trainer_ids"]) == (True, False, 5)
    assert cut["windows"][0]["kind"] == "ids" and cut["windows"][0]["at"] == 5
    # dropping the final eos is post-processing that breaks the pairing, not a cut
    assert (stripped["truncated"], stripped["ids_mismatch"], stripped["ids_first_diff"]) == (False, True, len(ids) - 1)
    assert (audit["counts"]["truncated"], audit["counts"]["ids_mismatch"]) == (1, 1)


@pytest.fixture(scope="module")
def two_eos(tmp_path_factory):
    """A Qwen-style model: the tokenizer's eos is <|im_end|>, generation_config lists <|endoftext|> too."""
    from transformers import AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(build_chatml_tokenizer(tmp_path_factory.mktemp("eos")))
    ids = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    return tok, GenerationConfig(eos_token_id=ids), ids[1]


def test_the_full_eos_set_counts_the_generation_configs_second_eos_as_an_end(two_eos) -> None:
    tok, generation_config, endoftext = two_eos
    ended = identity_record(tok, sampled(tok, "It is 6.", eos=endoftext), finish=None)
    assert audit_batch([ended], tok)["samples"][0]["finish_lost"] is True  # the tokenizer's eos alone: looks cut
    full = audit_batch([ended], tok, generation_config=generation_config)
    assert full["counts"]["finish_eos"] == 1 and full["samples"] == []


def test_an_eos_the_rollout_sampled_past_is_caught_unless_what_follows_is_spliced_context(two_eos) -> None:
    tok, generation_config, endoftext = two_eos
    ids = sampled(tok, "It is 6.", eos=endoftext) + sampled(tok, " Also 7.", eos=tok.eos_token_id)
    past = identity_record(tok, ids)
    audit = audit_batch([past], tok, generation_config=generation_config)
    [sample] = audit["samples"]
    at = ids.index(endoftext)
    assert sample["eos_ignored_at"] == at and audit["counts"]["eos_ignored"] == 1
    [window] = sample["windows"]
    assert window["kind"] == "eos" and window["rollout"][at - window["start"]] == "<|endoftext|>"
    # a turn's eos followed by a tool output the worker spliced in (mask 0) is a turn ending
    spliced = identity_record(tok, ids, completion_mask=[1] * (at + 1) + [0] * 3 + [1] * (len(ids) - at - 4))
    assert audit_batch([spliced], tok, generation_config=generation_config)["samples"] == []
    # healthy twin: the engine stopped at the generation config's eos
    stopped = identity_record(tok, ids[:at + 1])
    assert audit_batch([stopped], tok, generation_config=generation_config)["samples"] == []


@pytest.fixture(scope="module")
def qwen2_vl_image_processor():
    from transformers import Qwen2VLImageProcessorPil

    def make(max_pixels: int):
        return Qwen2VLImageProcessorPil(min_pixels=28 * 28 * 4, max_pixels=max_pixels)
    return make


def test_image_features_missing_or_at_another_resolution_on_the_trainer_side(tokenizers, qwen2_vl_image_processor) -> None:
    import numpy as np

    from trainer_hooks.sample_identity import image_features

    rollout, _ = tokenizers
    image = np.random.default_rng(0).integers(0, 256, (96, 120, 3), dtype=np.uint8)
    engine = qwen2_vl_image_processor(28 * 28 * 64)
    seen = image_features(engine(images=[image]))
    assert seen["images"] == 1 and seen["grid"] == [engine(images=[image])["image_grid_thw"][0].tolist()]
    same = image_features(qwen2_vl_image_processor(28 * 28 * 64)(images=[image]))
    smaller = image_features(qwen2_vl_image_processor(28 * 28 * 8)(images=[image]))  # other max_pixels
    none = image_features({"input_ids": [[1, 2, 3]]})  # a training forward without the image features
    assert smaller["grid"] != seen["grid"] and none == {"images": 0, "grid": [], "image_tokens": None}
    records = [identity_record(rollout, [5, rollout.eos_token_id], images=seen) for _ in range(3)]
    audit = audit_batch(records, rollout, trainer_images=[same, smaller, none])
    assert (audit["counts"]["images_checked"], audit["counts"]["images_mismatch"]) == (3, 2)
    by_index = {s["index"]: s for s in audit["samples"]}
    assert set(by_index) == {1, 2} and by_index[2]["trainer_images"]["images"] == 0
    assert by_index[1]["rollout_images"]["grid"] == seen["grid"] and by_index[1]["images_mismatch"] is True
