"""Keyset pagination of list reads, one way for every list: rows in id order, a page is
`limit` rows after a position (the id of the previous page's last row). Offsets would skip or
repeat rows while new ones arrive; an id position never does."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

from sqlalchemy import Select

T = TypeVar("T")


@dataclass(frozen=True)
class PageRequest:
    limit: int
    # the last row of the previous page: its id (or its name, for lists ordered by name); None = from the start
    position: int | str | None = None


def keyset(q: Select, id_col, page: PageRequest, newest_first: bool = True) -> Select:
    """`q` ordered by `id_col`, from `page.position` on, one row more than the page (to know
    whether another page follows)."""
    if page.position is not None:
        q = q.where(id_col < page.position if newest_first else id_col > page.position)
    return q.order_by(id_col.desc() if newest_first else id_col.asc()).limit(page.limit + 1)


def split_page(rows: Sequence[T], page: PageRequest, id_of: Callable[[T], int | str]) -> tuple[list[T], int | str | None]:
    """(the page's rows, the position of the next page or None when this is the last)."""
    rows = list(rows)
    if len(rows) <= page.limit:
        return rows, None
    rows = rows[: page.limit]
    return rows, id_of(rows[-1])
