"""Fixtures of the security tests: servers open and closed, a stub DNS, and a guard that makes
sure nothing ever connects anywhere but loopback (whatever the code under test does)."""
from __future__ import annotations

import ipaddress
import logging
import socket
from dataclasses import dataclass, field
from typing import Iterator

import pytest

from paritywatch.backend import migrate
from paritywatch.backend.settings import Settings
from tests.support.live import ThreadServer, make_tokens


@pytest.fixture
def sqlite_db(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'sec.db'}"
    migrate.upgrade(url)
    return url


@pytest.fixture
def open_server(sqlite_db) -> Iterator[ThreadServer]:
    """What `paritywatch serve` on 127.0.0.1 runs with no token: open mode."""
    with ThreadServer(Settings(database_url=sqlite_db, open_mode=True)) as server:
        yield server


@pytest.fixture
def closed_server(sqlite_db) -> Iterator[tuple[ThreadServer, dict[str, str]]]:
    tokens = make_tokens(sqlite_db)
    with ThreadServer(Settings(database_url=sqlite_db)) as server:
        yield server, tokens


@dataclass
class Network:
    """A stub resolver (`names`: host -> addresses; may be changed mid-test, e.g. a DNS rebinding)
    and a record of every outbound connection attempt. Installed over socket.getaddrinfo and
    socket.socket.connect, so it also holds for code that does its own resolution: an attempt to
    reach anything but loopback is recorded and refused, never sent."""

    names: dict[str, list[str]] = field(default_factory=dict)
    # host -> successive answers (the last one repeats): a DNS rebinding between two lookups
    sequences: dict[str, list[list[str]]] = field(default_factory=dict)
    lookups: list[str] = field(default_factory=list)
    blocked: list[tuple] = field(default_factory=list)

    def resolve(self, host: str, port: int) -> list[str]:
        self.lookups.append(host)
        if host in self.sequences:
            answers = self.sequences[host]
            return list(answers.pop(0) if len(answers) > 1 else answers[0])
        if host not in self.names:
            raise socket.gaierror(socket.EAI_NONAME, f"stub resolver: unknown name {host}")
        return list(self.names[host])


@pytest.fixture
def network(monkeypatch) -> Network:
    net = Network()
    real_getaddrinfo = socket.getaddrinfo
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        name = host.decode() if isinstance(host, bytes) else host
        if name is None or _is_ip(name.strip("[]")):
            return real_getaddrinfo(host, port, family, type, proto, flags)
        out = []
        for addr in net.resolve(name, port):
            fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
            sockaddr = (addr, int(port or 0), 0, 0) if fam == socket.AF_INET6 else (addr, int(port or 0))
            out.append((fam, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", sockaddr))
        return out

    def guarded(real):
        def connect(sock, address):
            if sock.family in (socket.AF_INET, socket.AF_INET6) and not ipaddress.ip_address(
                    address[0].split("%")[0]).is_loopback:
                net.blocked.append(address)
                raise ConnectionRefusedError(f"test guard: no traffic to {address[0]}")
            return real(sock, address)

        return connect

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", guarded(real_connect))
    monkeypatch.setattr(socket.socket, "connect_ex", guarded(real_connect_ex))
    return net


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


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
