"""examples/async_grpo.py needs GPUs and vLLM, so it is not run here: check that everything it uses
exists in the installed TRL and in our hooks (imports, keyword arguments, config fields)."""
from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "async_grpo.py"


def _tree() -> ast.Module:
    return ast.parse(EXAMPLE.read_text())


def _imports() -> dict[str, str]:
    """name -> module for every `from X import name` in the example."""
    out = {}
    for node in ast.walk(_tree()):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                out[alias.asname or alias.name] = node.module
    return out


def _calls() -> dict[str, set[str]]:
    """callee name -> keyword argument names used."""
    out: dict[str, set[str]] = {}
    for node in ast.walk(_tree()):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            out.setdefault(node.func.id, set()).update(k.arg for k in node.keywords if k.arg)
    return out


def _resolve(name: str):  # noqa: ANN202
    return getattr(importlib.import_module(_imports()[name]), name)


@pytest.mark.parametrize("name", sorted(_imports()))
def test_every_import_exists(name):
    assert _resolve(name) is not None


def test_trainer_and_hook_keyword_arguments_exist():
    calls = _calls()
    for callee in ("AsyncGRPOTrainer", "ParityCallback", "instrument_rollout_worker"):
        obj = _resolve(callee)
        target = obj.__init__ if inspect.isclass(obj) else obj
        params = inspect.signature(target).parameters
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
        missing = {k for k in calls[callee] if k not in params}
        assert not missing or takes_kwargs, f"{callee} has no parameter(s) {missing}"


def test_config_fields_exist():
    fields = {f.name for f in dataclasses.fields(_resolve("AsyncGRPOConfig"))}
    used = _calls()["AsyncGRPOConfig"]
    assert used <= fields, used - fields


def test_trainer_exposes_the_rollout_worker_the_example_instruments():
    src = inspect.getsource(_resolve("AsyncGRPOTrainer"))
    assert "self.rollout_worker" in src
    assert "processing_class" in inspect.signature(_resolve("AsyncGRPOTrainer").__init__).parameters
