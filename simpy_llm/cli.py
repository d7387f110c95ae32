"""Command line: ``simpy-llm run | workload | observe | serve | calibrate | sweep | capacity | deploy | validate``.

``simpy-llm run SCENARIO [--out DIR] [--set dotted.key=value ...] [--seed N]``
runs a scenario, prints the summary as a table and, last, how many requests
were simulated in how many wall seconds. Files are written only with
``--out``, which every command checks it can write before it simulates or sends
anything. ``simpy-llm validate FILE ...`` checks scenario files and bare workload
specs without running them (``PATH: ok``, ``PATH: ok: workload spec``), with the
files they reference (:func:`~simpy_llm.workload.checks.check_spec_files`, which
every command that runs also calls first). ``simpy-llm serve SCENARIO [--host H]
[--port P]`` runs the emulated OpenAI-compatible server (docs/emulate.md) until
SIGINT or SIGTERM.
``simpy-llm workload SPEC --out DIR`` writes the requests of a workload without
simulating them. ``simpy-llm observe SPEC --url URL [--model M] [--api
chat|completions] [--out DIR] [--server-type T] [--server-config FILE]`` sends a
workload to a real server and records it as a trace v2 (docs/observe.md);
Ctrl-C stops it cleanly. ``workload``, ``observe`` and ``validate`` take a bare
workload spec (a workload at the top of the file) or a scenario (a mapping with
``serving`` or ``workload`` at the top), told apart by content; ``run`` and
``serve`` take scenarios, whose workload may be a reference, ``workload: {file:
PATH}``. Every command that reads a scenario takes ``--set KEY=VALUE``
overrides (for a bare workload spec relative to the workload) and ``--plugin
MODULE_OR_FILE`` (modules or Python files imported first, so the policies they
register can be named in the scenario). ``simpy-llm calibrate compare | fit OBSERVED``
compares an observed trace with the simulator or fits a latency profile to it
(:mod:`simpy_llm.calibrate.cli`, docs/calibration.md). ``simpy-llm sweep SCENARIO --grid
KEY=V1,V2 ...`` runs a scenario at every point of a grid on a process pool or a Dask
cluster (:mod:`simpy_llm.explore.cli`, docs/sweeps.md); ``simpy-llm capacity SCENARIO
--slo METRIC=TARGET ...`` finds the largest load it carries, or with ``--replicas --load
L`` the fewest replicas for a load (:mod:`simpy_llm.explore.capacity_cli`,
docs/capacity.md). ``simpy-llm catalogue [--csv]`` lists the measured latency profiles (docs/latency.md, "The
catalogue"). ``simpy-llm --version`` prints the version. Exit status: 0 ok, 2 bad
input (a :class:`~simpy_llm.config.ScenarioError`, also one raised while a run reads its
files or draws its values, is printed as its message, without a traceback).

Kept whole (over 800 lines): it is the one place the command line's options are declared, so
that every verb reads the same ``--set``/``--seed``/``--out`` rules; each verb's work lives in
its own module, imported only when that verb runs.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import simpy_llm.cli_threads  # noqa: F401  (first: it sets OpenBLAS's threads before numpy loads)
from simpy_llm import __version__
from simpy_llm.cli_options import byte_count, connection_cap
from simpy_llm.config import Scenario, ScenarioError
from simpy_llm.loading import load_plugins, load_scenario
from simpy_llm.metrics.results import rate_lines
from simpy_llm.report.cli import HTML_HELP, html_ok, write_html

# Each subcommand imports what it runs, when it runs (the function-local imports below): the
# command line starts fast whatever it does, and a run loads neither the observer, the
# calibrator nor the explorer (tests/observe/emulate/test_isolation.py).

if TYPE_CHECKING:
    from simpy_llm.metrics.summary import Summary

__all__ = ["main"]


_OWN_VERBS = frozenset({"run", "workload", "observe", "serve", "validate", "lut-drift"})
"""The verbs whose options this module declares itself; the others' come from their own modules."""


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser. With *command*, one of :data:`_OWN_VERBS`, the verbs declared
    in other modules are left out: the parse of that verb's arguments is its subparser's alone, so
    it reads and reports the same, and the calibrator's, observer's, explorer's and report's
    modules stay unimported (``simpy-llm run`` starts without them). Any other *command* (or
    none: ``--help``, ``--version``, a verb misspelled) gets every verb."""
    p = argparse.ArgumentParser(prog="simpy-llm", description="Simulate LLM inference serving.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a scenario and print its summary")
    run.add_argument("scenario", help="scenario YAML file")
    run.add_argument("--out", metavar="DIR", help="write records, summary and manifest here")
    run.add_argument("--html", metavar="FILE", help=HTML_HELP)
    _add_scenario_options(run)
    run.add_argument("--seed", type=int, help=_SEED_HELP)
    run.add_argument(
        "--progress",
        choices=("auto", "on", "off"),
        default="auto",
        help="progress: on = a bar on a terminal, else a line every 10 s; auto = a bar on a terminal for long runs",
    )
    run.add_argument("--stream-records", metavar="DIR", help=(
        "write the records to DIR in chunks as the run goes (Parquet with the parquet extra, else CSV), not held in memory; "
        "the summary is the same, read from the chunks (docs/model.md, 'Streamed records')"))
    run.add_argument("--stream-chunk", metavar="N", type=int, help="records per chunk with --stream-records (default 16,384)")

    wl = sub.add_parser("workload", help="generate a workload's requests without simulating them")
    wl.add_argument("spec", metavar="SPEC", help=_SPEC_HELP)
    wl.add_argument("--out", metavar="DIR", required=True, help="write trace v2, summary.json (and plots) here")
    _add_scenario_options(wl, workload_keys=True)
    wl.add_argument("--seed", type=int, help=_SEED_HELP)
    wl.add_argument("--plots", action="store_true", help="also write PNG histograms")

    obs = sub.add_parser("observe", help="send a workload to a real server and record a trace")
    obs.add_argument("workload", metavar="SPEC", help=_SPEC_HELP)
    obs.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000 (without /v1)")
    obs.add_argument("--model", help="model name to request (default: the first of the server's /v1/models)")
    obs.add_argument("--api", choices=("chat", "completions"), default="chat", help="endpoint (default chat)")
    obs.add_argument("--out", metavar="DIR", default="runs/observe", help="output directory (default runs/observe)")
    obs.add_argument("--api-key", help="bearer token (default: the OPENAI_API_KEY environment variable)")
    obs.add_argument("--html", metavar="FILE", help=HTML_HELP)
    _add_scenario_options(obs, workload_keys=True)
    obs.add_argument("--seed", type=int, help=_SEED_HELP)
    obs.add_argument("--stream", choices=("auto", "on", "off"), default="auto", help="auto: per request, as the workload says")
    obs.add_argument("--concurrency", type=int, help="at most this many requests in flight (default: open loop)")
    obs.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="processes sending the schedule (default 1); a --concurrency limit is split across them",
    )
    obs.add_argument(
        "--max-connections",
        type=connection_cap,
        default="4096",
        metavar="N|none",
        help="connections each sending process keeps open at most (default 4096); a request beyond it waits",
    )
    obs.add_argument(
        "--prepare-bytes",
        type=byte_count,
        default="256M",
        metavar="N[K|M|G]",
        help="request bodies each sending process builds ahead, in bytes (default 256M): as many as fit are "
             "built before the clock starts, the rest during the run",
    )
    obs.add_argument("--timeout", type=float, default=600.0, metavar="S", help="per-attempt limit, seconds (default 600)")
    obs.add_argument("--retries", type=int, default=0, help="retries of 429/503 answers with backoff (default 0)")
    obs.add_argument("--no-ignore-eos", action="store_true", help="let the server stop before max_tokens")
    obs.add_argument(
        "--scrape-metrics",
        nargs="?",
        const="",
        metavar="URL",
        help="scrape Prometheus metrics into metrics.csv (default URL: the server's /metrics)",
    )
    obs.add_argument("--scrape-interval", type=float, default=1.0, metavar="S", help="seconds between scrapes")
    obs.add_argument("--loop", choices=("auto", "uvloop", "asyncio"), default="auto", help="event loop (auto: uvloop)")
    obs.add_argument(
        "--prompts",
        metavar="FILE",
        help="prompt dataset (ShareGPT JSON, or JSON/JSONL records with a text field); default: synthetic words",
    )
    obs.add_argument(
        "--prompt-field",
        metavar="NAME",
        help="the dataset's prompt field (default: prompt, text, question or ShareGPT conversations, found by itself)",
    )
    obs.add_argument(
        "--progress",
        choices=("auto", "on", "off"),
        default="auto",
        help="live progress line on stderr: auto shows it on a terminal",
    )
    obs.add_argument(
        "--server-type",
        choices=_SERVER_TYPES,
        help="the server's kind, for the trace header's server block: llamacpp, emulated and tgi are described "
        "from the server itself, vllm and sglang from --server-config (default: its server.type, else other)",
    )
    obs.add_argument(
        "--server-config",
        metavar="FILE",
        help="YAML with optional server, hardware and network mappings for the trace header (its values "
        "override what the server reports)",
    )
    obs.add_argument(
        "--warm-up-requests",
        type=int,
        default=0,
        metavar="N",
        help="the first N requests (by request id) are warm-up, left out of calibration; written to the "
        "trace header (default 0)",
    )

    srv = sub.add_parser("serve", help="serve an OpenAI-compatible API with the simulator's timing")
    srv.add_argument("scenario", help="scenario YAML file (its serving section is simulated)")
    srv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    srv.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    srv.add_argument("--model", help="model name served (default: the latency model's model, else the scenario name)")
    srv.add_argument("--trace", metavar="PATH", help="write every request as a trace v2 row (PATH.yaml + PATH.csv)")
    _add_scenario_options(srv)
    srv.add_argument("--seed", type=int, help=_SEED_HELP)

    val = sub.add_parser("validate", help="check scenario files and bare workload specs without running them")
    val.add_argument(
        "files",
        nargs="+",
        help="scenario or bare workload spec YAML files (told apart by content, as workload and observe do); "
        "the files they reference are checked too (their headers and columns)",
    )
    _add_scenario_options(val, workload_keys=True)

    drift = sub.add_parser(
        "lut-drift", help="compare a LUT file with its previous version; exit 1 when a shared row moved more than the tolerance"
    )
    drift.add_argument("new", help="the new LUT file (CSV, or Parquet by its .parquet / .pq ending)")
    drift.add_argument("previous", help="the previous version of the same LUT")
    drift.add_argument("--tolerance", type=float, default=0.05, help="largest relative change that is not drift (default 0.05)")
    drift.set_defaults(plugins=[])
    if command in _OWN_VERBS:
        return p

    from simpy_llm.explore.catalogue_cli import add_verb as add_catalogue_verb

    add_catalogue_verb(sub)
    from simpy_llm.calibrate.bench_cli import add_verbs as add_bench_verbs
    from simpy_llm.calibrate.cli import add_parser as add_calibrate
    from simpy_llm.explore.capacity_cli import add_parser as add_capacity
    from simpy_llm.explore.cli import add_parser as add_sweep
    from simpy_llm.explore.deploy_cli import add_parser as add_deploy
    from simpy_llm.observe.bench.cli import add_parser as add_bench
    from simpy_llm.report.cli import add_parser as add_report

    add_sweep(sub, _add_scenario_options)
    add_calibrate(sub, _add_scenario_options)
    add_capacity(sub, _add_scenario_options)
    add_deploy(sub, _add_scenario_options)
    add_report(sub)
    add_bench_verbs(add_bench(sub, _add_scenario_options), _add_scenario_options)
    return p


_SPEC_HELP = (
    "a bare workload spec (a workload at the top level: version, seed, aggregate_rate, clients, ...) or a "
    "scenario (a mapping with serving or workload at the top: its workload section is used), told apart by content"
)
_SERVER_TYPES = ("vllm", "sglang", "llamacpp", "emulated", "tgi", "other")
"""simpy_llm.observe.server_info.SERVER_TYPES, written out so that starting the command does not import aiohttp."""
_SEED_HELP = (
    "the whole run's root seed: sets the scenario's seed and its workload's seed (a workload file's own seed "
    "included); for a bare workload spec, its seed. To hold the workload fixed and vary the rest, use --set seed=N"
)


def _add_scenario_options(parser: argparse.ArgumentParser, workload_keys: bool = False) -> None:
    """``--set`` and ``--plugin``, the same on every command that reads a scenario (with
    *workload_keys*, the command also reads bare workload specs)."""
    bare = (
        "; for a bare workload spec keys are relative to the workload, a leading workload. accepted: "
        "--set aggregate_rate=5 or --set workload.aggregate_rate=5"
        if workload_keys
        else ""
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a scenario value, e.g. --set workload.num_requests=1000 (repeatable; the value is "
        "parsed as YAML, null unsets an optional key; list items by index: workload.clients.0.rate_fraction=2"
        f"{bare})",
    )
    parser.add_argument(
        "--plugin",
        dest="plugins",
        action="append",
        default=[],
        metavar="MODULE_OR_FILE",
        help="import a module (my_package.policies) or Python file (my_policies.py) before reading the "
        "scenario, so the policies it registers can be named in it (repeatable)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``simpy-llm`` command."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser(argv[0] if argv else None).parse_args(argv)
    if args.plugins:
        try:
            load_plugins(args.plugins, source="command line", key="--plugin")
        except ScenarioError as exc:
            print(exc, file=sys.stderr)
            return 2
    if args.command == "validate":
        return _validate(args)
    if args.command == "workload":
        return _workload(args)
    if args.command == "serve":
        return _serve(args)
    if args.command == "sweep":
        from simpy_llm.explore.cli import main as sweep_command

        return sweep_command(args)
    if args.command == "calibrate":
        from simpy_llm.calibrate.cli import main as calibrate

        if getattr(args, "html", None) is None:
            return calibrate(args)
        if not html_ok(args.html):
            return 2
        return calibrate(args, on_report=lambda report, samples: _compare_html(report, samples, args.html))
    if args.command == "report":
        from simpy_llm.report.cli import main as report

        return report(args)
    if args.command == "capacity":
        from simpy_llm.explore.capacity_cli import main as capacity

        return capacity(args)
    if args.command == "observe":
        return _observe(args)
    if args.command == "bench":
        from simpy_llm.report.cli import bench_page_ok, write_bench_html

        if not html_ok(args.html) or not bench_page_ok(args):
            return 2
        if args.bench_command != "run":
            from simpy_llm.calibrate.bench_cli import main as bench_predicted

            return bench_predicted(args, on_page=lambda result, predicted, errors: write_bench_html(result, predicted, errors, args.html))
        from simpy_llm.observe.bench.cli import main as bench_command

        code = bench_command(args)
        if code == 0 and args.html:
            from simpy_llm.report.sources import bench_dir_page

            write_html(bench_dir_page(args.out), args.html)
        return code
    if args.command == "lut-drift":
        return _lut_drift(args)
    if args.command == "catalogue":
        from simpy_llm.explore.catalogue_cli import print_catalogue
        return print_catalogue(csv_out=args.csv)
    return args.deploy_main(args) if args.command == "deploy" else _run(args)  # deploy: explore.deploy_cli


def _lut_drift(args: argparse.Namespace) -> int:
    """``simpy-llm lut-drift NEW PREVIOUS``: print the shared rows that drifted; 0 when none,
    1 on drift, 2 when a file is not a valid LUT, the two share no row, or the tolerance is not positive."""
    from simpy_llm.serving.lut import load_lut
    from simpy_llm.serving.lut_drift import describe_drift, lut_drift, shared_rows

    if not 0 < args.tolerance < float("inf"):
        print(f"--tolerance must be a positive number, got {args.tolerance}", file=sys.stderr)
        return 2
    try:
        new, old = load_lut(args.new), load_lut(args.previous)
    except ScenarioError as exc:
        print(exc, file=sys.stderr)
        return 2
    if not shared_rows(new.frame, old.frame):
        print(f"{args.new} and {args.previous} share no row (phase, model, hardware, TP, PP, dtype, fanout, context, "
              "microbatch): there is nothing to compare", file=sys.stderr)
        return 2
    found = lut_drift(new.frame, old.frame, args.tolerance)
    print(f"{args.new} against {args.previous}: {describe_drift(found, args.tolerance, limit=len(found) or 1)}")
    return 1 if found else 0


def _overrides(args: argparse.Namespace) -> list[str]:
    """The ``--set`` overrides, then ``--seed`` as the whole run's root seed.

    ``--seed N`` sets ``seed`` and ``workload.seed``: the serving side's streams and the
    workload's (whose own ``seed``, in the scenario or in the workload file it reads, would
    otherwise hold the requests fixed). For a bare workload spec both keys are its
    ``seed``. A ``--set workload.seed=M`` is kept: the workload then stays fixed while N
    seeds the rest, as ``--set seed=N`` alone does.

    Examples
    --------
    >>> _overrides(argparse.Namespace(overrides=["workload.num_requests=10"], seed=7))
    ['workload.num_requests=10', 'seed=7', 'workload.seed=7']
    >>> _overrides(argparse.Namespace(overrides=["workload.seed=3"], seed=7))
    ['workload.seed=3', 'seed=7']
    """
    out = list(args.overrides)
    if args.seed is None:
        return out
    fixed = any(item.partition("=")[0].strip() == "workload.seed" for item in out)
    return out + [f"seed={args.seed}"] + ([] if fixed else [f"workload.seed={args.seed}"])


def _load(args: argparse.Namespace) -> Scenario | None:
    """The scenario the arguments name (with their overrides), its referenced files checked
    (:func:`~simpy_llm.workload.checks.check_spec_files`), or None after printing why it is bad."""
    from simpy_llm.workload.checks import check_spec_files

    try:
        scenario = load_scenario(args.scenario, _overrides(args))
        check_spec_files(scenario, args.scenario)
    except ScenarioError as exc:
        print(exc, file=sys.stderr)
        return None
    return scenario


def _out_ok(path: str | None) -> bool:
    """Whether the command can write its ``--out`` directory *path*, checked before any work
    (:func:`~simpy_llm.output_paths.check_output_dir`); prints why not. True without one."""
    from simpy_llm.output_paths import OutputPathError, check_output_dir

    if path is None:
        return True
    try:
        check_output_dir(path)
    except OutputPathError as exc:
        print(exc, file=sys.stderr)
        return False
    return True


def _trace_ok(path: str | None) -> bool:
    """Whether ``serve --trace PATH`` can write the trace's header and CSV
    (:func:`~simpy_llm.workload.traces.trace_v2_paths`), checked before serving; prints why
    not. True without one."""
    from simpy_llm.output_paths import OutputPathError, check_output_file
    from simpy_llm.workload.traces import trace_v2_paths

    if path is None:
        return True
    try:
        for file in trace_v2_paths(path):
            check_output_file(file, option="--trace")
    except OutputPathError as exc:
        print(exc, file=sys.stderr)
        return False
    return True


def _checked_spec(path: str, overrides: list[str], out: str | None) -> Any:
    """The workload spec or scenario at *path* (with *overrides*), its files checked and the
    output directory *out* found writable; None after printing why not."""
    from simpy_llm.loading import load_workload_or_scenario
    from simpy_llm.workload.checks import check_spec_files

    try:
        spec = load_workload_or_scenario(path, overrides)
        check_spec_files(spec, path)
    except ScenarioError as exc:
        print(exc, file=sys.stderr)
        return None
    return spec if _out_ok(out) else None


def _workload(args: argparse.Namespace) -> int:
    import json
    import time
    from pathlib import Path

    from simpy_llm.workload.export import generate_requests, plot_histograms, workload_summary
    from simpy_llm.workload.sources import spec_workload
    from simpy_llm.workload.traces import write_generated_trace

    spec = _checked_spec(args.spec, _overrides(args), args.out)
    if spec is None:
        return 2
    try:
        wall0 = time.perf_counter()
        frame = generate_requests(spec)
    except ScenarioError as exc:
        print(exc, file=sys.stderr)
        return 2
    wall = time.perf_counter() - wall0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wl, seed = spec_workload(spec)
    paths = write_generated_trace(frame, out / "trace", source=args.spec, seed=seed, max_concurrency=wl.max_concurrency)
    summary = workload_summary(frame)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {', '.join(str(p) for p in paths)} and {out / 'summary.json'}")
    if args.plots:
        for path in plot_histograms(frame, out):
            print(f"wrote {path}")
    for client, c in summary["clients"].items():
        cv = c["interarrival_cv"]
        print(
            f"  {client}: {c['requests']} requests, {c['rate_per_s']:.3f}/s, "
            f"CV {'-' if cv is None else f'{cv:.2f}'}, input p50 {c['input_tokens'].get('p50', 0):.0f}, "
            f"output p50 {c['output_tokens'].get('p50', 0):.0f}"
        )
    print(f"generated {len(frame)} requests in {wall:.2f} wall seconds")
    return 0


def _observe(args: argparse.Namespace) -> int:
    import os

    import aiohttp
    from rich.console import Console

    from simpy_llm.observe.client import OpenFilesLimitError
    from simpy_llm.observe.progress import show_progress
    from simpy_llm.observe.prompts import PromptDatasetError
    from simpy_llm.observe.report import latency_table
    from simpy_llm.observe.run import observe

    overrides = _overrides(args)
    scrape = args.scrape_metrics
    if scrape == "":
        scrape = args.url.rstrip("/") + "/metrics"
    if args.concurrency is not None and args.concurrency < 1:
        print(f"--concurrency must be at least 1, got {args.concurrency}", file=sys.stderr)
        return 2
    if args.workers < 1:
        print(f"--workers must be at least 1, got {args.workers}", file=sys.stderr)
        return 2
    if args.concurrency is not None and args.workers > args.concurrency:
        print(f"--workers ({args.workers}) must not exceed --concurrency ({args.concurrency}): each worker needs a slot",
              file=sys.stderr)
        return 2
    if args.warm_up_requests < 0:
        print(f"--warm-up-requests must be at least 0, got {args.warm_up_requests}", file=sys.stderr)
        return 2
    spec = _checked_spec(args.workload, overrides, args.out)  # before anything is sent
    if spec is None or not html_ok(args.html):
        return 2
    if args.workers > 1:
        from simpy_llm.observe.sessions import has_sessions

        if has_sessions(spec):
            print(f"--workers {args.workers}: the workload's clients open closed-loop sessions, which one process "
                  "runs (their later calls share request ids and tool slots); use --workers 1", file=sys.stderr)
            return 2
    try:
        summary = observe(
            args.workload,
            args.url,
            args.out,
            model=args.model,
            api=args.api,
            api_key=args.api_key or os.environ.get("OPENAI_API_KEY"),
            overrides=overrides,
            stream={"auto": None, "on": True, "off": False}[args.stream],
            concurrency=args.concurrency,
            timeout_s=args.timeout,
            retries=args.retries,
            ignore_eos=not args.no_ignore_eos,
            scrape_metrics=scrape,
            scrape_interval_s=args.scrape_interval,
            loop=args.loop,
            prompts=args.prompts,
            prompt_field=args.prompt_field,
            progress=show_progress(args.progress, is_terminal=Console(stderr=True).is_terminal, environ=os.environ),
            server_type=args.server_type,
            server_config=args.server_config,
            warm_up_requests=args.warm_up_requests,
            workers=args.workers,
            max_connections=args.max_connections,
            prepare_bytes=args.prepare_bytes,
        )
    except (ScenarioError, PromptDatasetError, OpenFilesLimitError) as exc:
        print(exc, file=sys.stderr)
        return 2
    except (aiohttp.ClientError, OSError) as exc:
        print(f"cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1e3:.1f} ms"

    def rate(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}/s"

    counts = ", ".join(f"{k} {v}" for k, v in sorted(summary.status_counts.items()))
    print(f"requests: {summary.n_requests} ({counts}){' - stopped early' if summary.stopped else ''}")
    print(f"send rate: requested {rate(summary.requested_rate)}, achieved {rate(summary.achieved_rate)}")
    print(
        f"schedule delay: p50 {ms(summary.schedule_delay_p50_s)}, p99 {ms(summary.schedule_delay_p99_s)}, "
        f"max {ms(summary.schedule_delay_max_s)}{' - LAGGING: the client could not keep the rate' if summary.lagging else ''}"
    )
    Console(soft_wrap=True).print(latency_table(summary.latency_s, summary.latency_s_by_client, "observed latency"))
    print(f"trace written to {args.out}")
    if args.html:
        from simpy_llm.report.sources import observe_page

        write_html(observe_page(args.out), args.html)
    return 0


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    from simpy_llm.observe.emulate.server import EmulatedServer, serve_until_signalled

    scenario = _load(args)
    if scenario is None or not _trace_ok(args.trace):
        return 2
    try:
        server = EmulatedServer(scenario, model=args.model, host=args.host, port=args.port, trace=args.trace)
    except ScenarioError as exc:
        print(exc, file=sys.stderr)
        return 2

    def ready(url: str) -> None:
        print(f"serving {server.model} at {url} (OpenAI-compatible: /v1/chat/completions, /v1/completions)", flush=True)

    try:
        asyncio.run(serve_until_signalled(server, ready))
    except OSError as exc:  # e.g. the port is taken
        print(f"cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    print(f"stopped after {len(server.served)} requests", flush=True)
    return 0


def _validate(args: argparse.Namespace) -> int:
    """Check each file: a scenario (``PATH: ok``) or a bare workload spec (``PATH: ok:
    workload spec``), told apart by content, with the files it references."""
    from simpy_llm.config import WorkloadConfig
    from simpy_llm.loading import load_workload_or_scenario
    from simpy_llm.workload.checks import check_spec_files

    status = 0
    for path in args.files:
        try:
            spec = load_workload_or_scenario(path, args.overrides)
            check_spec_files(spec, path)
        except ScenarioError as exc:
            print(exc, file=sys.stderr)
            status = 2
        else:
            print(f"{path}: ok: workload spec" if isinstance(spec, WorkloadConfig) else f"{path}: ok")
    return status


def _run(args: argparse.Namespace) -> int:
    from simpy_llm.simulation import Simulation

    scenario = _load(args)
    if scenario is None or not _out_ok(args.out) or not html_ok(args.html):
        return 2

    try:  # a bad row of a replayed file, a distribution drawing NaN: the message, not a traceback
        stream = {} if args.stream_chunk is None else {"stream_chunk_requests": args.stream_chunk}
        sim = Simulation(scenario, stream_to=args.stream_records, **stream)
        # auto: the same rule as in Python (simpy_llm.progress): a terminal and a long run.
        results = sim.run(progress={"auto": None, "on": True, "off": False}[args.progress])
    except ScenarioError as exc:
        print(exc, file=sys.stderr)
        return 2

    from rich.console import Console  # after the run: only the summary's printing needs it

    console = Console(soft_wrap=True)
    summary = results.summary()
    console.print(_summary_table(summary, scenario.name or args.scenario, has_slo=bool(scenario.slo)))
    if args.out:
        written: list[Path] = []
        out = results.save(args.out, written=written)
        console.print(f"wrote {', '.join(f.name for f in written)} in {out}")
    if args.html:
        from simpy_llm.report.sources import run_page

        write_html(run_page(results), args.html)
    n = len(results)
    rate = n / results.wall_s if results.wall_s > 0 else float("inf")
    console.print(f"simulated {n} requests in {results.wall_s:.2f} wall seconds ({rate:,.0f} requests per wall-second)")
    return 0


def _compare_html(report: Any, samples: Any, path: str) -> None:
    """``calibrate compare --html``: the calibration's page (the calibrator hands its report over,
    as it sits below the report's layer)."""
    from simpy_llm.report.sources import compare_page

    write_html(compare_page(report, samples), path)


def _fmt(value: Any, scale: float = 1.0, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value * scale:.{digits}f}"


def _known(value: float) -> float | None:
    """*value*, or None for NaN (a rate over a window of no length): shown as ``-``."""
    return None if math.isnan(value) else value


def _summary_table(s: Summary, title: str, *, has_slo: bool = True) -> Any:
    """The run's summary as rich tables (*has_slo*: the scenario has SLO targets; without
    them goodput counts every completed request, and the table says so)."""
    from rich.console import Group
    from rich.table import Table

    lat = Table(title=f"{title}: latency", header_style="bold")
    lat.add_column("metric")
    for col in ("mean", "p50", "p90", "p95", "p99"):
        lat.add_column(col, justify="right")
    latency = s["latency_s"]
    rows: list[tuple[Mapping[str, object], str, float]] = [
        (latency["ttft"], "TTFT (ms)", 1000.0),
        (latency["tpot"], "TPOT (ms)", 1000.0),
        (latency["itl"], "ITL (ms)", 1000.0),
        (latency["e2e"], "E2E (s)", 1.0),
        (latency["queue_delay"], "queue delay (ms)", 1000.0),
    ]
    if "client_latency_s" in s:
        rows += [(s["client_latency_s"]["ttft"], "client TTFT (ms)", 1000.0), (s["client_latency_s"]["e2e"], "client E2E (s)", 1.0)]
    if "disaggregation" in s:
        rows.append((s["disaggregation"]["kv_transfer_s"], "KV transfer (ms)", 1000.0))
    if "speculation" in s:
        rows.append((s["speculation"]["tvt_s"], "TVT (ms)", 1000.0))
    for st, label, scale in rows:
        lat.add_row(label, *(_fmt(st.get(k), scale) for k in ("mean", "p50", "p90", "p95", "p99")))
    b = s["batch_size"]
    lat.add_row("batch size (per step)", *(_fmt(b[k], 1.0, 1) for k in ("mean", "p50", "p90", "p95", "p99")))

    req = s["requests"]
    gp = s["goodput"]
    run = Table(title=f"{title}: run", header_style="bold")
    run.add_column("metric")
    run.add_column("value")
    for label, text in (
        ("requests", f"{req['arrived']} arrived, {req['completed']} completed, "
         f"{req['dropped']} dropped, {req['in_flight']} in flight"),
        ("simulated time", f"{s['duration_s']:.2f} s"),
        *rate_lines(s),  # each rate with the window it divides by
        ("goodput", (f"{_fmt(_known(gp['requests_per_s']))} req/s in the arrival window, "
                     f"{_fmt(_known(gp['whole_run_requests_per_s']))} over the whole run "
                     + (f"({_fmt(_known(gp['fraction']), 100, 1)}% met their SLO)" if has_slo
                        else "(no slo section: every completed request counts)"))),
        ("preemptions", f"{s['preemptions']['total']} ({s['preemptions']['requests_preempted']} requests)"),
        ("KV utilisation", f"{_fmt(s['kv_utilization']['time_weighted_mean'], 100, 1)}% (time-weighted mean)"),
        ("GPU utilisation", f"{_fmt(s['gpu_utilization']['mean'], 100, 1)}% busy (mean over replicas)"),
        ("prefix cache", f"{_fmt(s['prefix_cache']['hit_rate'], 100, 1)}% of prompt tokens cached"),
        ("in system", f"{s['in_system']['time_average']:.2f} mean, {s['in_system']['peak']} peak"),
        (
            "engine steps",
            f"{s['engine']['steps']}"
            + (f" ({s['engine']['cold_starts']} cold starts, {s['engine']['cold_start_s']:.2f} s loading)" if "cold_starts" in s["engine"] else ""),
        ),
    ):
        run.add_row(label, text)
    if req["dropped_by_reason"]:
        run.add_row("drops", ", ".join(f"{k} {v}" for k, v in sorted(req["dropped_by_reason"].items())))
    if "disaggregation" in s:
        d = s["disaggregation"]
        run.add_row("KV transfers", f"{d['kv_transfers']} ({d['kv_bytes'] / 1e9:.2f} GB)")
    if "speculation" in s:
        sp = s["speculation"]
        modes = ", ".join(f"{k} {v}" for k, v in sp["requests_by_mode"].items() if v)
        run.add_row("speculation", f"{sp['mode']}: {sp['rounds']} rounds, {_fmt(sp['tokens_per_round'], 1.0, 2)} tokens per round, "
                    f"{_fmt(sp['acceptance_rate'], 100, 1)}% of drafts accepted, mean γ {_fmt(sp['mean_gamma'], 1.0, 2)}"
                    + (f"; requests {modes}" if modes else "")
                    + (f"; {sp['drafter_switches']} drafter switches" if sp["drafter_switches"] else "")
                    + (f"; {sp['rollbacks']} rollbacks" if sp["rollbacks"] else ""))
        for name, g in sp["drafts"].items():
            energy = "" if g["energy_j_per_output_token"] is None else f", {g['energy_j_per_output_token']:.3f} J per output token"
            run.add_row(f"drafts {name}", f"{g['devices']} devices, {_fmt(g['utilisation'], 100, 1)}% drafting{energy}, "
                        f"{_fmt(g['slo_attainment'], 100, 1)}% met their SLO")
    if "devices" in s:
        dev = s["devices"]
        cost = "no price" if dev["cost_usd"] is None else f"${dev['cost_usd']:.4f}, ${dev['cost_usd_per_1k_tokens']:.6f} per 1k tokens"
        run.add_row("energy", f"{dev['energy_j'] / 3.6e6:.4f} kWh, {_fmt(dev['energy_j_per_output_token'], 1.0, 3)} J per output token")
        run.add_row("cost", f"{cost} ({dev['gpus']} GPUs)")
    if "planner" in s:
        pl = s["planner"]
        final = ", ".join(f"{k}={v}" for k, v in pl["final"].items())
        run.add_row("planner", f"{pl['ticks']} ticks, {pl['changes']} changes, ending at {final}; "
                    f"{_fmt(pl['mean_gpus'], 1.0, 2)} GPUs on average")
    links = s.get("network", {}).get("links", {})
    if links:
        name, busiest = max(links.items(), key=lambda kv: (kv[1]["utilisation"] or 0.0, kv[0]))
        run.add_row("network", f"{len(links)} links, {sum(v['delivered'] for v in links.values())} messages; busiest {name}: "
                    f"{_fmt(busiest['utilisation'], 100, 1)}% busy, {_fmt(busiest['mean_queueing_s'], 1000.0, 3)} ms mean queueing")
    ses = s["sessions"]
    if ses["count"]:
        reasons = ", ".join(f"{k} {v}" for k, v in ses["end_reasons"].items())
        run.add_row("sessions", f"{ses['count']} ({ses['mean_rounds']:.2f} rounds on average; ended: {reasons})")
    parts: list[Any] = [lat, run]
    if "batch_servers" in s:
        parts.append(_batch_server_table(s["batch_servers"], s["engine"].get("group"), title))
    if "workflows" in s:
        parts.append(_workflow_table(s["workflows"], title))
    for diag in s.get("diagnostics", []):
        from rich.text import Text

        style = "bold yellow" if diag["severity"] == "warning" else "cyan"
        where = f" [{diag['group']}]" if diag.get("group") else ""
        parts.append(Text(f"{diag['severity']}{where}: {diag['message']}", style=style))
    return Group(*parts)


def _workflow_table(workflows: dict[str, Any], title: str) -> Any:
    """One row per agentic workflow (``summary()["workflows"]``)."""
    from rich.table import Table

    table = Table(title=f"{title}: agentic sessions", header_style="bold")
    for col in ("workflow", "sessions", "done", "e2e p50", "e2e p99", "calls", "tool s", "iter", "queue"):
        table.add_column(col, justify="left" if col == "workflow" else "right")
    for name, w in workflows.items():
        table.add_row(
            name, str(w["sessions"]), str(w["completed"]), _fmt(w["e2e_s"]["p50"], 1.0, 2), _fmt(w["e2e_s"]["p99"], 1.0, 2),
            _fmt(w["llm_calls_mean"], 1.0, 1), _fmt(w["tool_wait_s_mean"], 1.0, 2), _fmt(w["iterations"]["mean"], 1.0, 1),
            "-" if w["critical_queue_share_mean"] is None else f"{w['critical_queue_share_mean']:.1%}",
        )
    return table


def _batch_server_table(servers: dict[str, Any], groups: list[str] | None, title: str) -> Any:
    """One row per request-level batch server (``summary()["batch_servers"]``).

    ``SLA miss`` is "-" for a fixed-B server without a ``d_sla_s``; ``target`` is the
    dynamic batcher's settled ``b_target`` and, in brackets, when it settled ("-" with a
    fixed B or too few batches to tell, "unsettled" when it never stayed in its band)."""
    from rich.table import Table

    table = Table(title=f"{title}: batch servers", header_style="bold")
    for col in ("server", "batches", "req/s", "c_max", "size", "p95 s", "SLA miss", "KV peak", "target"):
        table.add_column(col, justify="left" if col == "server" else "right")
    for index, b in servers.items():
        size = b["batch_size"]
        memory = b["memory"]
        limit = memory["limit_tokens"]
        controller = b["controller"]
        settled = controller["settled_b_target"]
        if settled is None:
            target = "-"
        elif controller["convergence_s"] is None:
            target = f"{settled:g} (unsettled)"
        else:
            target = f"{settled:g} ({controller['convergence_s']:.0f} s)"
        table.add_row(
            f"{groups[int(index)]}/{index}" if groups else index,
            str(b["batches"]),
            _fmt(b["requests_per_s"], 1.0, 2),
            _fmt(b["c_max_requests_per_s"], 1.0, 2),
            f"{_fmt(size['mean'], 1.0, 1)}±{_fmt(size['std'], 1.0, 1)}",
            _fmt(b["service_s"]["p95"], 1.0, 2),
            "-" if b["sla"]["violation_rate"] is None else f"{b['sla']['violation_rate']:.1%}",
            f"{memory['peak_tokens']}/{limit if limit is not None else '-'}",
            target,
        )
    return table


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
