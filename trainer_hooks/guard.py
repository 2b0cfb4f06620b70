"""The one "never crash training" guard of the monitor and its rooms.

SDK work must never raise into the host: `guarded` swallows what a method raises, counts it
(`stats()["internal_errors"]`) and logs the first of each kind. It guards the monitor's public
methods and the work a room runs where no public method is on the stack (the fingerprint thread,
the hashing inside `attest_stream`). Any object with a `_guard` attribute can use it.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

from .logs import LogOnce

_T = TypeVar("_T")


class Guard:
    """What the guard swallowed: a count, and which kinds were already said (once per process)."""

    def __init__(self) -> None:
        self.errors = 0
        self._log_once = LogOnce()

    def swallow(self, name: str, exc: Exception, says: str | None = None) -> None:
        self.errors += 1
        self._log_once.warning((name, type(exc)), "paritywatch: %s: %r", says or f"{name} failed", exc)

    def reset_after_fork(self) -> None:
        self._log_once = LogOnce()  # a forked child says its own problems


def guarded(default: Any, *, says: str | None = None) -> Callable[[Callable[..., _T]], Callable[..., _T]]:
    """Return `default` instead of raising; `says` words the log line (default: "<method> failed")."""

    def decorate(method: Callable[..., _T]) -> Callable[..., _T]:
        @functools.wraps(method)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except Exception as exc:
                self._guard.swallow(method.__name__, exc, says)
                return default

        return wrapper

    return decorate
