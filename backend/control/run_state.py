"""The run state machine, and the process lifecycle that drives part of it.

One column (`runs.control_state`) holds one of:

    running --pause--> paused --resume--> running
    running | paused --stop--> stopping --(trainer reports its loop ended)--> stopped
    running | paused --(the last trainer closes; with no trainer, the last process)--> finished
    running | paused --(no process left live, some lost)--> crashed --(a process is back)--> the state before
    stopping --(no process live for the heartbeat timeout since the stop)--> stopped
    finished --(a trainer registers again: the job was resumed)--> running
    crashed --stop--> stopped

Processes (components) are `live`, `closed` (they said so: POST .../close) or `lost` (silent for
the heartbeat timeout while the run was live). Only a lost process of a running or paused run
raises `heartbeat_lost`; it resolves when the process heartbeats, registers or closes. The sweep
reads live runs only: a live process of an ended run that falls silent (its orchestrator shut it
down without close()) stays `live` in storage and is shown `ended` (detect/workers.py,
process_state); if a trainer resumes the run, such processes become `lost` without an alert. A run that
ends cleanly (stopped, finished) resolves its open alerts: nothing is left to act on, and the
receivers that were told an alert fired are told it resolved. Every state change is audited
(`control_events`) and, except a clean finish, sent as a `run.control` event. A run that ends
(stopped, finished, crashed) having trained steps while a divergence was open also sends
`run.ended_tainted` with its record (backend/alerts/taint.py): an untainted finish still sends
nothing.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from paritywatch.backend.alerts import lifecycle, taint
from paritywatch.backend.alerts.effects import wakeups
from paritywatch.backend.alerts.hearing import HearingClock
from paritywatch.backend.db import Database
from paritywatch.backend.errors import Conflict
from paritywatch.backend.models import ENDED_RUN_STATES, Component, Run, utcnow
from paritywatch.backend.store import control as control_store
from paritywatch.backend.store.alerts import heartbeat_key
from paritywatch.backend.store import runs as run_store
from paritywatch.backend.store.rows import raced
from paritywatch.backend.store.workers import silent_cutoff
from paritywatch.backend.webhooks.outbox import enqueue_event, run_ref
from trainer_hooks import contract

ACTOR = "paritywatch"
ACTIONS = contract.RUN_CONTROL_ACTIONS  # action -> (states it may start from, resulting state)
QUIET_STATES = ("finished",)  # a clean end pages nobody: no run.control event
# A run that ends in one of these having trained on tainted steps sends `run.ended_tainted` (a
# finish too: its checkpoints are what a user must now refuse).
END_STATES = ("stopped", "finished", "crashed")


def who(comp: Component) -> str:
    return f"{comp.side} {comp.worker_id}"


def change_state(s: Session, run: Run, target: str, actor: str | None, reason: str) -> bool:
    """Move the run to `target` (audited), and set off what that means. False if already there."""
    if run.control_state == target:
        return False
    previous = run.control_state
    control_store.set_state(s, run, target, actor, reason)
    wakeups(s).control_runs[run.id] = control_store.control_of(run)
    if target in ENDED_RUN_STATES:
        lifecycle.resolve_all(s, run, f"the run {target}")
    record = taint.record_of(s, run)  # after the resolutions: spans still open closed at the last step
    control = control_store.control_of(run)
    control["updated_at"] = control["updated_at"].isoformat()
    data = {"run": run_ref(s, run), "control": control, "from_state": previous, "taint": record}
    if target not in QUIET_STATES:
        enqueue_event(s, contract.EVENT_RUN_CONTROL, data, run.project)
    if target in END_STATES and record["tainted"]:
        enqueue_event(s, contract.EVENT_RUN_ENDED_TAINTED, data, run.project)
    return True


# ------------------------------------------------------------------ control actions

def apply_action(s: Session, run_id: int, action: str, actor: str | None, reason: str) -> dict:
    """Pause, resume or stop; repeating an action already in effect is a no-op, not an error."""
    allowed_from, target = ACTIONS[action]
    run = run_store.lock_run(s, run_id)
    current = run.control_state
    if action == "stop" and current == "crashed":  # nobody is left to finish the loop
        change_state(s, run, "stopped", actor, reason or "stopped after the run crashed")
    elif current == target or (action == "stop" and current == "stopped"):
        pass
    elif current not in allowed_from:
        raise Conflict(f"cannot {action} a run that is {current}")
    else:
        change_state(s, run, target, actor, reason)
    return control_store.control_of(run)


def act_on_rule(s: Session, run: Run, action: str, reason: str) -> bool:
    """A rule's action (pause | stop) where it applies; True if the state changed."""
    allowed_from, target = ACTIONS[action]
    if run.control_state not in allowed_from or run.control_state not in contract.ACTIVE_RUN_STATES:
        return False
    return change_state(s, run, target, ACTOR, reason)


def pause_on_mismatch(s: Session, run: Run, reason: str) -> bool:
    """A new (or newly error) processor or weights mismatch: pause the run if its `on_mismatch`
    policy says so and it is running; True if the state changed."""
    if run.on_mismatch != "pause" or run.control_state != "running":
        return False
    return change_state(s, run, "paused", ACTOR, reason)


def acknowledge_stop(s: Session, run_id: int, component_id: int | None, actor: str, reason: str) -> dict:
    """A hook reports that its loop has ended after a stop: `stopping` becomes `stopped`.
    Idempotent (a second report is a no-op); a run nobody asked to stop is a conflict."""
    run = run_store.lock_run(s, run_id)
    if component_id is not None:
        actor = who(run_store.get_component(s, run_id, component_id))
    if run.control_state == "stopped":
        return control_store.control_of(run)
    if run.control_state != "stopping":
        raise Conflict(f"run {run_id} is {run.control_state}: there is no stop to acknowledge")
    change_state(s, run, "stopped", actor, reason or "the training loop ended after the stop")
    return control_store.control_of(run)


# ------------------------------------------------------------------ process lifecycle

def register(s: Session, run_id: int, side: str, worker_id: str, host: str, pid: int,
             heartbeat_timeout_s: float | None = None) -> Component:
    """Upsert the process (live again if it was closed or lost) and wake its run if it needs it.
    A trainer resuming a finished run: the processes the run left silent (shown `ended`, silent
    for `heartbeat_timeout_s`) become lost quietly, so that the sweep does not page about them."""
    def attempt(_n: int) -> Component:  # a concurrent registration of the same worker can win the insert
        run = run_store.lock_run(s, run_id)
        comp, previous = run_store.upsert_component(s, run_id, side, worker_id, host, pid)
        if previous == "lost":
            lifecycle.resolve_key(s, run, heartbeat_key(comp.id), "the process registered again")
        if run.control_state == "crashed":
            _recover(s, run, comp)
        elif run.control_state == "finished" and side == "trainer":
            if heartbeat_timeout_s is not None:
                now = utcnow()
                run_store.mark_silent_lost(s, run_id, silent_cutoff(now, heartbeat_timeout_s), now)
            change_state(s, run, "running", who(comp), "a trainer registered after the run finished")
        return comp
    return raced(s, attempt, "component registration")


def heartbeat(db: Database, s: Session, run_id: int, component_id: int, progress: dict | None = None) -> dict:
    """The hot path: one UPDATE (backend/store/runs.py), which also stores the beat's `progress`
    (policy_version, samples_per_s, points_per_s), through `db`'s group-commit writer, not `s`
    (hundreds of processes beat: no ORM session, no write lock of the request's own). Returns
    the run's control. A lost process coming back is live again, its alert resolves, and a
    crashed run recovers: that, and only that, is written in `s`."""
    status, control = run_store.touch_component(db, run_id, component_id, utcnow(), progress)
    if status != "lost":
        return control
    run = run_store.lock_run(s, run_id)
    comp = run_store.get_component(s, run_id, component_id)
    if comp.status == "lost":
        comp.status, comp.lost_at = "live", None
        lifecycle.resolve_key(s, run, heartbeat_key(comp.id), "heartbeat resumed")
        if run.control_state == "crashed":
            _recover(s, run, comp)
    return control_store.control_of(run)


def close(s: Session, run_id: int, component_id: int, reason: str | None) -> Run:
    """The process ended cleanly (idempotent). Its trainer closing ends the run."""
    run = run_store.lock_run(s, run_id)
    comp = run_store.get_component(s, run_id, component_id)
    if comp.status == "closed":
        return run
    was = comp.status
    comp.status, comp.closed_at, comp.close_reason = "closed", utcnow(), reason
    s.flush()
    if was == "lost":
        lifecycle.resolve_key(s, run, heartbeat_key(comp.id), "the process closed")
    _end_if_last(s, run, comp)
    return run


def _end_if_last(s: Session, run: Run, comp: Component) -> None:
    counts = run_store.process_counts(s, [run.id])[run.id]
    last_trainer = comp.side == "trainer" and counts["live_trainers"] == 0
    last_process = counts["trainers"] == 0 and counts["live"] == 0
    if not (last_trainer or last_process):
        return
    what = "the trainer closed" if last_trainer else "every process closed"
    if run.control_state == "stopping":
        change_state(s, run, "stopped", who(comp), f"{what} after the stop")
    elif run.control_state in ("running", "paused", "crashed"):
        change_state(s, run, "finished", who(comp), what)


def _recover(s: Session, run: Run, comp: Component) -> None:
    back_to = control_store.state_before(s, run.id, "crashed") or "running"
    change_state(s, run, back_to, who(comp), "a process of the run is back")


# ------------------------------------------------------------------ the heartbeat sweep

def sweep(s: Session, timeout_s: float, now: datetime | None = None,
          hearing: HearingClock | None = None) -> dict[str, int]:
    """Live processes of live runs silent for `timeout_s` are lost; runs left with no live
    process crash (or, stopping, complete their stop). Silence counts only while `hearing` says
    this backend could hear (none given: all along). Reads only live runs' live processes: its
    cost does not grow with history. One transaction: the caller's `s` (an `Effects.write`
    session, so the wake-ups of what changed fire once it commits). Returns counts for tests
    and benches."""
    now = now or utcnow()
    cutoff = now - timedelta(seconds=timeout_s) if hearing is None else hearing.cutoff(now, timeout_s)
    out = {"runs": 0, "lost": 0, "changed": 0}
    if cutoff is None:  # not listening for a whole timeout yet: nobody's silence is proven
        return out
    run_ids = run_store.live_run_ids(s)
    out["runs"] = len(run_ids)
    stale = run_store.stale_components(s, run_ids, cutoff)
    for run_id in sorted({c.run_id for c in stale}):
        run = run_store.lock_run(s, run_id)  # the run before its processes, as everywhere
        for comp in (c for c in stale if c.run_id == run_id):
            if run_store.mark_lost(s, comp.id, cutoff, now):
                out["lost"] += 1
                _announce_lost(s, run, comp, now)
    counts = run_store.process_counts(s, run_ids)
    for run_id in run_ids:
        if counts[run_id]["live"] == 0:
            out["changed"] += _settle_silent_run(s, run_id, cutoff, timeout_s)
    return out


def _announce_lost(s: Session, run: Run, comp: Component, now: datetime) -> None:
    if run.control_state == "stopping":
        return  # processes going away is what a stop asks for
    age = (now - comp.last_heartbeat).total_seconds()
    title = f"{comp.side} {comp.worker_id} on {comp.host or '?'} silent for {age:.0f} s without closing"
    lifecycle.fire(s, run, "heartbeat_lost", "warning", heartbeat_key(comp.id), title,
                   {"component_id": comp.id, "side": comp.side, "worker_id": comp.worker_id, "host": comp.host,
                    "last_heartbeat": comp.last_heartbeat.isoformat()})


def _settle_silent_run(s: Session, run_id: int, cutoff: datetime, timeout_s: float) -> int:
    run = run_store.lock_run(s, run_id)  # and count again under the lock: a registration may have won
    counts = run_store.process_counts(s, [run_id])[run_id]
    if counts["live"]:
        return 0
    if run.control_state == "stopping" and run.control_updated_at < cutoff:
        return int(change_state(s, run, "stopped", ACTOR,
                                f"no process of the run sent a heartbeat for {timeout_s:g} s after the stop"))
    if run.control_state in ("running", "paused") and counts["lost"]:
        return int(change_state(s, run, "crashed", ACTOR, f"every process of the run was lost ({counts['lost']})"))
    return 0
