"""The ``simpy-llm bench`` command: ``bench run`` benchmarks a server as ``vllm bench serve`` and guidellm do.

Its options keep vLLM's names (``--dataset``, ``--request-rate``, ``--max-concurrency``,
``--num-prompts``, ``--goodput``, ``--percentiles`` for vLLM's ``--metric-percentiles``) and
guidellm's (``--profile``, ``--rates``, ``--max-seconds``, ``--max-requests``,
``--max-error-rate``); see docs/observe.md, "Benchmarks".
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from simpy_llm.cli_options import byte_count, connection_cap

__all__ = ["add_parser", "add_profile_options", "main", "print_results", "rate_text"]

_SERVER_TYPES = ("vllm", "sglang", "llamacpp", "emulated", "tgi", "other")
"""simpy_llm.observe.server_info.SERVER_TYPES, written out so that starting the command does not import aiohttp."""
_PROFILES = ("synchronous", "concurrency", "throughput", "constant", "poisson", "sweep")
"""simpy_llm.observe.bench.profiles.PROFILES, written out for the same reason."""


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rate (a number of requests per second, or inf)") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a rate must be > 0 (inf: all at once)")
    return value


def add_profile_options(parser: argparse.ArgumentParser) -> None:
    """The options that say what a benchmark sends: dataset, profile, rates, concurrency,
    metrics and seed (``bench run`` and ``bench predict`` share them)."""
    parser.add_argument(
        "--dataset",
        default="random",
        metavar="sharegpt|random|synthetic|FILE",
        help="where prompts come from (default random): ShareGPT V3 (the bench extra), vLLM's random lengths, "
        "exact synthetic lengths, or a prompt file (ShareGPT JSON, JSON/JSONL records)",
    )
    parser.add_argument("--num-prompts", "--max-requests", dest="num_prompts", type=int, default=1000, metavar="N",
                        help="requests per run (default 1000)")
    parser.add_argument("--profile", choices=_PROFILES, default="poisson",
                        help="how requests are sent (default poisson, vLLM's arrivals; see docs/observe.md)")
    parser.add_argument("--request-rate", type=_rate, nargs="+", metavar="RATE",
                        help="requests per second of constant / poisson runs, one run each (default inf: all at once)")
    parser.add_argument("--max-concurrency", type=int, nargs="+", metavar="N",
                        help="at most N requests in flight; several values with --profile concurrency: one run each")
    parser.add_argument("--rates", type=int, metavar="N", help="sweep: rates between the synchronous and throughput runs (default 5)")
    parser.add_argument("--sweep-arrivals", choices=("constant", "poisson"), help="sweep: how those rates space requests (default constant)")
    parser.add_argument("--percentiles", default="99", metavar="P,P,...", help="percentiles of each latency metric (default 99)")
    parser.add_argument("--goodput", nargs="+", default=[], metavar="KEY:MS",
                        help="SLOs for goodput, vLLM's syntax: ttft:500 tpot:50 e2el:3000 (milliseconds)")
    parser.add_argument("--input-len", type=int, metavar="N", help="random / synthetic: prompt tokens (default 1024)")
    parser.add_argument("--output-len", type=int, metavar="N",
                        help="output tokens: random / synthetic (default 128), a prompt file (required), sharegpt (instead of the reply's)")
    parser.add_argument("--random-range-ratio", type=float, default=0.0, metavar="R",
                        help="random: lengths drawn in [len*(1-R), len*(1+R)] (default 0)")
    parser.add_argument("--prompt-field", metavar="NAME", help="a prompt file's field (default: found by itself)")
    parser.add_argument("--tokenizer", metavar="FILE",
                        help="a tokenizers file (tokenizer.json) to count tokens with (default: the server's /tokenize)")
    parser.add_argument("--seed", type=int, default=0, help="draws the dataset, the lengths and the Poisson gaps (default 0)")


def add_parser(sub: Any, add_scenario_options: Any = None) -> Any:
    """Add ``bench`` with its ``run`` subcommand to the subparsers *sub* and return the
    subparsers of its verbs, for the layers above to add theirs (*add_scenario_options* is
    not used: a benchmark of a server reads no scenario)."""
    bench = sub.add_parser("bench", help="benchmark a server with vllm bench / guidellm profiles, recording every run as a trace")
    verbs = bench.add_subparsers(dest="bench_command", required=True)
    run = verbs.add_parser("run", help="run a benchmark profile: one trace per rate, bench.json and bench.csv")
    run.set_defaults(plugins=[])
    run.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000 (without /v1)")
    add_profile_options(run)
    run.add_argument("--max-seconds", type=float, metavar="S", help="stop each run after S seconds (in-flight requests cancelled)")
    run.add_argument("--max-error-rate", type=float, metavar="F",
                     help="stop a run when more than this share of the last 20 ended requests failed")
    run.add_argument("--out", metavar="DIR", default="runs/bench", help="output directory (default runs/bench)")
    run.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page of the latency-vs-rate curves (needs the report extra)")
    run.add_argument("--model", help="model name to request (default: the first of the server's /v1/models)")
    run.add_argument("--api", choices=("chat", "completions"), default="completions", help="endpoint (default completions, as vLLM)")
    run.add_argument("--api-key", help="bearer token (default: the OPENAI_API_KEY environment variable)")
    run.add_argument("--timeout", type=float, default=600.0, metavar="S", help="per-request limit, seconds (default 600)")
    run.add_argument("--ignore-eos", action="store_true", help="ask for exactly the output length (ignore_eos: true)")
    run.add_argument("--server-type", choices=_SERVER_TYPES, help="the server's kind, for each trace header's server block")
    run.add_argument("--server-config", metavar="FILE", help="YAML with server, hardware and network mappings for the trace headers")
    run.add_argument("--loop", choices=("auto", "uvloop", "asyncio"), default="auto", help="event loop (auto: uvloop)")
    run.add_argument("--max-connections", type=connection_cap, default="4096", metavar="N|none",
                     help="connections the client keeps open at most (default 4096); a request beyond it waits")
    run.add_argument("--prepare-bytes", type=byte_count, default="256M", metavar="N[K|M|G]",
                     help="request bodies built ahead of each run, in bytes (default 256M)")
    return verbs


def main(args: argparse.Namespace) -> int:
    """Run ``simpy-llm bench run``: 0 when every run was made, 2 for bad options or data, 1 when
    the server cannot be reached."""
    import os

    import aiohttp

    from simpy_llm.config import ScenarioError
    from simpy_llm.observe.bench.metrics import parse_goodput, parse_percentiles
    from simpy_llm.observe.bench.run import bench
    from simpy_llm.observe.client import OpenFilesLimitError
    from simpy_llm.observe.prompts import PromptDatasetError

    if args.prompt_field is not None and args.dataset in ("sharegpt", "random", "synthetic"):
        print(f"--prompt-field is for a prompt file, not --dataset {args.dataset}", file=sys.stderr)
        return 2
    try:
        percentiles = parse_percentiles(args.percentiles)
        goodput = parse_goodput(args.goodput)
        result = bench(
            args.url,
            args.out,
            dataset=args.dataset,
            num_prompts=args.num_prompts,
            profile=args.profile,
            request_rates=tuple(args.request_rate or (math.inf,)),
            max_concurrency=tuple(args.max_concurrency or ()),
            rates=args.rates,
            sweep_arrivals=args.sweep_arrivals,
            max_seconds=args.max_seconds,
            max_error_rate=args.max_error_rate,
            percentiles=percentiles,
            goodput=goodput or None,
            input_len=args.input_len,
            output_len=args.output_len,
            range_ratio=args.random_range_ratio,
            prompt_field=args.prompt_field,
            tokenizer=args.tokenizer,
            seed=args.seed,
            model=args.model,
            api=args.api,
            api_key=args.api_key or os.environ.get("OPENAI_API_KEY"),
            timeout_s=args.timeout,
            ignore_eos=args.ignore_eos,
            server_type=args.server_type,
            server_config=args.server_config,
            loop=args.loop,
            max_connections=args.max_connections,
            prepare_bytes=args.prepare_bytes,
        )
    except (ValueError, ScenarioError, PromptDatasetError, OpenFilesLimitError) as exc:
        print(exc, file=sys.stderr)
        return 2
    except (aiohttp.ClientError, OSError) as exc:
        print(f"cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
    print_results(result, percentiles)
    print(f"written to {args.out}: bench.json, bench.csv, rate_<k>/")
    return 0


def rate_text(rate: float | str) -> str:
    """A run's target rate for a table: four significant figures, or ``inf``.

    >>> rate_text(27.816641451006806), rate_text("inf")
    ('27.82', 'inf')
    """
    return rate if isinstance(rate, str) else f"{rate:.4g}"


def print_results(result: dict[str, Any], percentiles: tuple[float, ...]) -> None:
    """The runs of a benchmark (``bench.json``'s content) as a table on standard output."""
    from rich.console import Console
    from rich.table import Table

    from simpy_llm.observe.bench.metrics import percentile_key

    p = percentiles[-1]
    kind = "predicted " if result.get("predicted") else ""
    table = Table(title=f"{kind}bench {result['profile']} ({result['dataset']}, {result['num_prompts']} prompts, "
                        f"tokens: {result['token_counting']})")
    for name in ("run", "strategy", "rate", "conc.", "done", "failed", "req/s", "out tok/s", "goodput",
                 "TTFT p50 ms", f"TTFT p{p:g} ms", "TPOT p50 ms", "ITL p50 ms", "E2EL p50 ms"):
        table.add_column(name, justify="right")
    for r in result["runs"]:
        table.add_row(
            str(r["run"]), r["strategy"], rate_text(r["request_rate"]), str(r["max_concurrency"] or "-"),
            str(r["completed"]), str(r["failed"]), f"{r['request_throughput']:.2f}", f"{r['output_throughput']:.1f}",
            "-" if r["request_goodput"] is None else f"{r['request_goodput']:.2f}",
            f"{r['median_ttft_ms']:.1f}", f"{r[percentile_key(p, 'ttft')]:.1f}", f"{r['median_tpot_ms']:.1f}",
            f"{r['median_itl_ms']:.1f}", f"{r['median_e2el_ms']:.1f}",
        )
    console = Console(soft_wrap=True)
    if not console.is_terminal:  # a file or a pipe: every column, not an 80-column cut
        console = Console(soft_wrap=True, width=200)
    console.print(table)
