"""Per-sample audits through the hooks' worker thread against a real backend over real HTTP: the
training thread never waits or sees an error, audits wait (bounded, oldest dropped and counted)
while the backend is away, and arrive exactly once when it is back."""
from __future__ import annotations

from pathlib import Path

from tests.hooks.conftest import Backend
from trainer_hooks.alignment import RolloutRecord
from trainer_hooks.monitor import ParityMonitor
from trainer_hooks.worker import MAX_PENDING_AUDITS

# No processor: length parity and finish reasons only; tokens show as ids.
SHIFTED = RolloutRecord(prompt_ids=[1, 2], completion_ids=[3, 4, 5], rollout_logprobs=[-1.0, -1.0], finish_reason="length")


def test_audits_wait_bounded_while_the_backend_is_away_and_arrive_once_when_it_is_back(own_backend: Backend,
                                                                                       spool_dir: Path) -> None:
    run_id = own_backend.run_id("away")
    with ParityMonitor("away", url=own_backend.url, spool_dir=spool_dir, max_backoff_s=1.0) as monitor:
        assert monitor.flush(30)  # registered while the backend is up
        own_backend.stop()
        total = MAX_PENDING_AUDITS + 8
        for step in range(total):
            assert monitor.audit_rollout_batch([SHIFTED, SHIFTED], step=step)
        assert monitor.stats()["audits_dropped"] == 8  # the oldest went; the queue stays bounded
        own_backend.start()
        assert monitor.flush(60)
        assert monitor.stats()["audits_posted"] == MAX_PENDING_AUDITS
    audits = own_backend.get(f"/runs/{run_id}/audits", limit=100)["audits"]
    assert sorted(a["step"] for a in audits) == list(range(8, total))
    [sample, _] = audits[0]["samples"]
    assert sample["length_mismatch"] and sample["finish"] == "length"
    assert sample["windows"][0]["rollout"] == ["<id 3>", "<id 4>", "<id 5>"]


def test_bad_input_never_raises_into_the_training_loop(backend: Backend, spool_dir: Path) -> None:
    with ParityMonitor("bad-input", url=backend.url, spool_dir=spool_dir) as monitor:
        assert monitor.audit_rollout_batch([object()], step=1) is False
        assert monitor.audit_rollout_batch([SHIFTED], step=-5) is False  # not a step
        assert monitor.stats()["internal_errors"] == 2
        assert monitor.audit_rollout_batch([SHIFTED], step=2)
        assert monitor.flush(30)
    run_id = backend.run_id("bad-input")
    assert [a["step"] for a in backend.get(f"/runs/{run_id}/audits")["audits"]] == [2]
