"""Query strings, alike on every endpoint: strict (a parameter the endpoint does not take is a
422, as an unknown value is, so a typo in a filter never silently widens a list) and, on lists,
paginated the same way: `limit` (default and maximum per list) and an opaque `cursor` that the
previous page's `next_cursor` gave."""
# No `from __future__ import annotations`: the page dependency's annotations name its closure's
# `default` and `maximum`, which FastAPI must see as values.
import base64
import binascii
import json
from typing import Annotated, Callable

from fastapi import Depends, Query, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError

from paritywatch.backend.store.paging import PageRequest

_declared: dict[int, frozenset[str]] = {}


def _query_names(dependant: Dependant) -> set[str]:
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


async def reject_unknown_query(request: Request) -> None:  # async: no thread hop (backend/api/deps.py)
    """Dependency for every API route: 422 for a query parameter the route does not declare."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None or not request.query_params:
        return
    allowed = _declared.get(id(route))
    if allowed is None:
        allowed = _declared[id(route)] = frozenset(_query_names(dependant))
    unknown = [k for k in dict.fromkeys(request.query_params.keys()) if k not in allowed]
    if unknown:
        takes = ", ".join(sorted(allowed)) or "none"
        raise RequestValidationError([
            {"type": "extra_forbidden", "loc": ("query", k), "msg": f"unknown query parameter (this endpoint takes: {takes})",
             "input": None}
            for k in unknown
        ])


def encode_cursor(position: int | str | None) -> str | None:
    if position is None:
        return None
    return base64.urlsafe_b64encode(json.dumps({"p": position}).encode()).decode().rstrip("=")


def decode_cursor(cursor: str, kind: type = int) -> int | str:
    """The position a cursor holds: an id (int) or, for lists ordered by name, a name (str)."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        position = json.loads(raw)["p"]
    except (binascii.Error, ValueError, KeyError, TypeError):
        position = None
    valid = (isinstance(position, str) and len(position) <= 1000) if kind is str else (
        isinstance(position, int) and not isinstance(position, bool) and 0 <= position < 2**63)
    if not valid:
        raise RequestValidationError([{"type": "value_error", "loc": ("query", "cursor"),
                                       "msg": "not a cursor this server issued (pass a page's next_cursor back unchanged)",
                                       "input": None}])
    return position


def pagination(default: int, maximum: int, kind: type = int) -> Callable[..., PageRequest]:
    """A dependency reading `limit` (1..maximum, `default` when absent) and `cursor` (holding a
    position of type `kind`)."""

    async def page(  # async: no thread hop (backend/api/deps.py)
        limit: Annotated[int, Query(ge=1, le=maximum, description=f"items per page (default {default}, at most {maximum})")] = default,
        cursor: Annotated[str | None, Query(min_length=1, max_length=4096,
                                            description="the previous page's next_cursor")] = None,
    ) -> PageRequest:
        return PageRequest(limit=limit, position=None if cursor is None else decode_cursor(cursor, kind))

    return page


# Defaults and maxima of each list (documented in docs/api.md, "Lists").
RunsPage = Annotated[PageRequest, Depends(pagination(default=100, maximum=500))]
AlertsPage = Annotated[PageRequest, Depends(pagination(default=100, maximum=1000))]
EventsPage = Annotated[PageRequest, Depends(pagination(default=100, maximum=1000))]
DeliveriesPage = Annotated[PageRequest, Depends(pagination(default=100, maximum=1000))]
DeletionsPage = Annotated[PageRequest, Depends(pagination(default=100, maximum=1000))]
KeysPage = Annotated[PageRequest, Depends(pagination(default=10_000, maximum=10_000, kind=str))]
AuditsPage = Annotated[PageRequest, Depends(pagination(default=20, maximum=100))]
AuditSamplesPage = Annotated[PageRequest, Depends(pagination(default=100, maximum=1000))]
AttestationsPage = Annotated[PageRequest, Depends(pagination(default=100, maximum=1000))]
VersionsPage = Annotated[PageRequest, Depends(pagination(default=20, maximum=200))]
WorkersPage = Annotated[PageRequest, Depends(pagination(default=1000, maximum=1000))]
