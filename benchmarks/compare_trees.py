"""Speed of two checkouts of the library, side by side: alternated runs, CPU time ratios.

Each round runs every case once in each checkout, alternating which goes first, each run in
its own fresh process (the worker of ``bench_quickstart`` or ``bench_scenarios`` of that
checkout, so each side runs its own code and scenarios). It reports, per case, the CPU time
(user + sys) of the whole process and the wall time of ``Simulation.run()``, as medians over
the rounds, and the ratio new / base of each (below 1: the new checkout is faster), with
the spread of the per-round ratios.

Run from the repository root::

    git worktree add --detach ../base <commit>
    python -m benchmarks.compare_trees --base ../base --rounds 5
    python -m benchmarks.compare_trees --base ../base --cases qs_100k,react,disagg_100k

Cases: ``qs_<N>`` is the quickstart with N requests (``qs_100k``); any other name is a case
of ``bench_scenarios``. This is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.bench_quickstart import RESULT_TAG, machine_info

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CASES = ["qs_100k", "react", "mcts", "fork_join", "chain", "disagg_100k", "spec_mobile_cloud"]


def _argv(case: str) -> list[str]:
    if case.startswith("qs_"):
        return ["-m", "benchmarks.bench_quickstart", "--case", case[3:], "--mode", "event_per_change",
                "--scenario", "scenarios/quickstart.yaml"]
    return ["-m", "benchmarks.bench_scenarios", "--case", case]


def run_in(tree: Path, case: str) -> tuple[float, float]:
    """CPU seconds (user + sys) of a fresh process running *case* in *tree*, and the wall
    seconds of its ``Simulation.run()``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    env["OPENBLAS_NUM_THREADS"] = env["OMP_NUM_THREADS"] = "1"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, *_argv(case)], capture_output=True, text=True, env=env, cwd=tree, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return cpu, float(json.loads(line[len(RESULT_TAG):])["wall_s"])
    sys.stderr.write(proc.stdout + proc.stderr)
    raise RuntimeError(f"{case} failed in {tree} (exit code {proc.returncode})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.compare_trees", description=__doc__.splitlines()[0])
    p.add_argument("--base", type=Path, required=True, help="the checkout to compare against")
    p.add_argument("--new", type=Path, default=REPO, help="the checkout measured (default: this one)")
    p.add_argument("--cases", default=",".join(DEFAULT_CASES))
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    trees = {"base": args.base.resolve(), "new": args.new.resolve()}
    cases = args.cases.split(",")
    info = machine_info()
    print(f"compare_trees {info['date']}: {info['cpu']}; {info['cores']} cores; {info['python']}")
    print(f"  base {trees['base']}\n  new  {trees['new']}")
    figures: dict[str, dict[str, list[tuple[float, float]]]] = {c: {"base": [], "new": []} for c in cases}
    for k in range(args.rounds):
        for case in cases:
            order = ["base", "new"] if (k + cases.index(case)) % 2 == 0 else ["new", "base"]
            for side in order:
                figures[case][side].append(run_in(trees[side], case))
            b, n = figures[case]["base"][-1], figures[case]["new"][-1]
            print(f"  round {k + 1} {case:<18} cpu base {b[0]:7.2f} s new {n[0]:7.2f} s  ratio {n[0] / b[0]:.3f}", flush=True)
    print()
    print(f"{'case':<18} | {'cpu base s':>10} | {'cpu new s':>9} | {'cpu ratio':>9} | {'ratio range':>13} | {'run() ratio':>11}")
    for case in cases:
        base, new = figures[case]["base"], figures[case]["new"]
        cpu_b, cpu_n = statistics.median(c for c, _ in base), statistics.median(c for c, _ in new)
        run_b, run_n = statistics.median(w for _, w in base), statistics.median(w for _, w in new)
        ratios = [n[0] / b[0] for b, n in zip(base, new, strict=True)]
        print(f"{case:<18} | {cpu_b:>10.2f} | {cpu_n:>9.2f} | {cpu_n / cpu_b:>9.3f} | {min(ratios):.3f}-{max(ratios):.3f} | "
              f"{run_n / run_b:>11.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
