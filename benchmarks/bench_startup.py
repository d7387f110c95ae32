"""Start-up benchmark: ``simpy-llm run`` of a 100-request quickstart, from interpreter start to the first event.

Run from the repository root::

    python -m benchmarks.bench_startup                     # 5 rounds of this checkout
    python -m benchmarks.bench_startup --rounds 7 --trees .,../base   # two checkouts, alternated

Each round starts, for every checkout (``--trees``: directories whose ``simpy_llm`` is put
first on ``PYTHONPATH``), two fresh Python processes, one after the other:

``run``
    ``simpy_llm.cli.main(["run", SCENARIO, "--set", "workload.num_requests=100", "--progress",
    "off"])`` (what ``simpy-llm run`` does) with a ``step`` given to the kernel's
    :class:`~simpy_llm.kernel.Environment` until the simulation's environment returns from
    its first call (an environment with a ``step`` of its own runs SimPy's loop).
    **The first event** is that moment: the first event of the simulation's queue has been
    processed (the scenario loaded and checked, the simulation built, its processes
    started). Reported there:

    * ``wall s``: from just before the parent starts the process (``time.monotonic()``, the
      system-wide monotonic clock, read again in the child) to the first event: interpreter
      start, imports, argument parsing, loading, building;
    * ``CPU s``: the child's user + system CPU time at the first event
      (``resource.getrusage(RUSAGE_SELF)``), all of it spent since the interpreter started;
    * ``RSS MB``: the peak resident set size at the first event, and ``peak RSS MB`` at the
      end of the run (``ru_maxrss``, KiB on Linux); the 100-request run itself adds little;
    * ``modules``: how many modules ``sys.modules`` holds at the first event, and which of
      the heavy ones (:data:`HEAVY`) among them.

``import``
    ``import simpy_llm.cli`` alone, timed with ``time.perf_counter()`` around the import
    statement (the interpreter's own start is not in it).

Runs alternate between the checkouts within a round, so a busy spell of the (shared)
machine falls on both. The figures printed are the minimum, median and maximum over the
rounds, and with two checkouts the ratio of their medians. SimPy and the kernel are imported
before the command to give the environment its ``step``; the run imports them anyway, so the
totals do not change.

This is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TAG = "BENCH_STARTUP "
HEAVY = (
    "pandas", "scipy", "plotly", "aiohttp", "dask", "sklearn", "matplotlib", "networkx", "pyarrow",
    "prometheus_client", "optuna", "uvloop", "simpy_llm.observe", "simpy_llm.calibrate",
    "simpy_llm.explore.sweeps", "simpy_llm.report.figures",
)
"""Modules reported when they are loaded at the first event (none of them is needed by a run)."""


def _rusage() -> tuple[float, float]:
    """(user + system CPU seconds, peak RSS MB) of this process so far."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024.0


def child_run(spawned: float, scenario: str, requests: int) -> None:
    """The ``run`` case, in this (fresh) process: print one tagged JSON line."""
    import io
    from contextlib import redirect_stdout

    import simpy.core

    import simpy_llm.kernel as kernel

    first: dict[str, Any] = {}

    def first_step(self: simpy.core.Environment) -> None:
        simpy.core.Environment.step(self)
        del kernel.Environment.step  # one call only: the rest of the run needs no hook
        cpu, rss = _rusage()
        first.update(wall_s=time.monotonic() - spawned, cpu_s=cpu, rss_mb=rss, modules=len(sys.modules),
                     heavy=sorted(m for m in HEAVY if m in sys.modules))

    # An environment whose class has a step of its own runs SimPy's loop, which calls it (the
    # kernel's own loop inlines step): the first event is recorded there.
    kernel.Environment.step = first_step  # type: ignore[method-assign]
    from simpy_llm.cli import main

    with redirect_stdout(io.StringIO()):
        code = main(["run", scenario, "--set", f"workload.num_requests={requests}", "--progress", "off"])
    cpu, rss = _rusage()
    print(TAG + json.dumps({"code": code, "end_wall_s": time.monotonic() - spawned, "end_cpu_s": cpu, "peak_rss_mb": rss, **first}))


def child_import() -> None:
    """The ``import`` case: ``import simpy_llm.cli`` timed in this (fresh) process."""
    t0 = time.perf_counter()
    import simpy_llm.cli  # noqa: F401

    print(TAG + json.dumps({"import_s": time.perf_counter() - t0, "modules": len(sys.modules)}))


def _spawn(tree: Path, args: list[str]) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    spawned = time.monotonic()
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", *args, "--spawned", repr(spawned)],
        cwd=tree, env=env, capture_output=True, text=True, check=False,
    )
    for line in out.stdout.splitlines():
        if line.startswith(TAG):
            result: dict[str, Any] = json.loads(line[len(TAG):])
            return result
    raise RuntimeError(f"no result from {args} in {tree}:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")


def _stats(values: list[float]) -> str:
    return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5, help="rounds; each runs every case once in every tree (default 5)")
    p.add_argument("--trees", default=".", help="comma-separated checkouts to compare, alternated (default: this one)")
    p.add_argument("--requests", type=int, default=100, help="workload.num_requests of the run (default 100)")
    p.add_argument("--child", choices=("run", "import"), help=argparse.SUPPRESS)
    p.add_argument("--spawned", type=float, help=argparse.SUPPRESS)
    p.add_argument("--scenario", default="scenarios/quickstart.yaml", help="scenario, relative to each tree")
    args = p.parse_args(argv)
    if args.child == "run":
        child_run(args.spawned, args.scenario, args.requests)
        return 0
    if args.child == "import":
        child_import()
        return 0

    trees = [Path(t).resolve() for t in args.trees.split(",")]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, load {os.getloadavg()[0]:.2f}")
    print(f"run: simpy-llm run {args.scenario} --set workload.num_requests={args.requests}; {args.rounds} rounds")
    runs: dict[Path, list[dict[str, Any]]] = {t: [] for t in trees}
    imports: dict[Path, list[float]] = {t: [] for t in trees}
    for r in range(args.rounds):
        for tree in trees:
            res = _spawn(tree, ["run", "--scenario", args.scenario, "--requests", str(args.requests)])
            if res["code"] != 0:
                raise RuntimeError(f"run exited {res['code']} in {tree}")
            runs[tree].append(res)
            imports[tree].append(_spawn(tree, ["import"])["import_s"])
            print(f"  round {r + 1} {tree.name}: first event {res['wall_s']:.3f} s wall, {res['cpu_s']:.3f} s CPU, "
                  f"{res['rss_mb']:.0f} MB; import {imports[tree][-1]:.3f} s", flush=True)
    print()
    print("min / median / max over the rounds")
    for tree in trees:
        rs = runs[tree]
        print(f"{tree}:")
        print(f"  first event wall s   {_stats([x['wall_s'] for x in rs])}")
        print(f"  first event CPU s    {_stats([x['cpu_s'] for x in rs])}")
        print(f"  RSS at first event   {_stats([x['rss_mb'] for x in rs])} MB")
        print(f"  peak RSS (end)       {_stats([x['peak_rss_mb'] for x in rs])} MB")
        print(f"  whole process wall s {_stats([x['end_wall_s'] for x in rs])}")
        print(f"  import simpy_llm.cli {_stats(imports[tree])} s")
        print(f"  modules at first event {rs[-1]['modules']}; heavy among them: {', '.join(rs[-1]['heavy']) or 'none'}")
    if len(trees) == 2:
        a, b = trees
        print(f"ratios {b.name} / {a.name} (medians):")
        for key, label in (("wall_s", "first event wall"), ("cpu_s", "first event CPU"), ("rss_mb", "RSS at first event"),
                           ("peak_rss_mb", "peak RSS")):
            ma = statistics.median(x[key] for x in runs[a])
            mb = statistics.median(x[key] for x in runs[b])
            print(f"  {label:20s} x{mb / ma:.3f}")
        print(f"  {'import simpy_llm.cli':20s} x{statistics.median(imports[b]) / statistics.median(imports[a]):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
