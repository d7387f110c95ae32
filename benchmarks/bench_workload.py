"""Benchmark: generating requests from the workload spec's two-client example.

Times :func:`simpy_llm.workload.export.generate_requests` (no simulation) for
``scenarios/two_clients.yaml`` at N requests and prints requests per
wall-second and peak RSS. Target: 1M requests in < 10 s.

Usage: ``python -m benchmarks.bench_workload [--n 1000000] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import platform
import resource
import statistics
import time

from simpy_llm import load_scenario
from simpy_llm.workload.export import generate_requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="requests to generate")
    parser.add_argument("--repeat", type=int, default=3, help="runs (best and median reported)")
    parser.add_argument("--scenario", default="scenarios/two_clients.yaml")
    args = parser.parse_args()
    scenario = load_scenario(args.scenario, [f"workload.num_requests={args.n}"])
    walls = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        frame = generate_requests(scenario)
        walls.append(time.perf_counter() - t0)
        assert len(frame) == args.n
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    best, med = min(walls), statistics.median(walls)
    print(f"python {platform.python_version()} on {platform.machine()}, {time.strftime('%Y-%m-%d')}")
    print(f"scenario {args.scenario}: {args.n:,} requests")
    print(f"wall s   best {best:.2f}  median {med:.2f}  ({args.n / med:,.0f} requests per wall-second, median)")
    print(f"peak RSS {rss_mb:.0f} MB")
    print(f"target   1M in < 10 s: {'met' if args.n >= 1_000_000 and med < 10 else 'see figures'}")


if __name__ == "__main__":
    main()
