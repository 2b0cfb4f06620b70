"""Shared pieces of the reliability tests: a live backend in this process with scoped tokens."""
from __future__ import annotations

import logging
from typing import Iterator

import pytest

from paritywatch.backend import migrate
from paritywatch.backend.auth import create_token
from paritywatch.backend.db import Database
from paritywatch.backend.settings import Settings
from tests.support.live import ThreadServer


class CaptureAll(logging.Handler):
    """Every log record of every logger, formatted, at DEBUG and up."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception:
            self.lines.append(repr(record.__dict__))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def make_tokens(url: str) -> dict[str, str]:
    db = Database(url)
    try:
        return {scope: create_token(db, f"rel-{scope}", [scope])[1] for scope in ("ingest", "read", "admin")}
    finally:
        db.dispose()


@pytest.fixture
def debug_logs() -> Iterator[CaptureAll]:
    handler = CaptureAll()
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


@pytest.fixture
def secured_server(tmp_path, debug_logs) -> Iterator[tuple[ThreadServer, dict[str, str]]]:
    """A closed server (tokens exist before it starts) on SQLite, logging everything at DEBUG."""
    url = f"sqlite:///{tmp_path / 'sec.db'}"
    migrate.upgrade(url)
    tokens = make_tokens(url)
    settings = Settings(database_url=url, host="127.0.0.1", allow_loopback_webhooks=True,
                        webhook_poll_interval_s=0.1)
    with ThreadServer(settings) as server:
        yield server, tokens
