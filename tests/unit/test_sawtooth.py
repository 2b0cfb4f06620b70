"""Saw-tooth rules (backend/detect/sawtooth.py) on a corpus of seeded synthetic k3 series, evaluated
the way the engine does it (after every new batch, on the newest window * blocks points): a
mismatch that climbs until an engine restart clears it (a stale prefix cache, NVIDIA-NeMo/RL#4018)
must fire once two climbs have reset; healthy noise of three kinds, a drift, a step after a
sync, a bad worker that came and went, spikes and a fixed saw-tooth that stops must not (or stop)."""
from __future__ import annotations

import numpy as np
import pytest

from paritywatch.backend.detect import sawtooth
from tests.unit.test_trend import noise

WINDOW = 25  # the built-in rule's (backend/detect/rules.py: SAWTOOTH_WINDOW)
SCORE = 8.0
BASE, PEAK = 0.0015, 0.012  # a healthy dense-model k3, and where a stale cache has taken it by the restart
SD = 0.003  # noise of trend.py's corpus: as large as the whole climb's first third
N = 1600
BATCH = 10  # the engine evaluates once per batch


def stale_cache(rng: np.random.Generator, period: int = 320, n: int = N, kind: str = "gaussian") -> np.ndarray:
    """k3 climbs linearly with the steps since the engine last started, and resets on each restart."""
    t = np.arange(n)
    climb = BASE + (PEAK - BASE) * ((t % period) / period)
    return climb + noise(rng, kind, n) * (0.0008 / SD)


def healthy(rng: np.random.Generator, kind: str) -> np.ndarray:
    return BASE + noise(rng, kind, N) * (0.0008 / SD)


def first_alert(series: np.ndarray, every: int = BATCH) -> int | None:
    """The number of points at which the rule first breaches, evaluated every `every` points."""
    need = sawtooth.points_needed(WINDOW)
    for n in range(every, len(series) + 1, every):
        result = sawtooth.assess(series[max(0, n - need):n], WINDOW, SCORE)
        if result is not None and result.breaches(SCORE):
            return n
    return None


@pytest.mark.parametrize("kind", ["gaussian", "heavy_tailed", "autocorrelated"])
def test_no_false_alarm_on_healthy_noise_over_50_seeds(kind) -> None:
    for seed in range(50):
        rng = np.random.default_rng(seed)
        assert first_alert(healthy(rng, kind), every=WINDOW) is None, seed  # once a block: the corpus is large


@pytest.mark.parametrize("kind", ["gaussian", "heavy_tailed", "autocorrelated"])
def test_a_stale_prefix_cache_fires_after_its_second_reset_and_not_before(kind) -> None:
    period = 320
    for seed in range(10):
        at = first_alert(stale_cache(np.random.default_rng(seed), period, kind=kind))
        assert at is not None and 2 * period < at <= 2 * period + 2 * WINDOW, (seed, at)


def test_the_verdict_says_how_high_it_climbed_and_where_it_fell_back() -> None:
    series = stale_cache(np.random.default_rng(3))
    result = sawtooth.assess(series[-sawtooth.points_needed(WINDOW):], WINDOW, SCORE)
    assert result.breaches(SCORE) and len(result.teeth) >= 2
    tooth = result.teeth[-1]
    assert tooth.low < 0.004 and tooth.high > 0.009 and 200 < tooth.climb_points <= 320
    steps = np.arange(N - sawtooth.points_needed(WINDOW), N)
    resets = [int(steps[t.reset_at]) for t in result.teeth]
    assert all(min(r % 320, 320 - r % 320) <= WINDOW for r in resets)  # within a block of each restart
    reason = result.reason("align/kl_k3", steps)
    assert "climbs and resets" in reason and str(resets[-1]) in reason and "engine restart" in reason


def shaped(rng: np.random.Generator, name: str) -> np.ndarray:
    x = healthy(rng, "gaussian")
    if name == "drift":  # verl#7519's slow FP8 drift: climbs and never falls back
        x += np.linspace(0, 0.02, N)
    elif name == "step_after_sync":
        x[800:] += 0.01
    elif name == "fix":  # a drift, then a fix brings it down once
        x[:900] += np.linspace(0, 0.015, 900)
    elif name == "bad_worker_came_and_went_twice":  # plateaus, not climbs: steps up, flat, steps down
        x[300:600] += 0.01
        x[900:1200] += 0.01
    elif name == "spikes":
        x[::97] += 0.2
    else:
        raise ValueError(name)
    return x


@pytest.mark.parametrize("name", ["drift", "step_after_sync", "fix", "bad_worker_came_and_went_twice", "spikes"])
def test_other_shapes_are_not_a_saw_tooth(name) -> None:
    for seed in range(10):
        assert first_alert(shaped(np.random.default_rng(seed), name), every=WINDOW) is None, (name, seed)


def test_too_few_points_is_no_verdict_and_a_fixed_cache_clears_the_look_back() -> None:
    assert sawtooth.assess(np.zeros(WINDOW * 7), WINDOW, SCORE) is None
    fixed = np.concatenate([stale_cache(np.random.default_rng(5), n=960),
                            healthy(np.random.default_rng(6), "gaussian")[:1300]])
    look_back = sawtooth.points_needed(WINDOW)
    assert sawtooth.assess(fixed[:960][-look_back:], WINDOW, SCORE).breaches(SCORE)
    assert not sawtooth.assess(fixed[-look_back:], WINDOW, SCORE).breaches(SCORE)  # the rule resolves
