"""A bounded on-disk FIFO of metric batches, for while the backend is unreachable.

Each process appends to its own JSON-lines file `<dir>/<owner>.jsonl` (fsync'd per batch) and
holds an exclusive `flock` on it while alive. A file nobody holds a lock on belongs to a process
that died: a new spool in the same directory adopts it and replays it before its own batches.
Batches keep their original (client_id, seq), so replaying a batch the server already has is a
harmless duplicate: that is why read progress needs no durable bookkeeping.

What is replayed is sent with this process's token, so the directory is private: created 0700
(an existing one of ours is tightened to 0700, one owned by another user is refused), files 0600,
never followed through a symlink; and every line must pass `accept` (the record's shape and its
backend) before it is handed out. Bad lines are skipped and counted, never sent.
"""
from __future__ import annotations

import json
import os
import stat
import threading
from collections import deque
from pathlib import Path
from typing import Any, Callable

from .logs import LogOnce, log

try:
    import fcntl
except ImportError:  # Windows: no adoption of leftovers, spooling still works
    fcntl = None  # type: ignore[assignment]

SUFFIX = ".jsonl"
DIR_MODE = 0o700
FILE_MODE = 0o600
_OPEN_FLAGS = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _try_lock(fd: int) -> bool:
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False


def make_private_dir(directory: Path) -> None:
    """Create `directory` 0700, or make sure an existing one is ours and 0700."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        directory.mkdir(mode=DIR_MODE)
    except FileExistsError:
        pass
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise OSError(f"spool path {directory} is not a directory")
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise OSError(f"spool directory {directory} belongs to another user (uid {info.st_uid})")
    if stat.S_IMODE(info.st_mode) != DIR_MODE:
        os.chmod(directory, DIR_MODE)


class _SpoolFile:
    """One file being read from `offset` on; `own` files are also appended to."""

    def __init__(self, path: Path, fd: int, own: bool) -> None:
        self.path = path
        self.fh = os.fdopen(fd, "r+b")
        self.own = own
        self.offset = 0

    def read_line(self) -> tuple[bytes, int]:
        self.fh.seek(self.offset)
        line = self.fh.readline()
        return line, self.offset + len(line)

    def size(self) -> int:
        return os.fstat(self.fh.fileno()).st_size


def _accept_all(record: Any) -> str | None:
    return None if isinstance(record, dict) else "not a JSON object"


class Spool:
    def __init__(self, directory: str | os.PathLike[str], owner: str, *, max_bytes: int = 64 << 20,
                 accept: Callable[[Any], str | None] = _accept_all) -> None:
        """`accept(record)` says why a decoded line must not be replayed (None: replay it)."""
        self.directory = Path(directory)
        self.owner = owner
        self.max_bytes = max_bytes
        self.corrupt_lines = 0    # not JSON: the torn last line of a crashed writer
        self.rejected_lines = 0   # JSON, but refused by `accept`
        self._accept = accept
        self._log_once = LogOnce()
        self._lock = threading.Lock()
        self._files: deque[_SpoolFile] = deque()
        self._own: _SpoolFile | None = None
        self._head: tuple[dict[str, Any], int] | None = None  # peeked record, offset after it
        make_private_dir(self.directory)
        self.adopted = self._adopt_orphans()

    @property
    def own_path(self) -> Path:
        return self.directory / f"{self.owner}{SUFFIX}"

    @property
    def skipped_lines(self) -> int:
        return self.corrupt_lines + self.rejected_lines

    def _adopt_orphans(self) -> int:
        if fcntl is None:
            return 0
        adopted = 0
        paths = sorted(self.directory.glob(f"*{SUFFIX}"), key=lambda p: p.lstat().st_mtime)
        for path in paths:
            if path == self.own_path:
                continue
            orphan = self._open_orphan(path)
            if orphan is not None:
                self._files.append(orphan)
                adopted += 1
        if adopted:
            log.info("paritywatch: replaying %d spool file(s) left by earlier processes", adopted)
        return adopted

    def _open_orphan(self, path: Path) -> _SpoolFile | None:
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except OSError:
            return None  # removed by another adopter meanwhile, or a symlink
        info = os.fstat(fd)
        foreign = hasattr(os, "getuid") and info.st_uid != os.getuid()
        if not stat.S_ISREG(info.st_mode) or foreign or not _try_lock(fd) or not path.exists():
            os.close(fd)
            return None
        return _SpoolFile(path, fd, own=False)

    def _open_own(self) -> _SpoolFile:
        fd = os.open(self.own_path, _OPEN_FLAGS | os.O_CREAT | os.O_APPEND, FILE_MODE)
        os.fchmod(fd, FILE_MODE)
        if not _try_lock(fd):
            os.close(fd)
            raise OSError(f"spool file {self.own_path} is locked by another process")
        self._own = _SpoolFile(self.own_path, fd, own=True)
        self._files.append(self._own)
        return self._own

    def append(self, record: dict[str, Any]) -> bool:
        """Durably append one batch. False (nothing written) when the size cap would be passed."""
        line = json.dumps(record, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode() + b"\n"
        with self._lock:
            own = self._own or self._open_own()
            if own.size() + len(line) > self.max_bytes:
                return False
            own.fh.write(line)
            own.fh.flush()
            os.fsync(own.fh.fileno())
            return True

    def peek(self) -> dict[str, Any] | None:
        """The oldest acceptable batch not yet popped, or None when the spool is empty."""
        with self._lock:
            while self._head is None and self._files:
                current = self._files[0]
                line, end = current.read_line()
                if not line:
                    self._finish(current)
                    if current.own:
                        break
                    continue
                record = self._decode(line, current.path)
                if record is None:
                    current.offset = end  # skipped, counted, never sent
                else:
                    self._head = (record, end)
            return None if self._head is None else self._head[0]

    def _decode(self, line: bytes, path: Path) -> dict[str, Any] | None:
        try:
            record = json.loads(line)
        except ValueError:
            self.corrupt_lines += 1
            self._log_once.warning("spool-corrupt", "paritywatch: skipped a spooled line in %s that is not JSON "
                                   "(the torn last write of a process that died): counted in "
                                   "stats()['spool_skipped_lines']", path)
            return None
        problem = self._accept(record)
        if problem is not None:
            self.rejected_lines += 1
            self._log_once.warning(("spool-reject", problem), "paritywatch: skipped a spooled batch in %s: %s",
                                   path, problem)
            return None
        return record

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
