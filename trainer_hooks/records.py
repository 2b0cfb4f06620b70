"""The spooled form of a metric batch: what the worker writes, and what a replay may send.

A record is a batch plus what it takes to send it again from another process: the backend it was
headed to, the run and component it belongs to (by key, since ids may not be known yet), and its
(client_id, seq). `record_problem` checks a decoded line before a replay sends it with this
process's token: anything that is not exactly this shape, or was headed elsewhere, is refused.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from . import contract

VERSION = 1


def make_record(*, backend: str, run: Mapping[str, Any], component: Mapping[str, Any], ids: tuple[int, int] | None,
                client_id: str, seq: int, steps: list[int], series: dict[str, list[float | None]]) -> dict[str, Any]:
    return {
        "v": VERSION,
        "backend": backend,
        "run": dict(run),
        "component": dict(component),
        "run_id": ids[0] if ids else None,
        "component_id": ids[1] if ids else None,
        "client_id": client_id,
        "seq": seq,
        "steps": steps,
        "series": series,
    }


def wire_batch(record: Mapping[str, Any], component_id: int) -> dict[str, Any]:
    """The body of `POST /runs/{id}/metrics` for a record."""
    return {"client_id": record["client_id"], "seq": record["seq"], "component_id": component_id,
            "steps": record["steps"], "series": record["series"]}


def record_points(record: Mapping[str, Any]) -> int:
    """Values that are not null."""
    return sum(1 for column in record["series"].values() for value in column if value is not None)


# --------------------------------------------------------------------------- validation

def record_problem(record: Any, backend: str) -> str | None:
    """Why `record` must not be sent to `backend`, or None when it is a well-formed record of its own."""
    if not isinstance(record, dict):
        return "not a JSON object"
    if record.get("v") != VERSION:
        return f"unknown record version {record.get('v')!r}"
    if record.get("backend") != backend:
        return "headed to another backend"
    for check in (_identity_problem, _batch_problem):
        problem = check(record)
        if problem is not None:
            return problem
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_text(value: Any, max_length: int = contract.MAX_NAME_LENGTH) -> bool:
    return isinstance(value, str) and 0 < len(value) <= max_length


def _optional_id(value: Any) -> bool:
    return value is None or (_is_int(value) and value > 0)


def _identity_problem(record: dict[str, Any]) -> str | None:
    run, component = record.get("run"), record.get("component")
    if not isinstance(run, dict) or not isinstance(component, dict):
        return "no run or component"
    if not (_is_text(run.get("project")) and (run.get("name") is None or _is_text(run.get("name")))
            and _optional_id(run.get("id")) and (run.get("name") is not None or run.get("id") is not None)):
        return "malformed run"
    if not (component.get("side") in contract.SIDES and _is_text(component.get("worker_id"))
            and isinstance(component.get("host"), str) and _is_int(component.get("pid"))):
        return "malformed component"
    if not (_optional_id(record.get("run_id")) and _optional_id(record.get("component_id"))):
        return "malformed ids"
    if not _is_text(record.get("client_id"), contract.MAX_CLIENT_ID_LENGTH):
        return "malformed client_id"
    seq = record.get("seq")
    if not (_is_int(seq) and 0 <= seq <= contract.MAX_SEQ):
        return "malformed seq"
    return None


def _batch_problem(record: dict[str, Any]) -> str | None:
    steps, series = record.get("steps"), record.get("series")
    if not isinstance(steps, list) or not isinstance(series, dict) or not steps or not series:
        return "no steps or series"
    if not all(_is_int(s) and 0 <= s <= contract.MAX_STEP for s in steps):
        return "a step outside [0, 2**53]"
    if len(steps) * len(series) > contract.MAX_POINTS_PER_BATCH:
        return "more points than a batch may carry"
    for key, column in series.items():
        if contract.metric_key_problem(key) is not None:
            return "a malformed metric key"
        if not isinstance(column, list) or len(column) != len(steps):
            return f"series {key!r} is not aligned with steps"
        if not all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
                   for v in column):
            return f"series {key!r} holds a value that is not a finite number"
    return None
