"""One JSON error shape for every API error: {"error": {status, code, message, details}}."""
from __future__ import annotations

import logging
import sqlite3

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError
from sqlalchemy.exc import OperationalError as SAOperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import Scope

from paritywatch.backend.errors import ParitywatchError
from trainer_hooks.contract import error_envelope

log = logging.getLogger("paritywatch.api")


try:
    import psycopg
except ImportError:  # pragma: no cover - the server extra installs it
    psycopg = None

# What the database drivers raise when the database failed, transient or not.
DATABASE_ERRORS: tuple[type[Exception], ...] = (SAOperationalError, sqlite3.OperationalError,
                                                *((psycopg.OperationalError,) if psycopg else ()))


def is_transient_db_error(exc: BaseException) -> bool:
    """The database was busy or away (a restart, a lost connection, a deadlock victim, SQLite
    "database is locked"): nothing was written, and the same request may succeed on a retry."""
    if isinstance(exc, SAOperationalError):
        exc = exc.orig or exc
    if isinstance(exc, sqlite3.OperationalError):
        return any(word in str(exc) for word in ("locked", "busy"))
    # psycopg's includes deadlocks and serialization failures
    return psycopg is not None and isinstance(exc, psycopg.OperationalError)


async def handler_response(scope: Scope, exc: Exception) -> Response:
    """The answer the app's own exception handlers (below) give, found as Starlette finds them:
    by the exception's class, nearest first; for middleware, which runs outside them. None fits:
    raised, a 500 as anywhere."""
    handlers = scope["app"].exception_handlers
    for cls in type(exc).__mro__:
        if cls in handlers:
            return await handlers[cls](Request(scope), exc)
    raise exc


def error_response(status: int, message: str, code: str | None = None, details=None, headers=None):
    return JSONResponse(error_envelope(status, message, code, details), status_code=status, headers=headers)


def _validation_message(errors: list[dict]) -> str:
    parts = []
    for e in errors[:5]:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more


def _jsonable_errors(errors: list[dict]) -> list[dict]:
    # Pydantic puts the offending input (possibly huge or non-JSON like NaN) in each error.
    return [{"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")} for e in errors[:20]]


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ParitywatchError)
    async def _domain(_: Request, exc: ParitywatchError):
        return error_response(exc.status, exc.message, exc.code, exc.details)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        errors = list(exc.errors())
        return error_response(422, _validation_message(errors), details=_jsonable_errors(errors))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(RecursionError)
    async def _too_deep(_: Request, exc: RecursionError):
        return error_response(400, "JSON nested too deeply")

    @app.exception_handler(OverflowError)
    async def _overflow(_: Request, exc: OverflowError):
        # An id or number the database's 64-bit integers cannot hold (SQLite raises this).
        return error_response(422, "a number in the request is out of range (ids are 64-bit integers)")

    @app.exception_handler(DataError)
    async def _data(_: Request, exc: DataError):
        # The database refused a value (out-of-range number, text it cannot store); the write
        # transaction has rolled back whole.
        log.info("database refused a value: %s", exc.orig)
        return error_response(422, "a value in the request cannot be stored (out of range or invalid text)")

    # By class, not in the catch-all below: Starlette hands an `Exception` handler's answer to
    # uvicorn and then re-raises, so uvicorn logged "Exception in ASGI application" and closed the
    # connection; a client that had not read the 503 yet got a reset instead, without Retry-After.
    async def _database(request: Request, exc: Exception):
        if is_transient_db_error(exc):  # the transaction rolled back whole: a retry is safe
            log.warning("database busy or unavailable on %s %s: %s", request.method, request.url.path, exc)
            return error_response(503, "the database is busy or unavailable; retry shortly",
                                  headers={"Retry-After": "1"})
        log.exception("database error on %s %s", request.method, request.url.path)
        return error_response(500, "internal error")

    for cls in DATABASE_ERRORS:
        app.add_exception_handler(cls, _database)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal error")
