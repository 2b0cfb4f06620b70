"""A bounded on-disk FIFO of metric batches, for while the backend is unreachable.

Each process appends to its own JSON-lines file `<dir>/<owner>.jsonl` (fsync'd per batch) and
holds an exclusive `flock` on it while alive. A file nobody holds a lock on belongs to a process
that died: a new spool in the same directory adopts it and replays it before its own batches.
Batches keep their original (client_id, seq), so replaying a batch the server already has is a
harmless duplicate: that is why read progress needs no durable bookkeeping.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from collections import deque
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # Windows: no adoption of leftovers, spooling still works
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("paritywatch")

SUFFIX = ".jsonl"


def _try_lock(fh: Any) -> bool:
    if fcntl is None:
        return True
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False


class _SpoolFile:
    """One file being read from `offset` on; `own` files are also appended to."""

    def __init__(self, path: Path, fh: Any, own: bool) -> None:
        self.path = path
        self.fh = fh
        self.own = own
        self.offset = 0

    def read_line(self) -> tuple[bytes, int]:
        self.fh.seek(self.offset)
        line = self.fh.readline()
        return line, self.offset + len(line)

    def size(self) -> int:
        return os.fstat(self.fh.fileno()).st_size


class Spool:
    def __init__(self, directory: str | os.PathLike[str], owner: str, *, max_bytes: int = 64 << 20) -> None:
        self.directory = Path(directory)
        self.owner = owner
        self.max_bytes = max_bytes
        self.corrupt_lines = 0
        self._lock = threading.Lock()
        self._files: deque[_SpoolFile] = deque()
        self._own: _SpoolFile | None = None
        self._head: tuple[dict[str, Any], int] | None = None  # peeked record, offset after it
        self.directory.mkdir(parents=True, exist_ok=True)
        self.adopted = self._adopt_orphans()

    @property
    def own_path(self) -> Path:
        return self.directory / f"{self.owner}{SUFFIX}"

    def _adopt_orphans(self) -> int:
        if fcntl is None:
            return 0
        adopted = 0
        paths = sorted(self.directory.glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_mtime)
        for path in paths:
            if path == self.own_path:
                continue
            try:
                fh = open(path, "r+b")
            except OSError:
                continue  # removed by another adopter meanwhile
            if not _try_lock(fh) or not path.exists():
                fh.close()
                continue
            self._files.append(_SpoolFile(path, fh, own=False))
            adopted += 1
        if adopted:
            log.info("paritywatch: replaying %d spool file(s) left by earlier processes", adopted)
        return adopted

    def _open_own(self) -> _SpoolFile:
        fh = open(self.own_path, "a+b")
        if not _try_lock(fh):
            fh.close()
            raise OSError(f"spool file {self.own_path} is locked by another process")
        self._own = _SpoolFile(self.own_path, fh, own=True)
        self._files.append(self._own)
        return self._own

    def append(self, record: dict[str, Any]) -> bool:
        """Durably append one batch. False (nothing written) when the size cap would be passed."""
        line = json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        with self._lock:
            own = self._own or self._open_own()
            if own.size() + len(line) > self.max_bytes:
                return False
            own.fh.write(line)
            own.fh.flush()
            os.fsync(own.fh.fileno())
            return True

    def peek(self) -> dict[str, Any] | None:
        """The oldest batch not yet popped, or None when the spool is empty."""
        with self._lock:
            while self._head is None and self._files:
                current = self._files[0]
                line, end = current.read_line()
                if not line:
                    self._finish(current)
                    if current.own:
                        break
                    continue
                try:
                    self._head = (json.loads(line), end)
                except ValueError:  # torn last line of a crashed writer
                    self.corrupt_lines += 1
                    current.offset = end
            return None if self._head is None else self._head[0]

    def pop(self) -> None:
        """Drop the batch last returned by peek() (it reached the server)."""
        with self._lock:
            if self._head is not None and self._files:
                self._files[0].offset = self._head[1]
            self._head = None

    def is_empty(self) -> bool:
        return self.peek() is None

    def _finish(self, current: _SpoolFile) -> None:
        """A file read to its end: an orphan is deleted, our own file is truncated for reuse."""
        if current.own:
            if current.offset:
                current.fh.truncate(0)
                current.offset = 0
            return
        self._files.popleft()
        current.path.unlink(missing_ok=True)
        current.fh.close()

    def close(self) -> None:
        """Release the files; an own file with unsent batches stays for a later process."""
        with self._lock:
            for current in self._files:
                if current.own and current.offset >= current.size():
                    current.path.unlink(missing_ok=True)
                current.fh.close()
            self._files.clear()
            self._own = None
            self._head = None

    def abandon_after_fork(self) -> None:
        """In a forked child: drop the parent's file handles without touching the parent's files
        (closing our copy of a descriptor leaves the parent's lock in place)."""
        for current in self._files:
            try:
                current.fh.close()
            except OSError:
                pass
        self._files.clear()
        self._own = None
        self._head = None
