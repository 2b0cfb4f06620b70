"""Rows the same way everywhere: fetching one by its key (a missing row is a 404 that names it),
inserting and updating one, and retrying a write that a concurrent writer raced."""
from __future__ import annotations

from typing import Callable, TypeVar

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from paritywatch.backend.errors import NotFound

T = TypeVar("T")


def get_or_404(s: Session, model: type[T], key: object, what: str) -> T:
    row = s.get(model, key)
    if row is None:
        raise NotFound(f"{what} {key} does not exist")
    return row


def insert_row(s: Session, row: T) -> T:
    """Store a new row; it comes back with its id."""
    s.add(row)
    s.flush()
    return row


def update_row(s: Session, model: type[T], key: object, what: str, fields: dict) -> T:
    """Set `fields` on one row (404 when it is missing); the updated row."""
    row = get_or_404(s, model, key, what)
    for field, value in fields.items():
        setattr(row, field, value)
    s.flush()
    return row


def raced(s: Session, attempt: Callable[[int], T], what: str, tries: int = 2) -> T:
    """`attempt(n)` (n = 0, 1...) in a SAVEPOINT; a concurrent writer that won an insert first
    (IntegrityError) undoes only this attempt, and the next one sees its row. The caller's
    transaction stays usable: a store function retries inside it, never by opening another."""
    for n in range(tries):
        try:
            with s.begin_nested():
                return attempt(n)
        except IntegrityError:
            continue
    raise RuntimeError(f"{what} raced {tries} times")  # pragma: no cover
