"""``simpy-llm calibrate compare | fit | probe``: the calibrator on the command line.

``simpy-llm calibrate compare OBSERVED [--scenario S] [--profile P] [--out DIR]``
replays an observed trace (``simpy-llm observe``'s output directory, or a trace
file) through a scenario and prints the per-metric comparison with its rating;
``--out`` writes ``report.json``, ``report.md`` and QQ, CDF and
scatter plots. ``simpy-llm calibrate fit OBSERVED [OBSERVED ...] --out PROFILE [--priors P]`` fits a
``batch_table`` latency model to the trace (or to several traces of one server at once: one
loss over all their requests) and writes it as a profile (the
coefficients the traces do not determine from the priors profile ``P``, else
their documented defaults), prints each coefficient's value, 95 % interval and
source, then compares the fitted model with each trace (its report opens
with the fit's warnings; ``--report DIR`` with several traces writes each trace's report
in ``DIR/trace1``, ``DIR/trace2``, ... in the order given). Without ``--scenario`` the
serving system comes from the trace header (:func:`~simpy_llm.calibrate.scenario.scenario_from_trace`);
``--profile`` applies a fitted latency profile to it. ``simpy-llm calibrate probe --url URL
--out DIR`` sends a short designed set of requests to a server and writes its trace and a
profile of the coefficients it measured, with their intervals
(:mod:`~simpy_llm.calibrate.probe`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

# Each subcommand imports what it runs, when it runs (the function-local imports below), so the
# command line starts fast whatever it does.

__all__ = ["add_parser", "coefficient_table", "main"]


def add_parser(sub: Any, add_scenario_options: Any) -> None:
    """Add ``calibrate`` with its ``compare``, ``fit`` and ``probe`` subcommands to the subparsers
    *sub*; *add_scenario_options* adds ``--set`` and ``--plugin`` (as every command reading a
    scenario has them)."""
    cal = sub.add_parser("calibrate", help="compare an observed trace with the simulator, or fit a latency profile to it")
    verbs = cal.add_subparsers(dest="calibrate_command", required=True)

    cmp = verbs.add_parser("compare", help="replay an observed trace through a scenario and rate the prediction")
    _common(cmp, add_scenario_options)
    cmp.add_argument("--profile", metavar="PROFILE", help="apply this fitted latency profile to the scenario")
    cmp.add_argument("--out", metavar="DIR", help="write report.json, report.md and plots here")
    cmp.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report (interactive plots, works offline) "
                     "to FILE (needs the report extra)")

    fit = verbs.add_parser("fit", help="fit a batch_table latency model to observed traces and write it as a profile")
    _common(fit, add_scenario_options, several=True)
    fit.add_argument("--out", metavar="PROFILE", required=True, help="the profile file to write (YAML)")
    fit.add_argument("--report", metavar="DIR", help="also write the fitted model's comparison report here "
                     "(several traces: one per trace, in DIR/trace1, DIR/trace2, ...)")
    fit.add_argument("--no-refine", action="store_true", help="stop after the direct estimate (no simulation-based refinement)")
    fit.add_argument("--max-evaluations", type=int, default=400, metavar="N", help="replays the refinement may run (default 400)")
    fit.add_argument("--priors", metavar="PROFILE",
                     help="a profile (a probe's, or a previous fit's) giving the coefficients this trace does not determine")

    _add_probe(verbs)


_SERVER_TYPES = ("vllm", "sglang", "llamacpp", "emulated", "other")
"""simpy_llm.observe.server_info.SERVER_TYPES, written out so that starting the command does not import aiohttp."""


def _add_probe(verbs: Any) -> None:
    probe = verbs.add_parser(
        "probe",
        help="measure a server with a short designed set of requests and write a profile (the priors of calibrate fit)",
    )
    probe.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8080 (without /v1)")
    probe.add_argument("--out", metavar="DIR", required=True, help="write trace.yaml, trace.csv and profile.yaml here")
    probe.add_argument("--model", help="model name to request (default: the first of the server's /v1/models)")
    probe.add_argument("--api", choices=("completions", "chat"), default="completions", help="endpoint (default completions)")
    probe.add_argument("--api-key", help="bearer token (default: the OPENAI_API_KEY environment variable)")
    probe.add_argument("--server-type", choices=_SERVER_TYPES, help="what the server is (default: the server config's type, else other)")
    probe.add_argument("--server-config", metavar="FILE", help="YAML with server, hardware and network settings (as for observe)")
    probe.add_argument("--max-seconds", type=float, metavar="S", help="time budget, seconds (default 75)")
    probe.add_argument(
        "--parallel", type=int, metavar="N", help="the server's slots: batch sizes 1..N are measured (default: from the server's description)"
    )
    probe.add_argument("--seed", type=int, help="seed of the prompts' words (default: drawn afresh)")
    probe.add_argument("--loop", choices=("auto", "uvloop", "asyncio"), default="auto", help="event loop (auto: uvloop)")
    probe.set_defaults(plugins=[], overrides=[])  # it reads no scenario: no --set, no --plugin


def _common(parser: argparse.ArgumentParser, add_scenario_options: Any, *, several: bool = False) -> None:
    if several:
        parser.add_argument("observed", nargs="+", help="observed traces v2 (simpy-llm observe's output directory, its trace.csv "
                            "or trace.yaml): one, or several of one server, fitted together")
    else:
        parser.add_argument("observed", help="an observed trace v2: simpy-llm observe's output directory, its trace.csv or trace.yaml")
    parser.add_argument(
        "--scenario",
        metavar="FILE",
        help="the serving system to test (its workload is replaced by the trace); default: from the trace header",
    )
    parser.add_argument("--warm-up-requests", type=int, metavar="N", help="leave out the first N requests (default: the header's warm_up_requests)")
    parser.add_argument("--warm-up-s", type=float, default=0.0, metavar="T", help="also leave out requests sent in the first T seconds")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap confidence intervals (default 0)")
    parser.add_argument("--resamples", type=int, default=1000, metavar="N", help="bootstrap resamples (default 1000)")
    add_scenario_options(parser)


def _us(value: float) -> str:
    return f"{value:,.1f}" if abs(value) >= 1 else f"{value:.3g}"


def coefficient_table(result: Any) -> Any:
    """A :mod:`rich` table of a :class:`~simpy_llm.calibrate.fit.FitResult`: each coefficient's
    value (µs), its 95 % interval (``-`` when the trace does not determine it) and where the
    value comes from (``trace``, ``prior``, ``default``)."""
    from rich import box
    from rich.table import Table

    table = Table(title="coefficients (µs)", header_style="bold", box=box.SIMPLE_HEAD)
    for col, justify in (("coefficient", "left"), ("value", "right"), ("95 % interval", "right"), ("source", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    intervals, sources = result.intervals or {}, result.sources or {}
    rows = [(f"decode_step_us[{i}] ({i + 1} decoder{'s' if i else ''})", v,
             (intervals.get("decode_step_us") or [None] * len(result.params["decode_step_us"]))[i],
             (sources.get("decode_step_us") or ["-"] * len(result.params["decode_step_us"]))[i])
            for i, v in enumerate(result.params["decode_step_us"])]
    rows += [(name, v, intervals.get(name), sources.get(name, "-")) for name, v in result.params.items() if name != "decode_step_us"]
    for name, value, interval, source in rows:
        table.add_row(name, _us(value), "-" if interval is None else f"{_us(interval[0])} - {_us(interval[1])}", source)
    return table


def main(args: argparse.Namespace, on_report: Callable[[Any, Any], None] | None = None) -> int:
    """Run the ``calibrate`` command *args* asks for; exit status 0, 2 on bad input (1 when
    the probe cannot reach the server). *on_report* is called with the comparison's report and
    samples after they are printed and written (``compare --html``: the command line above this
    layer writes the page)."""
    if args.calibrate_command == "probe":
        return _probe(args)
    from rich.console import Console

    from simpy_llm.calibrate.compare import compare
    from simpy_llm.calibrate.fit import fit, write_profile
    from simpy_llm.calibrate.ranges import PROFILE_FIT_WARNING
    from simpy_llm.calibrate.report import report_table, write_report
    from simpy_llm.config import ScenarioError
    from simpy_llm.loading import load_scenario

    console = Console(soft_wrap=True)
    if not console.is_terminal:  # a log or a pipe: wide enough for the comparison table
        console = Console(soft_wrap=True, width=160)
    if args.warm_up_requests is not None and args.warm_up_requests < 0:
        print(f"--warm-up-requests must be >= 0, got {args.warm_up_requests}", file=sys.stderr)
        return 2
    from simpy_llm.output_paths import (
        OutputPathError,
        check_output_dir,
        check_output_file,
    )

    try:  # before any replay: an output it cannot write would lose the fit or the comparison
        if args.calibrate_command == "fit":
            check_output_file(args.out)
            if args.report is not None:
                check_output_dir(args.report, "--report")
        elif args.out is not None:
            check_output_dir(args.out)
    except OutputPathError as exc:
        print(exc, file=sys.stderr)
        return 2
    observed = _as_list(args.observed)  # fit takes several traces, compare one
    try:
        scenario = load_scenario(args.scenario, list(args.overrides)) if args.scenario else None
        if scenario is None and args.overrides:
            print("--set needs --scenario (the scenario from the trace header takes no overrides)", file=sys.stderr)
            return 2
        if args.calibrate_command == "fit":
            if args.max_evaluations < 1:
                print(f"--max-evaluations must be >= 1, got {args.max_evaluations}", file=sys.stderr)
                return 2
            result = fit(args.observed, scenario, priors=args.priors, refine=not args.no_refine,
                         max_evaluations=args.max_evaluations)
            path = write_profile(result, args.out)
            console.print(f"wrote {path}")
            stats = result.statistics
            console.print(
                f"fit: {stats['method']}, {stats['evaluations']} replays ({stats['identification_replays']} to identify), "
                f"loss {stats['loss_direct']:.4f} (direct)"
                + (f" -> {stats['loss_refined']:.4f} (refined)" if "loss_refined" in stats else "")
            )
            console.print(coefficient_table(result))
            profile: Any = path
        else:
            profile = args.profile
        cals = [compare(
            one,
            scenario,
            profile=profile,
            warm_up_requests=args.warm_up_requests,
            warm_up_s=args.warm_up_s,
            seed=args.seed,
            n_resamples=args.resamples,
        ) for one in observed]
    except ScenarioError as exc:
        print(exc, file=sys.stderr)
        return 2
    except ValueError as exc:  # e.g. a trace without token times to fit, traces of different servers
        print(f"cannot calibrate {' '.join(map(str, observed))}: {exc}", file=sys.stderr)
        return 2
    out = args.report if args.calibrate_command == "fit" else args.out
    for k, (one, cal) in enumerate(zip(observed, cals, strict=True), start=1):
        report = cal.report
        if args.calibrate_command == "fit":  # the report says where its latency model came from, its warnings first
            report = attrs.evolve(report, fit=result.profile()["fit"],
                                  warnings=[w for w in report.warnings if not w.startswith(PROFILE_FIT_WARNING)])
        if len(observed) > 1:
            console.print(f"compared with {one}")
        console.print(report_table(report))
        if out:
            where = Path(out) / f"trace{k}" if len(observed) > 1 else Path(out)
            written = write_report(report, cal.samples, where)
            console.print(f"wrote {', '.join(p.name for p in written)} in {where}")
        if on_report is not None:
            on_report(report, cal.samples)
    return 0


def _as_list(observed: Any) -> list[Any]:
    """The traces given (``fit``: a list; ``compare``: one)."""
    return list(observed) if isinstance(observed, list) else [observed]


def _probe(args: argparse.Namespace) -> int:
    """``calibrate probe``: checks its options and output directory before anything is sent."""
    import math
    import os

    from simpy_llm.output_paths import OutputPathError, check_output_dir

    if args.max_seconds is not None and not (math.isfinite(args.max_seconds) and args.max_seconds > 0):
        print(f"--max-seconds must be a number > 0, got {args.max_seconds}", file=sys.stderr)
        return 2
    if args.parallel is not None and args.parallel < 1:
        print(f"--parallel must be at least 1, got {args.parallel}", file=sys.stderr)
        return 2
    try:
        check_output_dir(args.out)
    except OutputPathError as exc:
        print(exc, file=sys.stderr)
        return 2
    import aiohttp
    from rich.console import Console

    from simpy_llm.calibrate.probe import DEFAULT_MAX_SECONDS, ProbeError, run_probe
    from simpy_llm.config import ScenarioError
    from simpy_llm.observe.server_info import load_server_config

    try:
        load_server_config(args.server_config)  # a bad file is reported before anything is sent
        result = run_probe(
            args.url, args.out, model=args.model, api=args.api, api_key=args.api_key or os.environ.get("OPENAI_API_KEY"),
            server_type=args.server_type, server_config=args.server_config,
            max_seconds=DEFAULT_MAX_SECONDS if args.max_seconds is None else args.max_seconds,
            parallel=args.parallel, seed=args.seed, loop=args.loop,
        )
    except (ScenarioError, ProbeError) as exc:
        print(exc, file=sys.stderr)
        return 2
    except (aiohttp.ClientError, OSError) as exc:
        print(f"cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted: the requests answered so far are in {Path(args.out) / 'trace.csv'}", file=sys.stderr)
        return 130
    console = Console(soft_wrap=True)
    console.print(probe_table(result))
    for warning in result.warnings:
        console.print(f"warning: {warning}")
    stats = result.statistics
    console.print(f"probe took {stats['duration_s']:.1f} s of its {stats['budget_s']:.0f} s budget")
    console.print(f"wrote trace.yaml, trace.csv and profile.yaml in {args.out}")
    return 0


def probe_table(result: Any) -> Any:
    """The probe's coefficients as a ``rich`` table: value, 95 % interval and source (µs)."""
    from rich.table import Table

    table = Table(title="probed batch_table coefficients (µs)")
    for column in ("coefficient", "value", "95 % interval", "source"):
        table.add_column(column, justify="left" if column in ("coefficient", "source") else "right")

    def fmt(v: float) -> str:
        return f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.0f}"

    def row(name: str, value: float, interval: Any, source: str) -> None:
        iv = "-" if interval is None else f"[{fmt(interval[0])}, {fmt(interval[1])}]"
        table.add_row(name, fmt(value), iv, source)

    for name, value in result.params.items():
        if name == "decode_step_us":
            for n, (v, iv, src) in enumerate(zip(value, result.intervals[name], result.sources[name], strict=True), 1):
                row(f"decode_step_us D({n})", v, iv, src)
        else:
            row(name, value, result.intervals[name], result.sources[name])
    return table
