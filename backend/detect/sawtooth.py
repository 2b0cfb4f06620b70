"""Saw-tooth rules: a metric that climbs, falls back at once, and climbs again (pure).

A cache that outlives weight syncs (a prefix cache computed with old weights: NVIDIA-NeMo/RL#4018,
huggingface/trl#3024) makes the rollout/trainer mismatch grow step after step until the engine
restarts and the cache is gone; then it grows again. No level catches that early (each climb starts
low) and a trend rule sees one climb at a time and resolves at each reset. The shape is the sign.

The newest `window * blocks` points are cut into blocks of `window` points, each summarised by its
median (spikes move nothing); the noise of a block median is trend.py's (within-block MAD,
widened for autocorrelation). A **reset** is a fall of at least `min_score` x the noise of a
difference of two block medians between a block and the next one or the one after (a reset in the
middle of a block splits it). A **tooth** is the stretch between two resets (or the start of the
look-back and the first reset) that rose by at least `min_score` x that noise, gradually (over at
least 3 blocks, no single block-to-block step holding more than two thirds of the rise), and whose
reset fell back at least half of the rise. Two teeth make a saw-tooth: one climb and one fall are
a drift and a fix, or an incident that ended.

Pure: numbers in, a verdict out; the engine reads the points and keeps the alert state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from paritywatch.backend.detect.trend import block_noise

DEFAULT_BLOCKS = 48
MIN_TOOTH_BLOCKS = 3
MIN_TEETH = 2
RETURN_FRACTION = 0.5  # a reset falls back at least this part of the rise before it
GRADUAL = 2 / 3  # no single block-to-block step holds more of a rise than this


@dataclass(frozen=True)
class Tooth:
    low: float  # median of the block the climb starts from
    high: float  # median of the last block before the fall
    after: float  # median right after the fall
    climb_points: int  # how many points the climb lasted
    reset_at: int  # index (into the assessed points) of the first point of the block the fall lands on
    score: float  # min(rise, fall) / noise of a difference of two block medians


@dataclass(frozen=True)
class SawtoothResult:
    teeth: tuple[Tooth, ...]
    score: float  # the weaker of the newest two teeth (0 with fewer than two)
    noise: float  # standard error of a block median
    points: int

    def breaches(self, min_score: float) -> bool:
        return len(self.teeth) >= MIN_TEETH and self.score >= min_score

    def reason(self, key: str, steps: np.ndarray | None = None) -> str:
        """What it saw, in words a person on call can act on."""
        newest = self.teeth[-1]
        where = [int(steps[t.reset_at]) if steps is not None else t.reset_at for t in self.teeth]
        at = "steps" if steps is not None else "points"
        return (f"{key} climbs and resets: {len(self.teeth)} times it rose (last from {newest.low:.4g} to "
                f"{newest.high:.4g} over ~{newest.climb_points} points) and fell back at once (near {at} "
                f"{', '.join(str(w) for w in where)}), {self.score:.1f}x its noise: a mismatch that grows until "
                "an engine restart clears it")


def points_needed(window: int, blocks: int = DEFAULT_BLOCKS) -> int:
    return max(2, int(window)) * blocks


def assess(values: np.ndarray, window: int, min_score: float, blocks: int = DEFAULT_BLOCKS) -> SawtoothResult | None:
    """The saw-tooth verdict of the newest points of a series (oldest first); None until there
    are enough blocks for two teeth."""
    window = max(2, int(window))
    n_blocks = min(blocks, len(values) // window)
    if n_blocks < MIN_TEETH * (MIN_TOOTH_BLOCKS + 1):
        return None
    offset = len(values) - n_blocks * window
    points = np.asarray(values[offset:], dtype=np.float64)
    medians = np.median(points.reshape(n_blocks, window), axis=1)
    noise = block_noise(points, medians, window)
    unit = noise * math.sqrt(2.0)
    teeth = tuple(_teeth(medians, unit, min_score, window, offset))
    newest = teeth[-MIN_TEETH:]
    score = min(t.score for t in newest) if len(newest) == MIN_TEETH else 0.0
    return SawtoothResult(teeth, score, noise, len(values))


def _teeth(medians: np.ndarray, unit: float, min_score: float, window: int, offset: int):
    start, b = 0, 1
    while b < len(medians):
        after_block = _fall_to(medians, b, unit * min_score)
        if after_block is None:
            b += 1
            continue
        tooth = _tooth(medians[start:b], medians[after_block], unit, min_score, window, offset + after_block * window)
        if tooth is not None:
            yield tooth
        start = b = after_block
        b += 1


def _fall_to(medians: np.ndarray, b: int, least: float) -> int | None:
    """The block a fall between block b-1 and block b (or b+1) lands on, when it falls at least `least`."""
    candidates = [i for i in (b, b + 1) if i < len(medians) and medians[b - 1] - medians[i] >= least]
    return min(candidates, key=lambda i: medians[i]) if candidates else None


def _tooth(climb: np.ndarray, after: float, unit: float, min_score: float, window: int, reset_at: int) -> Tooth | None:
    if len(climb) < MIN_TOOTH_BLOCKS:
        return None
    low, high = float(climb.min()), float(climb[-1])
    rise, fall = high - low, high - float(after)
    steps_up = np.diff(climb)
    if rise < min_score * unit or fall < RETURN_FRACTION * rise or steps_up.max() > GRADUAL * rise:
        return None
    return Tooth(low, high, float(after), len(climb) * window, reset_at, min(rise, fall) / unit)
