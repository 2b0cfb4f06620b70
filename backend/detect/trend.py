"""Trend rules: a change in a metric's level that no fixed threshold sees, told apart from noise.

The newest `window * blocks` points of a series are cut into `blocks` blocks of `window` points
(the newest block ends at the newest point). Each block is summarised by its median, so a single
spike moves nothing. Two shifts are measured, both in the rule's direction:

- step:  the newest block's median against the block before it (a jump, e.g. right after a
  weight sync, is seen once half a window of points has arrived after it);
- drift: the newest block's median against the oldest block's (a slow drift, e.g. 0.011 -> 0.036
  over hundreds of steps, adds up over the whole look-back).

Each shift is scaled by the noise of a block median: the points' spread inside blocks (MAD of
each point's distance to its block's median, the median over blocks), times the standard error of
a median of `window` points, widened for the lag-1 autocorrelation training metrics usually have.
The score is shift / (noise * sqrt 2), a robust z-score; the rule breaches when it reaches the
rule's threshold and the shift is at least `min_change`.

Pure: numbers in, a verdict out; the engine reads the points and keeps the alert state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DEFAULT_BLOCKS = 8
MIN_BLOCKS = 2
MAD_TO_SIGMA = 1.4826  # sigma of a normal distribution / its median absolute deviation
MEDIAN_EFFICIENCY = 1.2533  # standard error of a median / that of a mean, normal data (sqrt(pi/2))
HOLD_FRACTION = 0.5  # a firing trend alert holds while its score stays above this part of the threshold


@dataclass(frozen=True)
class TrendResult:
    test: str  # "step" or "drift": the test with the higher score
    score: float  # shift / its noise, signed so that positive is the rule's direction
    change: float  # newest block median - reference block median (signed, raw units)
    recent: float  # median of the newest block
    reference: float  # median of the block it was compared with
    noise: float  # standard error of a block median used for the score
    points: int  # points assessed

    def breaches(self, min_score: float, min_change: float = 0.0) -> bool:
        return self.score >= min_score and abs(self.change) >= min_change

    def reason(self, key: str, window: int) -> str:
        """Why it fired, in words a person on call can act on."""
        moved = "rose" if self.change > 0 else "fell"
        against = "the previous" if self.test == "step" else f"{self.points - window} points earlier:"
        kind = "a step change" if self.test == "step" else "a sustained drift"
        return (f"{key} {moved} from {self.reference:.4g} to {self.recent:.4g} (median of the last {window} points "
                f"against {against} {window}), {self.score:.1f}x its noise: {kind}")


def points_needed(window: int, blocks: int = DEFAULT_BLOCKS) -> int:
    return window * blocks


def assess(values: np.ndarray, window: int, blocks: int = DEFAULT_BLOCKS, direction: str = "up") -> TrendResult | None:
    """Step and drift scores of the newest points of a series (oldest first); None until at least
    MIN_BLOCKS full blocks exist. `direction` "up" scores rises, "down" scores falls."""
    window = max(1, int(window))
    n_blocks = min(blocks, len(values) // window)
    if n_blocks < MIN_BLOCKS:
        return None
    newest = np.asarray(values[-n_blocks * window:], dtype=np.float64)
    medians = np.median(newest.reshape(n_blocks, window), axis=1)
    noise = block_noise(newest, medians, window)
    sign = 1.0 if direction == "up" else -1.0
    candidates = [_result("step", medians[-1], medians[-2], noise, sign, len(newest))]
    if n_blocks > 2:
        candidates.append(_result("drift", medians[-1], medians[0], noise, sign, len(newest)))
    return max(candidates, key=lambda r: r.score)


def _result(test: str, recent: float, reference: float, noise: float, sign: float, points: int) -> TrendResult:
    change = float(recent - reference)
    return TrendResult(test, sign * change / (noise * math.sqrt(2.0)), change, float(recent), float(reference),
                       noise, points)


def block_noise(points: np.ndarray, medians: np.ndarray, window: int) -> float:
    """Standard error of one block's median. Estimated inside each block (each point's distance to
    its block's median, which a trend or a step between blocks barely moves) and the median taken
    over blocks, so that the one block a step falls into cannot inflate it."""
    residuals = points.reshape(len(medians), window) - medians[:, None]
    sigmas = np.array([mad_sigma(r) for r in residuals])
    rhos = np.array([_lag1_autocorrelation(r, sd) for r, sd in zip(residuals, sigmas)])
    sigma, rho = float(np.median(sigmas)), min(max(float(np.median(rhos)), 0.0), 0.9)
    # Training metrics usually move together step to step: a median of correlated points
    # varies more, by sqrt((1 + rho) / (1 - rho)) for a lag-1 autocorrelation rho.
    from_points = MEDIAN_EFFICIENCY * sigma / math.sqrt(window) * math.sqrt((1 + rho) / (1 - rho))
    # A series that is exactly constant has no noise: any move of its median is real, but a move
    # in the last bits of a float is not worth a page.
    floor = 1e-12 + 1e-9 * float(np.max(np.abs(medians)))
    return max(from_points, floor)


def _lag1_autocorrelation(residuals: np.ndarray, sigma: float) -> float:
    """Lag-1 autocorrelation of residuals clipped at 3 sigma (one spike cannot hide it)."""
    if sigma <= 0 or len(residuals) < 3:
        return 0.0
    r = np.clip(residuals, -3 * sigma, 3 * sigma)
    return float(np.dot(r[1:], r[:-1]) / max(float(np.dot(r, r)), 1e-300))


def mad_sigma(x: np.ndarray) -> float:
    """A robust standard deviation: 1.4826 x the median absolute deviation (0 for no points)."""
    if not len(x):
        return 0.0
    return MAD_TO_SIGMA * float(np.median(np.abs(x - np.median(x))))
