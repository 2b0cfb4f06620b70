"""Who this process is to the backend: run and component keys, resolved to server ids once."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Mapping

from .transport import Transport


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

    def ids(self, transport: Transport, run: RunKey | None = None, component: ComponentKey | None = None,
            timeout: float | None = None) -> tuple[int, int]:
        """Server ids for a run and component (this monitor's by default). Raises TransportError."""
        run, component = run or self.run, component or self.component
        with self._lock:
            run_id = self._run_id(transport, run, timeout)
            key = (run_id, component.side, component.worker_id)
            if key not in self._components:
                body = transport.request("POST", f"/runs/{run_id}/components", json=component.as_record(),
                                         timeout=timeout)
                self._components[key] = int(body["id"])
            return run_id, self._components[key]

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

    def _run_id(self, transport: Transport, run: RunKey, timeout: float | None) -> int:
        if run.run_id is not None:
            return run.run_id
        if run not in self._runs:
            payload: dict[str, Any] = {"name": run.name, "project": run.project}
            if run == self.run:  # leftovers of other runs are replayed without touching their tags
                payload.update(tags=self.tags, config=self.config)
                if self.packs:
                    payload["packs"] = self.packs
            self._runs[run] = int(transport.request("POST", "/runs", json=payload, timeout=timeout)["id"])
        return self._runs[run]

