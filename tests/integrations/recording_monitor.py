"""A stand-in with ParityMonitor's interface that records what the hooks do (no network).

Module-level so a spawned child process can unpickle `FileMonitor` by name.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any


class RecordingMonitor:
    """register_processor / log / wait_if_paused / should_stop / close, recorded in memory."""

    def __init__(self, **kwargs: Any):
        self.kwargs = kwargs
        self.processors: list[tuple[Any, Any]] = []
        self.chat_template_kwargs: list[Any] = []  # as given with each register_processor call
        self.sampling: list[tuple[Any, dict[str, Any]]] = []
        self.logged: list[tuple[dict[str, float], int]] = []
        self.policy_versions: list[int] = []
        self.waits: list[float] = []  # seconds each wait_if_paused call blocked
        self.wait_ends: list[float] = []  # time.monotonic() when each returned
        self.resumed_at: float | None = None
        self.closed = False
        self.stop_after_step: int | None = None  # simulate a "stop" arriving with the log of this step
        self.waiting = threading.Event()  # set when a wait_if_paused call finds the run paused
        self._running = threading.Event()
        self._running.set()
        self._stop = False

    def register_processor(self, processor: Any, generation_config: Any = None, *,
                           chat_template_kwargs: Any = None) -> None:
        self.processors.append((processor, generation_config))
        self.chat_template_kwargs.append(chat_template_kwargs)

    def report_sampling_params(self, params: Any = None, **kwargs: Any) -> bool:
        self.sampling.append((params, kwargs))
        return True

    def log(self, metrics: dict[str, float], step: int) -> bool:
        self.logged.append((dict(metrics), step))
        if self.stop_after_step is not None and step >= self.stop_after_step:
            self.request_stop()
        return True

    def set_policy_version(self, version: int) -> None:
        self.policy_versions.append(version)

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self.resumed_at = time.monotonic()
        self._running.set()

    def request_stop(self) -> None:
        self._stop = True
        self._running.set()  # a stop ends a pause

    def wait_if_paused(self, timeout: float | None = None) -> bool:
        start = time.monotonic()
        if not self._running.is_set():
            self.waiting.set()
        resumed = self._running.wait(timeout)
        self.wait_ends.append(time.monotonic())
        self.waits.append(self.wait_ends[-1] - start)
        return resumed

    @property
    def should_stop(self) -> bool:
        return self._stop

    def close(self) -> None:
        self.closed = True


class FileMonitor(RecordingMonitor):
    """Appends one JSON line per call to ``path``: how a child process reports back to the test."""

    def __init__(self, path: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.path = path
        self._write({"event": "init", "kwargs": kwargs})

    def register_processor(self, processor: Any, generation_config: Any = None, *,
                           chat_template_kwargs: Any = None) -> None:
        self._write(
            {
                "event": "register_processor",
                "chat_template_kwargs": chat_template_kwargs,
                "chat_template": processor.chat_template,
                "vocab_size": len(processor),
                "eos_token_id": list(generation_config.eos_token_id),
                "temperature": generation_config.temperature,
            }
        )

    def log(self, metrics: dict[str, float], step: int) -> bool:
        self._write({"event": "log", "metrics": metrics, "step": step})
        return True

    def set_policy_version(self, version: int) -> None:
        self._write({"event": "policy_version", "version": version})

    def close(self) -> None:
        self._write({"event": "close"})

    def _write(self, entry: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


def trivial_reward(completions, **kwargs) -> list[float]:
    """Module-level (picklable) reward: longer completions score higher."""
    return [float(len(str(c))) / 100 for c in completions]
