"""Which sample_audit causes fire, from a run's latest audited batches (backend/detect/audits.py):
table-driven, pure."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from paritywatch.backend.detect.audits import detail_of, findings, title_of


def batch(id_: int, length: int = 0, rerender: int = 0, samples: int = 64):  # noqa: ANN202
    return SimpleNamespace(id=id_, step=id_ * 10, samples=samples, length_mismatches=length, rerender_mismatches=rerender)


@pytest.mark.parametrize("recent, expected", [
    ([], {"length_parity": None, "rerender": None}),
    ([batch(3), batch(2), batch(1)], {"length_parity": None, "rerender": None}),
    # the newest failing batch is named; the window counts every failing one
    ([batch(3), batch(2, length=1), batch(1, length=5, rerender=2)],
     {"length_parity": (2, 1, 2), "rerender": (1, 2, 1)}),
    ([batch(3, rerender=64)], {"length_parity": None, "rerender": (3, 64, 1)}),
])
def test_findings_per_cause(recent, expected) -> None:
    got = {cause: None if f is None else (f.audit_id, f.failing, f.failing_batches) for cause, f in findings(recent).items()}
    assert got == expected


def test_title_says_what_and_detail_says_why_and_what_to_do() -> None:
    finding = findings([batch(4, length=3)])["length_parity"]
    example = SimpleNamespace(sample_index=7, n_ids=64, n_rollout_logprobs=63, n_trainer_logprobs=None,
                              rerender_first_diff=None, windows=[])
    assert title_of(finding, example) == ("log-probs misaligned with token ids in 3 of 64 samples, batch at step 40 "
                                          "(e.g. 63 rollout log-probs for 64 ids)")
    detail = detail_of(finding, example, clear_batches=10)
    assert detail["cause"] == "length_parity" and "wrong tokens" in detail["why"] and detail["action"]
    assert detail["example"]["sample_index"] == 7 and detail["resolves_after"].startswith("10 audited batches")
    rerender = findings([batch(5, rerender=1)])["rerender"]
    assert title_of(rerender, SimpleNamespace(rerender_first_diff=19)).endswith("(first at prompt token 19)")
