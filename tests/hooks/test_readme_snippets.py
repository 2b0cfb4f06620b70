"""README's "Instrument your run" snippets, run as written against a backend that requires tokens,
with the project-bound ingest token README tells the user to create (issue 29: the "any trainer"
snippet had no `project=`, and with such a token every batch was refused).

The snippet's code is executed as README prints it; the objects it leaves to the user (`tokenizer`,
`model`, `loader`, `loss`, `records`, `logps`, `version`) are small real stand-ins: a trained BPE
ChatML tokenizer, a transformers GenerationConfig, rollout records rendered with that tokenizer.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.hooks.conftest import ROOT, TokenBackend

README = ROOT / "README.md"


def readme_python(after: str) -> str:
    """The first ```python block of README after the line `after`."""
    text = README.read_text()
    block = re.search(r"```python\n(.*?)```", text[text.index(after):], re.S)
    assert block, f"no python block after {after!r} in README.md"
    return block[1]


@pytest.fixture
def users_objects(tmp_path: Path) -> dict:
    """What the snippet assumes the user has, and nothing else."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig

    from tests.fixtures.tokenizers import build_chatml_tokenizer
    from trainer_hooks import RolloutRecord

    tokenizer = AutoTokenizer.from_pretrained(build_chatml_tokenizer(tmp_path))
    messages = [{"role": "user", "content": "What is 7 times 6?"}]
    prompt_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    completion_ids = tokenizer.encode("It is 42.", add_special_tokens=False) + [tokenizer.eos_token_id]
    logps = [[-0.5] * len(completion_ids)]
    return {
        "tokenizer": tokenizer,
        "model": SimpleNamespace(generation_config=GenerationConfig(eos_token_id=tokenizer.eos_token_id)),
        "loader": [{"input_ids": prompt_ids}] * 3,
        "loss": torch.tensor(0.25),
        "records": [RolloutRecord(messages=messages, prompt_ids=prompt_ids, completion_ids=completion_ids,
                                  rollout_logprobs=logps[0], finish_reason="stop")],
        "logps": logps,
        "version": 1,
    }


def _run_in(backend: TokenBackend, project: str, name: str) -> dict:
    [run] = [r for r in backend.backend.get("/runs", project=project)["runs"] if r["name"] == name]
    return run


def test_any_trainer_snippet_runs_as_written_with_a_project_bound_token(
        token_backend: TokenBackend, users_objects: dict, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="paritywatch")
    monkeypatch.setenv("PARITYWATCH_URL", token_backend.url)
    monkeypatch.setenv("PARITYWATCH_TOKEN", token_backend.ingest)  # bound to "my-project", as README creates it
    snippet = readme_python("**Any trainer, a few lines:**")

    exec(compile(snippet, "README.md (any trainer)", "exec"), dict(users_objects))

    assert [r.getMessage() for r in caplog.records] == []  # nothing refused, nothing dropped
    run = _run_in(token_backend, "my-project", "qwen3-grpo")
    assert run["control"]["state"] == "finished"  # the trainer closed: the run ended cleanly
    [trainer] = run["components"]
    assert trainer["side"] == "trainer" and trainer["fingerprint_digest"]
    counts = token_backend.backend.counts(run["id"])
    assert counts["loss"] == len(users_objects["loader"])
    assert counts["align/prompt_rerender_mismatch_frac"] == len(users_objects["loader"])
    assert token_backend.backend.get(f"/runs/{run['id']}/audits")["audits"]


def test_packs_snippet_runs_as_written_with_a_project_bound_token(
        token_backend: TokenBackend, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="paritywatch")
    monkeypatch.setenv("PARITYWATCH_URL", token_backend.url)
    monkeypatch.setenv("PARITYWATCH_TOKEN", token_backend.ingest)
    namespace = {"ParityMonitor": __import__("trainer_hooks").ParityMonitor}
    exec(compile(readme_python("**Your framework already logs a mismatch metric**"), "README.md (packs)", "exec"), namespace)
    monitor = namespace["monitor"]
    monitor.log({"rollout_corr/kl": 0.01}, 0)
    assert monitor.flush(30.0) and monitor.healthy
    monitor.close()
    assert [r.getMessage() for r in caplog.records] == []
    assert "verl" in _run_in(token_backend, "my-project", "qwen3-grpo")["packs"]
