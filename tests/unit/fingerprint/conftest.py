"""Fixtures for fingerprint tests: real tokenizers built offline (see tests/fixtures/tokenizers.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:  # plain `pytest` does not put the project root on sys.path
    sys.path.insert(0, str(ROOT))

from tests.fixtures import tokenizers as builders  # noqa: E402

builders.quiet_transformers()


@pytest.fixture
def load():
    """load(path, **kwargs) -> a fresh AutoTokenizer (a new object: never a cache hit)."""
    from transformers import AutoTokenizer

    return lambda path, **kw: AutoTokenizer.from_pretrained(path, **kw)


@pytest.fixture
def chatml_dir(tmp_path):
    return builders.build_chatml_tokenizer(tmp_path)


@pytest.fixture
def model_specific_dir(chatml_dir, tmp_path):
    """The same tokenizer files, plus a config.json naming a model_type and no tokenizer_class: transformers
    then loads Qwen2Tokenizer, which builds its own pre-tokenizer instead of tokenizer.json's."""
    import json
    import shutil

    path = shutil.copytree(chatml_dir, tmp_path / "with-config")
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("tokenizer_class", None)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


@pytest.fixture
def fp():
    """fp(obj, **kw): a fingerprint, forced fresh, JSON round-tripped as it would travel."""
    import json

    from trainer_hooks.fingerprint import fingerprint_processor

    return lambda obj, gen=None, **kw: json.loads(json.dumps(fingerprint_processor(obj, gen, refresh=True, **kw)))


def names(result: dict, severity: str | None = None) -> set:
    return {c["name"] for c in result["components"] if severity is None or c["severity"] == severity}
