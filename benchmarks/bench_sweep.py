"""Speed benchmark: a 64-point sweep of the quickstart scenario on a process pool.

Run from the repository root::

    python -m benchmarks.bench_sweep                    # 64 points at 10k requests, 2 workers
    python -m benchmarks.bench_sweep --workers 2 --requests 10000 --json sweep.json

The sweep is ``workload.aggregate_rate`` (4 values) x ``serving.engine.max_num_seqs``
(2 values) x 8 seeds = 64 runs of ``scenarios/quickstart.yaml`` at
``workload.num_requests=10000``, through :func:`simpy_llm.explore.sweep` with its
default executor (a process pool of ``--workers`` processes forked from the fork server,
created and shut down by the call; this process runs the first points itself while
the workers start, unless ``--no-head-start``).

Figures printed:

* ``total_wall_s``: wall-clock seconds of the whole ``sweep()`` call (pool start-up,
  checking every point's scenario, the runs, gathering the frame);
* ``point_sim_s``: the mean of the frame's ``wall_s``, the time each run took inside
  its worker (loading the scenario, simulating, summarising);
* ``overhead_pct``: the sweep's overhead per point, ``(total_wall_s * workers / points
  - point_sim_s) / point_sim_s`` in percent: what the sweep adds to each run beyond
  the run itself, pool start-up and the end of the sweep (one worker idle while the
  other finishes the last run) included;
* ``list_schedule_makespan_s``: the time the same runs would take on ``--workers``
  workers with nothing else to do: each run, in point order, to the first free worker
  (what the pool does), from the runs' own ``wall_s``;
* ``machinery_s`` and ``machinery_pct``: ``total_wall_s - list_schedule_makespan_s``, what
  the sweep's machinery itself adds (starting the pool, checking every point, passing
  work and rows between processes), and that as a share of the runs' time per worker;
* ``warm_pool_s``: a second, 2-run sweep of 20 requests right after: how long a sweep
  takes once the fork server is running (a notebook's later sweeps).

This is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCENARIO = REPO / "scenarios" / "quickstart.yaml"
GRID = {"workload.aggregate_rate": [10.0, 20.0, 30.0, 40.0], "serving.engine.max_num_seqs": [64, 256]}
SEEDS = list(range(1, 9))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="process pool size (default 2)")
    parser.add_argument("--requests", type=int, default=10_000, help="workload.num_requests of each run (default 10000)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument(
        "--no-head-start",
        action="store_true",
        help="do not run points in this process while the pool's workers start (to measure what that saves)",
    )
    args = parser.parse_args()

    from simpy_llm.explore import sweep
    from simpy_llm.explore.sweeps import _Runner

    _Runner.head_start = not args.no_head_start

    start = time.perf_counter()
    frame = sweep(
        SCENARIO,
        GRID,
        overrides={"workload.num_requests": args.requests},
        seeds=SEEDS,
        max_workers=args.workers,
        metrics=["throughput.requests_per_s", "latency_s.ttft.p99"],
    )
    total = time.perf_counter() - start
    warm_start = time.perf_counter()
    sweep(SCENARIO, {"seed": [1, 2]}, overrides={"workload.num_requests": 20}, max_workers=args.workers, metrics=["requests.arrived"])
    warm = time.perf_counter() - warm_start
    points = len(frame)
    free = [0.0] * args.workers
    for wall in frame["wall_s"]:
        i = free.index(min(free))
        free[i] += float(wall)
    makespan = max(free)
    sim = float(frame["wall_s"].mean())
    per_point = total * args.workers / points
    figures = {
        "date": _dt.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "points": points,
        "workers": args.workers,
        "requests_per_point": args.requests,
        "head_start": not args.no_head_start,
        "total_wall_s": round(total, 3),
        "point_sim_s": round(sim, 4),
        "point_sim_min_s": round(float(frame["wall_s"].min()), 4),
        "point_sim_max_s": round(float(frame["wall_s"].max()), 4),
        "wall_per_point_x_workers_s": round(per_point, 4),
        "overhead_pct": round(100.0 * (per_point - sim) / sim, 2),
        "serial_equivalent_s": round(float(frame["wall_s"].sum()), 3),
        "list_schedule_makespan_s": round(makespan, 3),
        "machinery_s": round(total - makespan, 3),
        "machinery_pct": round(100.0 * (total - makespan) / (float(frame["wall_s"].sum()) / args.workers), 2),
        "warm_pool_s": round(warm, 3),
    }
    for key, value in figures.items():
        print(f"{key:>28}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
