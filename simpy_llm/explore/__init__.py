"""Exploring a scenario: many runs over a grid of settings, gathered in one table.

:func:`~simpy_llm.explore.sweeps.sweep` runs a scenario at every point of a grid of
overrides (and, optionally, under several seeds) and returns one tidy
:class:`pandas.DataFrame` row per run, with the run's summary figures as columns
(see :mod:`simpy_llm.explore.sweeps` for how they are named).
"""

from simpy_llm.explore.sweeps import column_name, run_point, summary_columns, sweep

__all__ = ["column_name", "run_point", "summary_columns", "sweep"]
