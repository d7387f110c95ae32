"""``simpy-llm capacity SCENARIO``: the max stable load, or the replicas a load needs.

``simpy-llm capacity SCENARIO --slo ttft_p99=0.5`` searches the offered load
(``--load-key``, default ``workload.aggregate_rate``) for the largest stable load and
the largest meeting every ``--slo`` (:func:`~simpy_llm.explore.capacity.max_stable_load`)
and prints the capacity card. ``--replicas --load 40`` searches the fewest replicas
meeting them at 40 requests/s instead (:func:`~simpy_llm.explore.capacity.min_replicas`).
``--out DIR`` writes the card as JSON, CSV, Markdown and a PNG plot.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

# Each subcommand imports what it runs, when it runs (the function-local imports below), so the
# command line starts fast whatever it does.

__all__ = ["add_parser", "main"]


def add_parser(sub: Any, add_scenario_options: Any) -> None:
    """Add ``capacity`` to the subparsers *sub*; *add_scenario_options* adds ``--set`` and
    ``--plugin`` (as every command has them)."""
    cap = sub.add_parser(
        "capacity",
        help="find the max stable / SLO-goodput load of a scenario, or the replicas a load needs",
        description="Binary search of the offered load (or, with --replicas, of the replica count) against "
        "stability and SLO criteria; prints a capacity card (docs/capacity.md).",
    )
    cap.add_argument("scenario", help="scenario YAML file")
    cap.add_argument(
        "--slo", action="append", default=[], metavar="METRIC_STAT=SECONDS",
        help="an SLO criterion, e.g. ttft_p99=0.5, e2e_p95[interactive]=10, queue_delay_mean=0.1 "
        "(repeatable; metrics ttft, tpot, e2e, queue_delay, client_ttft, client_e2e; statistics mean, pNN)",
    )
    cap.add_argument("--min-goodput", type=float, metavar="FRACTION",
                     help="also require this share of requests to meet the scenario's own slo: targets")
    cap.add_argument("--max-backlog-growth", type=float, default=0.01, metavar="FRACTION",
                     help="stable when the backlog grows by at most this share of arrivals (default 0.01)")
    cap.add_argument("--max-drop-fraction", type=float, default=0.01, metavar="FRACTION",
                     help="stable when at most this share of requests is dropped (default 0.01)")
    cap.add_argument("--load-key", default="workload.aggregate_rate", metavar="KEY",
                     help="the dotted key holding the load (default workload.aggregate_rate)")
    cap.add_argument("--low", type=float, help="load to start from (default: the scenario's)")
    cap.add_argument("--high", type=float, help="load closing the bracket from above (default: found by doubling)")
    cap.add_argument("--tolerance", type=float, default=0.02, help="relative width of the final bracket (default 0.02)")
    cap.add_argument("--replicas", action="store_true",
                     help="search the fewest replicas meeting the criteria at --load instead of the load")
    cap.add_argument("--load", type=float, help="with --replicas: the load (default: the scenario's)")
    cap.add_argument("--replicas-key", default="serving.replicas", metavar="KEY",
                     help="with --replicas: the dotted key holding the replica count (default serving.replicas)")
    cap.add_argument("--max-replicas", type=int, default=1024, metavar="N", help="with --replicas: give up above N")
    cap.add_argument("--warmup-requests", type=int, metavar="N", help="warm-up requests per probe (default 1000)")
    cap.add_argument("--measure-requests", type=int, metavar="N", help="measured requests per probe (default 10000)")
    cap.add_argument("--seeds", metavar="S1,S2",
                     help="comma-separated seeds; a load passes only under all. Each is the whole run's root seed "
                     "(seed and workload.seed); --set workload.seed=N holds the workload fixed")
    cap.add_argument("--out", metavar="DIR", help="write the card as JSON, CSV, Markdown and PNG here")
    cap.add_argument("--quiet", action="store_true", help="no line per probe on standard error")
    add_scenario_options(cap)


def _fail(message: str) -> int:
    print(f"simpy-llm capacity: {message}", file=sys.stderr)
    return 2


def main(args: argparse.Namespace) -> int:
    """Run the ``capacity`` command; exit status 0, 2 on bad input."""
    from simpy_llm.config import ScenarioError
    from simpy_llm.explore.capacity import StabilityCriteria, max_stable_load, min_replicas
    from simpy_llm.loading import ordered_overrides

    seeds = None
    if args.seeds:
        try:
            seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        except ValueError:
            return _fail(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    if args.replicas and (args.low is not None or args.high is not None):
        return _fail("--low and --high bound a load search; with --replicas give the load with --load")
    if not args.replicas and args.load is not None:
        return _fail("--load is the fixed load of a --replicas search; to search the load give --low/--high")
    if args.out is not None:  # before any probe: a directory it cannot write would lose the search
        from simpy_llm.output_paths import OutputPathError, check_output_dir

        try:
            check_output_dir(args.out)
        except OutputPathError as exc:
            return _fail(str(exc))
    try:
        criteria = StabilityCriteria(
            slo=list(args.slo),
            min_goodput_fraction=args.min_goodput,
            max_backlog_growth=args.max_backlog_growth,
            max_drop_fraction=args.max_drop_fraction,
        )
        overrides = ordered_overrides(list(args.overrides), args.scenario) if args.overrides else None
        common: dict[str, Any] = {
            "criteria": criteria,
            "load_key": args.load_key,
            "warmup_requests": args.warmup_requests,
            "measure_requests": args.measure_requests,
            "seeds": seeds,
            "overrides": overrides,
            "progress": not args.quiet,
        }
        if args.replicas:
            card: Any = min_replicas(
                args.scenario, load=args.load, replicas_key=args.replicas_key, max_replicas=args.max_replicas, **common
            )
        else:
            card = max_stable_load(args.scenario, low=args.low, high=args.high, tolerance=args.tolerance, **common)
    except ScenarioError as exc:
        print(exc, file=sys.stderr)
        return 2
    except (ValueError, TypeError) as exc:
        return _fail(str(exc))
    print(card.to_markdown(), end="")
    if args.out:
        written = card.save(args.out)
        print(f"wrote {', '.join(p.name for p in written)} in {args.out}")
    return 0
