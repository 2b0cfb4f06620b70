"""Processor fingerprints: say exactly whether two processes tokenize alike, and which part differs.

Stdlib only at import time: transformers, torch and mistral_common are touched only through the
objects you pass in (and lazily for mistral-common chat rendering), so the backend can import
``diff_fingerprints`` without any ML library installed.

Usage::

    fp = fingerprint_processor(tokenizer, model_dir="path/to/model")   # cached per object
    fp = fingerprint_processor(tokenizer, chat_template_kwargs={"enable_thinking": False})
    result = diff_fingerprints(trainer_fp, worker_fp)                   # {"verdict", "components", "causes"?}
    assert_processor_consistent(trainer_tokenizer, worker_tokenizer)    # raises on error
"""
from __future__ import annotations

from typing import Any

from .core import FINGERPRINT_VERSION, fingerprint_processor
from .diff import RANK, diff_fingerprints

__all__ = ["FINGERPRINT_VERSION", "ProcessorMismatchError", "assert_processor_consistent",
           "diff_fingerprints", "fingerprint_processor"]


class ProcessorMismatchError(AssertionError):
    """Two processors tokenize differently; ``.diff`` holds the full diff_fingerprints result."""

    def __init__(self, diff: dict):
        self.diff = diff
        self.components = [row["name"] for row in diff["components"]]
        lines = [f"processors differ ({diff['verdict']}): {', '.join(self.components)}"]
        lines += [f"  [{row['severity']}] {row['name']}: {row['summary']}" for row in diff["components"]]
        super().__init__("\n".join(lines))


def assert_processor_consistent(a: Any, b: Any, *, generation_config_a: Any = None,
                                generation_config_b: Any = None, model_dir_a: Any = None,
                                model_dir_b: Any = None, fail_on: str = "error") -> dict:
    """Raise ProcessorMismatchError when a and b (processors or fingerprint dicts) differ at
    ``fail_on`` severity or worse ("error" by default, or "warning" / "info"); return the diff."""
    if fail_on not in RANK or fail_on == "same":
        raise ValueError(f"fail_on must be 'error', 'warning' or 'info', not {fail_on!r}")
    fa = a if _is_fingerprint(a) else fingerprint_processor(a, generation_config_a, model_dir=model_dir_a)
    fb = b if _is_fingerprint(b) else fingerprint_processor(b, generation_config_b, model_dir=model_dir_b)
    result = diff_fingerprints(fa, fb)
    if RANK[result["verdict"]] >= RANK[fail_on]:
        raise ProcessorMismatchError(result)
    return result


def _is_fingerprint(obj: Any) -> bool:
    return isinstance(obj, dict) and "fingerprint_version" in obj
