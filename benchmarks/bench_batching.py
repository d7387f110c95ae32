"""Speed of the request-level batch server (``docs/batching.md``): the three batching
scenarios at 100k requests and ``multi_bin_only`` at 1M.

Run from the repository root::

    python -m benchmarks.bench_batching                          # every case once
    python -m benchmarks.bench_batching --cases mb_100k,mb_1m --repeat 3

Every run happens in its own fresh Python process (peak RSS belongs to it). Wall =
``perf_counter`` around ``Simulation.run()``; the SimPy event count is exact.
Targets (``multi_bin_only``): at least 50,000 simulated requests per wall-second, and
1M requests in under 30 s.

This is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_quickstart import RESULT_TAG, _maxrss_mb, machine_info, run_fresh

REPO = Path(__file__).resolve().parent.parent

# name -> (scenario file, overrides, description)
CASES: dict[str, tuple[str, dict[str, Any], str]] = {
    "mb_100k": ("multi_bin_only.yaml", {"workload.num_requests": 100_000}, "multi_bin_only: k = 4, B = 32, sampled U(1, 3)"),
    "mb_1m": ("multi_bin_only.yaml", {"workload.num_requests": 1_000_000}, "multi_bin_only at 1M requests"),
    "mb_k8_b8_100k": ("multi_bin_only.yaml", {"workload.num_requests": 100_000, "serving.batch_server.bins.count": 8,
                                              "serving.batch_server.batch_size": 8, "workload.aggregate_rate": 3.0},
                      "multi_bin_only with k = 8, B = 8 (four times the batches per request)"),
    "dyn_100k": ("dynamic_only.yaml", {"workload.num_requests": 100_000}, "dynamic_only: dynamic and static servers"),
    "mbd_100k": ("multi_bin_dynamic.yaml", {"workload.num_requests": 100_000}, "multi_bin_dynamic: three servers"),
}
DEFAULT_CASES = list(CASES)


def run_worker(case: str) -> dict[str, Any]:
    from simpy_llm import Simulation, load_scenario

    name, overrides, _ = CASES[case]
    sim = Simulation(load_scenario(REPO / "scenarios" / name, overrides))
    start = time.perf_counter()
    results = sim.run(progress=False)
    wall = time.perf_counter() - start
    n = len(results)
    batches = sum(b["batches"] for b in results.summary()["batch_servers"].values())
    return {
        "case": case,
        "requests": n,
        "batches": batches,
        "wall_s": wall,
        "requests_per_wall_s": n / wall,
        "events_per_request": results.events / n,
        "events_per_batch": results.events / batches,
        "peak_rss_mb": _maxrss_mb(),
    }


def spawn(case: str) -> dict[str, Any]:
    return run_fresh(["-m", "benchmarks.bench_batching", "--case", case], f"case {case}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_batching", description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(DEFAULT_CASES), help=f"comma-separated; known: {', '.join(CASES)}")
    p.add_argument("--repeat", type=int, default=1, help="runs per case (median reported)")
    p.add_argument("--case", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.case:
        print(RESULT_TAG + json.dumps(run_worker(args.case)), flush=True)
        return 0
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error(f"unknown case(s): {', '.join(unknown)}")
    info = machine_info()
    print(f"simpy_llm batching benchmark, {info['date']}\n  {info['cpu']}; {info['cores']} cores; {info['python']}; git {info['git']}")
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    for k in range(args.repeat):
        for case in cases:
            r = spawn(case)
            runs[case].append(r)
            print(f"  round {k + 1} {case:<14} {r['wall_s']:7.2f} s  {r['peak_rss_mb']:6.0f} MB", flush=True)
    print()
    print(f"{'case':<14} | {'requests':>9} | {'batches':>8} | {'wall s (med)':>12} | {'req/wall-s':>10} | "
          f"{'events/req':>10} | {'events/batch':>12} | {'peak MB':>7} | description")
    for c in cases:
        r = runs[c][0]
        wall = statistics.median(x["wall_s"] for x in runs[c])
        print(f"{c:<14} | {r['requests']:>9,} | {r['batches']:>8,} | {wall:>12.2f} | {r['requests'] / wall:>10,.0f} | "
              f"{r['events_per_request']:>10.2f} | {r['events_per_batch']:>12.2f} | "
              f"{max(x['peak_rss_mb'] for x in runs[c]):>7.0f} | {CASES[c][2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
