"""The load generator's own CPU per request, without sockets: what its Python path costs.

Run from the repository root::

    python -m benchmarks.bench_loadgen_memory                       # 20,000 requests at 10,000/s, 3 runs
    python -m benchmarks.bench_loadgen_memory --requests 5000 --rate 2000 --repeat 5

Each run, in a fresh process, sends an open-loop workload through a
:class:`~simpy_llm.observe.LoadGenerator` and the client's lean transport on uvloop, writing
a trace, exactly as ``bench_loadgen.py`` does against its no-op server, except that the
connections are in memory: the pool is given idle connections whose transport answers each
request, on the event loop's next step, with the no-op server's streamed answer
(``noop_sse_server.build_responses``: a role chunk, 4 content chunks, usage, ``[DONE]``). No
``send`` or ``recv``, no polling of sockets, no server on the machine: the figure is the
client's CPU (``time.process_time``) from the run's start to its end (summary included, the
bodies built before it) per request, the part that a shared machine's load moves least, and the
part that a change of the load generator's code changes. ``bench_loadgen.py`` measures the
whole, sockets included.

It stands a benchmark's in-memory connections in for the network through the transport's
internals (``OpenAIClient._lean``, ``lean._Connection``); it asserts nothing and prints figures
(the schedule delay it prints is not a network client's: the answers come at once).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
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
RESULT_TAG = "BENCH_RESULT "
CONNECTIONS = 4000
"""In-memory connections given to the pool: more than a run in this process ever holds at once."""


def _answer() -> bytes:
    spec = importlib.util.spec_from_file_location("noop_sse_server", Path(__file__).with_name("noop_sse_server.py"))
    assert spec is not None and spec.loader is not None
    noop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noop)
    return bytes(noop.build_responses(4)["chat_stream"])


def run_case(n: int, rate: float, prepare_bytes: int | None = None) -> dict[str, Any]:
    """One run of *n* requests at *rate*: CPU per request and the outcome (*prepare_bytes*: the
    generator's, default its own)."""
    from simpy_llm.observe import lean, run_loop
    from simpy_llm.observe.client import OpenAIClient
    from simpy_llm.observe.loadgen import OBSERVER_COLUMNS, LoadGenerator
    from simpy_llm.workload.traces import TraceV2Writer

    answer = _answer()

    class Transport:
        """Answers every request written on the next step of the loop; closing loses the connection."""

        def __init__(self, conn: Any) -> None:
            self.conn = conn
            self.loop = asyncio.get_running_loop()

        def write(self, data: bytes) -> None:
            self.loop.call_soon(self.conn.data_received, answer)

        def close(self) -> None:
            self.loop.call_soon(self.conn.connection_lost, None)

        def is_closing(self) -> bool:
            return False

    out: dict[str, Any] = {}

    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            async with OpenAIClient("http://127.0.0.1:1", model="noop", transport="lean", keep_alive=True, timeout_s=30.0) as client:
                pool = client._lean
                assert pool is not None, "the lean transport needs httptools"
                pool.idle_s = math.inf  # in-memory connections are never closed for idling
                reqs = [{"arrival_time_s": 0.05 + i / rate, "input_tokens": 1000, "output_tokens": 16} for i in range(n)]
                with TraceV2Writer(Path(tmp) / "trace", extra_columns=OBSERVER_COLUMNS) as writer:
                    window = {} if prepare_bytes is None else {"prepare_bytes": prepare_bytes}
                    gen = LoadGenerator(client, reqs, writer, model="noop", lag_threshold_s=math.inf, **window)
                    ahead = gen.prepare()  # the bodies that fit, before the run's clock starts
                    for _ in range(CONNECTIONS):
                        conn = lean._Connection(pool)
                        conn.connection_made(Transport(conn))  # type: ignore[arg-type]
                        pool._all.add(conn)
                        pool.release(conn)
                    cpu0 = time.process_time()
                    summary = await gen.run()
                    cpu = time.process_time() - cpu0
        out.update(cpu_us_per_request=cpu / n * 1e6, status_counts=summary.status_counts, built_ahead=ahead,
                   delay_p99_s=summary.schedule_delay_p99_s)

    run_loop(main(), loop="uvloop")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_loadgen_memory",
                                description="The load generator's CPU per request with in-memory connections.")
    p.add_argument("--requests", type=int, default=20_000, help="requests per run (default 20,000)")
    p.add_argument("--rate", type=float, default=10_000.0, help="target requests/s (default 10,000)")
    p.add_argument("--repeat", type=int, default=3, help="runs, each in a fresh process (default 3)")
    p.add_argument("--prepare-bytes", type=int, default=None, metavar="N",
                   help="LoadGenerator(prepare_bytes=N): bodies built before the clock starts; the rest are "
                        "built during the run, and counted (default: the generator's own)")
    p.add_argument("--case", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.case:
        print(RESULT_TAG + json.dumps(run_case(args.requests, args.rate, args.prepare_bytes)), flush=True)
        return 0
    load = os.getloadavg()
    print(f"load generator CPU per request, in-memory connections: {args.requests} requests at {args.rate:g}/s; "
          f"Python {platform.python_version()}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))}
    figures = []
    for k in range(args.repeat):
        cmd = [sys.executable, "-m", "benchmarks.bench_loadgen_memory", "--case",
               "--requests", str(args.requests), "--rate", repr(args.rate)]
        if args.prepare_bytes is not None:
            cmd += ["--prepare-bytes", str(args.prepare_bytes)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
        line = next((x for x in proc.stdout.splitlines() if x.startswith(RESULT_TAG)), None)
        if line is None:
            print(f"  run {k + 1}: failed: {proc.stderr.strip().splitlines()[-1:] or proc.returncode}")
            continue
        r = json.loads(line[len(RESULT_TAG):])
        figures.append(r["cpu_us_per_request"])
        print(f"  run {k + 1}: {r['cpu_us_per_request']:.1f} us/request  {r['status_counts']}, "
              f"{r['built_ahead']} bodies built before the clock", flush=True)
    if figures:
        print(f"median {statistics.median(figures):.1f} us/request (range {min(figures):.1f}-{max(figures):.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
