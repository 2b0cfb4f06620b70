"""The hooks' logger, and a guard that keeps a repeated problem from flooding the host's logs."""
from __future__ import annotations

import logging
import threading
from typing import Any

# With no logging configured, Python prints WARNING and above to stderr: what the hooks have to
# say to a person (an unreachable backend, a rejected batch) is logged at WARNING.
log = logging.getLogger("paritywatch")


class LogOnce:
    """Logs each distinct problem once per process: a broken config must not flood the host's logs."""

    def __init__(self) -> None:
        self._seen: set[Any] = set()
        self._lock = threading.Lock()

    def warning(self, key: Any, message: str, *args: Any) -> None:
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
        log.warning(message, *args)
