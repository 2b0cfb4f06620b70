"""Which silences mute an alert: pure matching, time decided by the caller (which silences are
active). A silence matches when every field it sets (run, project, alert kind) matches."""
from __future__ import annotations

from typing import Iterable, Protocol


class SilenceLike(Protocol):
    id: int
    run_id: int | None
    project: str | None
    kind: str | None


def matches(silence: SilenceLike, run_id: int, project: str, kind: str) -> bool:
    return ((silence.run_id is None or silence.run_id == run_id)
            and (silence.project is None or silence.project == project)
            and (silence.kind is None or silence.kind == kind))


def muting(silences: Iterable[SilenceLike], run_id: int, project: str, kind: str) -> list[int]:
    """Ids of the silences (from `silences`, the active ones) that mute this alert."""
    return [s.id for s in silences if matches(s, run_id, project, kind)]


def muted_count(silences: Iterable[SilenceLike], run_id: int, project: str, open_by_kind: dict[str, int]) -> int:
    """How many of a run's open alerts (`open_by_kind`: kind -> count) the silences mute."""
    silences = list(silences)
    return sum(n for kind, n in open_by_kind.items() if muting(silences, run_id, project, kind))
