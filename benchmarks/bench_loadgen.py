"""Speed benchmark of the observer's load generator: the highest open-loop rate it keeps.

Run from the repository root::

    python -m benchmarks.bench_loadgen                          # the default ladder, asyncio and uvloop (~2.5 min)
    python -m benchmarks.bench_loadgen --rates 300,500 --loop uvloop --duration 4
    python -m benchmarks.bench_loadgen --rates 500 --loop asyncio --profile   # where the client's time goes
    python -m benchmarks.bench_loadgen --rates 10000 --duration 10 --loop uvloop --workers 1,2

A no-op OpenAI-compatible server (``benchmarks/noop_sse_server.py``: it
answers every streamed request at once with a few chunks, usage and
``[DONE]``) runs in its own process on 127.0.0.1, so it never shares the load
generator's event loop. For each requested rate and loop, a fresh process runs
:class:`~simpy_llm.observe.LoadGenerator` open loop against it for
``--duration`` seconds of targets (Poisson arrivals by default) and reports
requested vs achieved send rate, the schedule delay (``sent - target``) p50,
p99 and max, the median client lag (``dispatched - target``), the ok count
and the client's CPU time per request; a run is ``saturated`` (with the reason: for a p99 over
10 ms, how many requests were late and the spans of their targets) when the generator itself
did not keep the schedule (:func:`~simpy_llm.observe.saturation.saturation`, judged at the
10 ms goal). The verdict per loop is the highest
rate whose p99 schedule delay stays below 10 ms (the goal: >= 300 requests/s
on 2 cores). See ``benchmarks/README.md``; figures go to ``RESULTS.md`` by hand.

``--new-connections`` makes the client open a connection per request
(``OpenAIClient(keep_alive=False)``), to measure what kept-alive connections save.
``--transport lean`` sends through the client's lean transport
(``OpenAIClient(transport="lean")``: an asyncio Protocol per connection, answers parsed by
httptools) instead of aiohttp.

``--workers 1,2`` runs each case with one sending process
(:class:`~simpy_llm.observe.LoadGenerator`) and with two worker processes
(:class:`~simpy_llm.observe.workers.ProcessLoadGenerator`); the client's CPU is
then the parent's plus its workers' (their start-up included), and the wall time
counts from the shared run start. ``client CPU us/req`` counts all the client's CPU (start-up,
building bodies ahead, the run); ``in run us/req`` only what it spent from the run's start (the
clock of the targets) to its end, and ``client CPU %`` is that share of the wall time. That
in-run CPU is split into the sending process's own (``parent sending/run us/req``: from the run's
start until every request was handed to a client, looked at every 20 ms, then to the run's end)
and, with workers, the workers' (``workers us/req``).

``--max-connections N`` caps the connections each sending process holds
(``OpenAIClient(max_connections=N)``; ``0``: no cap; default: the client's own).

``--prepare-bytes N`` sets how many bytes of request bodies each sending process builds
ahead of their targets (``LoadGenerator(prepare_bytes=N)``; ``0``: each built just before its
target, as before the look-ahead).

This is a benchmark, not a test: it asserts nothing. The figures are
wall-clock figures on a shared machine: p99 and max move by a few
milliseconds between runs, more when other work runs (the header prints the
load average); use ``--repeat`` for the median of several runs.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import multiprocessing
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.bench_quickstart import machine_info
from simpy_llm.observe.loadgen import PREPARE_BYTES

REPO = Path(__file__).resolve().parent.parent
SERVER = Path(__file__).resolve().with_name("noop_sse_server.py")
RESULT_TAG = "BENCH_RESULT "
DEFAULT_RATES = (100, 200, 300, 500, 700, 1000, 1400, 2000, 2800)
P99_TARGET_S = 0.010
"""The schedule-delay goal: p99 below 10 ms."""
GOAL_RATE = 300.0
"""The rate the goal asks for at that p99, on 2 cores."""
LEAD_S = 0.1
"""The first target is this long after the run starts (start-up is not part of the measure)."""


# --------------------------------------------------------------------------
# Worker: one rate on one loop, in a fresh process
# --------------------------------------------------------------------------
def targets(rate: float, duration_s: float, arrivals: str, seed: int) -> list[float]:
    """Target send times: ``rate * duration_s`` of them, Poisson (seeded) or evenly spaced."""
    n = max(round(rate * duration_s), 2)
    if arrivals == "constant":
        return [LEAD_S + i / rate for i in range(n)]
    rng = random.Random(seed)
    t, out = LEAD_S, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def _proc_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process *pid* (Linux ``/proc``; ``None`` elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def run_case(args: argparse.Namespace) -> dict[str, Any]:
    import cProfile
    import io
    import pstats
    import resource

    from simpy_llm.observe import OBSERVER_COLUMNS, LoadGenerator, OpenAIClient, RequestSpec, resolve_loop, run_loop
    from simpy_llm.observe.loadgen import ScheduleLagWarning
    from simpy_llm.observe.workers import ProcessLoadGenerator
    from simpy_llm.workload.traces import TraceV2Writer

    url = f"http://127.0.0.1:{args.port}"
    times = targets(args.case_rate, args.duration, args.arrivals, args.seed)
    requests = [{"arrival_time_s": t, "input_tokens": args.input_tokens, "output_tokens": args.output_tokens} for t in times]
    out: dict[str, Any] = {
        "loop": args.case_loop, "loop_used": resolve_loop(args.case_loop), "rate": args.case_rate, "workers": args.case_workers,
        "transport": args.transport,
    }
    profiler = cProfile.Profile() if args.profile else None

    async def main() -> None:
        # The trace's directory outlives the client: a run that fell behind may end holding every
        # file it may open (a connection per request in flight), and the directory's removal needs
        # files too. The client closes its connections first; a removal that fails all the same
        # leaves a temporary directory behind rather than losing the case's figures.
        with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
            await measure(Path(tmp) / "trace")

    async def measure(trace: Path) -> None:
        # The client's own cap on connections unless --max-connections names one.
        cap = {} if args.max_connections is None else {"max_connections": args.max_connections or None}
        async with OpenAIClient(
            url, timeout_s=30.0, keep_alive=not args.new_connections, transport=args.transport, **cap
        ) as client:
            # Warm-up: the first requests pay lazy imports and first-use costs.
            for _ in range(5):
                await client.send(RequestSpec("warm up", 4, request_id=-1))
            with TraceV2Writer(trace, extra_columns=OBSERVER_COLUMNS) as writer:
                # The goal's threshold: the summary's saturated flag judges the p99 against it (the
                # warning a lagging median would give is left out: the lag is reported below).
                gen: LoadGenerator | ProcessLoadGenerator
                if args.case_workers > 1:
                    gen = ProcessLoadGenerator(
                        client, requests, writer, workers=args.case_workers, lag_threshold_s=P99_TARGET_S, loop=args.case_loop,
                        prepare_bytes=args.prepare_bytes,
                    )
                else:
                    gen = LoadGenerator(client, requests, writer, lag_threshold_s=P99_TARGET_S, prepare_bytes=args.prepare_bytes)
                server_cpu0 = _proc_cpu_s(args.server_pid) if args.server_pid else None
                children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu0 = time.process_time()
                if profiler is not None:
                    profiler.enable()
                task = asyncio.ensure_future(gen.run())
                # The CPU from the run's start: one process builds bodies ahead and starts its clock
                # in the run's first step; workers start, import and build theirs before it.
                if isinstance(gen, ProcessLoadGenerator):
                    await gen.wait_started(task)
                    workers_cpu = [_proc_cpu_s(p.pid) for p in multiprocessing.active_children() if p.pid is not None]
                    start_children = None if None in workers_cpu else sum(c for c in workers_cpu if c is not None)
                else:
                    await asyncio.sleep(0)
                    start_children = 0.0
                run_cpu0 = time.process_time()
                all_sent = asyncio.ensure_future(_all_sent(gen, len(requests)))
                try:
                    s = await task
                except RuntimeError as exc:  # a worker failed: the run's summary holds what it measured
                    if gen.summary is None:
                        raise
                    s = gen.summary
                    out["failed"] = _last_line(str(exc))
                all_sent.cancel()
                parent_sending = all_sent.result() - run_cpu0 if all_sent.done() and not all_sent.cancelled() else None
                if profiler is not None:
                    profiler.disable()
                children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                # Wall time from the run start (the workers' start-up before it is left out).
                wall = time.perf_counter() - client.run_start
                children_s = (children1.ru_utime + children1.ru_stime) - (children0.ru_utime + children0.ru_stime)
                cpu = time.process_time() - cpu0 + children_s
                parent_run = time.process_time() - run_cpu0
                workers_run = children_s - start_children if start_children is not None and args.case_workers > 1 else None
                run_cpu = parent_run + children_s - start_children if start_children is not None else None
                server_cpu1 = _proc_cpu_s(args.server_pid) if args.server_pid else None
        out.update(
            n_requests=s.n_requests,
            n_sent=s.n_sent,
            ok=s.status_counts.get("ok", 0),
            status_counts=s.status_counts,
            requested_rate=s.requested_rate,
            achieved_rate=s.achieved_rate,
            delay_p50_s=s.schedule_delay_p50_s,
            delay_p99_s=s.schedule_delay_p99_s,
            delay_max_s=s.schedule_delay_max_s,
            lag_p50_s=s.lag_p50_s,
            saturated=s.saturated,
            saturation_reason=s.saturation_reason,
            late=getattr(s, "late", None),  # None: a tree that did not count them
            late_spans_s=getattr(s, "late_spans_s", None),
            wall_s=wall,
            client_cpu_s=cpu,
            client_cpu_us_per_request=cpu / s.n_requests * 1e6 if s.n_requests else None,
            run_cpu_s=run_cpu,
            run_cpu_us_per_request=run_cpu / s.n_requests * 1e6 if s.n_requests and run_cpu is not None else None,
            parent_run_us_per_request=parent_run / s.n_requests * 1e6 if s.n_requests else None,
            parent_sending_us_per_request=parent_sending / s.n_requests * 1e6 if s.n_requests and parent_sending is not None else None,
            workers_run_us_per_request=workers_run / s.n_requests * 1e6 if s.n_requests and workers_run is not None else None,
            connection_waits=getattr(s, "connection_waits", None),  # None: a tree without the cap
            connection_wait_max_s=getattr(s, "connection_wait_max_s", None),
            client_cpu_share=run_cpu / wall if wall > 0 and run_cpu is not None else None,
            server_cpu_share=(server_cpu1 - server_cpu0) / wall if server_cpu0 is not None and server_cpu1 is not None and wall > 0 else None,
        )
        errors = [r.error_message for r in gen.records.values() if r.status != "ok"]
        if errors:
            out["first_error"] = errors[0]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleLagWarning)
        run_loop(main(), loop=args.case_loop)
    if profiler is not None:
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(args.profile_top)
        out["profile"] = buf.getvalue()
    return out


# --------------------------------------------------------------------------
# Parent: the server, one process per case, the report
# --------------------------------------------------------------------------
def start_server(chunks: int, loop: str) -> tuple[subprocess.Popen[str], int]:
    """Start the no-op server in its own process; return it and its port."""
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--port", "0", "--chunks", str(chunks), "--loop", loop],
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until bound (or the process died)
    if not line.startswith("LISTENING "):
        stop_server(proc)
        raise RuntimeError(f"the no-op server did not start (said {line!r}, exit code {proc.poll()})")
    return proc, int(line.split()[1])


def stop_server(proc: subprocess.Popen[str]) -> None:
    """Stop the server by its PID (SIGTERM, then SIGKILL if it does not exit)."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def spawn(rate: float, loop: str, workers: int, port: int, server_pid: int, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [
        sys.executable, "-m", "benchmarks.bench_loadgen",
        "--case-rate", repr(rate), "--case-loop", loop, "--case-workers", str(workers),
        "--port", str(port), "--server-pid", str(server_pid),
        "--duration", repr(args.duration), "--arrivals", args.arrivals, "--seed", str(args.seed),
        "--input-tokens", str(args.input_tokens), "--output-tokens", str(args.output_tokens),
    ]
    if args.profile:
        cmd += ["--profile", "--profile-top", str(args.profile_top)]
    if args.new_connections:
        cmd.append("--new-connections")
    cmd += ["--transport", args.transport, "--prepare-bytes", str(args.prepare_bytes)]
    if args.max_connections is not None:
        cmd += ["--max-connections", str(args.max_connections)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    limit = args.duration * 20 + 240
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=limit)
    except subprocess.TimeoutExpired:  # subprocess.run has killed the case's process (by its pid)
        return failed_row(rate, loop, workers, args, f"no result within {limit:g} s")
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG) :])
    # A collapse is a result too (the generator could not keep the schedule): reported, not raised.
    sys.stderr.write(proc.stdout + proc.stderr)
    return failed_row(rate, loop, workers, args, f"exit code {proc.returncode}: {_last_line(proc.stderr)}")


def _last_line(text: str) -> str:
    """The last non-empty line of *text* (a traceback's: the exception), or ``""``."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


async def _all_sent(gen: Any, n: int) -> float:
    """This process's CPU time (``time.process_time()``) when *gen* has handed its *n* requests to
    the client (looked at every 20 ms): the parent's CPU while the run sends is from its start to this."""
    while gen.live.sent < n:
        await asyncio.sleep(0.02)
    return time.process_time()


def failed_row(rate: float, loop: str, workers: int, args: argparse.Namespace, why: str) -> dict[str, Any]:
    """The row of a case whose process gave no figures (it crashed, or ran out of time): the
    generator did not keep the schedule, so the case is saturated, and *why* says how it ended."""
    figures = ("requested_rate", "achieved_rate", "delay_p50_s", "delay_p99_s", "delay_max_s", "lag_p50_s",
               "client_cpu_us_per_request", "run_cpu_us_per_request", "parent_run_us_per_request",
               "parent_sending_us_per_request", "workers_run_us_per_request", "client_cpu_share", "server_cpu_share")
    return {
        "loop": loop, "loop_used": loop, "rate": rate, "workers": workers, "transport": args.transport,
        "n_requests": max(round(rate * args.duration), 2), "n_sent": None, "ok": 0, **dict.fromkeys(figures),
        "saturated": True, "saturation_reason": f"the case failed: {why}", "failed": why,
    }


def machine_line() -> str:
    info = machine_info()
    return f"{info['cpu']}; {info['cores']} cores ({info['usable_cores']} usable); {info['os']}"


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "not installed"


def _ms(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value * 1e3, spec)


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_rows(rows: list[dict[str, Any]]) -> None:
    headers = [
        ("loop", "<", lambda r: r["loop_used"]),
        ("workers", ">", lambda r: str(r.get("workers", 1))),
        ("rate", ">", lambda r: f"{r['rate']:g}"),
        ("requested/s", ">", lambda r: _fmt(r["requested_rate"], ".1f")),
        ("achieved/s", ">", lambda r: _fmt(r["achieved_rate"], ".1f")),
        ("sent", ">", lambda r: f"{_fmt(r['n_sent'], 'd')}/{r['n_requests']}"),
        ("ok", ">", lambda r: str(r["ok"])),
        ("delay p50 ms", ">", lambda r: _ms(r["delay_p50_s"])),
        ("p99 ms", ">", lambda r: _ms(r["delay_p99_s"])),
        ("max ms", ">", lambda r: _ms(r["delay_max_s"], ".1f")),
        ("lag p50 ms", ">", lambda r: _ms(r["lag_p50_s"])),
        ("client CPU us/req", ">", lambda r: _fmt(r["client_cpu_us_per_request"], ".0f")),
        ("in run us/req", ">", lambda r: _fmt(r.get("run_cpu_us_per_request"), ".0f")),
        ("parent sending/run us/req", ">",
         lambda r: f"{_fmt(r.get('parent_sending_us_per_request'), '.0f')}/{_fmt(r.get('parent_run_us_per_request'), '.0f')}"),
        ("workers us/req", ">", lambda r: _fmt(r.get("workers_run_us_per_request"), ".0f")),
        ("client CPU %", ">", lambda r: _fmt(r["client_cpu_share"] and r["client_cpu_share"] * 100, ".0f")),
        ("server CPU %", ">", lambda r: _fmt(r["server_cpu_share"] and r["server_cpu_share"] * 100, ".0f")),
        ("saturated", "^", lambda r: "failed" if r.get("failed") else "yes" if r.get("saturated") else "no"),
        ("p99 < 10 ms", "^", lambda r: "yes" if _passes(r) else "NO"),
    ]
    cells = [[fn(r) for _, _, fn in headers] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, (h, _, _) in enumerate(headers)]
    print(" | ".join(format(h, f"{al}{w}") for (h, al, _), w in zip(headers, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for c in cells:
        print(" | ".join(format(v, f"{al}{w}") for v, (_, al, _), w in zip(c, headers, widths, strict=True)), flush=True)


def _case(loop: str, workers: int) -> str:
    """A case's name: the loop, and the workers when more than one."""
    return loop if workers == 1 else f"{loop} x{workers}"


def _passes(r: dict[str, Any]) -> bool:
    # Every request must have been sent and answered too: a fast p99 over failed requests means nothing.
    return r["delay_p99_s"] is not None and r["delay_p99_s"] < P99_TARGET_S and r["ok"] == r["n_requests"]


def median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row for repeated runs of a case: the median of each figure (counts: the smallest ok)."""
    if len(runs) == 1:
        return runs[0]
    out = dict(runs[0])
    for key in ("requested_rate", "achieved_rate", "delay_p50_s", "delay_p99_s", "delay_max_s", "lag_p50_s",
                "client_cpu_us_per_request", "run_cpu_us_per_request", "parent_run_us_per_request",
                "parent_sending_us_per_request", "workers_run_us_per_request", "client_cpu_share", "server_cpu_share"):
        vals = [r[key] for r in runs if r.get(key) is not None]
        out[key] = statistics.median(vals) if vals else None
    out["ok"] = min(r["ok"] for r in runs)
    sent = [r["n_sent"] for r in runs if r.get("n_sent") is not None]
    out["n_sent"] = min(sent) if sent else None
    out["saturated"] = any(r.get("saturated") for r in runs)
    failed = [r["failed"] for r in runs if r.get("failed")]
    out["failed"] = f"{len(failed)} of {len(runs)} runs: {failed[0]}" if failed else None
    return out


def verdict(rows: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(highest rate passing with every lower rate passing too, highest passing rate at all)."""
    ordered = sorted(rows, key=lambda r: r["rate"])
    contiguous = None
    for r in ordered:
        if not _passes(r):
            break
        contiguous = r["rate"]
    passing = [r["rate"] for r in ordered if _passes(r)]
    return contiguous, (max(passing) if passing else None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_loadgen",
        description="Highest open-loop rate of the load generator with p99 schedule delay < 10 ms, against a no-op server.",
    )
    p.add_argument("--rates", default=",".join(map(str, DEFAULT_RATES)),
                   help=f"comma-separated requests/s (default {','.join(map(str, DEFAULT_RATES))})")
    p.add_argument("--duration", type=float, default=5.0, help="seconds of targets per rate (default 5)")
    p.add_argument("--loop", choices=("asyncio", "uvloop", "both"), default="both",
                   help="the load generator's event loop (default both; the server always uses uvloop when installed)")
    p.add_argument("--arrivals", choices=("poisson", "constant"), default="poisson",
                   help="Poisson (seeded, default) or evenly spaced targets")
    p.add_argument("--repeat", type=int, default=1, metavar="K", help="runs per case; the median figures are shown")
    p.add_argument("--seed", type=int, default=0, help="seed of the Poisson targets")
    p.add_argument("--input-tokens", type=int, default=1000,
                   help="prompt length of every request (the client builds the prompt text; default 1000)")
    p.add_argument("--output-tokens", type=int, default=16, help="max_tokens sent (the server ignores it; default 16)")
    p.add_argument("--chunks", type=int, default=4, help="content chunks per answer from the server (default 4)")
    p.add_argument("--profile", action="store_true",
                   help="run each case under cProfile and print the top functions (slows the client down)")
    p.add_argument("--profile-top", type=int, default=25, help="functions shown with --profile (default 25)")
    p.add_argument("--json", metavar="PATH", help="also write every figure to this JSON file")
    p.add_argument("--new-connections", action="store_true",
                   help="open a new connection per request (OpenAIClient(keep_alive=False)), as the client did "
                        "before it kept connections alive")
    p.add_argument("--transport", choices=("aiohttp", "lean"), default="aiohttp",
                   help="the client's transport (OpenAIClient(transport=...)): aiohttp (default) or lean "
                        "(an asyncio Protocol with httptools; the loadgen extra)")
    p.add_argument("--prepare-bytes", type=int, default=PREPARE_BYTES, metavar="N",
                   help="bytes of request bodies each sending process builds ahead of their targets "
                        f"(LoadGenerator(prepare_bytes=...); default {PREPARE_BYTES}; 0: each built just before its target)")
    p.add_argument("--max-connections", type=int, default=None, metavar="N",
                   help="connections each sending process holds at most (OpenAIClient(max_connections=...); "
                        "default: the client's own, 4096; 0: no cap)")
    p.add_argument("--workers", default="1",
                   help="comma-separated numbers of sending processes, one case each (default 1: the one-process generator)")
    # Worker mode: one case, started by the parent.
    p.add_argument("--case-rate", type=float, help=argparse.SUPPRESS)
    p.add_argument("--case-loop", help=argparse.SUPPRESS)
    p.add_argument("--case-workers", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--server-pid", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.case_rate is not None:  # ---- worker
        print(RESULT_TAG + json.dumps(run_case(args)), flush=True)
        return 0

    rates = [float(x) for x in args.rates.split(",") if x.strip()]
    loops = ["asyncio", "uvloop"] if args.loop == "both" else [args.loop]
    worker_counts = [int(x) for x in args.workers.split(",") if x.strip()]
    if args.repeat < 1 or not rates or any(r <= 0 for r in rates):
        p.error("--repeat must be >= 1 and every rate > 0")
    if not worker_counts or any(w < 1 for w in worker_counts):
        p.error("--workers must list whole numbers >= 1")
    cases = [(loop, w) for loop in loops for w in worker_counts]
    now = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print("simpy_llm load-generator benchmark (open loop against a no-op SSE server on loopback)")
    print(f"  date      {now}")
    print(f"  machine   {machine_line()}")
    if load is not None:
        print("  load avg  {:.2f} {:.2f} {:.2f} (1/5/15 min; other busy processes distort the delays)".format(*load))
    print(f"  software  Python {platform.python_version()}; aiohttp {_version('aiohttp')}; uvloop {_version('uvloop')}; "
          f"httptools {_version('httptools')}; transport {args.transport}")
    print(f"  workload  {args.arrivals} targets, {args.duration:g} s per rate, prompts of {args.input_tokens} words, "
          f"{args.chunks} content chunks per answer, {args.repeat} run(s) per case, one fresh process each")
    print(flush=True)

    server, port = start_server(args.chunks, "auto")
    rows: dict[str, list[dict[str, Any]]] = {_case(loop, w): [] for loop, w in cases}
    all_runs: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    try:
        # Loops interleaved per rate, so a change in the machine's load hits both alike.
        for rate in rates:
            for loop, w in cases:
                runs = []
                for k in range(args.repeat):
                    print(f"  running {rate:>6g}/s on {loop:<7} x{w} {k + 1}/{args.repeat} ...", end=" ", flush=True)
                    r = spawn(rate, loop, w, port, server.pid, args)
                    print(f"p99 {_ms(r['delay_p99_s'])} ms, ok {r['ok']}/{r['n_requests']}"
                          + (f" (first error: {r['first_error']})" if r.get("first_error") else "")
                          + (f" [saturated: {r['saturation_reason']}]" if r.get("saturated") else "")
                          + (f" [FAILED: {r['failed']}]" if r.get("failed") else ""), flush=True)
                    if r.get("profile"):
                        print(r.pop("profile"))
                    runs.append(r)
                    all_runs.append(r)
                rows[_case(loop, w)].append(median_row(runs))
    finally:
        stop_server(server)
    print(f"\n  total {time.perf_counter() - t_start:.0f} s\n")

    print("Figures (delay = sent - target; lag = dispatched - target; rates between the first and last send"
          + (f"; median of {args.repeat} runs" if args.repeat > 1 else "") + ")")
    print_rows([r for key in rows for r in rows[key]])
    print()
    print(f"Highest rate with p99 schedule delay < {P99_TARGET_S * 1e3:g} ms and every request ok "
          f"(goal: >= {GOAL_RATE:g} requests/s):")
    verdicts = {}
    for key in rows:
        contiguous, best = verdict(rows[key])
        verdicts[key] = {"contiguous": contiguous, "highest": best}
        met = contiguous is not None and contiguous >= GOAL_RATE
        extra = f" (a higher rate, {best:g}/s, passed too, after a failure)" if best != contiguous and best is not None else ""
        print(f"  {key:<12} {_fmt(contiguous, 'g')} requests/s{extra}  [{'met' if met else 'not met'}]")

    if args.json:
        payload = {"date": now, "machine": machine_line(), "load_avg_at_start": load, "args": vars(args),
                   "runs": all_runs, "rows": rows, "verdicts": verdicts}
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
