"""Pareto frontiers: the runs no other run beats on every objective (seed 003's mode A).

A row *a* **dominates** a row *b* when *a* is at least as good as *b* on every
objective and strictly better on at least one ("good" is larger for a ``"max"``
objective, smaller for a ``"min"`` one). The **front** is the rows no row
dominates. Two rows equal on every objective do not dominate each other, so
both stay on the front. A row with NaN in an objective is neither on the front
nor used to dominate others (it cannot be compared): :func:`dominated` marks it
True and :func:`pareto_front` drops it.

Typical use: sweep policies on fixed hardware (:func:`~simpy_llm.explore.sweeps.sweep`),
then keep the policies worth considering::

    frame = sweep("scenarios/heterogeneous_fleet.yaml",
                  {"serving.router": [{"kind": "round_robin"}, {"kind": "least_loaded"},
                                      {"kind": "power_of_d", "params": {"d": 2}}]})
    front = pareto_front(frame, {"goodput.requests_per_s": "max",
                                 "latency_s.ttft.p99": "min",
                                 "devices.cost_usd": "min"})

and draw two of the objectives with :func:`simpy_llm.plot.pareto_front` (``front=front``).
The front keeps a sweep row's ``overloaded`` flag (and the plot crosses such rows out): an
overloaded run's latency grows with the run's length, so its place on a latency front
describes no steady state; ``pareto_front(frame[frame["overloaded"] != 1], ...)`` leaves
such runs out.

Examples
--------
>>> import pandas as pd
>>> runs = pd.DataFrame({"goodput": [10, 12, 9, 12], "p99": [1.0, 2.0, 1.5, 2.0]}, index=list("abcd"))
>>> pareto_front(runs, {"goodput": "max", "p99": "min"})  # c is beaten by a; b and d tie
   goodput  p99
a       10  1.0
b       12  2.0
d       12  2.0
>>> dominated(runs, {"goodput": "max", "p99": "min"}).tolist()
[False, False, True, False]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["dominated", "pareto_front"]

DIRECTIONS = ("max", "min")


def _scores(frame: pd.DataFrame, objectives: Mapping[str, str]) -> np.ndarray:
    """The objectives as a float matrix in which larger is better (``"min"`` columns negated)."""
    import pandas as pd

    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"frame must be a pandas DataFrame, got {type(frame).__name__}")
    if not isinstance(objectives, Mapping) or not objectives:
        raise ValueError('objectives must be a non-empty mapping {column: "max" | "min"}')
    missing = [c for c in objectives if c not in frame.columns]
    if missing:
        raise ValueError(
            f"objective column(s) {', '.join(map(repr, missing))} not in the frame; its columns: "
            + ", ".join(map(str, frame.columns))
        )
    cols = []
    for column, direction in objectives.items():
        if direction not in DIRECTIONS:
            raise ValueError(f"objective {column!r}: direction must be 'max' or 'min', got {direction!r}")
        try:
            values = frame[column].to_numpy(dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"objective {column!r} must hold numbers") from None
        cols.append(values if direction == "max" else -values)
    return np.column_stack(cols) if cols else np.empty((len(frame), 0))


def _dominated_mask(scores: np.ndarray) -> np.ndarray:
    """Row i is dominated when some comparable row is >= on every column and > on one;
    rows with a NaN are marked dominated (incomparable) and dominate nothing."""
    n = scores.shape[0]
    valid = ~np.isnan(scores).any(axis=1)
    out = ~valid
    good = scores[valid]
    idx = np.flatnonzero(valid)
    for k, i in enumerate(idx):
        row = good[k]
        ge = (good >= row).all(axis=1)
        gt = (good > row).any(axis=1)
        out[i] = bool((ge & gt).any())
    assert out.shape == (n,)
    return out


def dominated(frame: pd.DataFrame, objectives: Mapping[str, str]) -> pd.Series:
    """Per row of *frame*: whether another row dominates it (True) or it is on the front.

    Parameters
    ----------
    frame
        One row per run (e.g. a :func:`~simpy_llm.explore.sweeps.sweep` frame).
    objectives
        ``{column: "max" | "min"}``: the columns compared and which way is better.

    Returns
    -------
    pandas.Series
        Booleans on *frame*'s index, named ``dominated``.

    Raises
    ------
    ValueError
        If *objectives* is empty, names a column the frame lacks (listing its
        columns), a direction other than ``max``/``min``, or a non-numeric column.
    TypeError
        If *frame* is not a DataFrame.
    """
    import pandas as pd

    return pd.Series(_dominated_mask(_scores(frame, objectives)), index=frame.index, name="dominated")


def pareto_front(frame: pd.DataFrame, objectives: Mapping[str, str]) -> pd.DataFrame:
    """The rows of *frame* no other row dominates, in their original order and with their
    original index (ties on every objective all kept). Arguments and errors as :func:`dominated`."""
    return frame[~dominated(frame, objectives).to_numpy()]
