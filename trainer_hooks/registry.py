"""Who this process is to the backend: run and component keys, resolved to server ids once.

Before the first registration, one `GET /whoami` checks that the URL serves the Paritywatch API and
that the token may post metrics (the ingest scope): a wrong URL or a read token is then named as
what it is, whatever run the process was given (a run given by id would otherwise meet a 404 that
reads like an unknown run)."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Mapping

from . import contract, health
from .transport import FOREIGN, PROBE, REGISTRATION, Transport, TransportError

# Scopes that may post metrics (admin implies every other).
_POSTING_SCOPES = frozenset({"ingest", "admin"})


@dataclass(frozen=True)
class RunKey:
    name: str | None = None
    project: str = "default"
    run_id: int | None = None  # a run given by id needs no lookup

    def as_record(self) -> dict[str, Any]:
        return {"name": self.name, "project": self.project, "id": self.run_id}

    @classmethod
    def from_record(cls, data: Mapping[str, Any]) -> "RunKey":
        return cls(name=data.get("name"), project=data.get("project") or "default", run_id=data.get("id"))


@dataclass(frozen=True)
class ComponentKey:
    side: str
    worker_id: str
    host: str
    pid: int

    def as_record(self) -> dict[str, Any]:
        return {"side": self.side, "worker_id": self.worker_id, "host": self.host, "pid": self.pid}


@dataclass
class Registry:
    """Resolves (run, component) keys to server ids, once per key per process."""

    run: RunKey
    component: ComponentKey
    tags: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    packs: list[str] = field(default_factory=list)  # framework packs the run should have enabled
    _runs: dict[RunKey, int] = field(default_factory=dict)
    _components: dict[tuple[int, str, str], int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _probed: bool = False

    def ids(self, transport: Transport, run: RunKey | None = None, component: ComponentKey | None = None,
            timeout: float | None = None) -> tuple[int, int]:
        """Server ids for a run and component (this monitor's by default). Raises TransportError."""
        run, component = run or self.run, component or self.component
        purpose = REGISTRATION if run == self.run else FOREIGN  # its refusal is this process's problem, or not
        with self._lock:
            if not self._probed:
                self._probe(transport, timeout)
            run_id = self._run_id(transport, run, timeout, purpose)
            key = (run_id, component.side, component.worker_id)
            if key not in self._components:
                body = transport.request("POST", contract.run_path(run_id, "components"), json=component.as_record(),
                                         timeout=timeout, purpose=purpose)
                self._components[key] = int(body["id"])
            return run_id, self._components[key]

    def _probe(self, transport: Transport, timeout: float | None) -> None:
        body = transport.request("GET", contract.WHOAMI_PATH, timeout=timeout, purpose=PROBE)
        scopes = body.get("scopes") if isinstance(body, dict) else None
        if not isinstance(scopes, list):
            problem, message = health.WRONG_URL, "GET /whoami did not answer as the Paritywatch API"
        elif _POSTING_SCOPES.isdisjoint(scopes):
            problem, message = health.WRONG_SCOPE, f"token {body.get('name')!r} has scope {', '.join(scopes) or 'none'}"
        else:
            self._probed = True
            return
        error = TransportError(message, retryable=False, status=200, detail=message, purpose=PROBE, problem=problem)
        transport.report(error, PROBE)
        raise error

    def after_fork(self, component: ComponentKey) -> None:
        """In a forked child: a fresh lock (the parent's may be held) and a re-registration."""
        self._lock = threading.Lock()
        self.component = component
        self._components = {}

    def own_ids(self) -> tuple[int, int] | None:
        """This monitor's ids if already known (no network)."""
        run_id = self.run.run_id or self._runs.get(self.run)
        if run_id is None:
            return None
        cid = self._components.get((run_id, self.component.side, self.component.worker_id))
        return None if cid is None else (run_id, cid)

    def _run_id(self, transport: Transport, run: RunKey, timeout: float | None, purpose: str) -> int:
        if run.run_id is not None:
            return run.run_id
        if run not in self._runs:
            payload: dict[str, Any] = {"name": run.name, "project": run.project}
            if run == self.run:  # leftovers of other runs are replayed without touching their tags
                payload.update(tags=self.tags, config=self.config)
                if self.packs:
                    payload["packs"] = self.packs
            self._runs[run] = int(transport.request("POST", contract.RUNS_PATH, json=payload, timeout=timeout, purpose=purpose)["id"])
        return self._runs[run]

