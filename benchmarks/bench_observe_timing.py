"""Wall-clock figures of the observer, the emulated server and the real server.

The tests of ``tests/observe`` and ``tests/real`` assert only what does not depend on how fast
or how busy the machine is (exact relations between the client's and the server's stamps, and
allowances derived from the event loop's lag measured during the run). The wall-clock figures
those tests used to hold to fixed bands are printed here instead. Run from the repository root,
with the package and its ``test`` and ``real-server`` extras installed::

    python -m benchmarks.bench_observe_timing                          # every section, 3 runs (~1.5 min)
    python -m benchmarks.bench_observe_timing --sections truth,replay --runs 10
    python -m benchmarks.bench_observe_timing --sections real          # llama.cpp only (~45 s)

Each section reproduces the workload of a test, imported from it so that both stay the same:

``truth`` (tests/observe/emulate/test_truth.py, first test)
    40 requests sent open loop to an in-process emulated server. Per run: the deviation
    observed - predicted of TTFT (streamed) and E2E, split into the arrival gap (server's arrival
    stamp - client's send) and the delivery lateness (client's reception - simulated due time),
    and the lateness of a timer on the event loop (``tests/observe/lag.py``), p50 / p99 / max, ms.
``replay`` (tests/observe/test_observe_cli.py)
    The observe workload (open-loop and multi-turn clients) sent to ``simpy-llm serve`` by
    :func:`simpy_llm.observe.run.observe`; the observer's trace is replayed at its send times and
    the predicted TTFT (streamed) and E2E compared with the observed ones: p50 / p90 / max |error|
    and the requests off by more than 10 ms. This was the test's band (90% within 10 ms); it
    moves with the loopback delay between send and arrival, so with the machine's load.
``real`` (tests/real/)
    The llama.cpp server of the tests (1 thread, 4 slots): the 30 open-loop completions of
    ``test_open_loop_completions`` (TTFT per prompt token and inter-token latency, p10 / p50 /
    p90, ms; the test's former bands were medians within 1-30 ms and 2-400 ms) and the
    closed-loop chat of ``test_multi_turn.py`` (TTFT per prompt token median and max, the former
    band was a max below 30 ms; median inter-token gap).

This is a benchmark, not a test: it asserts nothing. The header prints the load average; the
figures grow with other work on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from benchmarks.bench_quickstart import machine_info

SECTIONS = ("truth", "replay", "real")


def _pcts(values: Any, qs: tuple[float, ...]) -> str:
    """Percentiles of *values* (seconds) in ms, e.g. ``"1.2 / 3.4 / 5.6"``."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return "-"
    return " / ".join(f"{np.quantile(v, q) * 1e3:.1f}" if q < 1 else f"{v.max() * 1e3:.1f}" for q in qs)


# --------------------------------------------------------------------------------------- truth
def truth_run() -> dict[str, Any]:
    """One run of the truth test's in-process workload; the arrays of its figures, s."""
    from simpy_llm import scenario_from_dict
    from simpy_llm.observe.emulate import EmulatedServer
    from tests.observe.emulate.conftest import SLOW
    from tests.observe.emulate.test_truth import _observe, _predict, _workload
    from tests.observe.lag import LagProbe, perf_minus_loop_s

    scenario = scenario_from_dict(copy.deepcopy(SLOW))
    rows = _workload(40, seed=11)
    with tempfile.TemporaryDirectory() as tmp:
        served = Path(tmp) / "served"

        async def go() -> tuple[Any, LagProbe, float]:
            async with EmulatedServer(scenario, trace=served) as server:
                async with LagProbe() as probe:
                    seen = await _observe(server.url, rows)
                assert server.driver is not None
                origin = server.driver.loop_time(0.0) + perf_minus_loop_s(asyncio.get_running_loop())
            return seen, probe, origin

        seen, probe, origin = asyncio.run(go())
        predicted = _predict(scenario, served)
    out: dict[str, list[float]] = {"ttft": [], "e2e": [], "arrival": [], "delivery": []}
    for row in rows:
        i = row["request_id"]
        s, pred = seen[i], predicted.loc[f"r{i}"]
        rec = s.record
        out["e2e"].append(rec.e2e_s - pred.e2e_s)
        out["arrival"].append(origin + pred.arrival_s - s.at(rec.sent_s))
        out["delivery"].append(s.at(rec.done_s) - (origin + pred.completion_s))
        if row["streaming"]:
            out["ttft"].append(rec.ttft_s - pred.ttft_s)
            out["delivery"].append(s.at(rec.first_content_s) - (origin + pred.first_token_s))
    return {**out, "loop": probe.latenesses_s().tolist()}


def truth_section(runs: int) -> None:
    print("truth: 40 requests open loop to an in-process emulated server (tests/observe/emulate/test_truth.py)")
    print(
        "  p50 / p99 / max, ms      observed - predicted TTFT   observed - predicted E2E   arrival gap       "
        "delivery lateness   loop timer lateness"
    )
    for k in range(runs):
        r = truth_run()
        qs = (0.5, 0.99, 1.0)
        print(f"  run {k + 1:<3}                  {_pcts(r['ttft'], qs):<27} {_pcts(r['e2e'], qs):<26} "
              f"{_pcts(r['arrival'], qs):<17} {_pcts(r['delivery'], qs):<19} {_pcts(r['loop'], qs)}", flush=True)
    print()


# -------------------------------------------------------------------------------------- replay
def replay_run() -> dict[str, Any]:
    """One observe run against ``simpy-llm serve``, its trace replayed at its send times."""
    from simpy_llm import Simulation, load_scenario
    from simpy_llm.config.schema import TraceSource, WorkloadConfig
    from simpy_llm.observe.run import observe
    from simpy_llm.workload.traces import read_trace_v2
    from tests.observe.serve_process import serve_process
    from tests.observe.test_observe_cli import _scenario_file

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        scenario_file = _scenario_file(tmp)
        with serve_process(scenario_file, tmp) as server:
            observe(scenario_file, server.url, tmp / "run")
        trace = tmp / "run" / "trace.csv"
        replay = attrs.evolve(
            load_scenario(scenario_file),
            workload=WorkloadConfig(traces=(TraceSource(path=str(trace), arrival_column="send_time_us"),)),
        )
        predicted = Simulation(replay).run().to_dataframe().sort_values("arrival_s", kind="stable").reset_index(drop=True)
        f = read_trace_v2(trace).frame.sort_values("send_time_us", kind="stable").reset_index(drop=True)
    sent = f.send_time_us.to_numpy(dtype=float)
    e2e = np.abs((f.done_time_us.to_numpy(dtype=float) - sent) / 1e6 - predicted.e2e_s.to_numpy())
    streamed = f.streaming.to_numpy(dtype=bool)
    ttft = np.abs((f.first_token_time_us.to_numpy(dtype=float) - sent) / 1e6 - predicted.ttft_s.to_numpy())[streamed]
    return {"n": len(f), "ttft": ttft, "e2e": e2e}


def replay_section(runs: int) -> None:
    print("replay: the observer's trace replayed at its send times (tests/observe/test_observe_cli.py)")
    print("  |observed - predicted|    TTFT p50 / p90 / max ms   > 10 ms    E2E p50 / p90 / max ms   > 10 ms   requests")
    for k in range(runs):
        r = replay_run()
        qs = (0.5, 0.9, 1.0)
        print(f"  run {k + 1:<3}                  {_pcts(r['ttft'], qs):<25} {int((r['ttft'] > 0.01).sum()):<10} "
              f"{_pcts(r['e2e'], qs):<24} {int((r['e2e'] > 0.01).sum()):<9} {r['n']}", flush=True)
    print()


# ---------------------------------------------------------------------------------------- real
def real_section() -> None:
    from simpy_llm.observe.client import OpenAIClient
    from simpy_llm.observe.llamacpp import LlamaCppConfig, LlamaCppServer
    from simpy_llm.observe.loadgen import LoadGenerator
    from simpy_llm.observe.run import observe
    from simpy_llm.workload.traces import read_trace_v2
    from tests.real.conftest import CTX_PER_SLOT, PARALLEL, THREADS
    from tests.real.test_llamacpp import NO_CACHE, _open_loop
    from tests.real.test_multi_turn import _workload as chat_workload

    print(f"real: llama.cpp, Gemma 3 270M Q4_K_M, {THREADS} thread(s), {PARALLEL} slots (tests/real/)")
    config = LlamaCppConfig(port=0, parallel=PARALLEL, threads=THREADS, ctx=PARALLEL * CTX_PER_SLOT)
    with LlamaCppServer(config, startup_timeout_s=120.0) as server:
        assert server.url is not None
        requests = _open_loop(30, rate_per_s=1.0, seed=20261123)

        async def go() -> LoadGenerator:
            async with OpenAIClient(server.url, timeout_s=60.0) as client:  # type: ignore[arg-type]
                gen = LoadGenerator(client, requests, endpoint="completions", extra_body=NO_CACHE, lag_threshold_s=1e9)
                await gen.run()
                return gen

        gen = asyncio.run(go())
        ok = [r for r in gen.records.values() if r.status == "ok" and r.ttft_s is not None and r.prompt_tokens]
        per_token = [r.ttft_s / r.prompt_tokens for r in ok]  # type: ignore[operator]
        itl = [g for r in ok for g in r.itl_s]
        qs = (0.1, 0.5, 0.9)
        print(f"  open loop, 30 completions at 1/s: {len(ok)}/30 ok; TTFT per prompt token p10 / p50 / p90 "
              f"{_pcts(per_token, qs)} ms; inter-token latency p10 / p50 / p90 {_pcts(itl, qs)} ms", flush=True)

        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            out = tmp / "run"
            observe(chat_workload(tmp), server.url, out, api="chat", timeout_s=120.0)
            f = read_trace_v2(out / "trace").frame
        f = f[f.status == "ok"]
        per_token = ((f.first_token_time_us - f.send_time_us) / 1e6 / f.input_tokens).to_numpy(dtype=float)
        itl = ((f.last_chunk_time_us - f.first_token_time_us) / 1e6 / (f.output_tokens - 1)).to_numpy(dtype=float)
        print(f"  closed-loop chat, {len(f)} rounds: TTFT per prompt token p50 / max {_pcts(per_token, (0.5, 1.0))} ms; "
              f"mean inter-token gap per round p50 {_pcts(itl, (0.5,))} ms", flush=True)
    print()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)} (default: all)")
    p.add_argument("--runs", type=int, default=3, help="runs of the truth and replay sections (default 3)")
    args = p.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown or args.runs < 1:
        p.error(f"unknown section(s) {', '.join(unknown)}" if unknown else "--runs must be >= 1")
    info = machine_info()
    print("simpy_llm observer timing figures")
    print(f"  date      {info['date']}")
    print(f"  machine   {info['cpu']}, {info['usable_cores']} usable core(s), {info['os']}, Python {platform.python_version()}")
    if hasattr(os, "getloadavg"):
        print("  load avg  {:.2f} {:.2f} {:.2f} (1/5/15 min; other busy processes lengthen every figure)".format(*os.getloadavg()))
    print(f"  git       {info['git']}")
    print(flush=True)
    if "truth" in sections:
        truth_section(args.runs)
    if "replay" in sections:
        replay_section(args.runs)
    if "real" in sections:
        real_section()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
