"""backend/detect/attest.py, pure: verdicts, staleness (lag and grace, time passed in), going
back, and which trainer attestation is the reference."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from paritywatch.backend.detect import attest as attest_logic
from paritywatch.backend.detect.attest import AttestPolicy, check_worker, compare_tensors, reference_for, verdict
from paritywatch.backend.store.attestations import Attested

T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
FULL = ("xxh3_128", "full", 16 << 20, ())
POLICY = AttestPolicy(grace_s=300, max_lag=1)
_ids = iter(range(1, 10_000))


def att(side: str, version: int, digest: str = "d", *, cid: int = 1, at_s: float = 0, status: str = "live",
        backwards_from: int | None = None, settings: tuple = FULL) -> Attested:
    return Attested(next(_ids), cid, side, f"{side}{cid}", status, version, f"{digest}{version}", settings, 3,
                    backwards_from, T0 + timedelta(seconds=at_s))


def kinds(trainers, worker, now_s: float = 0) -> list[str]:
    return [f.kind for f in check_worker(trainers, worker, T0 + timedelta(seconds=now_s), POLICY)]


def test_verdicts():
    ref = att("trainer", 3)
    assert verdict(ref, att("rollout", 3)) == "same"
    assert verdict(ref, att("rollout", 3, "x")) == "differs"
    assert verdict(ref, att("rollout", 3, settings=("xxh3_128", "sampled", 16 << 20, (("chunks", 4),)))) == "incomparable"
    assert verdict(None, att("rollout", 3)) == "pending"


def test_the_lowest_trainer_rank_and_its_latest_attestation_is_the_reference():
    old, rank1, other_rank = att("trainer", 5, "old", cid=1), att("trainer", 5, cid=1), att("trainer", 5, "z", cid=2)
    assert reference_for([other_rank, old, rank1], 5) is rank1
    assert reference_for([rank1], 6) is None


@pytest.mark.parametrize("trainer_versions, worker_version, now_s, stale", [
    ([1, 2], 1, 10, False),     # one version behind, just published: a sync in flight
    ([1, 2, 3], 1, 10, True),   # two behind: more than max_lag
    ([1, 2], 1, 299, False),    # one behind, within the grace
    ([1, 2], 1, 301, True),     # one behind, past the grace
    ([1, 2], 2, 10_000, False),  # up to date, however late
])
def test_staleness(trainer_versions, worker_version, now_s, stale):
    trainers = [att("trainer", v) for v in trainer_versions]
    worker = att("rollout", worker_version, cid=9)
    assert ("weights_stale" in kinds(trainers, worker, now_s)) is stale


def test_closed_and_lost_workers_are_never_stale_and_closed_ones_raise_nothing():
    trainers = [att("trainer", v) for v in (1, 2, 3)]
    assert kinds(trainers, att("rollout", 1, cid=9, status="lost"), 10_000) == []
    assert kinds(trainers, att("rollout", 3, "x", cid=9, status="closed")) == []


def test_going_back_is_an_alert_unless_the_trainer_went_back_too():
    ahead = [att("trainer", 7), att("trainer", 8)]
    assert "weights_backwards" in kinds(ahead, att("rollout", 7, cid=9, backwards_from=8))
    rewound = [att("trainer", 8), att("trainer", 0)]  # resumed from a checkpoint: latest is 0
    assert kinds(rewound, att("rollout", 0, cid=9, backwards_from=8)) == []


def test_compare_tensors_names_differing_missing_and_extra_in_the_trainers_order():
    ref = [{"name": n, "digest": n, "dtype": "bfloat16", "shape": [2]} for n in ("a", "b", "c", "d")]
    worker = [{"name": "d", "digest": "X", "dtype": "float32", "shape": [2]},
              {"name": "b", "digest": "Y", "dtype": "bfloat16", "shape": [2]},
              {"name": "a", "digest": "a", "dtype": "bfloat16", "shape": [2]},
              {"name": "e", "digest": "e", "dtype": "bfloat16", "shape": [2]}]
    diff = compare_tensors(ref, worker)
    assert (diff["differing"], diff["missing"], diff["extra"]) == (["b", "d"], ["c"], ["e"])
    assert diff["shape_or_dtype"] == ["d"] and diff["compared"] == 3


def test_a_weights_mismatch_is_described_by_its_tensors_without_a_database():
    """The alert's texts are the pure module's: the title names the differing tensors and counts the
    rest (here b, missing), the detail lists both and says why it matters, the dedup key is per
    process and kind."""
    trainer, worker = att("trainer", 4), att("rollout", 4, "x", cid=9)
    (finding,) = check_worker([trainer], worker, T0, POLICY)
    ref = [{"name": n, "digest": n, "dtype": "bfloat16", "shape": [2]} for n in ("a", "b", "c")]
    attest_logic.describe_mismatch(finding, ref, [{**ref[0], "digest": "X"}, ref[2]])
    assert finding.title == ("rollout rollout9 holds different weights than the trainer for version 4: a and 1 more")
    assert finding.detail["differing_tensors"] == ["a", "b"] and finding.detail["why"] == attest_logic.MISMATCH_WHY
    assert (finding.detail["trainer_attestation_id"], finding.detail["worker_attestation_id"]) == (trainer.id, worker.id)
    assert attest_logic.alert_key(finding) == "weights_mismatch:9"
    assert attest_logic.pause_reason(finding) == f"weights mismatch: {finding.title}"
    assert set(attest_logic.WEIGHT_ALERTS) == {"weights_mismatch", "weights_stale", "weights_backwards"}
