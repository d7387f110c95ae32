"""Speed of shipped scenarios beyond the quickstart: the request-level batch server
(``docs/batching.md``), the agentic presets (``docs/agentic.md``) and the disaggregated
fleet (``docs/network.md``).

Run from the repository root::

    python -m benchmarks.bench_scenarios                         # every case once
    python -m benchmarks.bench_scenarios --cases mb_100k,mb_1m --repeat 3
    python -m benchmarks.bench_scenarios --cases react,mcts,fork_join,chain --repeat 3
    python -m benchmarks.bench_scenarios --cases disagg_100k --repeat 3

Every run happens in its own fresh Python process (peak RSS belongs to it). Wall =
``perf_counter`` around ``Simulation.run()``; the SimPy event count is exact. Requests
are LLM calls (an agentic session makes several).

Targets: ``multi_bin_only`` at least 50,000 simulated requests per wall-second and 1M
requests in under 30 s; the agentic presets at least 15,000 LLM calls per wall-second;
``disaggregated`` (2 prefill + 6 decode, clos) at least 10,000 requests per wall-second at 100k.

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
    "react": ("agentic_react.yaml", {}, "ReAct agent, 2,000 sessions"),
    "mcts": ("agentic_mcts.yaml", {}, "tree of thought (fan-out 4), 1,000 sessions"),
    "fork_join": ("agentic_fork_join.yaml", {}, "fork-join research (3 parallel tools), 3,000 sessions"),
    "chain": ("agentic_chain.yaml", {}, "multi-step chain (2 tools), 3,000 sessions"),
    "disagg_100k": ("disaggregated.yaml", {"workload.num_requests": 100_000},
                    "disaggregated: 2 prefill + 6 decode, KV over a clos fabric"),
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
    summary = results.summary()
    batches = sum(b["batches"] for b in summary.get("batch_servers", {}).values())
    return {
        "case": case,
        "requests": n,
        "batches": batches,
        "sessions": sum(w["sessions"] for w in summary.get("workflows", {}).values()),
        "wall_s": wall,
        "requests_per_wall_s": n / wall,
        "events_per_request": results.events / n,
        "peak_rss_mb": _maxrss_mb(),
    }


def spawn(case: str) -> dict[str, Any]:
    return run_fresh(["-m", "benchmarks.bench_scenarios", "--case", case], f"case {case}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_scenarios", description=__doc__.splitlines()[0])
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
    print(f"simpy_llm scenario benchmark, {info['date']}\n  {info['cpu']}; {info['cores']} cores; {info['python']}; git {info['git']}")
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    for k in range(args.repeat):
        for case in cases:
            r = spawn(case)
            runs[case].append(r)
            print(f"  round {k + 1} {case:<14} {r['wall_s']:7.2f} s  {r['peak_rss_mb']:6.0f} MB", flush=True)
    print()
    print(f"{'case':<14} | {'requests':>9} | {'batches':>8} | {'sessions':>8} | {'wall s (med)':>12} | {'req/wall-s':>10} | "
          f"{'events/req':>10} | {'peak MB':>7} | description")
    for c in cases:
        r = runs[c][0]
        wall = statistics.median(x["wall_s"] for x in runs[c])
        print(f"{c:<14} | {r['requests']:>9,} | {r['batches']:>8,} | {r['sessions']:>8,} | {wall:>12.2f} | "
              f"{r['requests'] / wall:>10,.0f} | {r['events_per_request']:>10.2f} | "
              f"{max(x['peak_rss_mb'] for x in runs[c]):>7.0f} | {CASES[c][2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
