"""The hooks' settings from the environment, read in one place (like the backend's `Settings`).

`ParityMonitor` arguments win over these; these win over the defaults. Read once per monitor, at
construction, so a bad value fails there (loudly), never inside a training step.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Mapping

DEFAULT_URL = "http://127.0.0.1:8321"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


@dataclass(frozen=True)
class HookSettings:
    """Every variable the hooks read. PARITYWATCH_* unless named otherwise."""

    url: str = DEFAULT_URL                 # PARITYWATCH_URL: the backend
    token: str | None = None               # PARITYWATCH_TOKEN: an ingest token
    run: str | None = None                 # PARITYWATCH_RUN: the run name all processes share
    project: str = "default"               # PARITYWATCH_PROJECT
    worker_id: str | None = None           # PARITYWATCH_WORKER_ID: stable across restarts
    spool_dir: Path | None = None          # PARITYWATCH_SPOOL_DIR: unsent batches while the backend is away
    disabled: bool = False                 # PARITYWATCH_DISABLED=1: every monitor is a no-op
    fail_closed: bool = False              # PARITYWATCH_FAIL_CLOSED=1: hold training while unmonitored
    rank: str | None = None                # RANK (torchrun, accelerate): the default worker id
    cache_dir: Path = Path.home() / ".cache"  # XDG_CACHE_HOME: where the default spool lives

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "HookSettings":
        env = os.environ if environ is None else environ
        return cls(
            url=(env.get("PARITYWATCH_URL") or DEFAULT_URL).rstrip("/"),
            token=env.get("PARITYWATCH_TOKEN") or None,
            run=env.get("PARITYWATCH_RUN") or None,
            project=env.get("PARITYWATCH_PROJECT") or "default",
            worker_id=env.get("PARITYWATCH_WORKER_ID") or None,
            spool_dir=Path(env["PARITYWATCH_SPOOL_DIR"]) if env.get("PARITYWATCH_SPOOL_DIR") else None,
            disabled=_flag(env, "PARITYWATCH_DISABLED"),
            fail_closed=_flag(env, "PARITYWATCH_FAIL_CLOSED"),
            rank=env.get("RANK") or None,
            cache_dir=Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache"),
        )

    def spool_directory(self, url: str, spool_dir: str | os.PathLike[str] | None = None) -> Path:
        """Where unsent batches headed to `url` wait: a private subdirectory per backend URL of
        `spool_dir` (or PARITYWATCH_SPOOL_DIR, or ~/.cache/paritywatch/spool), so leftovers are only
        ever replayed where they were headed."""
        root = Path(spool_dir) if spool_dir else (self.spool_dir or self.cache_dir / "paritywatch" / "spool")
        return root / hashlib.sha1(url.encode()).hexdigest()[:12]

    @staticmethod
    def variables() -> list[str]:
        """The variable names, for docs and error messages."""
        named = {"rank": "RANK", "cache_dir": "XDG_CACHE_HOME"}
        return [named.get(f.name, f"PARITYWATCH_{f.name.upper()}") for f in fields(HookSettings)]


def _flag(env: Mapping[str, str], name: str) -> bool:
    value = env.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}={env[name]!r}: expected 1/true/yes/on or 0/false/no/off")
