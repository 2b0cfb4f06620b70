"""Is this process protected? What stands between it and the backend, judged from every request, said out loud.

A wrong PARITYWATCH_URL, a token the backend refuses or a run it will not register must not be
silent: the run trains with nobody able to pause it. Every request's outcome feeds one tracker,
which names the problem (`problem_of`: the backend is unreachable, the URL is not the Paritywatch
API, the token is refused, lacks the ingest scope or belongs to another project, the run cannot be
registered) and logs it at WARNING (Python prints warnings to stderr even when the host configured
no logging) with the metric batches not delivered so far and what becomes of them: once a batch
was affected or FIRST_WARNING_S after the problem began, whichever comes first, then at most once
per `repeat_s` while it lasts, and once more when it ends. `healthy` and the monitor's `stats()`
show the same.

What a failure means for the batch that met it is decided here too (`keeps_batches`), so the
delivery, the uploads and the messages cannot disagree.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from . import contract
from .logs import log
from .transport import FOREIGN, PROBE, REGISTRATION

if TYPE_CHECKING:  # pragma: no cover
    from .transport import TransportError

# The problems, each something the user must act on (or wait out, for the first).
UNREACHABLE = "unreachable"  # no answer, or a 5xx
WRONG_URL = "wrong_url"  # the URL answers, but not as the Paritywatch API
TOKEN_REFUSED = "token_refused"  # 401: no token, an unknown or a revoked one (or open mode refusing a remote caller)
WRONG_SCOPE = "wrong_scope"  # the token lacks the ingest scope
WRONG_PROJECT = "wrong_project"  # an ingest token bound to another project than the run's
NOT_REGISTERED = "registration_refused"  # the backend refused the run or process itself (an unknown run id...)

# Problems that leave the batch fine: it waits in the spool for a backend that takes it (this
# process's, or a later process's with the same PARITYWATCH_URL and a token that may write it).
# The others drop it (counted): no attempt could deliver it, and the spool is per URL.
KEEPING_PROBLEMS = frozenset({UNREACHABLE, TOKEN_REFUSED, WRONG_SCOPE, WRONG_PROJECT})

# The first warning of a problem waits this long for a metric batch to be affected, so that it
# can say what became of it; never longer.
FIRST_WARNING_S = 2.0

_NOT_FOUND = frozenset({404, 405})


def problem_of(error: "TransportError") -> str | None:
    """What a failed request says about this process's protection; None when it says nothing bad
    (the backend answered and took the token: a batch refused for its own content, a 429)."""
    if error.problem is not None:
        return error.problem
    status = error.status
    if status is None or status >= 500:
        return UNREACHABLE
    if status == 401:
        return TOKEN_REFUSED
    if (status in _NOT_FOUND and (error.purpose == PROBE or error.code is None)) or 200 <= status < 300:
        return WRONG_URL  # /whoami missing, another server's 404, or a 2xx that is not our JSON
    if error.purpose == PROBE and status == 403:
        return TOKEN_REFUSED  # open mode refuses callers from other machines
    if error.purpose == REGISTRATION and not error.retryable:
        return WRONG_PROJECT if status == 403 else NOT_REGISTERED
    return None


def keeps_batches(error: "TransportError") -> bool:
    """Does a batch that met `error` wait in the spool (True) or is it dropped and counted?"""
    return error.retryable or problem_of(error) in KEEPING_PROBLEMS


@dataclass(frozen=True)
class Undelivered:
    """This process's metric batches that did not reach the backend (so far)."""

    waiting: int = 0  # in its spool file, sent once the backend takes them
    dropped: int = 0  # batches dropped (spool full, or refused): counted in `dropped_points`
    dropped_points: int = 0  # every point lost: dropped batches' and those log() could not queue

    @property
    def batches(self) -> int:
        return self.waiting + self.dropped

    def describe(self, spool_dir: Any) -> str:
        """E.g. "3 metric batches not delivered so far: 2 waiting in the spool (dir), 1 dropped, 40 points lost in all"."""
        parts = [f"{self.waiting} waiting in the spool ({spool_dir})"] if self.waiting else []
        parts += [f"{self.dropped} dropped"] if self.dropped else []
        parts += [f"{_plural(self.dropped_points, 'point')} lost in all"] if self.dropped_points else []
        return f"{_plural(self.batches, 'metric batch')} not delivered so far" + (": " + ", ".join(parts) if parts else "")


def _plural(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}{'es' if what.endswith('ch') else 's'}"


def _what(problem: str, url: str, reason: str) -> str:
    if problem == UNREACHABLE:
        return f"cannot reach the backend at {url} ({reason})"
    if problem == WRONG_URL:
        hint = f", without {contract.API_PREFIX}" if url.endswith(contract.API_PREFIX) else ""
        return (f"{url} is not a Paritywatch backend ({reason}); PARITYWATCH_URL is the server's root, "
                f"e.g. http://127.0.0.1:8321{hint}")
    if problem == WRONG_SCOPE:
        return f"the backend at {url} refused this process's token ({reason}): the hooks need an ingest token"
    if problem == WRONG_PROJECT:
        return (f"the backend at {url} refused this process's token ({reason}): pass the token's project "
                "(project= or PARITYWATCH_PROJECT)")
    if problem == NOT_REGISTERED:
        return f"the backend at {url} refused to register this process ({reason})"
    return f"the backend at {url} refused this process's token ({reason}): check PARITYWATCH_TOKEN"


def _fate(problem: str) -> str:
    if problem in KEEPING_PROBLEMS:
        return "sent once the backend takes them, by a later process with this PARITYWATCH_URL too"
    return "new ones are dropped too (counted): no later attempt could deliver them"


@dataclass
class _Problem:
    kind: str
    reason: str
    since: float
    baseline: int  # batches already undelivered when it began
    warned: bool = False


class BackendHealth:
    """Fed the outcome of every request (from any thread) and ticked by the worker; warns at a bounded rate."""

    def __init__(self, url: str, *, fail_closed: bool = False, spool_dir: Any = None, repeat_s: float = 60.0,
                 first_warning_s: float = FIRST_WARNING_S, clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[bool], None] = lambda reachable: None,
                 undelivered: Callable[[], Undelivered] = Undelivered) -> None:
        self.url = url
        self.fail_closed = fail_closed
        self.spool_dir = spool_dir
        self.repeat_s = repeat_s
        self.first_warning_s = first_warning_s
        self._clock = clock
        self._on_change = on_change
        self._undelivered = undelivered
        self._closed = False
        self.reset_after_fork()

    def reset_after_fork(self) -> None:
        self._lock = threading.Lock()  # the parent's may have been held at fork time
        self.reachable: bool | None = None  # None until the first outcome
        self.failures = 0  # consecutive
        self.warnings = 0
        self._problem: _Problem | None = None
        self._last_warned: dict[str, float] = {}  # problem kind -> when it was last said

    @property
    def healthy(self) -> bool:
        """The backend took the last request: metrics arrive and a pause reaches the loop."""
        return self.reachable is True

    @property
    def problem(self) -> str | None:
        problem = self._problem
        return None if problem is None else problem.kind

    @property
    def drops_batches(self) -> bool:
        """The problem met, by any of this process's requests, is one no later attempt gets past."""
        problem = self.problem
        return problem is not None and problem not in KEEPING_PROBLEMS

    def observe(self, error: "TransportError | None", purpose: str | None = None) -> None:
        if self._closed:
            return
        problem = None if error is None else problem_of(error)
        if problem is None:
            if purpose not in (PROBE, FOREIGN):  # neither proves that this process is protected
                self._contact()
        else:
            self._failure(problem, _reason(error))

    def check(self) -> None:
        """Say a problem whose first warning was waiting, if it is due now (the worker, every tick)."""
        if not self._closed:
            self._warn_if_due()

    def close(self) -> None:
        """Stop judging: a closing monitor's own aborted requests say nothing about the backend."""
        self._closed = True

    def stats(self) -> dict[str, Any]:
        problem = self._problem
        return {"healthy": self.healthy, "backend_problem": None if problem is None else problem.kind,
                "backend_error": None if problem is None else problem.reason,
                "unreachable_s": None if problem is None else round(self._clock() - problem.since, 3),
                "unreachable_warnings": self.warnings}

    # -- transitions

    def _contact(self) -> None:
        with self._lock:
            was, ended = self.reachable, self._problem
            self.reachable, self.failures, self._problem = True, 0, None
        if ended is not None and ended.warned:
            log.warning("paritywatch: the backend at %s takes this process's requests again after %.0f s: the run is "
                        "protected again (%s).", self.url, self._clock() - ended.since,
                        self._undelivered().describe(self.spool_dir))
        if was is not True:
            self._on_change(True)

    def _failure(self, kind: str, reason: str) -> None:
        now = self._clock()
        undelivered = self._undelivered().batches
        with self._lock:
            was = self.reachable
            self.reachable = False
            self.failures += 1
            problem = self._problem
            if problem is None or problem.kind != kind:  # a new condition: said on its own
                since = now if problem is None else problem.since
                self._problem = _Problem(kind, reason, since, undelivered)
            else:
                problem.reason = reason
        self._warn_if_due()
        if was is not False:
            self._on_change(False)

    def _warn_if_due(self) -> None:
        """Each kind of problem is said at most once per `repeat_s`; its first time once a batch
        was affected or `first_warning_s` after it began."""
        now = self._clock()
        undelivered = self._undelivered()
        with self._lock:
            problem = self._problem
            if problem is None:
                return
            last = self._last_warned.get(problem.kind)
            if last is not None and now - last < self.repeat_s:
                return
            if not problem.warned and now - problem.since < self.first_warning_s \
                    and undelivered.batches <= problem.baseline:
                return
            first, problem.warned = not problem.warned, True
            self._last_warned[problem.kind] = now
            self.warnings += 1
        self._warn(problem, first, now - problem.since, undelivered)

    def _warn(self, problem: _Problem, first: bool, down_for: float, undelivered: Undelivered) -> None:
        if self.fail_closed:
            consequence = "Training is HELD in wait_if_paused() until the backend takes this process (fail_closed=True)"
        else:
            consequence = ("This run is UNPROTECTED: nothing can pause or stop it (fail_closed=True or "
                           "PARITYWATCH_FAIL_CLOSED=1 holds training instead)")
        what = _what(problem.kind, self.url, problem.reason)
        if not first:
            what = f"still, after {down_for:.0f} s: {what}"
        log.warning("paritywatch: %s. %s. %s; %s.", what, consequence, undelivered.describe(self.spool_dir),
                    _fate(problem.kind))


def _reason(error: "TransportError") -> str:
    """The server's own words when it answered, else what went wrong on the way."""
    if error.problem is None and error.status is not None and error.detail:
        return f"HTTP {error.status}: {error.detail}"
    return str(error)
