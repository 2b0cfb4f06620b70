"""Loopback HTTP receivers that misbehave on purpose (raw sockets: full control over the bytes)."""
from __future__ import annotations

import socket
import socketserver
import threading
from typing import Callable


class ScriptedServer:
    """Reads one request's head and hands the connection and the path to `answer(conn, path)`."""

    def __init__(self, answer: Callable[[socket.socket, str], None]):
        self.stopping = threading.Event()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                conn = self.request
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    head += chunk
                path = head.split(b" ", 2)[1].decode()
                try:
                    answer(conn, path)
                except OSError:
                    pass  # the client gave up: expected for the slow answers

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        outer.thread = self.thread

    def __enter__(self) -> "ScriptedServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()
