"""Speed benchmark: ``simpy-llm deploy`` over a 480-configuration space at 10k requests per simulation.

Run from the repository root::

    python -m benchmarks.bench_deploy                          # pruned search, 10k requests, 2 workers
    python -m benchmarks.bench_deploy --exhaustive-requests 2000   # also pruned vs exhaustive at 2k
    python -m benchmarks.bench_deploy --requests 2000 --skip-pruned --exhaustive-requests 10000

The question: ``scenarios/quickstart.yaml``'s workload (chat and batch clients, Llama-3.1-8B)
at 40 requests/s within p99 TTFT <= 0.5 s and p99 TPOT <= 0.05 s (and the default
stability criteria). The space (:data:`SPACE`), 480 configurations:

* the catalogue's six rows of ``llama-3.1-8b-instruct`` on H100 and A100-80 (TP 1, 2, 4;
  the catalogue has no L40S row of it),
* x scheduler ``fcfs``, ``sjf`` (2)
* x ``max_num_seqs`` 16, 32, 64, 128, 256 (5)
* x ``max_num_batched_tokens`` 512, 1024, 2048, 4096 (4)
* x chunked prefill on, off (2),

each searched for its fewest replicas up to 32; ``--pp 1,2`` adds pipeline stages (PP 2 on
the calibrated roofline, docs/capacity.md), 960 configurations. Every simulation runs ``--requests``
requests (default 10,000: the first 10 % warm-up, the rest measured). The search runs on a
process pool of ``--workers`` processes (default 2).

Figures printed (and written with ``--json``): the wall time of each ``deploy()`` call,
the simulations it ran, the configurations decided without a simulation, the statuses,
the answer, and the simulations the exhaustive search would run, computed from the
outcomes (:func:`exhaustive_simulations`: exact where the pruned search found a
configuration's fewest replicas or saw it miss at 32, a range where the bound cut it).

``--exhaustive-requests N`` runs the pruned and the exhaustive search (``exhaustive=True``:
every configuration to 32 replicas, no bound) at N requests per simulation, for the
exhaustive count measured and to check that both name the same configuration.

This is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import datetime as _dt
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SCENARIO = REPO / "scenarios" / "quickstart.yaml"
LOAD = 40.0
SLO = {"ttft_p99": 0.5, "tpot_p99": 0.05}
SPACE: dict[str, Any] = {
    "gpus": ["H100", "A100-80"],
    "tp": [1, 2, 4],
    "schedulers": ["fcfs", "sjf"],
    "max_num_seqs": [16, 32, 64, 128, 256],
    "max_num_batched_tokens": [512, 1024, 2048, 4096],
    "chunked_prefill": [True, False],
    "max_replicas": 32,
}
"""6 catalogue rows x 2 x 5 x 4 x 2 = 480 configurations."""


def _count_search_probes(needed: int | None, cap: int) -> int:
    """Simulations a fresh count search up to *cap* runs when *needed* replicas is the fewest
    that pass (None: none up to *cap* does): the search's own gallop and bisection
    (:func:`~simpy_llm.explore.capacity.searches.fewest_passing`) on a counting predicate."""
    from simpy_llm.explore.capacity.searches import fewest_passing

    tried: list[int] = []
    fewest_passing(lambda n: tried.append(n) is None and needed is not None and n >= needed, cap)
    return len(tried)


def exhaustive_simulations(result: Any) -> tuple[int, int]:
    """The simulations the exhaustive search of the same space would run, computed from a
    pruned search's outcomes: exact for a configuration whose fewest replicas it found or that
    misses the SLOs at ``max_replicas``; for one the bound cut (fails at F, count unknown), the
    least and the most over every count above F, or none. Returns ``(least, most)``."""
    cap = result.max_replicas
    least = most = 0
    for o in result.outcomes:
        if o.status == "refused":
            continue
        if o.min_replicas is not None:
            options = [_count_search_probes(o.min_replicas, cap)]
        elif o.status == "misses_slo":
            options = [_count_search_probes(None, cap)]
        else:
            options = [_count_search_probes(m, cap) for m in range(o.failing_replicas + 1, cap + 1)]
            options.append(_count_search_probes(None, cap))
        least += min(options)
        most += max(options)
    return least, most


def _search(requests: int, *, exhaustive: bool, workers: int, executor: str, progress: bool, pp: list[int] | None = None) -> dict[str, Any]:
    """Run one deploy() call and return its figures."""
    from simpy_llm.explore.deploy import deploy

    warmup = requests // 10
    start = time.perf_counter()
    result = deploy(
        SCENARIO, load=LOAD, slo=SLO, warmup_requests=warmup, measure_requests=requests - warmup,
        exhaustive=exhaustive, executor=executor, max_workers=workers, progress=progress, **SPACE,
        **({"pp": pp} if pp else {}),
    )
    wall = time.perf_counter() - start
    best = result.best
    return {
        "requests_per_simulation": requests,
        "exhaustive": exhaustive,
        "wall_s": round(wall, 2),
        "configurations": len(result.outcomes),
        "simulations": result.simulations,
        "decided_without_simulation": result.skipped,
        "statuses": dict(collections.Counter(o.status for o in result.outcomes)),
        "answer": None if best is None else {
            "configuration": best.configuration.label(), "replicas": best.min_replicas,
            "cost_per_hour": best.cost_per_hour, "ttft_p99_s": best.ttft_p99_s, "tpot_p99_s": best.tpot_p99_s,
        },
        "pareto": [o.configuration.label() for o in result.pareto()],
        "exhaustive_simulations_computed": None if exhaustive else list(exhaustive_simulations(result)),
        "load_average_after": list(os.getloadavg()),
        "outcomes": [o.row() for o in result.outcomes],
    }


def _show(figures: dict[str, Any]) -> None:
    kind = "exhaustive" if figures["exhaustive"] else "pruned"
    answer = figures["answer"]
    said = "none fits" if answer is None else (
        f"{answer['replicas']} x {answer['configuration']} = {answer['cost_per_hour']:.4g} USD/h")
    print(f"{kind:>10} @ {figures['requests_per_simulation']:>6} requests: {figures['wall_s']:8.1f} s wall, "
          f"{figures['simulations']:5d} simulations, {figures['decided_without_simulation']:3d} of "
          f"{figures['configurations']} configurations without one; {said}", flush=True)
    print(f"{'':>10}   statuses: {figures['statuses']}", flush=True)
    if figures["exhaustive_simulations_computed"] is not None:
        least, most = figures["exhaustive_simulations_computed"]
        print(f"{'':>10}   the exhaustive search would run {least}" + (f" to {most}" if most != least else "")
              + " simulations (computed from these outcomes)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000, help="requests per simulation (default 10000)")
    parser.add_argument("--workers", type=int, default=2, help="process pool size (default 2)")
    parser.add_argument("--executor", choices=("process", "serial"), default="process")
    parser.add_argument("--exhaustive-requests", type=int, metavar="N",
                        help="also run the pruned and the exhaustive search at N requests per simulation")
    parser.add_argument("--skip-pruned", action="store_true", help="do not run the search at --requests")
    parser.add_argument("--progress", action="store_true", help="one line per configuration on standard error")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--pp", metavar="N,N", type=lambda text: [int(x) for x in text.split(",")],
                        help="pipeline stages to search too (e.g. 1,2: 960 configurations; default PP 1 only)")
    args = parser.parse_args()

    runs: list[dict[str, Any]] = []
    kwargs = {"workers": args.workers, "executor": args.executor, "progress": args.progress, "pp": args.pp}
    if not args.skip_pruned:
        runs.append(_search(args.requests, exhaustive=False, **kwargs))
        _show(runs[-1])
    if args.exhaustive_requests:
        for exhaustive in (False, True):
            runs.append(_search(args.exhaustive_requests, exhaustive=exhaustive, **kwargs))
            _show(runs[-1])
        pruned, full = runs[-2], runs[-1]
        same = pruned["answer"] == full["answer"]
        print(f"at {args.exhaustive_requests} requests: pruned {pruned['simulations']} vs exhaustive "
              f"{full['simulations']} simulations ({1 - pruned['simulations'] / full['simulations']:.1%} skipped); "
              f"same answer: {same}")
    if args.json:
        machine = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()}
        Path(args.json).write_text(json.dumps({
            "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), "machine": machine,
            "scenario": str(SCENARIO.relative_to(REPO)), "load": LOAD, "slo": SLO,
            "space": {**SPACE, "pp": args.pp or [1]}, "runs": runs,
        }, indent=2) + "\n")


if __name__ == "__main__":
    main()
