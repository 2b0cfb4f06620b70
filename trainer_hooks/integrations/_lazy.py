"""Module-level ``__getattr__`` / ``__dir__`` for integrations whose names load their framework on first use."""
from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(module: str, lazy: Mapping[str, str], namespace: Mapping[str, Any]
               ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for `module`: each name in `lazy` is imported from the module it
    maps to when first read (so importing `module` imports no framework)."""

    def __getattr__(name: str) -> Any:
        if name not in lazy:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return getattr(importlib.import_module(lazy[name]), name)

    def __dir__() -> list[str]:
        return sorted([*namespace, *lazy])

    return __getattr__, __dir__
