"""Peak memory of streamed records: the quickstart at 100k and 1M requests, records streamed.

Each case runs in a fresh process (``--case N``, started by the parent) so that its peak RSS
is its own. Printed per case: peak RSS after imports, after ``run()`` (records streamed in
chunks) and after ``summary()`` (which reads the chunks back a column at a time), the wall
times, the chunks written and the distinct values of the engine's inter-token gap tally
(which stays in memory: one value and its weight per distinct gap). The target: peak RSS
at 1M within 20 % of that at 100k.

    python -m benchmarks.bench_stream                       # 100k and 1M, Parquet if pyarrow
    python -m benchmarks.bench_stream --cases 100000 --repeat 3 --chunk 65536 --memory
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _case(requests: int, chunk: int, memory: bool) -> dict[str, float]:
    import pandas  # noqa: F401 - imported before the first figure: both modes' chunks need it

    from simpy_llm import Simulation, load_scenario
    from simpy_llm.metrics.stream import stream_format

    if stream_format() == "parquet":
        import pyarrow.parquet  # noqa: F401 - imported before the first figure, as the chunks will

    pre = _rss_mb()
    scenario = load_scenario("scenarios/quickstart.yaml", [f"workload.num_requests={requests}"])
    with tempfile.TemporaryDirectory() as d:
        sim = Simulation(scenario) if memory else Simulation(scenario, stream_to=d, stream_chunk_requests=chunk)
        t0 = time.perf_counter()
        results = sim.run(progress=False)
        run_s = time.perf_counter() - t0
        after_run = _rss_mb()
        t0 = time.perf_counter()
        summary = results.summary()
        summary_s = time.perf_counter() - t0
        after_summary = _rss_mb()
        chunks = 0 if results.streamed_records is None else len(results.streamed_records.files)
    return {
        "requests": requests, "completed": summary["requests"]["completed"], "chunks": chunks,
        "rss_pre_mb": pre, "rss_run_mb": after_run, "rss_summary_mb": after_summary,
        "run_s": run_s, "summary_s": summary_s, "itl_distinct": len(results._recorder.itl.arrays()[0]),  # noqa: SLF001 - the engine's tally
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="100000,1000000", help="request counts, comma-separated")
    p.add_argument("--repeat", type=int, default=1, help="runs per case, alternated (each in a fresh process)")
    p.add_argument("--chunk", type=int, default=16_384, help="records per chunk")
    p.add_argument("--memory", action="store_true", help="records in memory instead (the comparison)")
    p.add_argument("--case", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case is not None:
        print(json.dumps(_case(args.case, args.chunk, args.memory)))
        return
    cases = [int(c) for c in args.cases.split(",")]
    print(f"# {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, load {os.getloadavg()[0]:.2f}; "
          f"{'in memory' if args.memory else f'streamed, chunks of {args.chunk}'}")
    print("requests  chunks  RSS pre MB  RSS run MB  RSS summary MB  run s  summary s  ITL values")
    peaks: dict[int, list[float]] = {c: [] for c in cases}
    for _ in range(args.repeat):
        for n in cases:  # alternated: each round runs every case once
            cmd = [sys.executable, "-m", "benchmarks.bench_stream", "--case", str(n), "--chunk", str(args.chunk)]
            out = json.loads(subprocess.run([*cmd, *(["--memory"] if args.memory else [])], check=True,
                                            capture_output=True, text=True).stdout)
            peaks[n].append(out["rss_summary_mb"])
            print(f"{n:>8}  {out['chunks']:>6}  {out['rss_pre_mb']:>10.0f}  {out['rss_run_mb']:>10.0f}  "
                  f"{out['rss_summary_mb']:>14.0f}  {out['run_s']:>5.1f}  {out['summary_s']:>9.2f}  {out['itl_distinct']:>10,}")
    if len(cases) >= 2:
        lo, hi = cases[0], cases[-1]
        ratio = max(peaks[hi]) / max(peaks[lo])
        print(f"peak RSS {hi} / {lo}: {ratio:.3f} (target <= 1.20: {'PASS' if ratio <= 1.2 else 'FAIL'})")


if __name__ == "__main__":
    main()
