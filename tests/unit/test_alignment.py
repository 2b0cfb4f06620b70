"""Alignment metrics: hand-computed values, masks, and token checks on a real (offline-trained) tokenizer."""

from __future__ import annotations

import json
import math
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.tokenizers import CUSTOM_TEMPLATE, build_chatml_tokenizer
from trainer_hooks.alignment import RolloutRecord, compute_alignment_metrics

ROOT = Path(__file__).resolve().parents[2]

# Same vocab, another role separator: ": " instead of "\n".
OTHER_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}: {{ m['content'] }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant: {% endif %}"
)
MESSAGES = [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "user", "content": "Say hello to the lazy dog."}],
]


@pytest.fixture(scope="module")
def make_tokenizer(tmp_path_factory):
    """ChatML tokenizer (byte-level BPE trained offline) loaded back with AutoTokenizer, template of choice."""
    from transformers import AutoTokenizer

    def make(**options):
        return AutoTokenizer.from_pretrained(build_chatml_tokenizer(tmp_path_factory.mktemp("tok"), **options))

    return make


@pytest.fixture(scope="module")
def tokenizer(make_tokenizer):
    return make_tokenizer()


def render(tok, messages) -> list[int]:
    return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]


def consistent_records(tok) -> list[RolloutRecord]:
    """Records exactly as a rollout worker using the trainer's own processor would produce them."""
    records = []
    for messages, answer in zip(MESSAGES, ["4", "hello, dog"]):
        completion = tok.encode(answer, add_special_tokens=False) + [tok.eos_token_id]
        records.append(
            RolloutRecord(
                messages=messages,
                prompt_ids=render(tok, messages),
                completion_ids=completion,
                completion_text=tok.decode(completion, skip_special_tokens=True),
                finish_reason="stop",
                policy_version=3,
            )
        )
    return records


# ------------------------------------------------------------------ numeric metrics, by hand

# Two sequences of 3 tokens. Token ratios r = p_train / p_rollout = [1, 2, 0.5] and [4, 1, 1].
P_ROLL = [[0.5, 0.25, 0.5], [0.1, 0.2, 0.4]]
P_TRAIN = [[0.5, 0.5, 0.25], [0.4, 0.2, 0.4]]
LN2 = math.log(2)
EXPECTED = {
    "align/logprob_abs_diff_mean": (LN2 + LN2 + 2 * LN2) / 6,
    "align/logprob_abs_diff_max": 2 * LN2,
    "align/prob_abs_diff_mean": (0.25 + 0.25 + 0.3) / 6,
    "align/prob_abs_diff_max": 0.3,
    "align/kl_k1": -(2 * LN2) / 6,  # mean(lp_rollout - lp_train)
    # r - log r - 1 per token: 0, 1 - ln2, ln2 - 0.5, 3 - 2 ln2, 0, 0
    "align/kl_k3": (3.5 - 2 * LN2) / 6,
    "align/is_ratio_mean": 9.5 / 6,
    "align/is_ratio_max": 4.0,
    "align/is_ratio_min": 0.5,
    "align/is_ratio_clip_frac": 1 / 6,  # only r = 4 exceeds C = 2; r = 2 sits on the threshold
    "align/seq_is_ratio_geo_mean": (1.0 + 4 ** (1 / 3)) / 2,  # (1*2*0.5)^(1/3) = 1, (4*1*1)^(1/3)
    "align/is_ess": 9.5 ** 2 / (6 * 23.25),  # (sum r)^2 / (n sum r^2): sum r^2 = 1 + 4 + 0.25 + 16 + 1 + 1
    "align/is_masked_frac": 0.0,  # every ratio inside IcePop's [0.5, 5]
}


def logs(rows):
    return [[math.log(p) for p in row] for row in rows]


def hand_records(**extra) -> list[RolloutRecord]:
    return [
        RolloutRecord(prompt_ids=[1], completion_ids=[5, 6, 7], rollout_logprobs=lp, **extra)
        for lp in logs(P_ROLL)
    ]


def assert_close(metrics, expected):
    for name, value in expected.items():
        assert metrics[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_hand_computed_logprob_metrics(backend):
    metrics = compute_alignment_metrics(hand_records(), trainer_logprobs=logs(P_TRAIN), backend=backend)
    assert_close(metrics, EXPECTED)
    assert all(isinstance(v, float) for v in metrics.values())


def test_dense_torch_trainer_logprobs_pick_torch_and_match():
    torch = pytest.importorskip("torch")
    dense = torch.tensor(logs(P_TRAIN) + [[0.0] * 3], dtype=torch.float32)[:2]
    metrics = compute_alignment_metrics(hand_records(), trainer_logprobs=dense)
    # float32 input: close, not bit-exact (a ratio of exactly 0.5, on IcePop's band edge, may round under it)
    for name, value in EXPECTED.items():
        if name == "align/is_masked_frac":
            continue
        assert metrics[name] == pytest.approx(value, rel=1e-6), name


def test_trainer_logprobs_that_require_grad_are_read_not_differentiated():
    torch = pytest.importorskip("torch")
    dense = torch.tensor(logs(P_TRAIN), dtype=torch.float64, requires_grad=True)
    metrics = compute_alignment_metrics(hand_records(), trainer_logprobs=dense)
    assert_close(metrics, EXPECTED)
    assert dense.grad is None


def test_dense_numpy_trainer_logprobs_wider_than_completions():
    np = pytest.importorskip("numpy")
    dense = np.full((2, 5), -0.1)
    dense[:, :3] = logs(P_TRAIN)
    metrics = compute_alignment_metrics(hand_records(), trainer_logprobs=dense)
    assert_close(metrics, EXPECTED)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_masked_and_non_finite_tokens_are_ignored(backend):
    records = hand_records()
    # A 4th token that is masked out (a tool output), with wildly different log-probs.
    records[0].completion_ids.append(8)
    records[0].rollout_logprobs.append(-30.0)
    records[0].completion_mask = [1, 1, 1, 0]
    # A 4th token on the other row whose rollout log-prob is missing (NaN): not a token to average in.
    records[1].completion_ids.append(9)
    records[1].rollout_logprobs.append(float("nan"))
    trainer = [row + [-0.01] for row in logs(P_TRAIN)]
    metrics = compute_alignment_metrics(records, trainer_logprobs=trainer, backend=backend)
    assert_close(metrics, EXPECTED)


def test_clip_threshold_is_configurable():
    metrics = compute_alignment_metrics(hand_records(), trainer_logprobs=logs(P_TRAIN), is_clip=1.5)
    assert metrics["align/is_ratio_clip_frac"] == pytest.approx(2 / 6)  # r = 2 and r = 4


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_pearson_sees_a_corrupted_log_prob_transport_that_k1_misses(backend):
    """ai-dynamo/dynamo#11640's shape: the rollout's log-probs arrive misassigned to their tokens
    (here: each sequence's log-probs in another order). Their mean barely moves (k1 stays small),
    their correlation with the trainer's collapses and k3 grows; a healthy twin with bf16-sized
    noise keeps Pearson at ~0.999."""
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    trainer = np.log(rng.dirichlet(np.full(50, 0.3), size=(16, 64)).max(axis=-1))  # sampled-token log-probs
    healthy = trainer + rng.normal(0, 0.02, trainer.shape)
    corrupted = np.stack([rng.permutation(row) for row in healthy])

    def metrics(rollout):
        records = [RolloutRecord(prompt_ids=[1], completion_ids=list(range(64)), rollout_logprobs=row.tolist())
                   for row in rollout]
        return compute_alignment_metrics(records, trainer_logprobs=trainer, backend=backend)

    good, bad = metrics(healthy), metrics(corrupted)
    assert good["align/logprob_pearson"] == pytest.approx(np.corrcoef(trainer.ravel(), healthy.ravel())[0, 1])
    assert good["align/logprob_pearson"] > 0.99
    assert bad["align/logprob_pearson"] < 0.5 and abs(bad["align/kl_k1"]) < 0.01  # k1 looks plausible
    assert bad["align/kl_k3"] > 50 * good["align/kl_k3"]


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_pearson_ignores_unscored_tokens_a_nan_log_prob_or_a_masked_tool_output(backend):
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(5)
    trainer = np.log(rng.uniform(0.05, 1.0, (2, 40)))
    rollout = trainer + rng.normal(0, 0.01, trainer.shape)
    clean = [RolloutRecord(prompt_ids=[1], completion_ids=list(range(40)), rollout_logprobs=row.tolist())
             for row in rollout]
    expected = compute_alignment_metrics(clean, trainer_logprobs=trainer, backend=backend)["align/logprob_pearson"]
    dirty = [RolloutRecord(prompt_ids=[1], completion_ids=list(range(42)),
                           rollout_logprobs=row.tolist() + [float("nan"), -30.0], completion_mask=[1] * 41 + [0])
             for row in rollout]
    wide = np.concatenate([trainer, np.full((2, 2), -0.5)], axis=1)
    got = compute_alignment_metrics(dirty, trainer_logprobs=wide, backend=backend)["align/logprob_pearson"]
    assert got == pytest.approx(expected) and got > 0.99


def test_pearson_is_left_out_for_a_constant_side_or_too_few_tokens():
    records = [RolloutRecord(prompt_ids=[1], completion_ids=list(range(20)), rollout_logprobs=[-1.0] * 20)]
    assert "align/logprob_pearson" not in compute_alignment_metrics(records, trainer_logprobs=[[-0.5] * 20])
    assert "align/logprob_pearson" not in compute_alignment_metrics(hand_records(), trainer_logprobs=logs(P_TRAIN))


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_a_temperature_mismatch_shows_in_the_ess_and_the_tokens_a_mask_would_drop(backend):
    """The rollout samples at T=0.6 while the trainer scores at T=1 (huggingface/trl#4159): the
    effective sample size falls and a token mask at IcePop's band would drop a good share of the
    tokens, which is what hides the mismatch; the same temperature on both sides is a clean batch."""
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 1, size=(32, 48, 200))

    def log_softmax(x):
        x = x - x.max(axis=-1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))

    cold = log_softmax(logits / 0.6)
    tokens = np.array([[rng.choice(200, p=np.exp(row)) for row in seq] for seq in cold])
    take = lambda lp: np.take_along_axis(lp, tokens[..., None], axis=-1)[..., 0]  # noqa: E731
    records = [RolloutRecord(prompt_ids=[1], completion_ids=t.tolist(), rollout_logprobs=lp.tolist())
               for t, lp in zip(tokens, take(cold))]
    mismatched = compute_alignment_metrics(records, trainer_logprobs=take(log_softmax(logits)), backend=backend)
    matched = compute_alignment_metrics(records, trainer_logprobs=take(cold) + rng.normal(0, 0.01, tokens.shape),
                                        backend=backend)
    assert mismatched["align/is_masked_frac"] > 0.1 and matched["align/is_masked_frac"] == 0.0
    assert mismatched["align/is_ess"] < 0.7 and matched["align/is_ess"] > 0.99
    assert 0.5 < matched["align/is_ratio_mean"] < 2


def test_uncomputable_metrics_are_omitted_never_nan():
    records = [RolloutRecord(prompt_ids=[1], completion_ids=[5, 6])]  # no log-probs, no messages
    metrics = compute_alignment_metrics(records, trainer_logprobs=[[-1.0, -1.0]])
    assert metrics == {}
    all_masked = hand_records()
    for r in all_masked:
        r.completion_mask = [0, 0, 0]
    assert compute_alignment_metrics(all_masked, trainer_logprobs=logs(P_TRAIN)) == {}


def test_huge_log_ratio_stays_finite():
    records = [RolloutRecord(prompt_ids=[1], completion_ids=[5], rollout_logprobs=[-500.0])]
    metrics = compute_alignment_metrics(records, trainer_logprobs=[[-0.001]])
    assert all(math.isfinite(v) for v in metrics.values())


def test_trainer_rows_must_match_records():
    with pytest.raises(ValueError, match="3 rows for 2 records"):
        compute_alignment_metrics(hand_records(), trainer_logprobs=logs(P_TRAIN) + [[0.0]])


def test_staleness():
    records = hand_records()
    records[0].policy_version, records[1].policy_version = 7, 4
    metrics = compute_alignment_metrics(records, trainer_policy_version=9)
    assert metrics == {"rollout/staleness_mean": 3.5, "rollout/staleness_max": 5.0}


# ------------------------------------------------------------------ the vectorised metrics against a plain reference


def awkward_batch():
    """Rows of every shape the padding and masking must get right: masks with holes (0/1 and bools,
    one shorter than its row), NaN and -inf on either side, ragged lengths, a log-ratio past the
    clamp, and rows that score nothing (no log-probs, no tokens, all masked, no trainer row)."""
    rng = random.Random(7)
    lp = lambda n: [math.log(rng.uniform(0.02, 1.0)) for _ in range(n)]  # noqa: E731
    rows = []  # (record, trainer row or None)
    roll, train = lp(40), lp(40)
    roll[3], train[9] = float("nan"), -math.inf
    mask = [1] * 40
    mask[10:16] = [0] * 6
    rows.append((RolloutRecord(prompt_ids=[1], completion_ids=list(range(40)), rollout_logprobs=roll,
                               completion_mask=mask), train))
    rows.append((RolloutRecord(prompt_ids=[1], completion_ids=list(range(7)), rollout_logprobs=lp(9)), lp(12)))
    rows.append((RolloutRecord(prompt_ids=[1], completion_ids=list(range(5))), lp(5)))
    rows.append((RolloutRecord(prompt_ids=[1], completion_ids=[], rollout_logprobs=[]), []))
    rows.append((RolloutRecord(prompt_ids=[1], completion_ids=[1, 2, 3], rollout_logprobs=lp(3),
                               completion_mask=[0, 0, 0]), lp(3)))
    rows.append((RolloutRecord(prompt_ids=[1], completion_ids=list(range(6)), rollout_logprobs=lp(6)), None))
    huge = lp(30)
    huge[0], huge[1] = -60.0, -math.inf  # log-ratio ~ +60: clamped to 20
    rows.append((RolloutRecord(prompt_ids=[1], completion_ids=list(range(30)), rollout_logprobs=huge,
                               completion_mask=[True, False] * 10), lp(30)))
    rows.append((RolloutRecord(prompt_ids=[1], completion_ids=list(range(25)), rollout_logprobs=lp(25)), lp(25)))
    return [r for r, _ in rows], [t for _, t in rows]


def reference_metrics(records, trainer_rows, is_clip=2.0):
    """The log-prob metrics token by token in plain Python, straight from their definitions."""
    tokens = []  # (sequence, trainer log-prob, rollout log-prob) of every scored token
    for seq, (record, train) in enumerate(zip(records, trainer_rows)):
        if record.rollout_logprobs is None or train is None:
            continue
        mask = record.completion_mask or [1] * len(record.completion_ids)
        for _, r, t, keep in zip(record.completion_ids, record.rollout_logprobs, train, mask):
            if keep and math.isfinite(r) and math.isfinite(t):
                tokens.append((seq, t, r))
    n = len(tokens)
    log_ratio = [min(max(t - r, -20.0), 20.0) for _, t, r in tokens]
    ratio = [math.exp(x) for x in log_ratio]
    prob_diff = [abs(math.exp(t) - math.exp(r)) for _, t, r in tokens]
    per_seq = {}
    for (seq, _, _), x in zip(tokens, log_ratio):
        per_seq.setdefault(seq, []).append(x)
    return {
        "align/logprob_abs_diff_mean": sum(abs(x) for x in log_ratio) / n,
        "align/logprob_abs_diff_max": max(abs(x) for x in log_ratio),
        "align/prob_abs_diff_mean": sum(prob_diff) / n,
        "align/prob_abs_diff_max": max(prob_diff),
        "align/kl_k1": -sum(log_ratio) / n,
        "align/kl_k3": sum(w - x - 1 for w, x in zip(ratio, log_ratio)) / n,
        "align/is_ratio_mean": sum(ratio) / n,
        "align/is_ess": sum(ratio) ** 2 / (n * sum(w * w for w in ratio)),
        "align/is_masked_frac": sum(w < 0.5 or w > 5.0 for w in ratio) / n,
        "align/is_ratio_max": max(ratio),
        "align/is_ratio_min": min(ratio),
        "align/is_ratio_clip_frac": sum(w > is_clip for w in ratio) / n,
        "align/seq_is_ratio_geo_mean": statistics.fmean(math.exp(statistics.fmean(xs)) for xs in per_seq.values()),
        "align/logprob_pearson": statistics.correlation([t for _, t, _ in tokens], [r for _, _, r in tokens]),
    }


def dense(trainer_rows, width=45):
    """The trainer's rows as one [B, width] array, -0.5 where a row has no value."""
    return [(row or [])[:width] + [-0.5] * (width - len((row or [])[:width])) for row in trainer_rows]


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("form", ["rows", "numpy array", "torch tensor"])
def test_vectorised_metrics_match_a_token_by_token_reference(backend, form):
    np = pytest.importorskip("numpy")
    records, trainer_rows = awkward_batch()
    if form == "rows":
        trainer = trainer_rows
    else:
        trainer_rows = dense(trainer_rows)
        trainer = np.array(trainer_rows)
        if form == "torch tensor":
            trainer = pytest.importorskip("torch").from_numpy(trainer)
    expected = reference_metrics(records, trainer_rows, is_clip=1.5)
    assert expected["align/logprob_abs_diff_max"] == 20.0  # the clamp is exercised
    got = compute_alignment_metrics(records, trainer_logprobs=trainer, is_clip=1.5, backend=backend)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name


# ------------------------------------------------------------------ token checks on a real tokenizer


def test_identical_processors_report_zero_mismatch(tokenizer):
    metrics = compute_alignment_metrics(consistent_records(tokenizer), tokenizer, trainer_policy_version=3)
    assert metrics == {
        "align/prompt_rerender_mismatch_frac": 0.0,
        "align/decode_mismatch_frac": 0.0,
        "align/out_of_vocab_frac": 0.0,
        "align/eos_disagreement_frac": 0.0,
        "align/truncated_frac": 0.0,
        "rollout/staleness_mean": 0.0,
        "rollout/staleness_max": 0.0,
    }


def test_prompt_rendered_with_another_template_is_caught(tokenizer, make_tokenizer):
    rollout_tok = make_tokenizer(chat_template=OTHER_TEMPLATE)
    records = consistent_records(tokenizer)
    for record in records:
        record.prompt_ids = render(rollout_tok, record.messages)
    metrics = compute_alignment_metrics(records, tokenizer)
    assert metrics["align/prompt_rerender_mismatch_frac"] == 1.0
    # Both renders agree on "<|im_start|>" + the first role, then "\n" vs ":" differ.
    first_roles = [m[0]["role"] for m in MESSAGES]
    expected = [len(tokenizer.encode("<|im_start|>" + role, add_special_tokens=False)) for role in first_roles]
    assert metrics["align/prompt_first_diff_pos_mean"] == pytest.approx(sum(expected) / len(expected))
    # The completions are untouched: token-in/token-out metrics stay clean.
    assert metrics["align/decode_mismatch_frac"] == 0.0


def test_trl_5498_shape_default_template_on_the_rollout(make_tokenizer):
    """Trainer: a custom template (default system prompt, think tag). Rollout: the default ChatML."""
    trainer_tok, rollout_tok = make_tokenizer(chat_template=CUSTOM_TEMPLATE), make_tokenizer()
    records = consistent_records(rollout_tok)
    metrics = compute_alignment_metrics(records, trainer_tok)
    assert metrics["align/prompt_rerender_mismatch_frac"] == 1.0
    # With a system message the renders agree until the trainer's "<think>": the rollout prompt is a
    # prefix. Without one they part right after "<|im_start|>" (system vs user).
    expected = [len(records[0].prompt_ids), 1]
    assert metrics["align/prompt_first_diff_pos_mean"] == pytest.approx(sum(expected) / 2)


def test_prompt_that_is_a_truncated_render_differs_at_its_end(tokenizer):
    records = consistent_records(tokenizer)[:1]
    full = records[0].prompt_ids
    records[0].prompt_ids = full[:-2]  # e.g. a rollout that forgot add_generation_prompt
    metrics = compute_alignment_metrics(records, tokenizer)
    assert metrics["align/prompt_rerender_mismatch_frac"] == 1.0
    assert metrics["align/prompt_first_diff_pos_mean"] == len(full) - 2


def test_repeated_prompts_are_rendered_once(tokenizer):
    calls = []

    class CountingProcessor:
        def __init__(self, tok):
            self._tok = tok

        def apply_chat_template(self, *args, **kwargs):
            calls.append(1)
            return self._tok.apply_chat_template(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(self._tok, name)

    group = consistent_records(tokenizer)[:1] * 8  # one GRPO group: 8 generations of one prompt
    metrics = compute_alignment_metrics(group, CountingProcessor(tokenizer))
    assert metrics["align/prompt_rerender_mismatch_frac"] == 0.0
    assert len(calls) == 1


def test_out_of_vocab_ids_are_counted_among_sampled_tokens(tokenizer):
    records = consistent_records(tokenizer)
    vocab = len(tokenizer)
    records[0].completion_ids = [10, vocab, vocab + 5, 11]  # two ids past the vocab (padded embedding rows)
    records[0].completion_mask = [1, 1, 0, 1]  # the masked one is not a sampled token
    records[1].completion_ids = [12, 13, 14, tokenizer.eos_token_id]
    metrics = compute_alignment_metrics(records, tokenizer)
    assert metrics["align/out_of_vocab_frac"] == pytest.approx(1 / 7)
    assert metrics["align/decode_mismatch_frac"] > 0  # the rollout text was of other ids


def test_decode_mismatch_with_a_rollout_decoder(tokenizer, make_tokenizer):
    records = consistent_records(tokenizer)
    twin = make_tokenizer()  # built separately, identical
    other = make_tokenizer()
    other.backend_tokenizer.decoder = None  # no byte-level decoder: "he ll o , Ġd og" instead of "hello, dog"
    records[0].completion_ids = records[0].completion_ids[:1]  # "4": one token decodes the same either way
    same = compute_alignment_metrics(records, tokenizer, rollout_decode=twin.decode)
    differ = compute_alignment_metrics(records, tokenizer, rollout_decode=other.decode)
    assert same["align/decode_mismatch_frac"] == 0.0
    assert differ["align/decode_mismatch_frac"] == 0.5


def test_eos_disagreement_from_explicit_eos_ids(tokenizer):
    records = consistent_records(tokenizer)
    endoftext = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    records[1].completion_ids[-1] = endoftext  # the rollout stopped on an id the trainer does not call eos
    metrics = compute_alignment_metrics(
        records, tokenizer, rollout_eos_ids=[tokenizer.eos_token_id, endoftext]
    )
    assert metrics["align/eos_disagreement_frac"] == 0.5


def test_eos_disagreement_from_finish_reason(tokenizer):
    records = consistent_records(tokenizer)
    records[0].finish_reason = "length"  # ran out of tokens on what the trainer calls eos
    records[1].finish_reason = None  # unknown: not counted
    metrics = compute_alignment_metrics(records, tokenizer)
    assert metrics["align/eos_disagreement_frac"] == 1.0


def test_rerender_failure_is_skipped_not_raised(tokenizer, make_tokenizer):
    broken = make_tokenizer(chat_template="{{ raise_exception('no') }}")
    metrics = compute_alignment_metrics(consistent_records(tokenizer), broken)
    assert "align/prompt_rerender_mismatch_frac" not in metrics
    assert metrics["align/decode_mismatch_frac"] == 0.0


def test_imports_and_runs_without_numpy_or_torch():
    script = """
import json, sys
sys.modules["numpy"] = None; sys.modules["torch"] = None  # make both imports fail
from trainer_hooks.alignment import RolloutRecord, compute_alignment_metrics
r = RolloutRecord(prompt_ids=[1], completion_ids=[2], rollout_logprobs=[-1.0], policy_version=1)
print(json.dumps(compute_alignment_metrics([r], trainer_logprobs=[[-1.0]], trainer_policy_version=2)))
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == {"rollout/staleness_mean": 1.0, "rollout/staleness_max": 1.0}


def test_torch_without_numpy_matches_hand_values():
    pytest.importorskip("torch")
    script = """
import json, sys
sys.modules["numpy"] = None  # torch alone: the list-to-tensor fallback
from trainer_hooks.alignment import RolloutRecord, compute_alignment_metrics
records = [RolloutRecord(prompt_ids=[1], completion_ids=[5, 6, 7], rollout_logprobs=lp, completion_mask=[1, 1, 1])
           for lp in json.loads(sys.argv[1])]
print(json.dumps(compute_alignment_metrics(records, trainer_logprobs=json.loads(sys.argv[2]))))
"""
    argv = [json.dumps(logs(P_ROLL)), json.dumps(logs(P_TRAIN))]
    out = subprocess.run([sys.executable, "-c", script, *argv], cwd=ROOT, capture_output=True, text=True, check=True)
    assert_close(json.loads(out.stdout.strip().splitlines()[-1]), EXPECTED)
