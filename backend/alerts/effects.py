"""What a committed write sets off: long-polls of a run's control wake, the notifier looks at its
groups, the dispatcher sends outbox rows, and whatever else the caller asked to run once its
writes are visible (`after_commit`: a route's detection of what it stored, a rules cache to
forget). Code inside the transaction records what it changed (`wakeups(s)`); `Effects.write`
fires the wake-ups only once the transaction has committed.
It also carries what payloads need from the settings (the dashboard's public URL)."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

from sqlalchemy.orm import Session

from paritywatch.backend.db import Database

_KEY = "paritywatch.effects"


def _noop(*_args) -> None:
    return None


@dataclass
class Wakeups:
    control_runs: dict[int, dict] = field(default_factory=dict)  # run id -> its new control state
    notify: bool = False  # a notification group is due
    outbox: bool = False  # a delivery row was written
    after: list[Callable[[], None]] = field(default_factory=list)  # run once committed, in order

    def pending(self) -> bool:
        return bool(self.control_runs or self.notify or self.outbox or self.after)


class Effects:
    def __init__(self, public_url: str = "", default_group_by: tuple[str, ...] = ("run", "kind"),
                 on_control_change: Callable[[int, dict], None] = _noop, on_notify: Callable[[], None] = _noop,
                 on_outbox: Callable[[], None] = _noop):
        self.public_url = public_url.rstrip("/")
        self.default_group_by = tuple(default_group_by)
        self.on_control_change = on_control_change
        self.on_notify = on_notify
        self.on_outbox = on_outbox

    @contextmanager
    def write(self, db: Database) -> Iterator[Session]:
        """`db.write()`, then the wake-ups its changes call for (none if it rolled back)."""
        with db.write() as s:
            wake = self.track(s)
            yield s
        self.fire(wake)

    def track(self, s: Session) -> Wakeups:
        """Collect what `s`'s changes will call for; the caller fires them once it has committed."""
        wake = Wakeups()
        s.info[_KEY] = (self, wake)
        return wake

    def fire(self, wake: Wakeups) -> None:
        for run_id, control in wake.control_runs.items():
            self.on_control_change(run_id, control)
        if wake.notify:
            self.on_notify()
        if wake.outbox:
            self.on_outbox()
        for fn in wake.after:
            fn()

    def run_url(self, run_id: int) -> str:
        return f"{self.public_url}/#/runs/{run_id}"


_DEFAULT = Effects()


def effects_of(s: Session) -> Effects:
    return s.info.get(_KEY, (_DEFAULT, None))[0]


def after_commit(s: Session, fn: Callable[[], None]) -> None:
    """Run `fn` once `s`'s transaction has committed (never if it rolls back): what must see the
    writes (an evaluation reading them in its own transaction) or must not run before them (a
    cache that could reload the old rows)."""
    entry = s.info.get(_KEY)
    if entry is None:
        raise RuntimeError("after_commit needs a session opened by Effects.write")
    entry[1].after.append(fn)


def wakeups(s: Session) -> Wakeups:
    """The current transaction's wake-ups (a throwaway one outside `Effects.write`)."""
    entry = s.info.get(_KEY)
    return entry[1] if entry is not None else Wakeups()
