"""backend/detect/parity.py, pure: what a processor_mismatch alert says (title, pause reason),
from the diff alone, without a database."""
from __future__ import annotations

from paritywatch.backend.detect.parity import MATCH_AGAIN, mismatch_pause_reason, mismatch_title
from paritywatch.backend.models import Component

TEMPLATE = {"name": "chat_template", "severity": "error"}
SAMPLING = {"name": "sampling_params", "severity": "error", "summary": "temperature 0.7 vs 1.0 (the ratios are off)"}
WARNING = {"name": "generation_config", "severity": "warning"}


def workers(n: int) -> list[Component]:
    return [Component(id=i, side="rollout", worker_id=f"w{i}") for i in range(n)]


def test_the_title_counts_the_workers_and_names_the_components_at_the_groups_verdict():
    trainer = Component(id=99, side="trainer", worker_id="t")
    diff = {"verdict": "error", "components": [TEMPLATE, WARNING]}
    assert mismatch_title(workers(2), trainer, diff, "error") == "2 rollout worker(s) differ from the trainer in chat_template"
    assert mismatch_title(workers(1), trainer, diff, "warning") == (
        "1 rollout worker(s) differ from the trainer in generation_config")
    assert mismatch_pause_reason(diff, "error") == "processor mismatch: chat_template"


def test_sampling_parameters_carry_what_differs_and_a_diff_without_components_names_the_fingerprint():
    reference = Component(id=1, side="rollout", worker_id="first")  # no trainer yet: the first worker
    diff = {"verdict": "error", "components": [SAMPLING]}
    assert mismatch_title(workers(3), reference, diff, "error") == (
        "3 rollout worker(s) differ from the rollout in sampling_params: temperature 0.7 vs 1.0 (the ratios are off)")
    assert mismatch_title(workers(1), reference, {"verdict": "error"}, "error").endswith("in fingerprint")
    assert MATCH_AGAIN == "processors match again"
