"""Speed of the serving policies: each scheduler, routing and preemption variant as a
ratio to FCFS without prefix caching, measured in one run; and the large fleet.

Run from the repository root::

    python -m benchmarks.bench_policies                      # every case once
    python -m benchmarks.bench_policies --cases fcfs,fcfs_pc,priority --repeat 3
    python -m benchmarks.bench_policies --cases fleet_1m     # 8 heterogeneous replicas, 1M requests

Every run happens in its own fresh Python process (peak RSS belongs to it), and the
cases of one repeat run back to back, so their ratios to the baseline share the
machine's state. Wall = ``perf_counter`` around ``Simulation.run()``.

This is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_quickstart import RESULT_TAG, _maxrss_mb, machine_info, run_fresh

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "scenarios" / "quickstart.yaml"
FLEET = REPO / "scenarios" / "heterogeneous_fleet.yaml"

N = 100_000
NO_PC = "serving.engine.prefix_caching=false"
FOUR = ["serving.replicas=4", "workload.aggregate_rate=80", NO_PC]
"""Four quickstart replicas at four times the rate: the baseline of the routing cases."""

# name -> (scenario, overrides, baseline case for the ratio, description)
CASES: dict[str, tuple[Path, list[str], str, str]] = {
    "fcfs": (QUICKSTART, [f"workload.num_requests={N}", NO_PC], "fcfs", "quickstart, FCFS, no prefix caching (baseline)"),
    "fcfs_pc": (QUICKSTART, [f"workload.num_requests={N}"], "fcfs", "FCFS with prefix caching (the default)"),
    "priority": (QUICKSTART, [f"workload.num_requests={N}", NO_PC, "serving.engine.scheduler.kind=priority",
                              "workload.clients.1.priority=1"], "fcfs", "priority scheduler, two levels"),
    "sjf": (QUICKSTART, [f"workload.num_requests={N}", NO_PC, "serving.engine.scheduler.kind=sjf"], "fcfs",
            "shortest prompt first"),
    "sjf_output": (QUICKSTART, [f"workload.num_requests={N}", NO_PC, "serving.engine.scheduler.kind=sjf",
                                "serving.engine.scheduler.params={by: output, predictor: {kind: noisy, sigma: 0.5}}"],
                   "fcfs", "shortest predicted output first (noisy predictor)"),
    "edf": (QUICKSTART, [f"workload.num_requests={N}", NO_PC, "serving.engine.scheduler.kind=edf"], "fcfs",
            "earliest deadline first"),
    "swap": (QUICKSTART, [f"workload.num_requests={N}", NO_PC, "serving.engine.preemption_mode=swap",
                          "serving.engine.swap_space_blocks=4096"], "fcfs", "swap preemption (hardware copy rate)"),
    "rr4": (QUICKSTART, [f"workload.num_requests={N}", *FOUR], "rr4", "4 replicas, round robin (routing baseline)"),
    "jsq4": (QUICKSTART, [f"workload.num_requests={N}", *FOUR, "serving.router.kind=jsq"], "rr4", "4 replicas, JSQ"),
    "p2c4": (QUICKSTART, [f"workload.num_requests={N}", *FOUR, "serving.router.kind=power_of_d"], "rr4",
             "4 replicas, power of two choices"),
    "least_kv4": (QUICKSTART, [f"workload.num_requests={N}", *FOUR, "serving.router.kind=least_kv"], "rr4",
                  "4 replicas, most free KV"),
    "prefix_affinity4": (QUICKSTART, [f"workload.num_requests={N}", *FOUR, "serving.router.kind=prefix_affinity"],
                         "rr4", "4 replicas, consistent hashing with bounded loads"),
    "weighted_score4": (QUICKSTART, [f"workload.num_requests={N}", *FOUR, "serving.router.kind=weighted_score"],
                        "rr4", "4 replicas, llm-d style weighted scorers"),
    "semi_clairvoyant4": (QUICKSTART, [f"workload.num_requests={N}", *FOUR, "serving.router.kind=semi_clairvoyant"],
                          "rr4", "4 replicas, predicted-work routing"),
    "stale_jsq4": (QUICKSTART, [f"workload.num_requests={N}", *FOUR, "serving.router.kind=jsq",
                                "serving.view_refresh_s=0.05"], "rr4", "4 replicas, JSQ on 50 ms stale views"),
    "trace_100k": (QUICKSTART, ["trace", NO_PC], "trace_100k", "replay of a 100k-request trace, no prefix caching"),
    "trace_100k_pc": (QUICKSTART, ["trace"], "trace_100k", "the same replay with prefix caching"),
    "fleet_1m": (FLEET, ["workload.num_requests=1000000"], "fleet_1m",
                 "8 heterogeneous replicas, power_of_d, prefix caching, 1M requests"),
}
DEFAULT_CASES = [c for c in CASES if c != "fleet_1m"]


def _trace_overrides(workdir: Path) -> list[str]:
    """Export the quickstart's first 100k requests as a trace v2 and replay it (the
    export happens before the timed run)."""
    from simpy_llm import load_scenario
    from simpy_llm.workload.export import generate_requests
    from simpy_llm.workload.traces import write_generated_trace

    csv = workdir / "trace.csv"
    if not csv.exists():
        write_generated_trace(generate_requests(load_scenario(QUICKSTART, [f"workload.num_requests={N}"])), csv)
    return ["workload.clients=[]", "workload.aggregate_rate=null", "workload.num_requests=null",
            f"workload.traces=[{{path: {csv}}}]"]


def run_worker(case: str, workdir: Path) -> dict[str, Any]:
    from simpy_llm import Simulation, load_scenario

    scenario_path, overrides, _base, _ = CASES[case]
    if overrides and overrides[0] == "trace":
        overrides = _trace_overrides(workdir) + overrides[1:]
    sim = Simulation(load_scenario(scenario_path, overrides))
    start = time.perf_counter()
    results = sim.run()
    wall = time.perf_counter() - start
    n = len(results)
    s = results.summary()
    return {
        "case": case,
        "requests": n,
        "wall_s": wall,
        "requests_per_wall_s": n / wall,
        "events_per_request": results.events / n,
        "peak_rss_mb": _maxrss_mb(),
        "completed": s["requests"]["completed"],
        "preemptions": s["preemptions"]["total"],
        "prefix_hit_rate": s["prefix_cache"]["hit_rate"],
        "ttft_p90_s": s["latency_s"]["ttft"]["p90"],
    }


def spawn(case: str, workdir: Path) -> dict[str, Any]:
    return run_fresh(["-m", "benchmarks.bench_policies", "--case", case, "--workdir", str(workdir)], f"case {case}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_policies", description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(DEFAULT_CASES), help=f"comma-separated; known: {', '.join(CASES)}")
    p.add_argument("--repeat", type=int, default=1, help="rounds over the cases (median reported)")
    p.add_argument("--json", metavar="PATH", help="also write every figure here")
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.case:
        print(RESULT_TAG + json.dumps(run_worker(args.case, args.workdir)), flush=True)
        return 0
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error(f"unknown case(s): {', '.join(unknown)}")
    info = machine_info()
    print(f"simpy_llm policy benchmark, {info['date']}\n  {info['cpu']}; {info['cores']} cores; {info['python']}; git {info['git']}")
    if info["load_avg_at_start"]:
        print("  load avg {:.2f} {:.2f} {:.2f}".format(*info["load_avg_at_start"]))
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeat):
            for case in cases:
                r = spawn(case, Path(tmp))
                runs[case].append(r)
                print(f"  round {k + 1} {case:<18} {r['wall_s']:7.2f} s  {r['peak_rss_mb']:6.0f} MB", flush=True)
    med = {c: statistics.median(r["wall_s"] for r in rs) for c, rs in runs.items()}
    print()
    print(f"{'case':<18} | {'requests':>9} | {'wall s (med)':>12} | {'req/wall-s':>10} | {'ratio':>6} | "
          f"{'events/req':>10} | {'peak MB':>7} | {'preempt':>7} | {'hit rate':>8} | {'TTFT p90 s':>10} | description")
    for c in cases:
        r = runs[c][0]
        base = CASES[c][2]
        ratio = med[c] / med[base] if base in med else None
        hit = r["prefix_hit_rate"]
        print(f"{c:<18} | {r['requests']:>9,} | {med[c]:>12.2f} | {r['requests'] / med[c]:>10,.0f} | "
              f"{'-' if ratio is None else format(ratio, '.2f'):>6} | {r['events_per_request']:>10.2f} | "
              f"{max(x['peak_rss_mb'] for x in runs[c]):>7.0f} | {r['preemptions']:>7,} | "
              f"{'-' if hit is None else format(hit, '.3f'):>8} | {r['ttft_p90_s']:>10.3f} | {CASES[c][3]}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "runs": runs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
