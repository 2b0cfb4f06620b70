"""Checks on a metric batch that the request schema cannot state: its size in points, its keys
(the wire contract's rule, with the server's configured length) and aligned series."""
from __future__ import annotations

from paritywatch.backend.errors import Invalid, TooLarge
from trainer_hooks.contract import metric_key_problem


def check_batch(steps: list[int], series: dict[str, list], max_points: int, max_key: int) -> None:
    n_steps = len(steps)
    total = n_steps * len(series)
    if total > max_points:
        raise TooLarge(f"batch has {total} points; the limit is {max_points} a batch")
    if len(series) > max_points:  # no steps: each key still costs its checks (a million empty series)
        raise TooLarge(f"batch has {len(series)} keys; the limit is {max_points} points a batch, each key at least one")
    for key, values in series.items():
        problem = metric_key_problem(key, max_key)
        if problem is not None:
            raise Invalid(f"metric key {key!r}: {problem}")
        if len(values) != n_steps:
            raise Invalid(f"series {key!r} has {len(values)} values for {n_steps} steps")
