"""The backend's hearing clock (backend/alerts/hearing.py): how much of a process's silence counts."""
from __future__ import annotations

import logging
from datetime import datetime, timezone

import pytest

from paritywatch.backend.alerts.hearing import DRAIN_S, PULSE_S, STALL_S, HearingClock

T0 = 1_800_000_000.0  # wall-clock seconds
TIMEOUT_S = 60.0


class FakeTime:
    def __init__(self) -> None:
        self.now = T0

    def advance(self, seconds: float) -> None:
        self.now += seconds


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, timezone.utc)


@pytest.fixture
def time_():
    return FakeTime()


@pytest.fixture
def clock(time_):
    c = HearingClock(monotonic=lambda: time_.now, wall=lambda: time_.now)
    c.pulse()  # serving begins at T0
    return c


def tick_for(clock: HearingClock, time_: FakeTime, seconds: float, every: float = PULSE_S) -> None:
    end = time_.now + seconds
    while time_.now + every <= end:
        time_.advance(every)
        clock.pulse()


def test_a_backend_that_heard_all_along_counts_the_whole_silence(clock, time_):
    tick_for(clock, time_, 3 * TIMEOUT_S)
    assert clock.cutoff(at(time_.now), TIMEOUT_S) == at(time_.now - TIMEOUT_S)


def test_nobody_is_silent_before_the_backend_has_listened_for_a_whole_timeout(clock, time_):
    tick_for(clock, time_, TIMEOUT_S - 1)
    assert clock.cutoff(at(time_.now), TIMEOUT_S) is None
    tick_for(clock, time_, 1)
    assert clock.cutoff(at(time_.now), TIMEOUT_S) == at(T0)


def test_startup_before_the_first_tick_heard_nobody(time_):
    clock = HearingClock(monotonic=lambda: time_.now, wall=lambda: time_.now)
    time_.advance(30)  # migrations
    clock.pulse()
    tick_for(clock, time_, TIMEOUT_S - 10)
    assert clock.cutoff(at(time_.now), TIMEOUT_S) is None


def test_a_stall_is_not_counted_and_its_backlog_gets_time_to_drain(clock, time_, caplog):
    tick_for(clock, time_, 2 * TIMEOUT_S)
    stalled_at = time_.now
    time_.advance(10)
    with caplog.at_level(logging.WARNING, logger="paritywatch"):
        clock.pulse()
    assert "did not run for 10.0 s" in caplog.text
    tick_for(clock, time_, 20)
    # 20 s heard since the stall ended, DRAIN_S of them deaf; the rest of the timeout before it
    before = TIMEOUT_S - (20 - DRAIN_S)
    assert clock.cutoff(at(time_.now), TIMEOUT_S) == at(stalled_at - before)


def test_a_loop_stalled_right_now_is_deaf_from_its_last_tick(clock, time_):
    tick_for(clock, time_, 2 * TIMEOUT_S)
    last_tick = time_.now
    time_.advance(TIMEOUT_S)  # the sweep's thread runs; the loop has not ticked since
    assert clock.cutoff(at(time_.now), TIMEOUT_S) == at(last_tick - TIMEOUT_S)


def test_a_loaded_loop_late_by_less_than_the_stall_bound_still_hears(clock, time_):
    """A dead process is never hidden by a busy server: ticks 1.9 s apart are hearing."""
    tick_for(clock, time_, 3 * TIMEOUT_S, every=STALL_S - 0.1)
    assert clock.cutoff(at(time_.now), TIMEOUT_S) == at(time_.now - TIMEOUT_S)


def test_repeated_stalls_delay_a_loss_by_their_own_deaf_time_only(clock, time_):
    tick_for(clock, time_, TIMEOUT_S)
    silent_from = time_.now  # a process's last heartbeat
    for _ in range(5):  # a 3 s stall every 10 s: 5 s deaf each, with the drain
        tick_for(clock, time_, 7)
        time_.advance(3)
        clock.pulse()
    lost_at = None
    while lost_at is None:
        tick_for(clock, time_, PULSE_S)
        if clock.cutoff(at(time_.now), TIMEOUT_S) > at(silent_from):
            lost_at = time_.now
    assert lost_at - silent_from == pytest.approx(TIMEOUT_S + 5 * (3 + DRAIN_S), abs=PULSE_S)


def test_a_cutoff_asked_for_a_moment_before_a_later_stall_ignores_that_stall(clock, time_):
    tick_for(clock, time_, 2 * TIMEOUT_S)
    asked = time_.now
    time_.advance(10)
    clock.pulse()
    assert clock.cutoff(at(asked), TIMEOUT_S) == at(asked - TIMEOUT_S)


def test_silence_counts_only_up_to_the_last_tick_of_a_loop_late_by_less_than_a_stall(clock, time_):
    """Seen in CI: a loop stalled for 2.0 s (not yet a stall) held the beats unread, and the sweep's
    thread counted those 2 s of silence: a 2 s timeout fired on a process that beat every 0.2 s."""
    tick_for(clock, time_, TIMEOUT_S + 1)
    last_tick = time_.now
    time_.advance(STALL_S * 0.9)  # the loop has not ticked since: beats may wait in its sockets
    assert clock.cutoff(at(time_.now), TIMEOUT_S) == at(last_tick - TIMEOUT_S)
