"""``simpy-llm sweep SCENARIO --grid KEY=V1,V2,... [...]``: a sweep on the command line.

Runs :func:`simpy_llm.explore.sweep` over the Cartesian product of the ``--grid``
options (each repeatable, values parsed as YAML scalars: ``--grid
serving.engine.max_num_seqs=64,128 --grid workload.aggregate_rate=5,10.5``), under
every ``--seeds`` seed, on a process pool of ``--workers`` processes or on the Dask
cluster at ``--scheduler``, and prints a table of the points, their ``overloaded``
flag and a few headline figures. ``--out DIR`` makes the sweep resumable (finished
runs are kept in ``DIR/runs/`` and not run again) and writes the frame to
``DIR/sweep.csv``. Each ``--seeds`` seed is the whole run's root seed (``seed`` and
``workload.seed``); ``--grid seed=1,2,3`` varies the top-level seed only, holding a
workload with its own seed fixed. Warnings (seeds of a point giving identical rows,
say) are printed one line each on standard error.
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from pathlib import Path
from typing import Any

# Each subcommand imports what it runs, when it runs (the function-local imports below), so the
# command line starts fast whatever it does.

__all__ = ["HEADLINE_METRICS", "add_parser", "main", "parse_grid"]

HEADLINE_METRICS = ("throughput.requests_per_s", "latency_s.ttft.p50", "latency_s.ttft.p99", "latency_s.e2e.p99")
"""The columns the table shows when ``--metrics`` is not given."""


class GridError(ValueError):
    """A malformed ``--grid``, ``--seeds`` or ``--metrics`` option."""


def add_parser(sub: Any, add_scenario_options: Any) -> None:
    """Add ``sweep`` to the subparsers *sub*; *add_scenario_options* adds ``--set`` and
    ``--plugin`` (as every command has them)."""
    p = sub.add_parser("sweep", help="run a scenario over a grid of settings (and seeds) and tabulate the runs")
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="a key to vary and its values, parsed as YAML (repeatable: the points are the product, "
        "the first --grid varying slowest), e.g. --grid serving.engine.max_num_seqs=64,128; a mapping replaces "
        "a whole block: --grid 'serving.router={kind: round_robin},{kind: least_loaded}'",
    )
    p.add_argument(
        "--seeds",
        metavar="S1,S2,...",
        help="run every point once per seed (integers), e.g. --seeds 1,2,3; each is the whole run's root seed "
        "(seed and workload.seed, a workload file's own seed included); --grid seed=1,2,3 varies the serving "
        "side only",
    )
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="processes of the local pool (default: one per CPU; 1 runs in this process)",
    )
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="run on the Dask cluster whose scheduler is at ADDRESS (tcp://host:8786); needs the explore extra "
        "and the scenario at the same path on the workers",
    )
    p.add_argument("--out", metavar="DIR", help="results directory: finished runs are kept there and not rerun; the frame goes to DIR/sweep.csv")
    p.add_argument(
        "--metrics",
        metavar="A,B,...",
        help="summary columns to keep and show (default: keep all, show " + ", ".join(HEADLINE_METRICS) + ")",
    )
    p.add_argument("--progress", choices=("auto", "on", "off"), default="auto", help="progress on stderr: auto shows a bar on a terminal")
    add_scenario_options(p)


def parse_grid(options: list[str]) -> dict[str, list[Any]]:
    """``["key=v1,v2", ...]`` as ``{"key": [v1, v2]}``, each value parsed as YAML.

    Values are read as a YAML flow sequence, so ``[1, 2]`` is one list value and
    ``"a,b"`` (quoted) one string.

    Raises
    ------
    GridError
        If an option has no ``=``, no key, no value, a value that is not valid
        YAML, or a key given twice.

    Examples
    --------
    >>> parse_grid(["serving.engine.max_num_seqs=64,128", "workload.aggregate_rate=5, 10.5", "name=a,null"])
    {'serving.engine.max_num_seqs': [64, 128], 'workload.aggregate_rate': [5, 10.5], 'name': ['a', None]}
    """
    import yaml

    grid: dict[str, list[Any]] = {}
    for option in options:
        key, eq, text = option.partition("=")
        key = key.strip()
        if not eq or not key:
            raise GridError(f"--grid {option!r}: expected KEY=V1,V2,... (e.g. --grid workload.aggregate_rate=5,10)")
        if key in grid:
            raise GridError(f"--grid {key!r} given twice: give all its values in one --grid")
        try:
            values = yaml.safe_load(f"[{text}]")
        except yaml.YAMLError as exc:
            # A character YAML does not allow raises a ReaderError, which has no `problem`.
            problem = exc.problem if isinstance(exc, yaml.MarkedYAMLError) else exc
            raise GridError(f"--grid {option!r}: the values are not valid YAML ({problem})") from None
        if not values or not text.strip():
            raise GridError(f"--grid {option!r}: no values after '=' (expected KEY=V1,V2,...)")
        grid[key] = values
    return grid


def _parse_seeds(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise GridError(f"--seeds {text!r}: expected integers separated by commas, e.g. --seeds 1,2,3") from None
    return seeds


def _parse_metrics(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [part.strip() for part in text.split(",")]
    if not all(names):
        raise GridError(f"--metrics {text!r}: expected column names separated by commas")
    return names


def main(args: argparse.Namespace) -> int:
    """Run the ``sweep`` command *args* asks for; exit status 0, 2 on bad input."""
    from simpy_llm.config import ScenarioError
    from simpy_llm.explore.sweeps import FRAME_FILE, OVERLOADED_COLUMN, SERIAL, sweep

    try:
        grid = parse_grid(args.grid)
        seeds = _parse_seeds(args.seeds)
        metrics = _parse_metrics(args.metrics)
    except GridError as exc:
        print(exc, file=sys.stderr)
        return 2
    if not grid:
        print("sweep: give at least one --grid KEY=V1,V2,... (the settings to vary)", file=sys.stderr)
        return 2
    if args.workers is not None and args.workers < 1:
        print(f"--workers must be >= 1, got {args.workers}", file=sys.stderr)
        return 2
    if args.scheduler and args.workers is not None:
        print("--workers and --scheduler exclude each other (the cluster has its own workers)", file=sys.stderr)
        return 2
    if args.out is not None:  # before any run: a directory it cannot write would lose every run
        from simpy_llm.output_paths import OutputPathError, check_output_dir

        try:
            check_output_dir(args.out)
        except OutputPathError as exc:
            print(exc, file=sys.stderr)
            return 2

    client = None
    if args.scheduler:
        try:
            import distributed
        except ImportError:
            print("--scheduler needs dask.distributed: pip install 'simpy-llm[explore]'", file=sys.stderr)
            return 2
        try:
            client = distributed.Client(args.scheduler, timeout="10s")
        except (OSError, TimeoutError, ValueError) as exc:
            print(f"--scheduler {args.scheduler!r}: cannot connect ({exc})", file=sys.stderr)
            return 2
    executor: Any = client if client is not None else (SERIAL if args.workers == 1 else None)
    progress = {"auto": None, "on": True, "off": False}[args.progress]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            frame = sweep(
                args.scenario,
                grid,
                overrides=list(args.overrides),
                seeds=seeds,
                metrics=metrics,
                executor=executor,
                max_workers=args.workers if executor is None else None,
                results_dir=args.out,
                plugins=list(args.plugins),
                progress=progress,
            )
    except (ScenarioError, ValueError, TypeError) as exc:
        print("\n".join([str(exc), *getattr(exc, "__notes__", [])]), file=sys.stderr)
        return 2
    finally:
        if client is not None:
            client.close()
    for warning in caught:
        print(f"warning: {' '.join(str(warning.message).split())}", file=sys.stderr)
    _print_table(frame, list(grid), metrics)
    over = frame[OVERLOADED_COLUMN]
    if (over == 1.0).any():
        print(
            f"{int((over == 1.0).sum())} of {len(frame)} runs overloaded (overloaded = yes): the offered load outgrew "
            f"the fleet, so their latency figures grow with the run's length; see the overload diagnostic of such a run"
        )
    runs, loaded = frame.attrs.get("runs", len(frame)), frame.attrs.get("loaded", 0)
    tail = f" ({loaded} loaded from {args.out})" if loaded else ""
    print(f"{len(frame)} runs{tail}, {runs} simulated" + (f"; wrote {Path(args.out) / FRAME_FILE}" if args.out else ""))
    return 0


def _fmt(value: Any) -> str:
    """A table cell: a float to 4 significant digits (``-`` for NaN), a mapping or list in
    YAML flow style as ``--grid`` takes it, anything else as text.

    >>> _fmt(0.123456), _fmt(float("nan")), _fmt({"kind": "power_of_d", "params": {"d": 2}}), _fmt(3)
    ('0.1235', '-', '{kind: power_of_d, params: {d: 2}}', '3')
    """
    from simpy_llm.explore.sweeps import _show

    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return _show(value)
    return str(value)


def _flag(value: float) -> str:
    """The ``overloaded`` cell: yes, no, or ``-`` (too short to judge)."""
    return "-" if math.isnan(value) else ("yes" if value == 1.0 else "no")


def _print_table(frame: Any, keys: list[str], metrics: list[str] | None) -> None:
    from rich.console import Console
    from rich.table import Table

    from simpy_llm.explore.sweeps import OVERLOADED_COLUMN

    shown = metrics if metrics is not None else [m for m in HEADLINE_METRICS if m in frame.columns]
    columns = [*keys, *(["seed"] if "seed" not in keys else []), OVERLOADED_COLUMN, *shown]
    table = Table(title="sweep", show_edge=False)
    for name in columns:
        table.add_column(name, justify="right")
    flag_at = columns.index(OVERLOADED_COLUMN)
    for record in frame[columns].itertuples(index=False, name=None):
        cells = [_fmt(v.item() if hasattr(v, "item") else v) for v in record]
        cells[flag_at] = _flag(float(record[flag_at]))
        table.add_row(*cells, style="bold yellow" if record[flag_at] == 1.0 else None)
    console = Console(soft_wrap=True)
    if not console.is_terminal:  # a log or a pipe: wide enough for the table
        console = Console(soft_wrap=True, width=200)
    console.print(table)
