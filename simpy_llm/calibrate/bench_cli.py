"""``simpy-llm bench predict`` and ``simpy-llm bench compare``: a benchmark predicted by the
simulator before it is run, and scored against it afterwards (:mod:`simpy_llm.calibrate.bench_predict`).

The serving system is a scenario (``SCENARIO``), or the one a trace header describes
(``--from-trace``, as ``calibrate compare`` builds it), with a fitted latency profile in place
of its latency model (``--latency-profile``). ``bench compare`` takes the first measured run's
trace by default, so ``simpy-llm bench compare runs/bench --latency-profile fit.yaml`` scores a
fit against a benchmark of the server it was fitted on.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["add_verbs", "main"]

_HTML_HELP = "also write a self-contained HTML page of the latency-vs-rate curves (needs the report extra)"


def add_verbs(verbs: Any, add_scenario_options: Any) -> None:
    """Add ``predict`` and ``compare`` to the ``bench`` command's subparsers *verbs*."""
    from simpy_llm.observe.bench.cli import add_profile_options

    predict = verbs.add_parser("predict", help="predict a benchmark's runs with the simulator, before sending a request")
    predict.add_argument("scenario", metavar="SCENARIO", nargs="?", help="the serving system (its workload is replaced by the benchmark's)")
    predict.add_argument("--from-trace", metavar="TRACE",
                         help="use the serving system a trace header describes instead of SCENARIO (with --latency-profile)")
    predict.add_argument("--latency-profile", metavar="PROFILE", help="a fitted profile (calibrate fit) as the latency model")
    add_scenario_options(predict)
    add_profile_options(predict)
    predict.add_argument("--out", metavar="DIR", default="runs/bench-predicted", help="output directory (default runs/bench-predicted)")
    predict.add_argument("--html", metavar="FILE", help=_HTML_HELP)

    compare = verbs.add_parser("compare", help="predict each run of a measured benchmark and report the errors run by run")
    compare.add_argument("measured", metavar="MEASURED", help="the output directory of bench run")
    compare.add_argument("--scenario", metavar="SCENARIO", help="the serving system (default: the first run's trace header, --from-trace)")
    compare.add_argument("--from-trace", metavar="TRACE", help="the trace whose header describes the serving system (default MEASURED/rate_0)")
    compare.add_argument("--latency-profile", metavar="PROFILE", help="a fitted profile (calibrate fit) as the latency model")
    add_scenario_options(compare)
    compare.add_argument("--out", metavar="DIR", help="output directory (default MEASURED/predicted)")
    compare.add_argument("--html", metavar="FILE", help=_HTML_HELP)


def _scenario(scenario: str | None, from_trace: str | None, latency_profile: str | None, overrides: list[str]) -> Any:
    from simpy_llm.calibrate.scenario import apply_profile, scenario_from_trace
    from simpy_llm.loading import load_scenario

    if (scenario is None) == (from_trace is None):
        raise ValueError("give a scenario or --from-trace (one of them)")
    if scenario is not None:
        loaded = load_scenario(scenario, overrides)
        return apply_profile(loaded, latency_profile) if latency_profile else loaded
    if overrides:
        raise ValueError("--set needs a scenario (the serving system from a trace header takes no overrides)")
    assert from_trace is not None  # one of the two is given (checked above)
    return scenario_from_trace(from_trace, profile=latency_profile)


PageWriter = Callable[[Mapping[str, Any], Mapping[str, Any] | None, Mapping[str, Any] | None], None]
"""Writes a benchmark's page: (benchmark, predicted or None, errors or None)."""


def main(args: argparse.Namespace, on_page: PageWriter | None = None) -> int:
    """Run ``bench predict`` or ``bench compare``: 0 on success, 2 for bad options or files.

    *on_page* is called with (benchmark, predicted or None, errors or None) when ``--html`` is
    given: the report's layer sits above this one, and writes the page.
    """
    from simpy_llm.calibrate.bench_predict import bench_errors, predict_bench, predict_measured
    from simpy_llm.config import ScenarioError
    from simpy_llm.observe.bench.cli import print_results
    from simpy_llm.observe.bench.metrics import parse_goodput, parse_percentiles
    from simpy_llm.observe.bench.run import write_bench_results
    from simpy_llm.observe.prompts import PromptDatasetError

    try:
        if args.bench_command == "predict":
            scenario = _scenario(args.scenario, args.from_trace, args.latency_profile, list(args.overrides))
            percentiles = parse_percentiles(args.percentiles)
            result = predict_bench(
                scenario, args.out, dataset=args.dataset, num_prompts=args.num_prompts, profile=args.profile,
                request_rates=tuple(args.request_rate or (math.inf,)), max_concurrency=tuple(args.max_concurrency or ()),
                rates=args.rates, sweep_arrivals=args.sweep_arrivals, percentiles=percentiles,
                goodput=parse_goodput(args.goodput) or None, input_len=args.input_len, output_len=args.output_len,
                range_ratio=args.random_range_ratio, prompt_field=args.prompt_field, tokenizer=args.tokenizer, seed=args.seed,
            )
            print_results(result, percentiles)
            print(f"written to {args.out}: bench.json, bench.csv, rate_<k>/")
            if args.html and on_page is not None:
                on_page(result, None, None)
            return 0
        measured_dir = Path(args.measured)
        measured = json.loads((measured_dir / "bench.json").read_text(encoding="utf-8"))
        from_trace = args.from_trace or (None if args.scenario else str(measured_dir / measured["runs"][0]["dir"] / "trace"))
        scenario = _scenario(args.scenario, from_trace, args.latency_profile, list(args.overrides))
        out = Path(args.out) if args.out else measured_dir / "predicted"
        predicted = predict_measured(scenario, measured_dir, out)
        errors = bench_errors(measured["runs"], predicted["runs"])
        (out / "compare.json").write_text(json.dumps({"measured": str(measured_dir), "errors": errors}, indent=2) + "\n", encoding="utf-8")
        write_bench_results(out, predicted)
        _print_errors(errors)
        print(f"written to {out}: bench.json, bench.csv, compare.json, rate_<k>/")
        if args.html and on_page is not None:
            on_page(measured, predicted, errors)
        return 0
    except (ValueError, ScenarioError, PromptDatasetError, OSError, KeyError) as exc:
        print(exc if not isinstance(exc, KeyError) else f"bench.json lacks {exc}", file=sys.stderr)
        return 2


def _print_errors(errors: Mapping[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    from simpy_llm.observe.bench.cli import rate_text

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:+.1f} %"

    table = Table(title="predicted against measured, (predicted - measured) / measured")
    for name in ("strategy", "rate", "measured req/s", "TTFT p50", "TTFT p99", "E2E p50", "E2E p99"):
        table.add_column(name, justify="right")
    for r in errors["runs"]:
        table.add_row(r["strategy"], rate_text(r["request_rate"]), f"{r['request_throughput']:.3f}",
                      *(pct(r[k]) for k in ("median_ttft_ms", "p99_ttft_ms", "median_e2el_ms", "p99_e2el_ms")))
    console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)
    console.print(table)
    sat = errors.get("saturation")
    if sat is not None:
        console.print(f"saturation rate: measured {sat['measured']:.3f}, predicted {sat['predicted']:.3f} requests/s ({pct(sat['error'])})")
    console.print("below saturation, MAPE: " + ", ".join(f"{k} {'-' if v is None else f'{100 * v:.1f} %'}" for k, v in errors["mape"].items()))
