"""Trend rules on a corpus of seeded synthetic series: each series is evaluated the way the engine
does it (after every new point, on the newest window * blocks points) and must raise an alert, or
stay silent, as labelled. Noise series: zero false alarms over 50 seeds of each noise type."""
from __future__ import annotations

import numpy as np
import pytest

from paritywatch.backend.detect import trend

WINDOW = 25
SCORE = 8.0  # the documented default threshold of a trend rule
FIXED_THRESHOLD = 0.05  # what a fixed rule would need to stay quiet on these noisy series
SD = 0.003
N = 600


def noise(rng: np.random.Generator, kind: str, n: int = N) -> np.ndarray:
    if kind == "gaussian":
        return rng.normal(0, SD, n)
    if kind == "heavy_tailed":  # Student t, 3 degrees of freedom: occasional big outliers
        return rng.standard_t(3, n) * SD * 0.6
    if kind == "autocorrelated":  # AR(1), rho 0.5: training metrics move together step to step
        e = rng.normal(0, SD * np.sqrt(1 - 0.25), n)
        x = np.zeros(n)
        for i in range(1, n):
            x[i] = 0.5 * x[i - 1] + e[i]
        return x
    raise ValueError(kind)


def first_alert(series: np.ndarray, direction: str = "up") -> tuple[int, trend.TrendResult] | None:
    """The 1-based count of points at which the rule first breaches, evaluated after every point."""
    need = trend.points_needed(WINDOW)
    for n in range(2 * WINDOW, len(series) + 1):
        result = trend.assess(series[max(0, n - need):n], WINDOW, direction=direction)
        if result is not None and result.breaches(SCORE):
            return n, result
    return None


def flat(rng, kind="gaussian"):
    return 0.011 + noise(rng, kind)


def slow_drift(rng):  # 0.011 -> 0.036 over 500 steps (FP8/BF16 drift, verl#7519's shape)
    return np.concatenate([np.full(100, 0.011), np.linspace(0.011, 0.036, 500)]) + noise(rng, "gaussian")


def step_after_sync(rng):  # a weight sync at step 300 leaves the rollout off by 0.015 (trl#5312's shape, smaller)
    return np.concatenate([np.full(300, 0.015), np.full(300, 0.030)]) + noise(rng, "gaussian")


def single_spike(rng):
    x = flat(rng)
    x[400] = 0.2
    return x


def burst_of_spikes(rng):  # three bad batches in a row: still not a change of level
    x = flat(rng)
    x[400:403] = 0.2
    return x


def step_down(rng):
    return np.concatenate([np.full(300, 0.9), np.full(300, 0.8)]) + noise(rng, "gaussian")


@pytest.mark.parametrize("seed", range(5))
def test_slow_drift_alerts_where_a_fixed_threshold_stays_silent(seed):
    series = slow_drift(np.random.default_rng(100 + seed))
    assert series.max() < FIXED_THRESHOLD
    hit = first_alert(series)
    assert hit is not None
    n, result = hit
    assert 100 < n < 400, "the drift started at 100; it is caught well before it ends at 600"
    assert result.test == "drift" and result.change > 0


@pytest.mark.parametrize("seed", range(5))
def test_step_after_a_sync_alerts_within_a_window(seed):
    hit = first_alert(step_after_sync(np.random.default_rng(200 + seed)))
    assert hit is not None
    n, result = hit
    assert 300 < n <= 300 + WINDOW, f"fired after {n - 300} points past the jump"
    assert 0.005 < result.change < 0.02  # part of the 0.015 jump: the newest block is only partly past it
    assert "rose from" in result.reason("sampling/sampling_logp_difference/mean", WINDOW)


@pytest.mark.parametrize("seed", range(5))
def test_a_fall_alerts_a_falling_rule_and_not_a_rising_one(seed):
    series = step_down(np.random.default_rng(300 + seed))
    assert first_alert(series, direction="down") is not None
    assert first_alert(series, direction="up") is None


@pytest.mark.parametrize("make", [single_spike, burst_of_spikes])
@pytest.mark.parametrize("seed", range(5))
def test_spikes_are_not_a_trend(make, seed):
    assert first_alert(make(np.random.default_rng(400 + seed))) is None


@pytest.mark.parametrize("kind", ["gaussian", "heavy_tailed", "autocorrelated"])
def test_no_false_alarms_on_noise_over_50_seeds(kind):
    false_alarms = [seed for seed in range(50) if first_alert(flat(np.random.default_rng(seed), kind)) is not None]
    assert false_alarms == []


def test_too_few_points_is_no_verdict_and_a_constant_series_has_no_noise():
    assert trend.assess(np.zeros(2 * WINDOW - 1), WINDOW) is None
    flat_then_up = np.concatenate([np.full(100, 1.0), np.full(100, 1.5)])
    result = trend.assess(flat_then_up, WINDOW)
    assert result is not None and result.breaches(SCORE) and result.change == 0.5
    assert not trend.assess(np.full(200, 1.0), WINDOW).breaches(SCORE)
    assert not result.breaches(SCORE, min_change=1.0)  # a real change, but smaller than the rule's floor
