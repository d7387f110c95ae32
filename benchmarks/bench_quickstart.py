"""Speed benchmark: the quickstart workload at 10k, 100k and 1M requests.

Run from the repository root::

    python -m benchmarks.bench_quickstart                       # every case, fast mode
    python -m benchmarks.bench_quickstart --cases 10k,100k --mode both
    python -m benchmarks.bench_quickstart --repeat 3 --json bench.json

Every run of every case happens in its own fresh Python process, so the peak
RSS it reports (``ru_maxrss``) belongs to that case alone; the parent process
never imports the simulator. The wall time is ``time.perf_counter()`` around
``Simulation(...).run()`` only; loading the scenario and building the
simulation are timed separately. See ``benchmarks/README.md`` for what each
figure means and for the targets the derived checks compare against.

This is a benchmark, not a test: it asserts nothing and always exits 0 unless a
run fails.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.machinery
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SCENARIO = REPO / "scenarios" / "quickstart.yaml"
MODES = ("event_per_change", "event_per_step")
RESULT_TAG = "BENCH_RESULT "

OUTPUT_SCALE = 10
"""The "long outputs" cases multiply every client's mean output length by this."""

# name -> (num_requests, scale outputs?, KV block multiplier, description)
CASES: dict[str, tuple[int, bool, int, str]] = {
    "10k": (10_000, False, 1, "quickstart, 10,000 requests"),
    "100k": (100_000, False, 1, "quickstart, 100,000 requests"),
    "1m": (1_000_000, False, 1, "quickstart, 1,000,000 requests"),
    # KV x20: room for a full batch of (length-biased) long requests, so no preemptions
    # and the comparison with 100k is about output length alone (see README.md).
    "100k_out10x": (100_000, True, 20, "100k, mean outputs x10, KV blocks x20"),
    "100k_out10x_kvdef": (100_000, True, 1, "100k, mean outputs x10, quickstart KV"),
    # Not run by default: KV scaled exactly with the outputs sits at the edge of a full batch.
    "100k_out10x_kvx10": (100_000, True, 10, "100k, mean outputs x10, KV blocks x10"),
}
DEFAULT_CASES = ("10k", "100k", "1m", "100k_out10x", "100k_out10x_kvdef")

# Targets (see README.md).
TARGET_RPS_100K = 20_000.0
TARGET_WALL_1M_S = 60.0
TARGET_RSS_1M_MB = 1024.0
TARGET_OUT10X_RATIO = 2.0
TARGET_CPU_1M_S = 25.0
TARGET_RSS_1M_LEAN_MB = 400.0
TARGET_REQUESTS_PER_RAW_TIMEOUT = 0.03
"""Marginal requests per CPU-second from 10k to 100k over raw SimPy timeouts per CPU-second
(:func:`raw_timeouts_per_cpu_s`, measured in the same processes): the speed target in units of
the machine's own SimPy speed."""
LINEARITY_TOLERANCE = 1.25
"""Our own tolerance: wall per request may grow at most this much from 100k to 1M."""


# --------------------------------------------------------------------------
# Case overrides
# --------------------------------------------------------------------------
def case_overrides(case: str, scenario_path: Path) -> list[str]:
    """The ``key.path=value`` overrides that turn the scenario file into *case*.

    The ten-fold values are read from the scenario file itself (so they follow
    it if it changes): every client's ``output_distribution.params.mean`` and
    ``serving.engine.kv_num_blocks``.
    """
    import yaml  # only the worker and the header need it

    n, long_out, kv_scale, _ = CASES[case]
    data = yaml.safe_load(scenario_path.read_text())
    overrides = [f"workload.num_requests={n}"]
    if long_out:
        for i, client in enumerate(data["workload"]["clients"]):
            params = (client.get("output_distribution") or {}).get("params") or {}
            if "mean" not in params:
                raise SystemExit(f"client {i} of {scenario_path} has no output_distribution.params.mean to scale")
            overrides.append(f"workload.clients.{i}.output_distribution.params.mean={params['mean'] * OUTPUT_SCALE}")
    if kv_scale != 1:
        blocks = (data["serving"].get("engine") or {}).get("kv_num_blocks", 8192)
        overrides.append(f"serving.engine.kv_num_blocks={blocks * kv_scale}")
    return overrides


# --------------------------------------------------------------------------
# Worker: one case, one mode, one fresh process
# --------------------------------------------------------------------------
def _maxrss_mb() -> float:
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # KiB on Linux, bytes on macOS.
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def raw_timeouts_per_cpu_s(n: int = 500_000) -> float:
    """The bar the simulator's speed is read against: plain SimPy timeouts one process
    yields per CPU-second in this process (one event each, nothing else)."""
    import simpy

    env = simpy.Environment()

    def ticker() -> Any:
        for _ in range(n):
            yield env.timeout(1)

    env.process(ticker())
    cpu0 = time.process_time()
    env.run()
    return n / (time.process_time() - cpu0)


def run_worker(case: str, mode: str, scenario_path: Path, extra: list[str]) -> dict[str, Any]:
    t0 = time.perf_counter()
    from simpy_llm import Simulation, load_scenario

    t1 = time.perf_counter()
    overrides = [*case_overrides(case, scenario_path), f"simulation.mode={mode}", *extra]
    scenario = load_scenario(scenario_path, overrides)
    t2 = time.perf_counter()
    sim = Simulation(scenario)
    t3 = time.perf_counter()
    rss_before_run = _maxrss_mb()

    start, cpu_start = time.perf_counter(), time.process_time()
    results = sim.run()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start

    peak_rss = _maxrss_mb()  # the target figure: peak up to the end of run()
    n = len(results)
    out: dict[str, Any] = {
        "case": case,
        "mode": mode,
        "overrides": overrides,
        "requests": n,
        "wall_s": wall,
        "wall_s_internal": results.wall_s,
        "cpu_s": cpu,
        "requests_per_wall_s": n / wall if wall > 0 else None,
        "steps": results.steps,
        "events": results.events,
        "events_per_request": results.events / n if n else None,
        "steps_per_request": results.steps / n if n else None,
        "peak_rss_mb": peak_rss,
        "rss_before_run_mb": rss_before_run,
        "import_s": t1 - t0,
        "load_s": t2 - t1,
        "build_s": t3 - t2,
    }
    # Context figures, computed after the timed run and the RSS reading.
    out["raw_timeouts_per_cpu_s"] = raw_timeouts_per_cpu_s()
    t4 = time.perf_counter()
    try:
        s = results.summary()
    except Exception as exc:  # noqa: BLE001 - the library is under development; keep the timings
        out["summary_error"] = f"{type(exc).__name__}: {exc}"
    else:
        out["summary_s"] = time.perf_counter() - t4
        req = s.get("requests", {})
        out["completed"] = req.get("completed")
        out["dropped"] = req.get("dropped")
        out["in_flight"] = req.get("in_flight")
        out["sim_duration_s"] = s.get("duration_s")
        out["mean_batch"] = (s.get("batch_size") or {}).get("mean")
        out["preemptions"] = (s.get("preemptions") or {}).get("total")
    return out


# --------------------------------------------------------------------------
# Parent: machine info, spawning, aggregation, report
# --------------------------------------------------------------------------
def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = None
    mem_mb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_mb = int(line.split()[1]) // 1024
                break
    except OSError:
        pass

    def version(pkg: str) -> str:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return "not installed"

    commit = None
    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if dirty:
            commit += " (+ uncommitted changes)"
    except (OSError, subprocess.CalledProcessError):
        pass
    now = _dt.datetime.now().astimezone()
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "load_avg_at_start": load,
        "date": now.isoformat(timespec="seconds"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "memory_mb": mem_mb,
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "simpy": version("simpy"),
        "numpy": version("numpy"),
        "simpy_llm": version("simpy-llm"),
        "git": commit,
        "engine": engine_build(),
    }


def engine_build() -> str:
    """Whether the engine the benchmark imports is ``compiled`` (an extension module, as a wheel
    built with a C compiler carries it; ``benchmarks/compiled_tree.py``) or ``source``: the
    figures differ by about ×1.7, so each says which it measured."""
    spec = importlib.util.find_spec("simpy_llm.serving.engine")
    origin = spec.origin if spec is not None else None
    return "compiled" if origin and origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)) else "source"


def run_fresh(argv: list[str], what: str, timeout: float | None = None) -> dict[str, Any]:
    """Run ``python *argv`` from the repository in a fresh process and return the figures
    it prints on its :data:`RESULT_TAG` line (its output goes to standard error if none)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG) :])
    sys.stderr.write(proc.stdout + proc.stderr)
    raise RuntimeError(f"{what} failed with exit code {proc.returncode}")


def spawn(case: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    argv = [str(Path(__file__).resolve()), "--case", case, "--mode", mode, "--scenario", str(args.scenario)]
    for item in args.set:
        argv += ["--set", item]
    return run_fresh(argv, f"case {case} ({mode})", timeout=args.timeout)


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Best and median over repeats (best wall = min; RSS: the largest seen)."""
    walls = [r["wall_s"] for r in runs]
    n = runs[0]["requests"]
    best, med = min(walls), statistics.median(walls)
    first = runs[0]
    agg = {
        "case": first["case"],
        "mode": first["mode"],
        "overrides": first["overrides"],
        "repeats": len(runs),
        "requests": n,
        "wall_s_best": best,
        "wall_s_median": med,
        "requests_per_wall_s_best": n / best if best > 0 else None,
        "requests_per_wall_s_median": n / med if med > 0 else None,
        "wall_us_per_request_median": med / n * 1e6 if n else None,
        "steps": first["steps"],
        "events": first["events"],
        "events_per_request": first["events_per_request"],
        "steps_per_request": first["steps_per_request"],
        "peak_rss_mb_max": max(r["peak_rss_mb"] for r in runs),
        "peak_rss_mb_median": statistics.median(r["peak_rss_mb"] for r in runs),
        "rss_before_run_mb_median": statistics.median(r["rss_before_run_mb"] for r in runs),
        "import_s_median": statistics.median(r["import_s"] for r in runs),
        "load_s_median": statistics.median(r["load_s"] for r in runs),
        "build_s_median": statistics.median(r["build_s"] for r in runs),
        "cpu_s_median": statistics.median(r["cpu_s"] for r in runs),
        "raw_timeouts_per_cpu_s_median": statistics.median(r["raw_timeouts_per_cpu_s"] for r in runs),
        "deterministic": len({(r["steps"], r["events"], r["requests"]) for r in runs}) == 1,
    }
    for key in ("completed", "dropped", "in_flight", "sim_duration_s", "mean_batch", "preemptions", "summary_s"):
        agg[key] = first.get(key)
    if any("summary_error" in r for r in runs):
        agg["summary_error"] = next(r["summary_error"] for r in runs if "summary_error" in r)
    agg["runs"] = runs
    return agg


def _fmt(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    return format(value, spec)


def print_table(rows: list[dict[str, Any]]) -> None:
    headers = [
        ("case", "<", lambda a: a["case"]),
        ("mode", "<", lambda a: "change" if a["mode"] == "event_per_change" else "step"),
        ("requests", ">", lambda a: f"{a['requests']:,}"),
        ("req/wall-s best", ">", lambda a: _fmt(a["requests_per_wall_s_best"], ",.0f")),
        ("req/wall-s med", ">", lambda a: _fmt(a["requests_per_wall_s_median"], ",.0f")),
        ("wall s best", ">", lambda a: f"{a['wall_s_best']:.3f}"),
        ("wall s med", ">", lambda a: f"{a['wall_s_median']:.3f}"),
        ("load+build s", ">", lambda a: f"{a['load_s_median'] + a['build_s_median']:.3f}"),
        ("steps", ">", lambda a: f"{a['steps']:,}"),
        ("SimPy events", ">", lambda a: f"{a['events']:,}"),
        ("events/req", ">", lambda a: _fmt(a["events_per_request"], ".2f")),
        ("peak RSS MB", ">", lambda a: f"{a['peak_rss_mb_max']:.0f}"),
    ]
    _print_grid(headers, rows)


def print_context(rows: list[dict[str, Any]]) -> None:
    headers = [
        ("case", "<", lambda a: a["case"]),
        ("mode", "<", lambda a: "change" if a["mode"] == "event_per_change" else "step"),
        ("completed", ">", lambda a: _fmt(a["completed"], ",")),
        ("dropped", ">", lambda a: _fmt(a["dropped"], ",")),
        ("sim s", ">", lambda a: _fmt(a["sim_duration_s"], ",.0f")),
        ("mean batch", ">", lambda a: _fmt(a["mean_batch"], ".1f")),
        ("preemptions", ">", lambda a: _fmt(a["preemptions"], ",")),
        ("steps/req", ">", lambda a: _fmt(a["steps_per_request"], ".2f")),
        ("us/req", ">", lambda a: _fmt(a["wall_us_per_request_median"], ".1f")),
        ("RSS pre-run MB", ">", lambda a: f"{a['rss_before_run_mb_median']:.0f}"),
        ("import s", ">", lambda a: f"{a['import_s_median']:.2f}"),
        ("load s", ">", lambda a: f"{a['load_s_median']:.3f}"),
        ("build s", ">", lambda a: f"{a['build_s_median']:.4f}"),
        ("summary s", ">", lambda a: _fmt(a["summary_s"], ".2f")),
    ]
    _print_grid(headers, rows)


def _print_grid(headers: list[tuple[str, str, Any]], rows: list[dict[str, Any]]) -> None:
    cells = [[fn(r) for _, _, fn in headers] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, (h, _, _) in enumerate(headers)]
    line = " | ".join(format(h, f"{al}{w}") for (h, al, _), w in zip(headers, widths, strict=True))
    print(line)
    print("-+-".join("-" * w for w in widths))
    for c in cells:
        print(" | ".join(format(v, f"{al}{w}") for v, (_, al, _), w in zip(c, headers, widths, strict=True)))


def derived_checks(by_case: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The targets, on median wall times (peak RSS: the largest over repeats)."""
    checks: list[dict[str, Any]] = []

    def add(name: str, target: str, value: str, ok: bool | None) -> None:
        checks.append({"check": name, "target": target, "measured": value, "pass": ok})

    a = by_case.get("100k")
    if a:
        rps = a["requests_per_wall_s_median"]
        add("requests/s at 100k", f">= {TARGET_RPS_100K:,.0f}", f"{rps:,.0f}", rps >= TARGET_RPS_100K)
    else:
        add("requests/s at 100k", f">= {TARGET_RPS_100K:,.0f}", "case 100k not run", None)

    a = by_case.get("1m")
    if a:
        w, m = a["wall_s_median"], a["peak_rss_mb_max"]
        add("wall at 1M", f"< {TARGET_WALL_1M_S:.0f} s", f"{w:.1f} s", w < TARGET_WALL_1M_S)
        add("peak RSS at 1M", f"< {TARGET_RSS_1M_MB:.0f} MB", f"{m:.0f} MB", m < TARGET_RSS_1M_MB)
    else:
        add("wall at 1M", f"< {TARGET_WALL_1M_S:.0f} s", "case 1m not run", None)
        add("peak RSS at 1M", f"< {TARGET_RSS_1M_MB:.0f} MB", "case 1m not run", None)

    a = by_case.get("1m")
    if a:
        cpu, m = a["cpu_s_median"], a["peak_rss_mb_max"]
        add("CPU of run() at 1M", f"<= {TARGET_CPU_1M_S:.0f} s", f"{cpu:.1f} s", cpu <= TARGET_CPU_1M_S)
        add("peak RSS at 1M (lean)", f"<= {TARGET_RSS_1M_LEAN_MB:.0f} MB", f"{m:.0f} MB", m <= TARGET_RSS_1M_LEAN_MB)
    small, large = by_case.get("10k"), by_case.get("100k")
    label = "marginal requests per CPU-s (10k to 100k) / raw SimPy timeouts per CPU-s"
    if small and large and large["cpu_s_median"] > small["cpu_s_median"]:
        marginal = (large["requests"] - small["requests"]) / (large["cpu_s_median"] - small["cpu_s_median"])
        bar = statistics.median([small["raw_timeouts_per_cpu_s_median"], large["raw_timeouts_per_cpu_s_median"]])
        ratio = marginal / bar
        add(label, f">= {TARGET_REQUESTS_PER_RAW_TIMEOUT:g}",
            f"{ratio:.4f} ({marginal:,.0f} requests/CPU-s over {bar / 1e6:.2f} M timeouts/CPU-s)",
            ratio >= TARGET_REQUESTS_PER_RAW_TIMEOUT)
    else:
        add(label, f">= {TARGET_REQUESTS_PER_RAW_TIMEOUT:g}", "needs 10k and 100k", None)

    base = by_case.get("100k")
    for name, label, is_target in (
        ("100k_out10x", "wall(100k, outputs x10, KV x20) / wall(100k)", True),
        ("100k_out10x_kvdef", "wall(100k, outputs x10, quickstart KV) / wall(100k) [info]", False),
        ("100k_out10x_kvx10", "wall(100k, outputs x10, KV x10) / wall(100k) [info]", False),
    ):
        if name not in by_case and not is_target:
            continue
        other = by_case.get(name)
        if base and other:
            ratio = other["wall_s_median"] / base["wall_s_median"]
            add(label, f"<= {TARGET_OUT10X_RATIO:g}" if is_target else "(no target)", f"{ratio:.2f}",
                ratio <= TARGET_OUT10X_RATIO if is_target else None)
        else:
            add(label, f"<= {TARGET_OUT10X_RATIO:g}" if is_target else "(no target)", f"needs 100k and {name}", None)

    per = {k: by_case[k]["wall_us_per_request_median"] for k in ("10k", "100k", "1m") if k in by_case}
    if per:
        shown = ", ".join(f"{k}: {v:.1f}" for k, v in per.items())
        ratios = []
        if "10k" in per and "100k" in per:
            ratios.append(f"100k/10k = {per['100k'] / per['10k']:.2f}")
        if "100k" in per and "1m" in per:
            ratios.append(f"1M/100k = {per['1m'] / per['100k']:.2f}")
        ok = per["1m"] / per["100k"] <= LINEARITY_TOLERANCE if "100k" in per and "1m" in per else None
        add(
            "linearity: wall us per request",
            f"1M/100k <= {LINEARITY_TOLERANCE:g}",
            shown + (" (" + "; ".join(ratios) + ")" if ratios else ""),
            ok,
        )
    return checks


def print_checks(checks: list[dict[str, Any]]) -> None:
    w = max(len(c["check"]) for c in checks)
    wt = max(len(c["target"]) for c in checks)
    for c in checks:
        verdict = {True: "PASS", False: "FAIL", None: "  - "}[c["pass"]]
        print(f"  [{verdict}] {c['check']:<{w}}  target {c['target']:<{wt}}  measured {c['measured']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_quickstart",
        description="Speed benchmark of the quickstart workload (each case in a fresh process).",
    )
    p.add_argument("--cases", default=",".join(DEFAULT_CASES),
                   help=f"comma-separated cases (default: {','.join(DEFAULT_CASES)}); known: {', '.join(CASES)}")
    p.add_argument("--mode", default="event_per_change", choices=[*MODES, "both"],
                   help="engine mode: the fast event_per_change (default), the per-step reference, or both")
    p.add_argument("--repeat", type=int, default=1, metavar="K",
                   help="runs per case, each in a fresh process; report best and median (default 1)")
    p.add_argument("--json", metavar="PATH", help="also write every figure to this JSON file")
    p.add_argument("--scenario", type=Path, default=DEFAULT_SCENARIO, help="scenario file (default: quickstart)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra override applied to every case (repeatable)")
    p.add_argument("--timeout", type=float, default=None, help="seconds allowed per run (default: none)")
    p.add_argument("--case", help=argparse.SUPPRESS)  # worker: run this one case and print its figures
    args = p.parse_args(argv)

    if args.case:  # ---- worker
        if args.mode == "both":
            p.error("--case runs one mode")
        result = run_worker(args.case, args.mode, args.scenario, args.set)
        print(RESULT_TAG + json.dumps(result), flush=True)
        return 0

    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    modes = list(MODES) if args.mode == "both" else [args.mode]

    info = machine_info()
    print("simpy_llm quickstart benchmark")
    print(f"  date      {info['date']}")
    print(f"  machine   {info['cpu']}; {info['cores']} cores ({info['usable_cores']} usable); "
          f"{info['memory_mb']} MB RAM; {info['os']}")
    if info["load_avg_at_start"] is not None:
        print("  load avg  {:.2f} {:.2f} {:.2f} (1/5/15 min; other busy processes distort wall times)".format(
            *info["load_avg_at_start"]))
    print(f"  software  {info['python']}; simpy {info['simpy']}; numpy {info['numpy']}; "
          f"simpy_llm {info['simpy_llm']} at git {info['git']}; engine {info['engine']}")
    print(f"  scenario  {args.scenario}" + (f" with {' '.join(args.set)}" if args.set else ""))
    print(f"  runs      {', '.join(cases)} x {', '.join(modes)} x {args.repeat} repeat(s), one fresh process each")
    for c in cases:
        extra = [o for o in case_overrides(c, args.scenario) if not o.startswith("workload.num_requests=")]
        if extra:
            print(f"  {c}: {' '.join(extra)}")
    print(flush=True)

    aggs: dict[str, dict[str, dict[str, Any]]] = {m: {} for m in modes}
    for mode in modes:
        for case in cases:
            runs = []
            for k in range(args.repeat):
                print(f"  running {case:<18} {mode:<16} {k + 1}/{args.repeat} ...", end=" ", flush=True)
                t = time.perf_counter()
                r = spawn(case, mode, args)
                r["load_avg_1min_after"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
                print(f"run {r['wall_s']:.2f} s, {r['peak_rss_mb']:.0f} MB "
                      f"(process {time.perf_counter() - t:.1f} s, load {_fmt(r['load_avg_1min_after'], '.2f')})",
                      flush=True)
                runs.append(r)
            aggs[mode][case] = aggregate(runs)
    print()

    rows = [aggs[m][c] for m in modes for c in cases]
    print("Figures (wall = perf_counter around Simulation.run(); req/wall-s = requests / wall; "
          "peak RSS = ru_maxrss at the end of run(), max over repeats)")
    print_table(rows)
    print()
    print("Context (first run; sim s = simulated duration; us/req = median wall per request; "
          "load/build/summary are outside the timed run)")
    print_context(rows)

    all_checks: dict[str, list[dict[str, Any]]] = {}
    for mode in modes:
        print()
        print(f"Derived checks ({mode}; median wall over repeats):")
        all_checks[mode] = derived_checks(aggs[mode])
        print_checks(all_checks[mode])

    if len(modes) == 2:
        print()
        print("event_per_change vs event_per_step (median wall):")
        for c in cases:
            fast, ref = aggs["event_per_change"][c], aggs["event_per_step"][c]
            same = fast["steps"] == ref["steps"] and fast["completed"] == ref["completed"]
            print(f"  {c:<18} speed-up x{ref['wall_s_median'] / fast['wall_s_median']:.2f}; "
                  f"SimPy events {fast['events']:,} vs {ref['events']:,}; "
                  f"same steps and completions: {'yes' if same else 'NO'}")

    nondet = [f"{a['case']} ({a['mode']})" for m in modes for a in aggs[m].values() if not a["deterministic"]]
    if nondet:
        print(f"\nWARNING: steps/events differed between repeats of {', '.join(nondet)}")

    if args.json:
        payload = {
            "machine": info,
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "case"},
            "targets": {
                "requests_per_wall_s_100k_min": TARGET_RPS_100K,
                "wall_s_1m_max": TARGET_WALL_1M_S,
                "peak_rss_mb_1m_max": TARGET_RSS_1M_MB,
                "out10x_wall_ratio_max": TARGET_OUT10X_RATIO,
                "linearity_1m_over_100k_max": LINEARITY_TOLERANCE,
            },
            "results": aggs,
            "checks": all_checks,
        }
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
