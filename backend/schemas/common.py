"""What every resource's schemas share: names and tags, the error envelope, the page of a list."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StringConstraints

from trainer_hooks.contract import (
    MAX_NAME_LENGTH,
    PACK_NAMES,
    RUN_STATES,
)

Name = Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=r"^[^\x00-\x1f]+$")


ControlStateName = Literal[RUN_STATES]


TagName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME_LENGTH)]


TagValue = Annotated[str, StringConstraints(max_length=1000)]


PackName = Literal[PACK_NAMES]


PackNames = Annotated[list[PackName], Field(max_length=len(PACK_NAMES),
                                           description="framework metric packs (GET /packs lists them)")]


class ErrorBody(BaseModel):
    status: int
    code: str
    message: str
    details: list[Any] | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


# The operations that can answer 409 (backend/errors.py, Conflict) say so; the app's default
# responses (backend/main.py) list the errors every operation can give.
CONFLICT_RESPONSE = {409: {"model": ErrorResponse,
                           "description": "Conflicts with what is stored (the message says what); nothing was changed"}}


class Page(BaseModel):
    """A page of a list: pass `next_cursor` back as `cursor` for the next one."""
    next_cursor: str | None = Field(default=None, description="pass as `cursor` for the next page; null on the last page")
