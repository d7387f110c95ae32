"""Exploring a scenario: many runs, the load it carries, the policies worth keeping.

:func:`~simpy_llm.explore.sweeps.sweep` runs a scenario at every point of a grid, a
random search or an Optuna study (and, optionally, under several seeds) on any
:class:`concurrent.futures.Executor` (a process pool by default, a Dask cluster
through its ``Client``) and returns one tidy :class:`pandas.DataFrame` row per run,
with the run's summary figures as columns (see :mod:`simpy_llm.explore.sweeps` for how
they are named); :func:`~simpy_llm.explore.sweeps.replications` gives each point's mean
and confidence interval over its seeds; :class:`~simpy_llm.explore.search.RandomSearch`
draws random points reproducibly (``docs/sweeps.md``).

:func:`~simpy_llm.explore.capacity.max_stable_load` searches the largest load a
scenario carries under stability and SLO criteria, and
:func:`~simpy_llm.explore.capacity.min_replicas` the fewest replicas for a load; both
return a card. :func:`~simpy_llm.explore.pareto.pareto_front` keeps the runs of a sweep
no other run beats on every objective (``docs/capacity.md``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simpy_llm.lazy import lazy_exports

if TYPE_CHECKING:
    from simpy_llm.explore.capacity import (
        CapacityCard,
        ReplicaCard,
        SloCriterion,
        StabilityCriteria,
        max_stable_load,
        min_replicas,
    )
    from simpy_llm.explore.pareto import dominated, pareto_front
    from simpy_llm.explore.search import RandomSearch
    from simpy_llm.explore.sweeps import (
        IdenticalReplicationsWarning,
        SweepPointError,
        column_name,
        overloaded_flag,
        replications,
        run_point,
        summary_columns,
        sweep,
    )

_HOME = {
    "CapacityCard": "capacity", "ReplicaCard": "capacity", "SloCriterion": "capacity",
    "StabilityCriteria": "capacity", "max_stable_load": "capacity", "min_replicas": "capacity",
    "dominated": "pareto", "pareto_front": "pareto", "RandomSearch": "search",
    "column_name": "sweeps", "replications": "sweeps", "run_point": "sweeps",
    "summary_columns": "sweeps", "sweep": "sweeps", "IdenticalReplicationsWarning": "sweeps",
    "SweepPointError": "sweeps", "overloaded_flag": "sweeps", "run_sharded": "sharded",
}
"""Each public name's module. They are imported on first use (PEP 562): the command line
imports this package's ``cli`` modules for every command, and a server started by it
should not carry the sweeps' multiprocessing machinery, pandas and the rest in its heap."""


__getattr__, __dir__ = lazy_exports(globals(), _HOME)


__all__ = [
    "CapacityCard",
    "IdenticalReplicationsWarning",
    "RandomSearch",
    "ReplicaCard",
    "SloCriterion",
    "StabilityCriteria",
    "SweepPointError",
    "column_name",
    "dominated",
    "max_stable_load",
    "min_replicas",
    "overloaded_flag",
    "pareto_front",
    "replications",
    "run_point",
    "run_sharded",
    "summary_columns",
    "sweep",
]
