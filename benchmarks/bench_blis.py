"""The side-by-side with BLIS: ``simpy-llm run scenarios/blis_linear.yaml`` on a 100k-request trace.

Run from the repository root::

    python -m benchmarks.bench_blis                          # 3 rounds of this checkout
    python -m benchmarks.bench_blis --rounds 5 --trees .,/tmp/blis_base   # two checkouts, alternated
    python -m benchmarks.bench_blis --requests 10000 --trace-dir /tmp/blis10k

The trace is :mod:`benchmarks.blis_trace`'s (seed 42, 20 requests/s, ``--requests`` of them),
written once as a trace v2 into ``--trace-dir`` (default: a temporary directory, removed at
the end) and replayed by every run: ``--set workload.traces.0.path=DIR/trace.csv``.

Each run is a fresh Python process doing what the ``simpy-llm`` command does
(``simpy_llm.cli.main(["run", SCENARIO, "--set", ..., "--progress", "off"])``) with the
checkout (``--trees``: directories put first on ``PYTHONPATH``) whose package it imports; the
scenario file is this checkout's for every tree (it names the trace, the engine and the
latency profile, nothing a tree's code changes). Measured by the parent, for the whole process
(interpreter start, imports, loading the scenario and the trace, the run, the summary it
prints): **CPU s**, user + system time (``os.wait4``'s resource usage of that child, so
nothing else is counted), **wall s** (``time.perf_counter()`` around it), and **peak RSS MB**
(``ru_maxrss``, KiB on Linux). Runs alternate between the checkouts within a round, so a busy
spell of the (shared) machine falls on both; the figures printed are the minimum, median and
maximum over the rounds, with the ratio of the medians against the first checkout. Each
tree's package is byte-compiled first (``compileall``, as ``pip install`` does), so that no
run spends its time compiling modules whose ``.pyc`` files an environment without bytecode
writing (``PYTHONDONTWRITEBYTECODE``) would never keep.

BLIS is not run here. Its figures, :data:`BLIS_CPU_S` and :data:`BLIS_RSS_GB`, were measured
earlier by hand on this machine (BLIS at its fastest settings, on a 100k-request trace of the
same kind); the ratio printed is BLIS's range over this checkout's range (its worst case:
BLIS's fastest over our slowest, and its best). This is a benchmark, not a test: it asserts
nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SCENARIO = REPO / "scenarios" / "blis_linear.yaml"
BLIS_CPU_S = (20.0, 25.0)
"""BLIS's CPU seconds (user + system) on a 100k-request trace, measured earlier by hand on this machine."""
BLIS_RSS_GB = (2.9, 3.1)
"""BLIS's peak RSS, GB, on that run."""
BLIS_REQUESTS = 100_000
"""The requests of the trace BLIS's figures are for (other sizes get no ratio)."""
TARGET_RATIO = 6.0
"""The issue's target: BLIS's CPU time over ours."""
RUN = "import sys; from simpy_llm.cli import main; sys.exit(main(sys.argv[1:]))"


def _one_run(tree: Path, trace_csv: Path, scenario: Path) -> dict[str, Any]:
    """One ``simpy-llm run`` of *scenario* replaying *trace_csv* in a fresh process importing *tree*'s package."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    argv = [sys.executable, "-c", RUN, "run", str(scenario), "--set", f"workload.traces.0.path={trace_csv}", "--progress", "off"]
    # Output to files, not pipes: the child is reaped by os.wait4 (for its own resource usage),
    # so nothing may wait on it first, and a full pipe would stall it.
    with tempfile.TemporaryFile("w+") as out_f, tempfile.TemporaryFile("w+") as err_f:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=tree, env=env, stdout=out_f, stderr=err_f, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out_f.seek(0)
        err_f.seek(0)
        out, err = out_f.read(), err_f.read()
    if proc.returncode != 0:
        raise RuntimeError(f"run in {tree} failed ({proc.returncode}):\n{err[-2000:]}")
    simulated = next((line for line in out.splitlines() if line.startswith("simulated ")), "")
    return {
        "tree": str(tree),
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "user_s": usage.ru_utime,
        "sys_s": usage.ru_stime,
        "wall_s": wall,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "requests": int(simulated.split()[1]) if simulated else None,
    }


def _spread(values: list[float]) -> tuple[float, float, float]:
    return min(values), statistics.median(values), max(values)


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    from benchmarks.blis_trace import DEFAULT_RATE, DEFAULT_REQUESTS, DEFAULT_SEED, requests_frame, write_trace

    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_blis", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds (each runs every tree once; default 3)")
    p.add_argument("--trees", default=".", help="comma-separated checkouts to compare (default: this one)")
    p.add_argument("--requests", type=int, default=DEFAULT_REQUESTS, help=f"requests in the trace (default {DEFAULT_REQUESTS:,})")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"trace seed (default {DEFAULT_SEED})")
    p.add_argument("--trace-dir", metavar="DIR", help="write (or reuse) the trace here instead of a temporary directory")
    p.add_argument("--scenario", default=str(SCENARIO), help="scenario file (default scenarios/blis_linear.yaml)")
    p.add_argument("--json", metavar="PATH", help="write every run and the machine to PATH")
    args = p.parse_args(argv)
    trees = [Path(t).resolve() for t in args.trees.split(",")]

    with tempfile.TemporaryDirectory(prefix="bench_blis_") as tmp:
        trace_dir = Path(args.trace_dir) if args.trace_dir else Path(tmp)
        trace_csv = trace_dir / "trace.csv"
        if not trace_csv.exists():
            t0 = time.perf_counter()
            write_trace(requests_frame(args.requests, args.seed, DEFAULT_RATE), trace_dir / "trace", seed=args.seed, rate=DEFAULT_RATE)
            print(f"trace: {args.requests:,} requests written to {trace_csv} in {time.perf_counter() - t0:.1f} s")
        else:
            print(f"trace: reusing {trace_csv}")
        print(
            f"machine: {os.cpu_count()} cores, Python {platform.python_version()}, load average "
            f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
        for tree in trees:  # as an installed package has them: the runs time the simulator, not compiling it
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "simpy_llm")], check=True)
        print(f"{'round':>5}  {'tree':<32} {'CPU s':>7} {'user':>7} {'sys':>6} {'wall s':>7} {'peak RSS MB':>11} {'requests':>9}")
        runs: list[dict[str, Any]] = []
        for r in range(args.rounds):
            for tree in trees:
                run = _one_run(tree, trace_csv.resolve(), Path(args.scenario).resolve())
                run["round"] = r
                runs.append(run)
                print(
                    f"{r:>5}  {str(tree)[-32:]:<32} {run['cpu_s']:>7.2f} {run['user_s']:>7.2f} {run['sys_s']:>6.2f} "
                    f"{run['wall_s']:>7.2f} {run['peak_rss_mb']:>11.0f} {run['requests'] or '-':>9}",
                    flush=True,
                )

    print(f"\n{'tree':<32} {'CPU s min / med / max':>24} {'RSS MB max':>11} {'CPU ratio':>10} {'BLIS CPU / ours':>16} {'BLIS RSS / ours':>16}")
    base_median = None
    for tree in trees:
        mine = [x for x in runs if x["tree"] == str(tree)]
        lo, med, hi = _spread([x["cpu_s"] for x in mine])
        rss = max(x["peak_rss_mb"] for x in mine)
        base_median = base_median or med
        # BLIS's figures are for 100k requests: no ratio for runs of another size.
        comparable = all(x["requests"] == BLIS_REQUESTS for x in mine)
        vs_blis = f"x{BLIS_CPU_S[0] / hi:.1f}-{BLIS_CPU_S[1] / lo:.1f}" if comparable else "-"
        rss_blis = f"x{BLIS_RSS_GB[0] * 1024 / rss:.1f}-{BLIS_RSS_GB[1] * 1024 / rss:.1f}" if comparable else "-"
        print(f"{str(tree)[-32:]:<32} {f'{lo:.2f} / {med:.2f} / {hi:.2f}':>24} {rss:>11.0f} {med / base_median:>10.3f} {vs_blis:>16} {rss_blis:>16}")
    print(
        f"\nBLIS (measured earlier by hand on this machine, not run here): {BLIS_CPU_S[0]:.0f}-{BLIS_CPU_S[1]:.0f} CPU s, "
        f"{BLIS_RSS_GB[0]}-{BLIS_RSS_GB[1]} GB; target: BLIS CPU / ours >= {TARGET_RATIO:.0f} "
        f"(ours <= {BLIS_CPU_S[0] / TARGET_RATIO:.2f}-{BLIS_CPU_S[1] / TARGET_RATIO:.2f} CPU s)"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"machine": {"cores": os.cpu_count(), "python": platform.python_version()}, "args": vars(args), "runs": runs}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
