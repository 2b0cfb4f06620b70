"""Uploads that are not metric batches, posted in order by the worker thread: processor
fingerprints (content-addressed, so the digest alone is enough when the server has it), weight
attestations (docs/design.md, "Weight-sync attestation") and per-sample audits ("Per-sample audit")."""
from __future__ import annotations

import threading
import uuid
from collections import deque
from typing import Any, Callable

from . import contract
from .health import keeps_batches
from .logs import LogOnce
from .registry import Registry
from .transport import Backoff, Transport, TransportError


class _PendingUploads:
    """Bodies waiting to be posted, oldest first. `submit` from any thread; `post_pending` on the
    worker thread. A failure that keeps batches (`health.keeps_batches`: no answer, a busy server, a
    refused token) leaves the body first in line for the next try; any other refusal drops it
    (repeating it cannot help). At most `max_pending` wait: beyond, the oldest goes. Drops are
    counted and logged once."""

    what = "upload"

    def __init__(self, *, registry: Registry, backoff: Backoff, timeout: Callable[[], float | None],
                 log_once: LogOnce, max_pending: int = 1_000) -> None:
        self.registry = registry
        self.backoff = backoff
        self.posted = 0
        self.dropped = 0
        self.max_pending = max_pending
        self._timeout = timeout
        self._log_once = log_once
        self._pending: deque[dict[str, Any]] = deque()
        self._lock = threading.Lock()

    def submit(self, body: dict[str, Any]) -> None:
        with self._lock:
            self._pending.append(body)
            if len(self._pending) > self.max_pending:
                self._pending.popleft()
                self.dropped += 1
                self._log_once.warning((self.what, "full"), "paritywatch: too many %ss waiting for the backend: "
                                       "dropping the oldest", self.what)

    def pending(self) -> bool:
        return bool(self._pending)

    def post_pending(self, transport: Transport) -> None:
        while self._pending and self.backoff.ready():
            body = self._pending[0]
            try:
                self._post(transport, body)
                self.posted += 1
            except TransportError as exc:
                if keeps_batches(exc):
                    self.backoff.failed(exc.retry_after)
                    return
                self.dropped += 1
                self._log_once.warning((self.what, exc.status, exc.code),
                                       "paritywatch: dropped a %s the server refused: %s", self.what, exc)
            with self._lock:
                if self._pending and self._pending[0] is body:
                    self._pending.popleft()
                else:  # `submit` pushed it out while it was in flight, and counted it dropped
                    self.dropped -= 1

    def _post(self, transport: Transport, body: dict[str, Any]) -> None:
        raise NotImplementedError


class FingerprintUploads(_PendingUploads):
    what = "fingerprint"

    def _post(self, transport: Transport, fingerprint: dict[str, Any]) -> None:
        """The digest first; the whole object only when the server answers `fingerprint_unknown`."""
        run_id, component_id = self.registry.ids(transport, timeout=self._timeout())
        path = contract.component_path(run_id, component_id, "fingerprint")
        try:
            transport.request("POST", path, json={"digest": fingerprint["digest"]}, timeout=self._timeout())
        except TransportError as exc:
            if exc.code != contract.ERROR_FINGERPRINT_UNKNOWN:
                raise
            transport.request("POST", path, json=fingerprint, timeout=self._timeout())


class AttestationUploads(_PendingUploads):
    """Weight attestations: a few per sync, each a few KB to a few MB (one line per tensor)."""

    what = "weight attestation"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_pending=64, **kwargs)

    def _post(self, transport: Transport, attestation: dict[str, Any]) -> None:
        run_id, component_id = self.registry.ids(transport, timeout=self._timeout())
        transport.request("POST", contract.component_path(run_id, component_id, "attestations"), json=attestation,
                          timeout=self._timeout())


class AuditUploads(_PendingUploads):
    """Per-sample audits (`POST /runs/{id}/audits`), each tagged with this process's client id and
    a sequence number when submitted, so a retry after a lost answer is stored once."""

    what = "sample audit"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.client_id = uuid.uuid4().hex
        self._seq = 0

    def submit(self, body: dict[str, Any]) -> None:
        with self._lock:
            seq, self._seq = self._seq, self._seq + 1
        super().submit({**body, "client_id": self.client_id, "seq": seq})

    def _post(self, transport: Transport, audit: dict[str, Any]) -> None:
        run_id, component_id = self.registry.ids(transport, timeout=self._timeout())
        transport.request("POST", contract.run_path(run_id, "audits"), json={**audit, "component_id": component_id},
                          timeout=self._timeout())
