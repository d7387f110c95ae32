"""Parameter sweeps: one scenario run at every point of a grid of overrides.

:func:`sweep` takes a scenario file and a grid ``{"dotted.key": [v1, v2, ...]}`` over
any key an override (``--set``) accepts, runs the scenario once per point of the
grid's Cartesian product (and per seed, when seeds are given) and returns a tidy
:class:`pandas.DataFrame`, one row per run. The runs are serial; the work of one
run is :func:`run_point`, a top-level function of plain arguments.

Columns
-------
In order:

1. the grid's keys, named exactly as given (``workload.aggregate_rate``), holding
   each run's value;
2. ``seed``: the scenario's root seed the run used (read from the loaded scenario;
   a grid that varies ``seed`` has its column among the grid's instead);
3. the run's summary figures, one column per row of
   :meth:`Results.summary_frame() <simpy_llm.metrics.results.Results.summary_frame>`
   (float; NaN for a statistic with nothing to be taken over), named by
   :func:`column_name`:

   * ``section.metric.statistic``: ``latency_s.ttft.p99``, ``goodput.by_class.fraction``;
   * the metric is left out where it is the section itself (a figure directly
     under its section): ``throughput.requests_per_s``, ``requests.completed``,
     ``duration_s.value``;
   * a non-empty group follows in brackets: ``latency_s_by_class.ttft.p99[interactive]``,
     ``gpu_utilization.per_replica[0]``, ``requests.dropped_by_class[gold/max_queue]``.

   A figure some runs have and others lack (a batch-size histogram bin, a replica
   of a larger fleet) is NaN in the runs that lack it; such columns follow the
   others in the order they first appear;
4. ``wall_s``: wall-clock seconds the run took (loading the scenario, simulating,
   summarising). It measures the machine, not the model: it differs from one call
   to the next, and is the only column that does.

Same scenario, grid, overrides and seeds give the same frame, ``wall_s`` aside.
"""

from __future__ import annotations

import difflib
import itertools
import math
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simpy_llm.config.loader import Overrides, _ordered_overrides, load_scenario
from simpy_llm.simulation import Simulation

if TYPE_CHECKING:
    import pandas as pd

    from simpy_llm.metrics.results import Results

__all__ = ["SEED_COLUMN", "WALL_COLUMN", "column_name", "run_point", "summary_columns", "sweep"]

SEED_COLUMN = "seed"
"""The column holding each run's root seed."""
WALL_COLUMN = "wall_s"
"""The column holding each run's wall-clock time, s (not deterministic)."""


def column_name(section: str, metric: str, statistic: str, group: str) -> str:
    """The sweep column of one summary figure (a row of ``summary_frame()``).

    ``section.metric.statistic``, without the metric where it is the section, and
    ``[group]`` after it when the group is not empty.

    Examples
    --------
    >>> column_name("latency_s", "ttft", "p99", "")
    'latency_s.ttft.p99'
    >>> column_name("throughput", "throughput", "requests_per_s", "")
    'throughput.requests_per_s'
    >>> column_name("latency_s_by_class", "e2e", "mean", "interactive")
    'latency_s_by_class.e2e.mean[interactive]'
    """
    name = f"{section}.{statistic}" if metric == section else f"{section}.{metric}.{statistic}"
    return f"{name}[{group}]" if group else name


def summary_columns(results: Results) -> dict[str, float]:
    """The summary of one run as sweep columns: ``{column_name: value}`` in
    ``summary_frame()`` order (see :func:`column_name`).

    Raises
    ------
    RuntimeError
        If two figures of the summary would share a column name.

    Examples
    --------
    >>> from simpy_llm import Simulation, load_scenario
    >>> results = Simulation(load_scenario("scenarios/quickstart.yaml", {"workload.num_requests": 50})).run(progress=False)
    >>> columns = summary_columns(results)
    >>> columns["requests.completed"], "latency_s_by_tenant.ttft.p99[chat]" in columns
    (50.0, True)
    """
    out: dict[str, float] = {}
    for section, metric, statistic, group, value in results.summary_frame().itertuples(index=False, name=None):
        name = column_name(str(section), str(metric), str(statistic), str(group))
        if name in out:
            raise RuntimeError(f"two summary figures map to the sweep column {name!r}")
        out[name] = float(value)
    return out


def run_point(scenario_path: str | Path, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Load *scenario_path* with *overrides* (mapping form: values taken as given), run
    it and return its row: ``seed``, the summary columns (:func:`summary_columns`),
    then ``wall_s``.

    Raises
    ------
    ScenarioError
        If the overrides do not give a valid scenario.

    Examples
    --------
    >>> row = run_point("scenarios/quickstart.yaml", {"workload.num_requests": 50, "seed": 3})
    >>> row["seed"], row["requests.arrived"], list(row)[-1]
    (3, 50.0, 'wall_s')
    """
    start = time.perf_counter()
    scenario = load_scenario(scenario_path, dict(overrides))
    results = Simulation(scenario).run(progress=False)
    row: dict[str, Any] = {SEED_COLUMN: scenario.seed, **summary_columns(results)}
    row[WALL_COLUMN] = time.perf_counter() - start
    return row


def sweep(
    scenario: str | Path,
    grid: Mapping[str, Iterable[Any]],
    *,
    overrides: Overrides | None = None,
    seeds: Iterable[int] | None = None,
    metrics: Sequence[str] | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Run *scenario* at every point of *grid* (and under every seed) and tabulate the runs.

    Parameters
    ----------
    scenario
        Path of a scenario YAML file.
    grid
        ``{"dotted.key": [v1, v2, ...], ...}``: the values each key takes, any key an
        override accepts (``serving.engine.max_num_seqs``, ``workload.aggregate_rate``,
        ``workload.clients.0.rate_fraction``...). Values are used as given (not parsed
        as YAML; numpy scalars become Python numbers). The points are the Cartesian
        product in the order given: the first key varies slowest, as in
        :func:`itertools.product`.
    overrides
        Overrides applied to every point, in any form :func:`~simpy_llm.config.load_scenario`
        takes (``"k=v"`` strings parsed as YAML, or a mapping). A point's keys are
        applied after them, so a grid key also given here takes the grid's value.
    seeds
        ``None``: each point runs once, with the scenario's own seed. Otherwise each
        point runs once per seed, with the top-level ``seed`` set to it (the seed
        then may not be set by the grid or *overrides*). A workload with its own
        ``workload.seed`` keeps it: the seed then changes the serving side's
        random streams only.
    metrics
        ``None``: every summary column. Otherwise the summary columns to keep, in
        this order (the grid's columns, ``seed`` and ``wall_s`` are always there).
    progress
        Print one line per finished run on standard error.

    Returns
    -------
    pandas.DataFrame
        One row per (point, seed), points in grid order and seeds in the order
        given; the columns are described in :mod:`simpy_llm.explore.sweeps`.

    Raises
    ------
    ScenarioError
        If a point does not give a valid scenario (an unknown key, a bad value),
        naming the key. Every run's scenario is loaded before the first run starts,
        so such an error costs no simulation.
    ValueError
        If the grid or a key's values are empty, *seeds* is empty or clashes with
        a ``seed`` set elsewhere, or *metrics* names a column no run has (with the
        closest names).
    TypeError
        If *grid* is not a mapping of lists, a seed is not an integer or *metrics*
        is not a list of names.

    Examples
    --------
    >>> frame = sweep(
    ...     "scenarios/quickstart.yaml",
    ...     {"workload.aggregate_rate": [5.0, 20.0]},
    ...     overrides={"workload.num_requests": 200},
    ...     seeds=[1, 2],
    ...     metrics=["throughput.requests_per_s", "latency_s.ttft.p99"],
    ... )
    >>> list(frame.columns)
    ['workload.aggregate_rate', 'seed', 'throughput.requests_per_s', 'latency_s.ttft.p99', 'wall_s']
    >>> frame[["workload.aggregate_rate", "seed"]].to_records(index=False).tolist()
    [(5.0, 1), (5.0, 2), (20.0, 1), (20.0, 2)]
    >>> rate = frame.groupby("workload.aggregate_rate")["throughput.requests_per_s"].mean()
    >>> bool(rate[20.0] > 2 * rate[5.0])
    True
    """
    import pandas as pd

    keys, values = _grid(grid)
    fixed = _ordered_overrides(overrides, str(scenario)) if overrides is not None else {}
    seed_list = _seeds(seeds)
    if seed_list is not None:
        if SEED_COLUMN in keys:
            raise ValueError("the grid varies 'seed' and seeds= is given too: give the seeds in one place")
        if SEED_COLUMN in fixed:
            raise ValueError("overrides set 'seed' and seeds= is given too: give the seeds in one place")
    wanted = _wanted(metrics, keys)

    points = list(itertools.product(*values))
    runs = [(point, seed) for point in points for seed in (seed_list or [None])]
    jobs = [_point_overrides(fixed, keys, point, seed) for point, seed in runs]
    for job in jobs:  # a few ms each: a bad value at the last point must not cost the runs before it
        load_scenario(scenario, job)

    rows: list[dict[str, Any]] = []
    seen: dict[str, None] = {}  # summary columns in order of first appearance
    for i, ((point, _seed), job) in enumerate(zip(runs, jobs, strict=True), start=1):
        row = run_point(scenario, job)
        for name in row:
            if name not in (SEED_COLUMN, WALL_COLUMN):
                seen.setdefault(name)
        if i == 1 and wanted is not None:
            _check_metrics(wanted, seen, final=False)
        rows.append(row)
        if progress:
            settings = ", ".join(f"{k}={v!r}" for k, v in zip(keys, point, strict=True))
            print(
                f"sweep [{i}/{len(runs)}] {settings}, seed={row[SEED_COLUMN]}: {row[WALL_COLUMN]:.2f} s",
                file=sys.stderr,
                flush=True,
            )
    if wanted is not None:
        _check_metrics(wanted, seen, final=True)
    clash = sorted(set(keys) & set(seen))
    if clash:
        raise ValueError(f"grid key(s) {', '.join(map(repr, clash))} clash with summary column names")

    columns: dict[str, Any] = {key: [point[j] for point, _ in runs] for j, key in enumerate(keys)}
    if SEED_COLUMN not in columns:
        columns[SEED_COLUMN] = np.array([row[SEED_COLUMN] for row in rows], dtype=np.int64)
    for name in wanted if wanted is not None else seen:
        columns[name] = np.array([row.get(name, math.nan) for row in rows], dtype=np.float64)
    columns[WALL_COLUMN] = np.array([row[WALL_COLUMN] for row in rows], dtype=np.float64)
    return pd.DataFrame(columns)


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python number it holds (the loader takes Python types only)."""
    return value.item() if isinstance(value, np.generic) else value


def _grid(grid: Mapping[str, Iterable[Any]]) -> tuple[list[str], list[list[Any]]]:
    """The grid's keys and their value lists, checked."""
    if not isinstance(grid, Mapping):
        raise TypeError(f"grid must be a mapping {{'dotted.key': [values, ...]}}, got {type(grid).__name__}")
    if not grid:
        raise ValueError("the grid is empty: give at least one 'dotted.key': [values, ...] to vary")
    keys, values = [], []
    for key, vals in grid.items():
        if isinstance(vals, (str, bytes, Mapping)) or not isinstance(vals, Iterable):
            raise TypeError(f"grid[{key!r}] must be a list of values, got {vals!r}")
        items = [_plain(v) for v in vals]
        if not items:
            raise ValueError(f"grid[{key!r}] has no values: give at least one")
        keys.append(key)
        values.append(items)
    return keys, values


def _seeds(seeds: Iterable[int] | None) -> list[int] | None:
    if seeds is None:
        return None
    if isinstance(seeds, (str, bytes, Mapping)) or not isinstance(seeds, Iterable):
        raise TypeError(f"seeds must be a list of integers, got {seeds!r}")
    out = [_plain(s) for s in seeds]
    for s in out:
        if isinstance(s, bool) or not isinstance(s, int):
            raise TypeError(f"seeds must be integers, got {s!r}")
    if not out:
        raise ValueError("seeds is empty: give None to use the scenario's seed, or at least one seed")
    return out


def _wanted(metrics: Sequence[str] | None, keys: list[str]) -> list[str] | None:
    """The summary columns asked for, checked for form (their existence is checked on the runs)."""
    if metrics is None:
        return None
    if isinstance(metrics, (str, bytes)) or not isinstance(metrics, Iterable):
        raise TypeError(f"metrics must be a list of column names, got {metrics!r}")
    names = list(metrics)
    if not names:
        raise ValueError("metrics is empty: give None for every summary column, or the columns to keep")
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"metrics must be column names (strings), got {name!r}")
        if name in (SEED_COLUMN, WALL_COLUMN) or name in keys:
            raise ValueError(f"metrics: {name!r} is always a column; list summary columns only")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"metrics: {', '.join(map(repr, repeated))} given more than once")
    return names


def _stem(name: str) -> str:
    """A column name without its ``[group]``."""
    return name.split("[", 1)[0]


def _check_metrics(wanted: list[str], seen: Mapping[str, None], *, final: bool) -> None:
    """Reject the names in *wanted* no run has. After the first run (*final* false) only
    names whose figure (the name without its group) is unknown are rejected: a group may
    appear in a later run (a histogram bin, a replica)."""
    known = list(seen)
    stems = {_stem(n) for n in known}
    unknown = [n for n in wanted if n not in seen and (final or _stem(n) not in stems)]
    if not unknown:
        return
    lines = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        hint = f"closest: {', '.join(close)}" if close else "no close match"
        lines.append(f"{name!r} ({hint})")
    raise ValueError(
        "metrics: no run has the column(s) " + "; ".join(lines)
        + ". Columns are named section.metric.statistic[group] (see simpy_llm.explore.sweeps)"
    )


def _point_overrides(fixed: Mapping[str, Any], keys: list[str], point: tuple[Any, ...], seed: int | None) -> dict[str, Any]:
    """The overrides of one run: *fixed*, then the point's keys, then the seed (each key
    given again moves to its last place, so it applies after the others)."""
    out = dict(fixed)
    for key, value in zip(keys, point, strict=True):
        out.pop(key, None)
        out[key] = value
    if seed is not None:
        out[SEED_COLUMN] = seed
    return out
