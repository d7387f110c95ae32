"""Speed of shipped scenarios beyond the quickstart: the request-level batch server
(``docs/batching.md``), the agentic presets (``docs/agentic.md``) and the disaggregated
fleet (``docs/network.md``).

Run from the repository root::

    python -m benchmarks.bench_scenarios                         # every case once
    python -m benchmarks.bench_scenarios --cases mb_100k,mb_1m --repeat 3
    python -m benchmarks.bench_scenarios --cases react,mcts,fork_join,chain --repeat 3
    python -m benchmarks.bench_scenarios --cases disagg_100k --repeat 3
    python -m benchmarks.bench_scenarios --cases spec_mobile_cloud,spec_80x20_1h,spec_80x20_1h_plain --repeat 3

Every run happens in its own fresh Python process (peak RSS belongs to it). Wall =
``perf_counter`` around ``Simulation.run()``; the SimPy event count is exact. Requests
are LLM calls (an agentic session makes several).

Targets: ``multi_bin_only`` at least 50,000 simulated requests per wall-second and 1M
requests in under 30 s; the agentic presets at least 20,000 LLM calls per wall-second;
``disaggregated`` (2 prefill + 6 decode, clos) at least 25,000 requests per wall-second at 100k
(both raised from 15,000 and 10,000 by the speed-and-scale issue);
speculative decoding (``spec_*``): seed 003 §4's example at least 5,000 verify rounds per
wall-second, and an hour of 80 draft devices and 20 targets in under 60 s.

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

SPEC_80X20: dict[str, Any] = {
    "workload.horizon_s": 3600.0, "workload.aggregate_rate": 8.0,
    "speculation.drafts.0.count": 50, "speculation.drafts.1.count": 30,
    "serving.clusters.0.replica_groups.0.count": 10, "serving.clusters.1.replica_groups.0.count": 10,
}
"""Seed 003 §4's example scaled to a sweep point of 80 draft devices and 20 targets for an hour
(the offered rate scaled with the devices, 6 -> 8 requests/s; the devices pace it, closed loop)."""
SPEC_PLAIN: dict[str, Any] = {
    "speculation.gamma_policy": {"kind": "static", "params": {"gamma": 4}},
    "speculation.verify.partial": "all", "speculation.verify.sample_rate": 1.0,
    "speculation.verify.rollback_penalty_ms": 0.0,
    "speculation.drafts.0.network.rtt_jitter_ms": 0.0, "speculation.drafts.0.network.bandwidth_jitter": 0.0,
}
"""The per-round options of the §4 example switched off (γ telemetry, sampled verification, jitter)."""

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
    "spec_mobile_cloud": ("speculative_mobile_cloud.yaml", {}, "seed 003 §4: 60 drafts, 4 targets, hybrid, 120 s"),
    "spec_80x20_1h": ("speculative_mobile_cloud.yaml", SPEC_80X20, "§4 scaled: 80 drafts, 20 targets, 1 hour"),
    "spec_80x20_1h_plain": ("speculative_mobile_cloud.yaml", {**SPEC_80X20, **SPEC_PLAIN},
                            "the same, static γ, full verification, no jitter"),
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
    rounds = summary.get("speculation", {}).get("rounds", 0)
    return {
        "rounds": rounds,
        "rounds_per_wall_s": rounds / wall,
        "events_per_round": results.events / rounds if rounds else None,
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
    spec = [c for c in cases if runs[c][0].get("rounds")]
    if spec:
        print()
        print(f"{'case':<20} | {'verify rounds':>13} | {'wall s (med)':>12} | {'rounds/wall-s':>13} | {'events/round':>12}")
        for c in spec:
            r = runs[c][0]
            wall = statistics.median(x["wall_s"] for x in runs[c])
            print(f"{c:<20} | {r['rounds']:>13,} | {wall:>12.2f} | {r['rounds'] / wall:>13,.0f} | {r['events_per_round']:>12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
