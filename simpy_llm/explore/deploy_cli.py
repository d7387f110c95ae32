"""``simpy-llm deploy SCENARIO``: the cheapest deployment that carries a load within SLOs.

``simpy-llm deploy SCENARIO --load 120 --slo ttft_p99=0.5,tpot_p99=0.05 --gpus H100,A100-80``
searches every catalogue row of the scenario's model on those GPUs (and ``--tp`` degrees,
at each ``--pp`` pipeline degree: above 1 the calibrated roofline stands in for the row)
crossed with ``--scheduler``, ``--max-num-seqs``, ``--max-batched-tokens`` and
``--chunked-prefill`` for the configuration and replica count that cost least per hour
(:func:`~simpy_llm.explore.deploy.deploy`), prints the table and, with ``--out DIR``, writes
``deploy.json``, ``deploy.csv`` and ``deploy.md`` there and keeps every finished search in
``DIR/runs`` so that the same command run again resumes. ``--disaggregated`` adds
disaggregated fleets (a prefill pool on a row of ``--prefill-gpus``, a decode pool on a row
of ``--decode-gpus``) and their P:D split; ``--speculation on,off`` tries each
configuration with and without the scenario's speculative decoding; ``--profile NAME=FILE
--profile-gpu NAME=GPU[:TP]`` adds a calibrated profile as a row. ``--day R1,R2,...`` (or
``--day servegen:DIR``) replaces ``--load`` by a day-shaped load: the search runs at its peak
window, and the cheapest configurations are run over the day, static and under each
``--autoscaler`` setting (:func:`~simpy_llm.explore.deploy_day.deploy_day`), with
``deploy_day.json``, ``.csv`` and ``.md`` written to ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

# The search is imported when the command runs (in main), so the command line starts fast.

__all__ = ["add_parser", "main"]


def add_parser(sub: Any, add_scenario_options: Any) -> None:
    """Add ``deploy`` to the subparsers *sub*; *add_scenario_options* adds ``--set`` and
    ``--plugin``. The parsed arguments carry ``deploy_main``, the function that runs them."""
    dep = sub.add_parser(
        "deploy",
        help="the cheapest GPU, parallelism, scheduler, batch limits and replicas carrying a load within SLOs",
        description="Search the catalogue's (GPU, TP) rows of the scenario's model with the engine settings "
        "given for the configuration and replica count that meet the SLOs at the load for the least per hour "
        "(docs/capacity.md, 'Which deployment').",
    )
    dep.add_argument("scenario", help="scenario YAML file: its workload and its model")
    dep.add_argument("--load", type=float, metavar="RPS", help="requests per second to carry (required without --day)")
    dep.add_argument("--slo", action="append", default=[], metavar="METRIC_STAT=SECONDS[,...]",
                     help="SLO criteria, comma-separated or repeated, e.g. ttft_p99=0.5,tpot_p99=0.05 "
                     "(as simpy-llm capacity --slo)")
    dep.add_argument("--gpus", required=True, metavar="GPU,GPU", help="GPUs to consider, e.g. H100,A100-80")
    dep.add_argument("--model", help="the model (default: the scenario's latency model's model)")
    dep.add_argument("--budget", type=float, metavar="USD_PER_HOUR", help="the most the answer may cost per hour")
    dep.add_argument("--tp", metavar="N,N", help="tensor-parallel degrees (default: every one the catalogue has)")
    dep.add_argument("--pp", metavar="N,N", help="pipeline stages of each row (default: 1); above 1 a row runs the "
                     "calibrated roofline, and a replica costs tp x pp GPUs")
    dep.add_argument("--max-num-seqs", metavar="N,N", help="max_num_seqs values (default: the scenario's)")
    dep.add_argument("--max-batched-tokens", metavar="N,N",
                     help="max_num_batched_tokens values (default: the scenario's)")
    dep.add_argument("--chunked-prefill", metavar="on,off", help="chunked prefill on, off or both (default: the scenario's)")
    dep.add_argument("--scheduler", metavar="NAME,NAME", help="scheduler policies, e.g. fcfs,sjf (default: the scenario's)")
    dep.add_argument("--max-replicas", type=int, default=64, metavar="N", help="the most replicas a configuration may have (default 64)")
    dep.add_argument("--prices", metavar="FILE", help="a GPU price file over profiles/gpu_prices.yaml")
    dep.add_argument("--warmup-requests", type=int, metavar="N", help="warm-up requests per simulation (default 1000)")
    dep.add_argument("--measure-requests", type=int, metavar="N", help="measured requests per simulation (default 10000)")
    dep.add_argument("--seeds", metavar="S1,S2", help="comma-separated seeds; a count passes only under all")
    dep.add_argument("--exhaustive", action="store_true", help="search every configuration fully, without the bound")
    dep.add_argument("--out", metavar="DIR", help="write deploy.json, deploy.csv and deploy.md here; "
                     "a run directory: the same command run again reuses the finished searches")
    dep.add_argument("--executor", choices=("serial", "process", "dask"), default="process",
                     help="where configurations are searched: this process, a process pool (default) or a local Dask cluster")
    dep.add_argument("--workers", type=int, metavar="N", help="processes of the pool or the Dask cluster (default 2)")
    dep.add_argument("--quiet", action="store_true", help="no line per configuration on standard error")
    dep.add_argument("--disaggregated", action="store_true", help="also search disaggregated fleets: a prefill pool and "
                     "a decode pool, each on its own catalogue row, and their P:D split")
    dep.add_argument("--prefill-gpus", metavar="GPU,GPU", help="with --disaggregated: the prefill pool's GPUs (default: --gpus)")
    dep.add_argument("--decode-gpus", metavar="GPU,GPU", help="with --disaggregated: the decode pool's GPUs (default: --gpus)")
    dep.add_argument("--speculation", metavar="on,off", help="each configuration with the scenario's speculative decoding "
                     "(on), without it (off) or both (default: as the scenario has it)")
    dep.add_argument("--profile", action="append", default=[], metavar="NAME=FILE",
                     help="a calibrated profile (simpy-llm calibrate fit) standing in for a catalogue row; repeatable")
    dep.add_argument("--profile-gpu", action="append", default=[], metavar="NAME=GPU[:TP]",
                     help="the GPU (and TP degree, default 1) a --profile runs on and is priced as")
    day = dep.add_argument_group("over a day (docs/capacity.md, 'Over a day: static against autoscaled')")
    day.add_argument("--day", metavar="R1,R2,...|servegen:DIR", help="a day-shaped load instead of --load: window rates "
                     "(requests/s) or ServeGen's aggregate rates of a data directory; the search runs at the peak window, "
                     "then the cheapest configurations run over the day, static and autoscaled")
    day.add_argument("--day-scale", type=float, metavar="F", help="multiply the day's rates (default 1)")
    day.add_argument("--window-s", type=float, metavar="S", help="simulated seconds per window (default: "
                     "a real window, 24 h over the windows; shorter compresses the day)")
    day.add_argument("--autoscaler", action="append", default=[], metavar="POLICY:METRIC=V[,V]",
                     help="autoscaler settings to try, e.g. target:queue_depth=4,8 or threshold:running=8-32; repeatable")
    day.add_argument("--scale-min", type=int, metavar="N", help="the autoscaler's fewest replicas (default 1)")
    day.add_argument("--scale-max", type=int, metavar="N", help="the autoscaler's most replicas (default: the static count)")
    day.add_argument("--day-top", type=int, metavar="N", help="configurations run over the day (default 3)")
    dep.set_defaults(deploy_main=main)
    add_scenario_options(dep)


def _fail(message: str) -> int:
    print(f"simpy-llm deploy: {message}", file=sys.stderr)
    return 2


def _list(text: str | None, option: str, parse: Callable[[str], Any]) -> list[Any] | None:
    """A comma-separated option's values (None when not given); ValueError naming *option*."""
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ValueError(f"{option} is empty: give comma-separated values")
    out = []
    for item in items:
        try:
            out.append(parse(item))
        except ValueError:
            raise ValueError(f"{option}: {item!r} is not allowed") from None
    return out


def _on_off(text: str) -> bool:
    if text.lower() in ("on", "true", "yes"):
        return True
    if text.lower() in ("off", "false", "no"):
        return False
    raise ValueError(text)


def _pairs(items: list[str], option: str) -> dict[str, str]:
    """``NAME=VALUE`` options by name; ValueError naming *option*."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ValueError(f"{option}: {item!r} is not NAME=VALUE")
        if name.strip() in out:
            raise ValueError(f"{option}: {name.strip()!r} is given twice")
        out[name.strip()] = value.strip()
    return out


def _profiles(files: list[str], gpus: list[str]) -> dict[str, dict[str, Any]] | None:
    """``--profile NAME=FILE`` and ``--profile-gpu NAME=GPU[:TP]`` as deploy's *profiles*."""
    if not files and not gpus:
        return None
    by_file, by_gpu = _pairs(files, "--profile"), _pairs(gpus, "--profile-gpu")
    for name in sorted(by_file.keys() ^ by_gpu.keys()):
        raise ValueError(f"profile {name!r}: give both --profile {name}=FILE and --profile-gpu {name}=GPU[:TP]")
    out: dict[str, dict[str, Any]] = {}
    for name, file in by_file.items():
        gpu, _, tp = by_gpu[name].partition(":")
        try:
            out[name] = {"file": file, "gpu": gpu, "tp": int(tp) if tp else 1}
        except ValueError:
            raise ValueError(f"--profile-gpu: {by_gpu[name]!r} is not GPU or GPU:TP") from None
    return out


def _day(args: argparse.Namespace) -> Any:
    """The ``--day`` options as a :class:`~simpy_llm.explore.deploy_day.Day`; ValueError naming the option."""
    from simpy_llm.explore.deploy_day import DAY_S, Day, servegen_rates

    if args.load is not None:
        raise ValueError("--load and --day exclude each other: with --day the search runs at the day's peak window")
    scale = 1.0 if args.day_scale is None else args.day_scale
    if not 0 < scale < float("inf"):
        raise ValueError(f"--day-scale must be > 0, got {scale:g}")
    if args.day.startswith("servegen:"):
        rates = servegen_rates(args.day.removeprefix("servegen:"), scale)
    else:
        rates = tuple(r * scale for r in _list(args.day, "--day", float) or [])
    return Day(rates=rates, window_s=args.window_s if args.window_s is not None else DAY_S / len(rates))


def main(args: argparse.Namespace) -> int:
    """Run the ``deploy`` command; exit status 0 (also when nothing fits), 2 on bad input."""
    from simpy_llm.config import ScenarioError
    from simpy_llm.explore.capacity import StabilityCriteria
    from simpy_llm.explore.deploy import deploy
    from simpy_llm.loading import ordered_overrides

    if args.out is not None:  # before any simulation: a directory it cannot write would lose the search
        from simpy_llm.output_paths import OutputPathError, check_output_dir

        try:
            check_output_dir(args.out)
        except OutputPathError as exc:
            return _fail(str(exc))
    try:
        slo = [s.strip() for text in args.slo for s in text.split(",") if s.strip()]
        if not slo:
            raise ValueError("--slo is required: the criteria a deployment must meet, e.g. ttft_p99=0.5,tpot_p99=0.05")
        day = None if args.day is None else _day(args)
        given = [o for o, v in (("--autoscaler", args.autoscaler), ("--window-s", args.window_s), ("--day-scale", args.day_scale),
                                ("--scale-min", args.scale_min), ("--scale-max", args.scale_max), ("--day-top", args.day_top))
                 if v not in (None, [])]
        if day is None and given:
            raise ValueError(f"{', '.join(given)}: need --day, the day-shaped load they run over")
        if day is None and args.load is None:
            raise ValueError("--load is required (or --day): the requests per second to carry")
        search: Callable[..., Any] = deploy if day is None else _over_day(args, day)
        result = search(
            args.scenario,
            load=args.load,
            slo=StabilityCriteria(slo=slo),
            gpus=_list(args.gpus, "--gpus", str) or [],
            tp=_list(args.tp, "--tp", int),
            schedulers=_list(args.scheduler, "--scheduler", str),
            max_num_seqs=_list(args.max_num_seqs, "--max-num-seqs", int),
            max_num_batched_tokens=_list(args.max_batched_tokens, "--max-batched-tokens", int),
            chunked_prefill=_list(args.chunked_prefill, "--chunked-prefill", _on_off),
            model=args.model,
            budget=args.budget,
            max_replicas=args.max_replicas,
            prices=args.prices,
            warmup_requests=args.warmup_requests,
            measure_requests=args.measure_requests,
            seeds=_list(args.seeds, "--seeds", int),
            overrides=ordered_overrides(list(args.overrides), args.scenario) if args.overrides else None,
            out=args.out,
            executor=args.executor,
            max_workers=args.workers,
            progress=not args.quiet,
            disaggregated=args.disaggregated,
            prefill_gpus=_list(args.prefill_gpus, "--prefill-gpus", str),
            decode_gpus=_list(args.decode_gpus, "--decode-gpus", str),
            speculation=_list(args.speculation, "--speculation", _on_off),
            profiles=_profiles(args.profile, args.profile_gpu),
            pp=_list(args.pp, "--pp", int),
        )
    except ScenarioError as exc:
        print(exc, file=sys.stderr)
        return 2
    except (ValueError, TypeError) as exc:
        return _fail(str(exc))
    if day is not None:
        print(result.search.to_markdown() + "\n## Over the day\n\n" + result.to_markdown(), end="")
        if args.out:
            print(f"wrote deploy.json, deploy.csv, deploy.md, deploy_day.json, deploy_day.csv, deploy_day.md in {args.out}")
        return 0
    print(result.to_markdown(), end="")
    if args.out:
        print(f"wrote deploy.json, deploy.csv, deploy.md in {args.out}")
    return 0


def _over_day(args: argparse.Namespace, day: Any) -> Callable[..., Any]:
    """:func:`~simpy_llm.explore.deploy_day.deploy_day` with the day's options, called as deploy is."""
    from simpy_llm.explore.deploy_day import deploy_day, parse_autoscaler

    low = 1 if args.scale_min is None else args.scale_min
    settings = [s for text in args.autoscaler for s in parse_autoscaler(text, low, args.scale_max)]

    def run(scenario: str, *, load: None, **search: Any) -> Any:
        return deploy_day(scenario, day, autoscalers=settings, top=3 if args.day_top is None else args.day_top, **search)

    return run
