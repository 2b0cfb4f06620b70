"""Metric batches as the API wants them: logged entries cleaned by the contract's rules, then kept
column by column (`steps` + aligned `series`). Pure: no threads, no I/O."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from . import contract


class ColumnBatch:
    """Rows of (step, {key: value}) kept column by column.

    Consecutive points at the same step with disjoint keys share a row; anything else opens a new
    row (the same key twice at one step stays two points, as it was logged twice). `max_cells`
    counts what the server counts: rows x keys, nulls included.
    """

    def __init__(self, max_points: int, max_cells: int = contract.MAX_POINTS_PER_BATCH) -> None:
        self.max_points = max_points
        self.max_cells = max_cells
        self.steps: list[int] = []
        self.series: dict[str, list[float | None]] = {}
        self.points = 0
        self._row_keys: set[str] = set()

    def add(self, step: int, values: Mapping[str, float | None]) -> bool:
        """Add one logged entry; False (nothing added) when it would exceed the batch limits."""
        merge = bool(self.steps) and self.steps[-1] == step and self._row_keys.isdisjoint(values)
        rows = len(self.steps) + (0 if merge else 1)
        keys = len(self.series) + sum(1 for k in values if k not in self.series)
        if self.steps and (self.points + len(values) > self.max_points or rows * keys > self.max_cells):
            return False
        if not merge:
            self.steps.append(step)
            self._row_keys = set()
        row = len(self.steps) - 1
        for key, value in values.items():
            column = self.series.setdefault(key, [])
            column.extend([None] * (row - len(column)))
            column.append(value)
        self._row_keys.update(values)
        self.points += len(values)
        return True

    def columns(self) -> tuple[list[int], dict[str, list[float | None]]]:
        rows = len(self.steps)
        for column in self.series.values():
            column.extend([None] * (rows - len(column)))
        return self.steps, self.series


@dataclass
class CleanEntry:
    """One `log()` call after the contract's rules: what can be sent, and what was dropped and why."""

    step: int | None
    values: dict[str, float] = field(default_factory=dict)
    problems: list[tuple[Any, str]] = field(default_factory=list)  # (metric key or "step", reason)


def clean_entry(step: Any, metrics: Mapping[Any, Any]) -> CleanEntry:
    """Apply the wire contract to one logged entry. A bad step drops the whole entry; a bad key or
    value drops that metric; null/NaN/inf are left out silently (the server would skip them)."""
    try:
        good_step = contract.step_value(step)
    except (TypeError, ValueError) as exc:
        return CleanEntry(None, problems=[("step", f"step {step!r}: {exc}")] * len(metrics))
    entry = CleanEntry(good_step)
    for key, value in metrics.items():
        problem = contract.metric_key_problem(key)
        if problem is None:
            try:
                number = contract.metric_value(value)
            except TypeError as exc:
                problem = str(exc)
            else:
                if number is not None:
                    entry.values[key] = number
                continue
        entry.problems.append((key, problem))
    return entry
