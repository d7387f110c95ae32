"""Parameter sweeps: one scenario run at many points of its settings, gathered in one table.

Kept whole (over 800 lines): the points, the executors that run them, the resumable results
directory and the table's columns share one row format, which a reader checks in one place.

:func:`sweep` takes a scenario file and the points to run (a grid
``{"dotted.key": [v1, v2, ...]}`` over any key an override (``--set``) accepts, a
:class:`~simpy_llm.explore.search.RandomSearch` or an Optuna study), runs the
scenario once per point (and per seed, when seeds are given) on any
:class:`concurrent.futures.Executor` (a process pool by default, a Dask cluster
through its ``Client``) and returns a tidy :class:`pandas.DataFrame`, one row per
run. The work of one run is :func:`run_point`, a top-level function of plain
arguments: a point gives the same row on any executor. With a results directory
the sweep is resumable. :func:`replications` gives each point's mean and
confidence interval over its seeds.

Columns
-------
In order:

1. the point's keys (the grid's, the random search's or the study's space's),
   named exactly as given (``workload.aggregate_rate``), holding each run's value;
2. ``trial``: with a study only, the Optuna trial's number;
3. ``seed``: the scenario's root seed the run used (read from the loaded scenario;
   a grid that varies ``seed`` has its column among the grid's instead);
4. ``overloaded``: the run's overload diagnostic (:func:`~simpy_llm.metrics.diagnostics.overload`)
   as a flag: 1.0 when it fired (the queues grew through the arrival window: the
   latency figures of such a row grow with the run's length and describe no steady
   state), 0.0 when the run was judged and is not overloaded, NaN when the run was too
   short to judge (:func:`~simpy_llm.metrics.diagnostics.overload_judged`). Every
   row has it, whatever *metrics* keeps; the command line's table shows it, and the
   sweep plots of :mod:`simpy_llm.plot` mark its rows;
5. the run's summary figures, one column per row of
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
6. ``wall_s``: wall-clock seconds the run took (loading the scenario, simulating,
   summarising). It measures the machine, not the model: it differs from one call
   to the next, and is the only column that does.

Same scenario, points, overrides and seeds give the same frame, ``wall_s`` aside,
whatever the executor.

Seeds
-----
A seed of *seeds* is the whole run's root seed: it sets the scenario's ``seed`` and
``workload.seed``, so a workload with a seed of its own (``workload: {file: ...}``
whose file has ``seed: 42``) varies with it too. Without a seed of its own the
workload's streams follow the scenario's seed anyway, so there it changes nothing. To
hold the workload fixed and vary only the serving side, vary ``seed`` in the grid (or
set it in *overrides*) instead of giving *seeds*: those set the top-level key only;
and a ``workload.seed`` given in *overrides* or by the points is kept under *seeds*
(the workload then stays fixed). When two or more seeds of one point give identical
rows (every summary figure equal), :func:`sweep` warns (:class:`IdenticalReplicationsWarning`)
naming the point and the seeds: their :func:`replications` interval has zero width.
"""

from __future__ import annotations

import ast
import collections
import concurrent.futures
import contextlib
import difflib
import hashlib
import inspect
import itertools
import json
import math
import multiprocessing
import os
import re
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simpy_llm import __version__
from simpy_llm import progress as progress_display
from simpy_llm.config import ScenarioError
from simpy_llm.explore.search import RandomSearch
from simpy_llm.loading import Overrides, load_plugins, load_scenario, ordered_overrides
from simpy_llm.metrics.diagnostics import overload_judged
from simpy_llm.metrics.summary import flatten_summary
from simpy_llm.simulation import Simulation
from simpy_llm.workload.checks import check_spec_files

if TYPE_CHECKING:
    import pandas as pd

    from simpy_llm.metrics.results import Results

__all__ = [
    "FRAME_FILE",
    "OVERLOADED_COLUMN",
    "SEED_COLUMN",
    "SERIAL",
    "TRIAL_COLUMN",
    "WALL_COLUMN",
    "IdenticalReplicationsWarning",
    "SweepPointError",
    "column_name",
    "overloaded_flag",
    "replications",
    "run_point",
    "summary_columns",
    "sweep",
]

SEED_COLUMN = "seed"
"""The column holding each run's root seed."""
WALL_COLUMN = "wall_s"
"""The column holding each run's wall-clock time, s (not deterministic)."""
TRIAL_COLUMN = "trial"
"""The column holding each run's Optuna trial number (study sweeps only)."""
SERIAL = "serial"
"""``executor=SERIAL`` runs a sweep in this process, one run after the other."""
FRAME_FILE = "sweep.csv"
"""The file, in a results directory, that the finished frame is written to."""
OVERLOADED_COLUMN = "overloaded"
"""The column holding each run's overload diagnostic as a flag (1.0, 0.0, or NaN: not judged)."""
_ALWAYS = (SEED_COLUMN, OVERLOADED_COLUMN, WALL_COLUMN)
"""The columns of a row besides the summary's, in every row whatever *metrics* keeps."""


class IdenticalReplicationsWarning(UserWarning):
    """Seeds of one sweep point gave identical rows: the runs do not depend on the seed, and
    the point's :func:`replications` interval has zero width."""


class SweepPointError(ScenarioError):
    """A point of a sweep whose scenario does not load: the :class:`ScenarioError`, with the
    point (its keys and values, and the seed) in its first line.

    Attributes
    ----------
    point
        ``{key: value}`` of the point, and ``seed`` when the sweep gives seeds.
    hint
        What to do about it, when the problem lies in a block the point changes only
        part of (else empty).
    """

    def __init__(self, error: ScenarioError, point: Mapping[str, Any], hint: str = "") -> None:
        self.point = dict(point)
        self.hint = hint
        where = ", ".join(f"{key}={_show(value)}" for key, value in self.point.items())
        super().__init__(f"{error.source} at sweep point {where}", list(error.problems), error.what)
        if hint:
            self.args = (f"{self.args[0]}\n{hint}",)


def _show(value: Any) -> str:
    """A setting as it would be written on the command line: YAML flow style
    (``{kind: least_loaded}``, ``[1, 2]``, ``round_robin``, ``5.0``).

    >>> _show({"kind": "power_of_d", "params": {"d": 2}}), _show("round_robin"), _show(0.5), _show(None)
    ('{kind: power_of_d, params: {d: 2}}', 'round_robin', '0.5', 'null')
    """
    import yaml

    try:
        text = yaml.safe_dump(value, default_flow_style=True, width=math.inf, sort_keys=False)
    except yaml.YAMLError:
        return repr(value)
    return text.removesuffix("\n").removesuffix("\n...").strip()


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


def summary_columns(results: Results, summary: Mapping[str, Any] | None = None) -> dict[str, float]:
    """The summary of one run as sweep columns: ``{column_name: value}`` in
    ``summary_frame()`` order (see :func:`column_name`). *summary* is ``results.summary()``
    when the caller has it already.

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
    figures = flatten_summary(summary if summary is not None else results.summary())  # type: ignore[arg-type]
    for section, metric, statistic, group, value in figures:
        name = column_name(section, metric, statistic, group)
        if name in out:
            raise RuntimeError(f"two summary figures map to the sweep column {name!r}")
        out[name] = float(value)
    return out


def overloaded_flag(results: Results, summary: Mapping[str, Any] | None = None) -> float:
    """The ``overloaded`` column of a run: 1.0 when its summary has the ``overload``
    diagnostic, 0.0 when the run could be judged and has not, NaN when it was too short
    to judge (:func:`~simpy_llm.metrics.diagnostics.overload_judged`).

    Examples
    --------
    >>> from simpy_llm import Simulation, load_scenario
    >>> def flag(rate, n):
    ...     overrides = {"workload.aggregate_rate": rate, "workload.num_requests": n}
    ...     return overloaded_flag(Simulation(load_scenario("scenarios/quickstart.yaml", overrides)).run())
    >>> flag(200.0, 3000), flag(5.0, 3000), flag(200.0, 50)
    (1.0, 0.0, nan)
    """
    diagnostics = (summary if summary is not None else results.summary())["diagnostics"]
    if any(d["code"] == "overload" for d in diagnostics):
        return 1.0
    return 0.0 if overload_judged(results) else math.nan


def run_point(scenario_path: str | Path, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Load *scenario_path* with *overrides* (mapping form: values taken as given), run
    it and return its row: ``seed``, ``overloaded`` (:func:`overloaded_flag`), the summary
    columns (:func:`summary_columns`), then ``wall_s``.

    Raises
    ------
    ScenarioError
        If the overrides do not give a valid scenario.

    Examples
    --------
    >>> row = run_point("scenarios/quickstart.yaml", {"workload.num_requests": 50, "seed": 3})
    >>> row["seed"], row["overloaded"], row["requests.arrived"], list(row)[-1]
    (3, nan, 50.0, 'wall_s')
    """
    start = time.perf_counter()
    scenario = load_scenario(scenario_path, dict(overrides))
    results = Simulation(scenario).run(progress=False)
    summary = results.summary()
    row: dict[str, Any] = {
        SEED_COLUMN: scenario.seed,
        OVERLOADED_COLUMN: overloaded_flag(results, summary),
        **summary_columns(results, summary),
    }
    row[WALL_COLUMN] = time.perf_counter() - start
    return row


def sweep(
    scenario: str | Path,
    grid: Mapping[str, Iterable[Any]] | None = None,
    *,
    random: RandomSearch | None = None,
    study: Any = None,
    space: Mapping[str, Any] | None = None,
    objective: str | Sequence[str] | None = None,
    n_trials: int | None = None,
    executor: Any = None,
    max_workers: int | None = None,
    results_dir: str | Path | None = None,
    overrides: Overrides | None = None,
    seeds: Iterable[int] | None = None,
    metrics: Sequence[str] | None = None,
    plugins: Sequence[str] = (),
    progress: bool | None = False,
) -> pd.DataFrame:
    """Run *scenario* at every point of a grid, a random search or an Optuna study, and tabulate the runs.

    The points come from exactly one of *grid*, *random* or *study*; each point runs
    once per seed (when *seeds* are given) on *executor*.

    Parameters
    ----------
    scenario
        Path of a scenario YAML file (with a Dask cluster, a path the workers can read).
    grid
        ``{"dotted.key": [v1, v2, ...], ...}``: the values each key takes, any key an
        override accepts (``serving.engine.max_num_seqs``, ``workload.aggregate_rate``,
        ``workload.clients.0.rate_fraction``...). Values are used as given (not parsed
        as YAML; numpy scalars become Python numbers). The points are the Cartesian
        product in the order given: the first key varies slowest, as in
        :func:`itertools.product`.
    random
        A :class:`~simpy_llm.explore.search.RandomSearch`: its points, drawn
        reproducibly from its seed, in the order drawn.
    study
        An :class:`optuna.study.Study` to drive: it is asked for *n_trials* trials over
        *space*, in batches as wide as the executor, and told each trial's *objective*
        (the mean over the seeds; a trial whose objective is NaN, e.g. a run that
        completed no request, is told as failed). Rows carry the trial's number in a
        ``trial`` column.
    space
        With *study* only: ``{"dotted.key": optuna.distributions.*}``.
    objective
        With *study* only: the summary column to optimise (a list of them for a
        multi-objective study, one per direction); the direction is the study's.
    n_trials
        With *study* only: how many trials to run (>= 1).
    executor
        Where the runs are done:

        * ``None`` (default): a :class:`concurrent.futures.ProcessPoolExecutor` of
          *max_workers* processes (default: one per CPU, never more than the runs),
          shut down at the end. Its workers are forked from :mod:`multiprocessing`'s
          fork server (``spawn`` where there is none), which imports the simulator
          once (it sets the fork server's preload list) and outlives the sweep, so
          later sweeps start fast; it keeps the code it imported, so restart the
          Python process after editing the simulator's code. While the workers
          start, this process runs points itself (the first in order). Each worker
          runs the main script again when it starts (:mod:`multiprocessing`'s rule),
          so a script that calls :func:`sweep` outside an ``if __name__ ==
          "__main__":`` block would start sweeps in its workers: such a sweep runs
          in this process instead, one run after the other, with a warning saying
          to put the call under that block;
        * ``"serial"``: one after the other in this process;
        * any :class:`concurrent.futures.Executor`: used as given, not shut down;
        * a ``dask.distributed.Client``: its ``get_executor()``, the cluster's width
          being its total worker threads.

        Each run is a call of :func:`run_point`, a pure function of its arguments: a
        point gives the same row (``wall_s`` aside) on any executor.
    max_workers
        The process pool's size (with ``executor=None``), or the batch width of a
        study on a given executor (default: the executor's own width).
    results_dir
        A directory that makes the sweep resumable. Each finished run is written at
        once to ``runs/<key>.json`` (atomically), *key* being a hash of the scenario
        file's bytes, the run's overrides (the seed among them), the *plugins* and
        simpy_llm's version; a run whose file exists is loaded instead of run
        again (with the ``wall_s`` it took then). Changing any of those makes new
        runs; edits to files the scenario refers to (a workload file, a profile, a
        plugin's code) are *not* seen: delete ``runs/`` then. The frame is written to
        ``sweep.csv`` at the end.
    overrides
        Overrides applied to every point, in any form :func:`~simpy_llm.config.load_scenario`
        takes (``"k=v"`` strings parsed as YAML, or a mapping). A point's keys are
        applied after them, so a key also given here takes the point's value.
    seeds
        ``None``: each point runs once, with the scenario's own seed. Otherwise each
        point runs once per seed, the seed being the whole run's root seed: it sets
        the top-level ``seed`` and ``workload.seed``, so a workload with a seed of its
        own (in the scenario or in the workload file it reads) varies with it too (the
        top-level ``seed`` then may not be set by the points or *overrides*). A
        ``workload.seed`` the points or *overrides* give is kept: the workload then
        stays fixed and the seeds vary the serving side only, as a grid over ``seed``
        does. Seeds of one point whose rows come out identical draw an
        :class:`IdenticalReplicationsWarning` naming the point and the seeds.
    metrics
        ``None``: every summary column. Otherwise the summary columns to keep, in
        this order (the point's columns, ``seed``, ``overloaded`` and ``wall_s`` are
        always there).
    plugins
        Plugins (modules or Python files) to import before loading the scenario, here
        and in every worker, as ``--plugin`` does.
    progress
        ``True``: show the finished runs, as a live ``rich`` bar when standard error is
        a terminal or in Jupyter, else as one line per run on standard error.
        ``None``: the bar only when someone watches. ``False``: nothing.

    Returns
    -------
    pandas.DataFrame
        One row per (point, seed), points in their order (whatever order the runs
        finish in) and seeds in the order given. Columns: the point's keys, ``trial``
        (with *study*), ``seed``, ``overloaded``, the summary columns, ``wall_s``; see
        :mod:`simpy_llm.explore.sweeps`. ``frame.attrs`` holds ``{"runs": ran,
        "loaded": loaded from results_dir, "executor": "pool", "serial" or "given"}``.

    Raises
    ------
    SweepPointError
        If a point does not give a valid scenario (an unknown key, a bad value): a
        :class:`~simpy_llm.config.ScenarioError` naming the point (its keys and
        values, and the seed) and the key. Every point's scenario (under the first
        seed), and the first point's under every seed, is loaded before the first run
        starts, so such an error costs no simulation (with *study*, the points of a
        batch). A point that sets one key of a block (``serving.router.kind``) keeps
        the block's other keys from the file; a point may replace a whole block by
        giving it as a mapping (``{"serving.router": [{"kind": "least_loaded"},
        {"kind": "power_of_d", "params": {"d": 2}}]}``), and the error says so when a
        kept key is the problem. An error raised while a point runs carries the point
        in a note (:meth:`BaseException.add_note`).
    ValueError
        If not exactly one of *grid*, *random*, *study* is given, the grid or a key's
        values are empty, *seeds* is empty or clashes with a ``seed`` set elsewhere,
        *metrics* or *objective* names a column no run has (with the closest names),
        a study argument is missing or given without *study*, *executor* is a string
        other than ``"serial"`` or *max_workers* is not a positive integer.
    TypeError
        If *grid* is not a mapping of lists, a seed is not an integer, *metrics* is
        not a list of names or *executor* is none of the kinds above.

    Examples
    --------
    >>> frame = sweep(
    ...     "scenarios/quickstart.yaml",
    ...     {"workload.aggregate_rate": [5.0, 20.0]},
    ...     overrides={"workload.num_requests": 200},
    ...     seeds=[1, 2],
    ...     metrics=["throughput.requests_per_s", "latency_s.ttft.p99"],
    ...     executor="serial",
    ... )
    >>> list(frame.columns)
    ['workload.aggregate_rate', 'seed', 'overloaded', 'throughput.requests_per_s', 'latency_s.ttft.p99', 'wall_s']
    >>> frame[["workload.aggregate_rate", "seed"]].to_records(index=False).tolist()
    [(5.0, 1), (5.0, 2), (20.0, 1), (20.0, 2)]
    >>> rate = frame.groupby("workload.aggregate_rate")["throughput.requests_per_s"].mean()
    >>> bool(rate[20.0] > 2 * rate[5.0])
    True

    A random search, and the mean with its confidence interval over the seeds
    (:func:`replications`):

    >>> from simpy_llm.explore import RandomSearch
    >>> frame = sweep(
    ...     "scenarios/quickstart.yaml",
    ...     random=RandomSearch(space={"serving.engine.max_num_seqs": [8, 64]}, n=2, seed=1),
    ...     overrides={"workload.num_requests": 200},
    ...     seeds=[1, 2, 3],
    ...     metrics=["latency_s.ttft.p99"],
    ...     executor="serial",
    ... )
    >>> stats = replications(frame)
    >>> list(stats.columns)
    ['serving.engine.max_num_seqs', 'metric', 'n', 'mean', 'std', 'ci_low', 'ci_high']
    >>> stats[["serving.engine.max_num_seqs", "n"]].to_records(index=False).tolist()
    [(8, 3), (64, 3)]
    """
    sources = [name for name, given in (("grid", grid), ("random", random), ("study", study)) if given is not None]
    if len(sources) != 1:
        raise ValueError(
            "give exactly one of grid=, random= or study= (the points to run)"
            + (f"; got {' and '.join(sources)}" if sources else "")
        )
    if study is None:
        for name, given in (("space", space), ("objective", objective), ("n_trials", n_trials)):
            if given is not None:
                raise ValueError(f"{name}= goes with study= only")
    fixed = ordered_overrides(overrides, str(scenario)) if overrides is not None else {}
    seed_list = _seeds(seeds)
    plugin_list = _plugins(plugins)
    if plugin_list:
        load_plugins(plugin_list, source="sweep", key="plugins")
    path = Path(scenario)
    if executor is None:
        script = _unguarded_main_script()
        if script is not None:
            warnings.warn(
                f"sweep() runs in this process, one run after the other: it is called from {script} outside an "
                f"'if __name__ == \"__main__\":' block, and every worker of a process pool would run that script, "
                f"sweep included, again; put the call under that block to run on a process pool",
                stacklevel=2,
            )
            executor = SERIAL
    runner = _Runner(executor, max_workers, str(path.resolve()) if path.is_file() else str(path), plugin_list)
    store = _Store(results_dir, path, plugin_list) if results_dir is not None else None

    if study is not None:
        keys, spaces, objectives, trials_wanted = _study_args(study, space, objective, n_trials)
    elif random is not None:
        if not isinstance(random, RandomSearch):
            raise TypeError(f"random must be a RandomSearch, got {type(random).__name__}")
        keys = random.keys
    else:
        keys, values = _grid(grid)  # type: ignore[arg-type]
    if seed_list is not None:
        if SEED_COLUMN in keys:
            raise ValueError(
                "the points vary 'seed' and seeds= is given too: give the seeds in one place (a grid over 'seed' "
                "varies the serving side only; seeds= the whole run, workload included)"
            )
        if SEED_COLUMN in fixed:
            raise ValueError("overrides set 'seed' and seeds= is given too: give the seeds in one place")
    wanted = _wanted(metrics, keys)
    state = _State(keys, seed_list, fixed, scenario, wanted, store, runner)

    try:
        if study is not None:
            total = trials_wanted * len(seed_list or [None])
            with _progress_display(progress, total, keys) as show:
                state.show = show
                _run_study(state, study, spaces, objectives, trials_wanted)
        else:
            points = random.points() if random is not None else list(itertools.product(*values))
            with _progress_display(progress, len(points) * len(seed_list or [None]), keys) as show:
                state.show = show
                state.run_points(points)
    finally:
        runner.close()

    seen: dict[str, None] = {}  # summary columns in order of first appearance, in point order
    for row in state.rows:
        for name in row:
            if name not in _ALWAYS:
                seen.setdefault(name)
    _warn_identical(state)
    if wanted is not None:
        _check_metrics(wanted, seen, final=True)
    clash = sorted(set(keys) & set(seen))
    if clash:
        raise ValueError(f"key(s) {', '.join(map(repr, clash))} clash with summary column names")
    import pandas as pd  # here, not above: a fresh process's first import of it takes ~0.5 s

    rows = state.rows
    columns: dict[str, Any] = {key: [point[j] for point in state.points] for j, key in enumerate(keys)}
    if study is not None:
        columns[TRIAL_COLUMN] = np.array(state.trials, dtype=np.int64)
    if SEED_COLUMN not in columns:
        columns[SEED_COLUMN] = np.array([row[SEED_COLUMN] for row in rows], dtype=np.int64)
    columns[OVERLOADED_COLUMN] = np.array([row[OVERLOADED_COLUMN] for row in rows], dtype=np.float64)
    for name in wanted if wanted is not None else seen:
        columns[name] = np.array([row.get(name, math.nan) for row in rows], dtype=np.float64)
    columns[WALL_COLUMN] = np.array([row[WALL_COLUMN] for row in rows], dtype=np.float64)
    frame = pd.DataFrame(columns)
    frame.attrs = {"runs": state.ran, "loaded": state.loaded, "executor": runner.kind}
    if store is not None:
        store.write_frame(frame)
    return frame


def replications(
    frame: pd.DataFrame,
    metrics: Sequence[str] | None = None,
    *,
    by: Sequence[str] | None = None,
    level: float = 0.95,
) -> pd.DataFrame:
    """Mean, standard deviation and Student-t confidence interval of each metric over
    the replications (seeds) of each point of a sweep frame.

    Parameters
    ----------
    frame
        A frame from :func:`sweep` (or any frame with the same layout).
    metrics
        The columns to summarise (default: every float column after ``seed``, but
        ``overloaded`` and ``wall_s``; name ``overloaded`` for the share of a point's
        seeds that ran overloaded).
    by
        The columns that identify a point (default: the columns before ``seed``, but
        ``trial``).
    level
        The confidence level, in (0, 1).

    Returns
    -------
    pandas.DataFrame
        One row per (point, metric), points in their first appearance's order:
        the *by* columns, ``metric``, ``n`` (the runs with a value: NaN values are
        left out), ``mean``, ``std`` (sample, ``ddof=1``), ``ci_low`` and ``ci_high``
        (``mean -/+ t_{(1+level)/2, n-1} * std / sqrt(n)``). With ``n < 2`` the std and
        interval are NaN. A zero-width interval (``std`` 0) means the seeds gave the
        same value, not that the value is known exactly: the runs did not depend on the
        seed (a deterministic scenario, or randomness the seeds do not reach), so the
        seeds say nothing about the variability (:func:`sweep` warns when a point's
        rows are identical).

    Raises
    ------
    ValueError
        If *level* is not in (0, 1), or a column named is not in *frame*.

    Examples
    --------
    >>> import pandas as pd
    >>> frame = pd.DataFrame({"rate": [1.0, 1.0, 1.0, 2.0, 2.0, 2.0], "seed": [1, 2, 3] * 2,
    ...                       "ttft": [1.0, 2.0, 3.0, 4.0, 4.0, 4.0], "wall_s": 0.1})
    >>> out = replications(frame)
    >>> out[["rate", "metric", "n", "mean", "std"]].to_records(index=False).tolist()
    [(1.0, 'ttft', 3, 2.0, 1.0), (2.0, 'ttft', 3, 4.0, 0.0)]
    >>> round(float(out["ci_high"].iloc[0]), 4)  # 2 + t(0.975, 2) * 1 / sqrt(3)
    4.4841
    """
    import pandas as pd
    from scipy import stats

    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    columns = list(frame.columns)
    if by is None:
        if SEED_COLUMN not in columns:
            raise ValueError(f"the frame has no {SEED_COLUMN!r} column: give by= (the columns identifying a point)")
        by = [c for c in columns[: columns.index(SEED_COLUMN)] if c != TRIAL_COLUMN]
    else:
        by = list(by)
    if metrics is None:
        after = columns[columns.index(SEED_COLUMN) + 1 :] if SEED_COLUMN in columns else columns
        metrics = [
            c for c in after
            if c not in by and c not in (WALL_COLUMN, OVERLOADED_COLUMN) and pd.api.types.is_float_dtype(frame[c])
        ]
    else:
        metrics = list(metrics)
    missing = [c for c in [*by, *metrics] if c not in columns]
    if missing:
        raise ValueError(f"replications: no column(s) {', '.join(map(repr, missing))} in the frame")
    if not by:
        groups: Iterable[tuple[Any, pd.DataFrame]] = [((), frame)]
    else:
        # A point that replaces a whole block holds a mapping, which pandas cannot group by:
        # such columns are grouped by their text (each group's own value is reported).
        keys = {c: frame[c].map(_show) if frame[c].map(lambda v: isinstance(v, (dict, list))).any() else frame[c] for c in by}
        groups = frame.groupby([keys[c] for c in by], sort=False, dropna=False)
    out: dict[str, list[Any]] = {key: [] for key in by}
    for name in ("metric", "n", "mean", "std", "ci_low", "ci_high"):
        out[name] = []
    for _group_key, group in groups:
        key_values = [group[c].iloc[0] for c in by]
        for metric in metrics:
            values = group[metric].to_numpy(dtype=np.float64)
            values = values[~np.isnan(values)]
            n = int(values.size)
            mean = float(values.mean()) if n else math.nan
            std = float(values.std(ddof=1)) if n > 1 else math.nan
            half = float(stats.t.ppf((1.0 + level) / 2.0, n - 1)) * std / math.sqrt(n) if n > 1 else math.nan
            for key, value in zip(by, key_values, strict=True):
                out[key].append(value)
            out["metric"].append(metric)
            out["n"].append(n)
            out["mean"].append(mean)
            out["std"].append(std)
            out["ci_low"].append(mean - half)
            out["ci_high"].append(mean + half)
    result = pd.DataFrame(out)
    result["n"] = result["n"].astype(np.int64)
    return result


class _State:
    """What a sweep has gathered so far: its points, rows and the columns seen."""

    def __init__(
        self,
        keys: list[str],
        seed_list: list[int] | None,
        fixed: dict[str, Any],
        scenario: str | Path,
        wanted: list[str] | None,
        store: _Store | None,
        runner: _Runner,
    ) -> None:
        self.keys: list[str] = keys
        self.seed_list: list[int] | None = seed_list
        self.fixed: dict[str, Any] = fixed
        self.scenario = scenario
        self.wanted: list[str] | None = wanted
        self.store: _Store | None = store
        self.runner: _Runner = runner
        self.points: list[tuple[Any, ...]] = []  # one per row
        self.trials: list[int] = []  # one per row, with a study
        self.rows: list[dict[str, Any]] = []
        self.seen: dict[str, None] = {}  # summary columns seen so far (in completion order)
        self.ran = 0
        self.loaded = 0
        self.show: Callable[[tuple[Any, ...], dict[str, Any], bool], None] = lambda *_: None

    def run_points(self, points: Sequence[tuple[Any, ...]]) -> list[dict[str, Any]]:
        """Run (or load) every point under every seed; append their rows in order and return them."""
        seeds: Sequence[int | None] = self.seed_list or [None]
        runs = [(point, seed) for point in points for seed in seeds]
        jobs = [_point_overrides(self.fixed, self.keys, point, seed) for point, seed in runs]
        stored = [self.store.load(job) if self.store is not None else None for job in jobs]
        todo = [i for i, row in enumerate(stored) if row is None]
        # Every point is loaded before any run (a few ms each): a bad value at the last point
        # must not cost the runs before it. A seed is an integer valid with any point, so each
        # point is checked under the first seed and each seed with the first point. The first
        # run is checked before a pool is started (a missing file, a bad common override), the
        # others while its workers start.
        per_point = len(self.seed_list or [None])
        check = [i for i in range(len(jobs)) if i % per_point == 0 or i < per_point]
        if jobs:  # with the files it references (a trace's header), as every run will read them
            self._load(runs[0], jobs[0], files=True)
        self.runner.prepare(len(todo))
        for i in check[1:]:
            self._load(runs[i], jobs[i])
        rows: list[dict[str, Any] | None] = list(stored)
        for i, row in enumerate(stored):
            if row is not None:
                self.loaded += 1
                self._seen(row)
                self.show(runs[i][0], row, True)
        if self.wanted is not None and self.loaded and todo:
            _check_metrics(self.wanted, self.seen, final=False)
        running = self.runner.run([jobs[i] for i in todo])
        while True:
            try:
                i, row = next(running)
            except StopIteration:
                break
            except _JobFailed as failed:
                cause = failed.__cause__ or failed
                cause.add_note(f"at sweep point {self._describe(runs[todo[failed.index]])}")
                cause.__suppress_context__ = True  # the run's own error, not the wrapper
                raise cause  # noqa: B904 - re-raised as it was (a `from` would replace its own cause), with the point in a note
            index = todo[i]
            rows[index] = row
            self.ran += 1
            if self.store is not None:
                self.store.save(jobs[index], row)
            self._seen(row)
            if self.ran == 1 and self.wanted is not None:
                _check_metrics(self.wanted, self.seen, final=False)
            self.show(runs[index][0], row, False)
        done = [row for row in rows if row is not None]
        self.points.extend(point for point, _ in runs)
        self.rows.extend(done)
        return done

    def _describe(self, run: tuple[tuple[Any, ...], int | None]) -> str:
        """``key=value, ..., seed=N`` of a run (its point and its seed)."""
        return ", ".join(f"{k}={_show(v)}" for k, v in self._point(run).items())

    def _point(self, run: tuple[tuple[Any, ...], int | None]) -> dict[str, Any]:
        point, seed = run
        out = dict(zip(self.keys, point, strict=True))
        if seed is not None:
            out[SEED_COLUMN] = seed
        return out

    def _load(self, run: tuple[tuple[Any, ...], int | None], job: dict[str, Any], files: bool = False) -> None:
        """Load one run's scenario, as a check (with *files*, the files it references too); a
        bad one raises :class:`SweepPointError`."""
        try:
            scenario = load_scenario(self.scenario, job)
            if files:
                check_spec_files(scenario, str(self.scenario))
        except ScenarioError as exc:
            raise SweepPointError(exc, self._point(run), _block_hint(exc, self.keys, run[0])) from None

    def _seen(self, row: Mapping[str, Any]) -> None:
        for name in row:
            if name not in _ALWAYS:
                self.seen.setdefault(name)


def _study_args(study: Any, space: Any, objective: Any, n_trials: Any) -> tuple[list[str], dict[str, Any], list[str], int]:
    """The keys, space, objective columns and trial count of a study sweep, checked."""
    if not callable(getattr(study, "ask", None)) or not callable(getattr(study, "tell", None)):
        raise TypeError(f"study must be an optuna.study.Study (with ask and tell), got {type(study).__name__}")
    if not isinstance(space, Mapping) or not space:
        raise ValueError("study= needs space={'dotted.key': optuna.distributions.*, ...}, not empty")
    from optuna.distributions import BaseDistribution

    for key, dist in space.items():
        if not isinstance(dist, BaseDistribution):
            raise TypeError(f"space[{key!r}] must be an optuna distribution (FloatDistribution, ...), got {dist!r}")
    if objective is None:
        raise ValueError("study= needs objective= (the summary column to optimise, e.g. 'latency_s.ttft.p99')")
    objectives = [objective] if isinstance(objective, str) else list(objective)
    if not objectives or not all(isinstance(o, str) for o in objectives):
        raise TypeError(f"objective must be a summary column name (or a list of them), got {objective!r}")
    directions = len(study.directions)
    if len(objectives) != directions:
        raise ValueError(f"the study has {directions} direction(s) but objective names {len(objectives)} column(s)")
    if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1:
        raise ValueError(f"study= needs n_trials= an integer >= 1, got {n_trials!r}")
    return list(space), dict(space), objectives, n_trials


def _run_study(state: _State, study: Any, space: dict[str, Any], objectives: list[str], n_trials: int) -> None:
    """Ask *study* for *n_trials* trials in batches as wide as the runner, run them and tell it each result."""
    from optuna.trial import TrialState

    per_trial = len(state.seed_list or [None])
    width = max(1, state.runner.width // per_trial)  # trials per batch: one run per worker
    asked = 0
    while asked < n_trials:
        batch = [study.ask(space) for _ in range(min(width, n_trials - asked))]
        asked += len(batch)
        points = [tuple(_plain(trial.params[key]) for key in state.keys) for trial in batch]
        try:
            rows = state.run_points(points)
            _check_metrics(objectives, state.seen, final=True)
        except BaseException:
            for trial in batch:
                study.tell(trial, state=TrialState.FAIL)
            raise
        for j, trial in enumerate(batch):
            state.trials.extend([trial.number] * per_trial)
            mine = rows[j * per_trial : (j + 1) * per_trial]
            values = [float(np.mean([row.get(name, math.nan) for row in mine])) for name in objectives]
            if any(math.isnan(v) for v in values):
                study.tell(trial, state=TrialState.FAIL)
            else:
                study.tell(trial, values[0] if len(values) == 1 else values)


def _plugins(plugins: Sequence[str]) -> list[str]:
    """The plugins as the workers should import them: files as absolute paths (a worker may
    run in another directory), modules by name."""
    if isinstance(plugins, (str, bytes)):
        raise TypeError(f"plugins must be a list of modules or files, got {plugins!r}")
    out = []
    for plugin in plugins:
        if not isinstance(plugin, str):
            raise TypeError(f"plugins must be module names or file paths (strings), got {plugin!r}")
        is_file = plugin.endswith(".py") or "/" in plugin or "\\" in plugin
        out.append(str(Path(plugin).resolve()) if is_file else plugin)
    return out


PRELOAD = ("simpy_llm.explore.sweeps", "simpy_llm.serving.latency", "simpy_llm.workload.arrivals", "pandas")
"""Modules the fork server imports once, so that every pool worker forked from it starts warm."""


def _pool_context() -> Any:
    """The start method of the default pool: ``forkserver`` where there is one (workers are
    forked from a server process that has imported the simulator once, and lives as long as
    this process: later pools start in a blink), else ``spawn``. Never plain ``fork`` (unsafe
    from a threaded process)."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(PRELOAD))  # honoured when the server starts
        return context
    return multiprocessing.get_context("spawn")


def _run_job(scenario_path: str, overrides: Mapping[str, Any], plugins: Sequence[str]) -> dict[str, Any]:
    """:func:`run_point` after importing *plugins* (in a worker process)."""
    if plugins:
        load_plugins(list(plugins), source="sweep", key="plugins")
    return run_point(scenario_path, overrides)


class _JobFailed(Exception):
    """A job raised: its index in the jobs run, and the job's exception as ``__cause__``."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


class _Runner:
    """Runs jobs on the executor a sweep was given, starting a process pool only when
    there is something to run.

    The default pool's workers take a second or so to start the first time (the fork
    server imports the simulator): meanwhile this process runs jobs itself, from the
    front of the list, and hands the rest to the pool once its workers are up."""

    head_start = True
    """Run jobs in this process while the default pool's workers start (False: wait for them)."""

    def __init__(self, executor: Any, max_workers: int | None, scenario: str, plugins: list[str]) -> None:
        if max_workers is not None and (isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1):
            raise ValueError(f"max_workers must be an integer >= 1, got {max_workers!r}")
        self.scenario = scenario
        self.plugins = plugins
        self.max_workers = max_workers
        self._own: concurrent.futures.Executor | None = None
        self._warming: threading.Thread | None = None
        self._lock = threading.Lock()
        self._ready = False  # the default pool's workers are up
        self._pending: collections.deque[tuple[int, dict[str, Any]]] = collections.deque()
        self._futures: dict[concurrent.futures.Future[Any], int] = {}
        if isinstance(executor, str):
            if executor != SERIAL:
                raise ValueError(f"executor={executor!r}: the one string allowed is {SERIAL!r} (runs in this process)")
            self.kind, self.executor = SERIAL, None
            self.width = 1
        elif executor is None:
            self.kind, self.executor = "pool", None
            self.width = max_workers or os.cpu_count() or 1
        elif isinstance(executor, concurrent.futures.Executor):
            self.kind, self.executor = "given", executor
            self.width = max_workers or getattr(executor, "_max_workers", None) or os.cpu_count() or 1
        elif callable(getattr(executor, "get_executor", None)):  # a dask.distributed.Client
            self.kind, self.executor = "given", executor.get_executor()
            threads = executor.nthreads() if callable(getattr(executor, "nthreads", None)) else {}
            self.width = max_workers or sum(threads.values()) or os.cpu_count() or 1
        else:
            raise TypeError(
                "executor must be None (a process pool), 'serial', a concurrent.futures.Executor or a "
                f"dask.distributed.Client, got {type(executor).__name__}"
            )

    def _here(self, job: dict[str, Any]) -> dict[str, Any]:
        """One job run in this process."""
        return run_point(self.scenario, job) if not self.plugins else _run_job(self.scenario, job, self.plugins)

    def run(self, jobs: list[dict[str, Any]]) -> Iterator[tuple[int, dict[str, Any]]]:
        """Yield ``(index in jobs, row)`` as each run finishes; a run that fails raises
        :class:`_JobFailed` with its index, from the run's own exception."""
        if not jobs:
            return
        if self.kind == SERIAL:
            for i, job in enumerate(jobs):
                yield i, self._here_as(i, job)
            return
        if self.kind == "given":
            assert self.executor is not None  # set with kind "given"
            futures = {self.executor.submit(_run_job, self.scenario, job, self.plugins): i for i, job in enumerate(jobs)}
        else:
            self.prepare(len(jobs))
            with self._lock:
                self._futures = {}
                self._pending = collections.deque(enumerate(jobs))
                if self._ready:
                    self._submit_pending()
            while self.head_start:  # until the workers are up, run jobs here
                with self._lock:
                    if self._ready or not self._pending:
                        break
                    i, job = self._pending.popleft()
                yield i, self._here_as(i, job)
            with self._lock:
                handed = self._ready or not self._pending
            if not handed:
                self._join_warming()  # the warming thread hands the pending jobs over once the pool is up
            futures = self._futures
        try:
            for future in concurrent.futures.as_completed(futures):
                try:
                    row = future.result()
                except Exception as exc:
                    raise _JobFailed(futures[future]) from exc
                yield futures[future], row
        finally:
            for future in futures:
                future.cancel()

    def _here_as(self, i: int, job: dict[str, Any]) -> dict[str, Any]:
        """Job *i* run in this process; its failure as :class:`_JobFailed`."""
        try:
            return self._here(job)
        except Exception as exc:
            raise _JobFailed(i) from exc

    def _submit_pending(self) -> None:
        """Hand every pending job to the pool (with the lock held)."""
        assert self._own is not None
        while self._pending:
            i, job = self._pending.popleft()
            try:
                future = self._own.submit(_run_job, self.scenario, job, self.plugins)
            except Exception as exc:  # a broken pool: the error reaches the caller through the future
                future = concurrent.futures.Future()
                future.set_exception(exc)
            self._futures[future] = i

    def prepare(self, runs: int) -> None:
        """Start the default pool, if it is to be used for *runs* runs and is not running yet,
        and set its workers starting (their start-up overlaps what the caller does next)."""
        if self.kind != "pool" or self._own is not None or runs == 0:
            return
        workers = min(self.width, runs)
        self._own = concurrent.futures.ProcessPoolExecutor(workers, mp_context=_pool_context())
        # Starting a worker blocks until the fork server has imported the simulator (about a
        # second, the first time): a thread waits for it while this one goes on.
        self._warming = threading.Thread(target=self._warm, args=(self._own, workers), daemon=True)
        self._warming.start()

    def _warm(self, pool: concurrent.futures.Executor, workers: int) -> None:
        with contextlib.suppress(Exception):  # a broken pool shows on the real submissions
            for future in [pool.submit(int) for _ in range(workers)]:  # no-ops: the pool starts its workers
                future.result()
        with self._lock:
            self._ready = True
            self._submit_pending()

    def _join_warming(self) -> None:
        if self._warming is not None:
            self._warming.join()
            self._warming = None

    def close(self) -> None:
        with self._lock:
            self._pending.clear()  # nothing more to hand to the pool
        self._join_warming()
        if self._own is not None:
            self._own.shutdown(wait=True, cancel_futures=True)
            self._own = None


class _Store:
    """A results directory: one JSON file per finished run, named by the run's key."""

    def __init__(self, results_dir: str | Path, scenario: Path, plugins: list[str]) -> None:

        self.dir = Path(results_dir)
        self.runs = self.dir / "runs"
        try:
            content = scenario.read_bytes()
        except OSError:
            content = b""  # load_scenario reports the missing file
        self.base = {
            "scenario": hashlib.sha256(content).hexdigest(),
            "plugins": plugins,
            "simpy_llm": __version__,
        }

    def key(self, overrides: Mapping[str, Any]) -> str:
        """The stable name of the run with *overrides*."""
        text = json.dumps({**self.base, "overrides": [[k, v] for k, v in overrides.items()]}, default=repr)
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def load(self, overrides: Mapping[str, Any]) -> dict[str, Any] | None:
        """The stored row of the run with *overrides*, or None (a missing or unreadable file)."""
        try:
            data = json.loads((self.runs / f"{self.key(overrides)}.json").read_text())
            row = data["row"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not isinstance(row, dict) or any(name not in row for name in _ALWAYS):
            return None  # not a row, or one written before every row had these columns: run it again
        return row

    def save(self, overrides: Mapping[str, Any], row: Mapping[str, Any]) -> None:
        """Write the run's row (atomically: a reader sees the whole file or none)."""
        self.runs.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"overrides": dict(overrides), "row": dict(row)}, default=repr, indent=1)
        _atomic_write(self.runs / f"{self.key(overrides)}.json", text)

    def write_frame(self, frame: pd.DataFrame) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.dir / FRAME_FILE, frame.to_csv(index=False))


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _progress_display(
    setting: bool | None, total: int, keys: list[str]
) -> Iterator[Callable[[tuple[Any, ...], dict[str, Any], bool], None]]:
    """A callback ``show(point, row, loaded)`` counting finished runs: a rich bar for a
    watcher, one line per run on standard error for a log, or nothing."""

    terminal, jupyter = progress_display.watched()  # looked up on the module: tests stand in for a terminal
    if not progress_display.progress_wanted(setting, terminal=terminal, jupyter=jupyter, expected_requests=math.inf, min_requests=0):
        yield lambda *_: None
        return
    if terminal or jupyter:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        columns = [TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn()]
        with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("sweep", total=total)
            yield lambda *_: bar.advance(task)
        return
    count = [0]

    def line(point: tuple[Any, ...], row: dict[str, Any], loaded: bool) -> None:
        count[0] += 1
        settings = ", ".join(f"{k}={v!r}" for k, v in zip(keys, point, strict=True))
        how = "loaded" if loaded else f"{row[WALL_COLUMN]:.2f} s"
        print(f"sweep [{count[0]}/{total}] {settings}, seed={row[SEED_COLUMN]}: {how}", file=sys.stderr, flush=True)

    yield line


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
        if name in _ALWAYS or name in keys:
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
    given again moves to its last place, so it applies after the others).

    The seed is the whole run's root seed: ``seed`` and ``workload.seed``, unless *fixed*
    or the point give the workload's seed (then the workload stays as they say).

    >>> _point_overrides({"workload.num_requests": 9}, ["serving.replicas"], (2,), 5)
    {'workload.num_requests': 9, 'serving.replicas': 2, 'seed': 5, 'workload.seed': 5}
    >>> _point_overrides({"workload.seed": 1}, ["serving.replicas"], (2,), 5)
    {'workload.seed': 1, 'serving.replicas': 2, 'seed': 5}
    """
    out = dict(fixed)
    for key, value in zip(keys, point, strict=True):
        out.pop(key, None)
        out[key] = value
    if seed is not None:
        out[SEED_COLUMN] = seed
        if not _sets_workload_seed(out):
            out["workload.seed"] = seed
    return out


def _block_hint(error: ScenarioError, keys: list[str], point: tuple[Any, ...]) -> str:
    """What to do when a problem of *error* lies in a block a point's key changes only part
    of (a grid over ``serving.router.kind`` keeping the file's ``serving.router.params``).

    >>> err = ScenarioError("s.yaml", [("serving.router.params.d", "unknown key; allowed: none")])
    >>> print(_block_hint(err, ["serving.router.kind"], ("round_robin",)))  # doctest: +NORMALIZE_WHITESPACE
    serving.router: the point sets serving.router.kind only and keeps the file's other keys of serving.router;
        to replace the whole block, vary serving.router itself with mappings, e.g. --grid 'serving.router={kind: round_robin}'
        (in Python {'serving.router': [{'kind': 'round_robin'}, ...]})
    >>> _block_hint(err, ["workload.aggregate_rate"], (5.0,))
    ''
    """
    hints = []
    for key, value in zip(keys, point, strict=True):
        block, dot, last = key.rpartition(".")
        if not dot:
            continue
        for path in error.paths:
            dotted = re.sub(r"\[(\d+)\]", r".\1", path)
            if dotted.startswith(block + ".") and not (dotted == key or dotted.startswith(key + ".")):
                hints.append(
                    f"{block}: the point sets {key} only and keeps the file's other keys of {block}; to replace the "
                    f"whole block, vary {block} itself with mappings, e.g. --grid '{block}={_show({last: value})}' "
                    f"(in Python {{{block!r}: [{ {last: value}!r}, ...]}})"
                )
                break
    return "\n".join(dict.fromkeys(hints))


def _sets_workload_seed(overrides: Mapping[str, Any]) -> bool:
    """Whether *overrides* give the workload's seed (``workload.seed``, or a whole
    ``workload`` mapping with a ``seed``)."""
    whole = overrides.get("workload")
    return "workload.seed" in overrides or (isinstance(whole, Mapping) and "seed" in whole)


def _warn_identical(state: _State) -> None:
    """Warn, point by point, about seeds whose rows are identical in every summary figure."""
    seeds = state.seed_list
    if seeds is None or len(seeds) < 2:
        return
    per_point = len(seeds)
    for start in range(0, len(state.rows), per_point):
        groups: dict[tuple[Any, ...], list[int]] = {}
        for seed, row in zip(seeds, state.rows[start : start + per_point], strict=True):
            figures = tuple(
                (name, "nan" if isinstance(value, float) and math.isnan(value) else value)
                for name, value in row.items() if name not in (SEED_COLUMN, WALL_COLUMN)
            )
            groups.setdefault(figures, []).append(seed)
        for same in groups.values():
            if len(same) > 1:
                where = ", ".join(f"{k}={_show(v)}" for k, v in zip(state.keys, state.points[start], strict=True))
                warnings.warn(
                    f"sweep point {where}: seeds {', '.join(map(str, same))} gave identical rows (every summary "
                    f"figure equal): the runs do not depend on the seed, so their replications() interval has "
                    f"zero width and says nothing about the variability",
                    IdenticalReplicationsWarning,
                    stacklevel=3,
                )


def _unguarded_main_script() -> str | None:
    """The main script, when this call comes from its top-level code outside an
    ``if __name__ == "__main__":`` block and a spawned worker would run that code again;
    else None (an interactive session, a notebook, ``python -c``, a guarded call, a
    script whose source cannot be read)."""
    main = sys.modules.get("__main__")
    if main is None:
        return None
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    if spec_name is not None and (spec_name == "__main__" or spec_name.endswith(".__main__")):
        return None  # multiprocessing does not run a package's __main__ again
    path = getattr(main, "__file__", None)
    if path is None or Path(path).stem == "ipython":
        return None
    line = None
    frame = inspect.currentframe()
    while frame is not None:  # the outermost frame of the script's own top-level code
        if frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>":
            line = frame.f_lineno
        frame = frame.f_back
    if line is None:
        return None
    try:
        tree = ast.parse(Path(path).read_text(), filename=path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    for node in tree.body:
        if isinstance(node, ast.If) and _is_main_test(node.test) and node.lineno <= line <= (node.end_lineno or line):
            return None
    return str(path)


def _is_main_test(test: ast.expr) -> bool:
    """Whether *test* is ``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    texts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(texts) == 1
