"""Fetching one row by its key, the same way everywhere: a missing row is a 404 that names it."""
from __future__ import annotations

from typing import TypeVar

from sqlalchemy.orm import Session

from paritywatch.backend.db import Database
from paritywatch.backend.errors import NotFound

T = TypeVar("T")


def get_or_404(s: Session, model: type[T], key: object, what: str) -> T:
    row = s.get(model, key)
    if row is None:
        raise NotFound(f"{what} {key} does not exist")
    return row


def insert_row(db: Database, row: T) -> T:
    """Store a new row; it comes back with its id."""
    with db.write() as s:
        s.add(row)
        s.flush()
        return row


def update_row(db: Database, model: type[T], key: object, what: str, fields: dict) -> T:
    """Set `fields` on one row (404 when it is missing); the updated row."""
    with db.write() as s:
        row = get_or_404(s, model, key, what)
        for field, value in fields.items():
            setattr(row, field, value)
        return row
