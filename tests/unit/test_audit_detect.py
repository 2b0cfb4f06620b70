"""Which sample_audit causes fire, from a run's latest audited batches (backend/detect/audits.py):
table-driven, pure."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from paritywatch.backend.detect.audits import CAUSES, detail_of, example_of, findings, title_of

NONE = {cause: None for cause in CAUSES}


def batch(id_: int, samples: int = 64, **counts: int):
    return SimpleNamespace(id=id_, step=id_ * 10, samples=samples, counts={"samples": samples, **counts})


def sample(**fields):
    base = dict(sample_index=0, n_ids=64, n_rollout_logprobs=None, n_trainer_logprobs=None, length_mismatch=False,
                rerender_first_diff=None, n_trainer_ids=None, ids_mismatch=None, ids_first_diff=None, truncated=False,
                finish_lost=False, eos_ignored_at=None, images_mismatch=None, rollout_images=None,
                trainer_images=None, windows=[])
    return SimpleNamespace(**{**base, **fields})


@pytest.mark.parametrize("recent, expected", [
    ([], NONE),
    ([batch(3), batch(2), batch(1)], NONE),
    # the newest failing batch is named; the window counts every failing one
    ([batch(3), batch(2, length_mismatch=1), batch(1, length_mismatch=5, rerender_mismatch=2)],
     {**NONE, "length_parity": (2, 1, 2), "rerender": (1, 2, 1)}),
    ([batch(3, rerender_mismatch=64)], {**NONE, "rerender": (3, 64, 1)}),
    # each new cause reads its own count; a count the batch lacks (an older hook) is 0
    ([batch(5, ids_mismatch=2, truncated=1), batch(4, finish_lost=3, eos_ignored=1, images_mismatch=4)],
     {**NONE, "token_identity": (5, 2, 1), "truncation": (5, 1, 1), "finish_lost": (4, 3, 1),
      "eos_ignored": (4, 1, 1), "image_features": (4, 4, 1)}),
])
def test_findings_per_cause(recent, expected) -> None:
    got = {cause: None if f is None else (f.audit_id, f.failing, f.failing_batches) for cause, f in findings(recent).items()}
    assert got == expected


def test_title_says_what_and_detail_says_why_and_what_to_do() -> None:
    finding = findings([batch(4, length_mismatch=3)])["length_parity"]
    example = sample(sample_index=7, n_rollout_logprobs=63)
    assert title_of(finding, example) == ("log-probs misaligned with token ids in 3 of 64 samples, batch at step 40 "
                                          "(e.g. 63 rollout log-probs for 64 ids)")
    detail = detail_of(finding, example, clear_batches=10)
    assert detail["cause"] == "length_parity" and "wrong tokens" in detail["why"] and detail["action"]
    assert detail["example"]["sample_index"] == 7 and detail["resolves_after"].startswith("10 audited batches")
    rerender = findings([batch(5, rerender_mismatch=1)])["rerender"]
    assert title_of(rerender, sample(rerender_first_diff=19)).endswith("(first at prompt token 19)")


@pytest.mark.parametrize("cause, count, example, says, severity", [
    ("token_identity", "ids_mismatch", sample(ids_mismatch=True, ids_first_diff=12), "(first at completion token 12)",
     "error"),
    ("truncation", "truncated", sample(truncated=True, n_trainer_ids=48), "(48 of 64 sampled ids)", "warning"),
    ("finish_lost", "finish_lost", sample(finish_lost=True), "end without eos", "warning"),
    ("eos_ignored", "eos_ignored", sample(eos_ignored_at=30), "(eos at completion token 30)", "error"),
    ("image_features", "images_mismatch",
     sample(images_mismatch=True, rollout_images={"images": 1, "grid": [[1, 4, 4]], "image_tokens": 4},
            trainer_images={"images": 0, "grid": [], "image_tokens": 0}),
     "(rollout 1 image 1x4x4, 4 image tokens; trainer no image features)", "error"),
])
def test_every_new_cause_names_its_example_says_why_with_its_source_and_where_to_look(cause, count, example, says,
                                                                                     severity) -> None:
    finding = findings([batch(9, **{count: 2})])[cause]
    # the worst sample *of this cause* is the example, not the batch's worst overall
    chosen = example_of([sample(length_mismatch=True), example], cause)
    assert chosen is example and example_of([sample(length_mismatch=True)], cause) is None
    title = title_of(finding, chosen)
    assert "2 of 64 samples" in title and says in title and "step 90" in title
    detail = detail_of(finding, chosen, clear_batches=10)
    assert CAUSES[cause].severity == severity and detail["cause"] == cause
    assert "#" in detail["why"] and len(detail["action"]) > 40  # a public report, and where to look
