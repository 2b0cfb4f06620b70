"""On-disk cache of the CLI's folder fingerprints, keyed by content: a second `paritywatch diff` of
unchanged folders loads nothing (importing transformers alone takes seconds).

The key is a SHA-256 over everything the fingerprint can depend on:
- every file the loaders may read, by content digest: the folder's files, recursively, except
  weights (``WEIGHT_SUFFIXES``) and hidden entries; a tekken file by itself;
- the load options (``--tokenizer-only``, ``--chat-template-kwargs``);
- the installed versions of the libraries that load and render (``KEY_LIBRARIES``) and Python's;
- the source of this fingerprint package (a changed probe or component is a new key).
Not cached: ``--trust-remote-code`` (its code may import modules from outside the folder) and
.gguf files (digesting gigabytes costs more than loading the tokenizer).

Where: ``$PARITYWATCH_FINGERPRINT_CACHE`` (a directory, or ``off``), else
``$XDG_CACHE_HOME/paritywatch/fingerprints`` (``~/.cache/...``). At most ``MAX_ENTRIES`` files,
the least recently used dropped. A cache that cannot be read or written is skipped, never an error.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from .canonical import digest

CACHE_ENV = "PARITYWATCH_FINGERPRINT_CACHE"
MAX_ENTRIES = 64
WEIGHT_SUFFIXES = frozenset({".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx",
                             ".gguf", ".npz", ".pkl", ".distcp"})
KEY_LIBRARIES = ("transformers", "tokenizers", "huggingface_hub", "jinja2", "mistral_common", "sentencepiece",
                 "tiktoken", "protobuf", "torch", "torchvision", "pillow", "numpy")
_CHUNK = 1 << 20


def cache_dir() -> Path | None:
    """The cache directory, or None when the cache is off."""
    configured = os.environ.get(CACHE_ENV, "").strip()
    if configured.lower() == "off":
        return None
    if configured:
        return Path(configured)
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "paritywatch" / "fingerprints"


def cache_key(path: Path, options: dict) -> str | None:
    """The content key of fingerprinting ``path`` with ``options``; None when it is not cacheable."""
    if options.get("trust_remote_code") or path.suffix == ".gguf":
        return None
    if path.is_file():
        inputs = {path.name: _file_digest(path)}
    elif path.is_dir():
        inputs = {str(f.relative_to(path)): _file_digest(f) for f in _loadable_files(path)}
    else:
        return None
    return digest({"inputs": inputs, "options": options, "libraries": _library_versions(),
                   "python": sys.version.split()[0], "code": _code_digest()})


def load(key: str) -> dict | None:
    folder = cache_dir()
    if folder is None:
        return None
    entry = folder / f"{key}.json"
    try:
        fingerprint = json.loads(entry.read_text(encoding="utf-8"))
        os.utime(entry)  # recently used: kept longest
    except (OSError, ValueError):
        return None
    return fingerprint if isinstance(fingerprint, dict) and "fingerprint_version" in fingerprint else None


def store(key: str, fingerprint: dict) -> None:
    folder = cache_dir()
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(fingerprint, fh, ensure_ascii=False)
        os.replace(tmp, folder / f"{key}.json")  # atomic: a concurrent reader sees all or nothing
        _prune(folder)
    except OSError:
        return


def _prune(folder: Path) -> None:
    entries = sorted(folder.glob("*.json"), key=lambda f: f.stat().st_mtime)
    for old in entries[:max(0, len(entries) - MAX_ENTRIES)]:
        old.unlink(missing_ok=True)


def _loadable_files(folder: Path) -> list[Path]:
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [Path(root) / f for f in sorted(files)
                  if not f.startswith(".") and Path(f).suffix.lower() not in WEIGHT_SUFFIXES]
    return found


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def _library_versions() -> dict:
    """name -> version of each KEY_LIBRARIES distribution on sys.path, read from the dist-info
    folder names (one listdir per path entry; importlib.metadata takes ~15 ms a name)."""
    found: dict[str, Any] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.endswith(".dist-info") and "-" in name:
                dist, version = name[:-len(".dist-info")].split("-", 1)
                found.setdefault(dist.lower().replace("-", "_").replace(".", "_"), version)
    return {lib: found.get(lib) for lib in KEY_LIBRARIES}


@functools.lru_cache(maxsize=1)
def _code_digest() -> str:
    h = hashlib.sha256()
    for source in sorted(Path(__file__).parent.glob("*.py")):
        h.update(source.name.encode() + b"\0" + source.read_bytes())
    return h.hexdigest()
