"""Sharded runs (``simpy_llm.explore.sharded``): an 8-cluster, 64-replica fleet, one process against several.

The fleet: 8 clusters of 8 replicas (Llama-3.1-8B on H100, TP 1, BLIS coefficients), the
cluster router ``least_loaded`` over views refreshed every Δ with every field, each
cluster's router ``jsq``; one Poisson client at ``--rate`` requests/s (default 640: about
half the fleet's capacity), ``--requests`` requests (default 1M).

Cases, alternated within each round (each run in a fresh process, so none warms the next):

``single``
    ``Simulation(scenario).run()``: the reference, one process.
``serial``
    ``run_sharded(scenario, shards=8)`` in this process, one shard after another: the
    cost of sharding itself (the coordinator, the windows, the merge).
``workers``
    ``run_sharded(scenario, client=...)`` on a Dask ``LocalCluster`` of ``--workers``
    worker processes (one thread each) made with ``QUIET_WORKERS`` (as ``run_sharded(...,
    workers=N)`` makes its own), started before the clock starts, each having
    imported the library before it (``client.run``), as the ``single`` case's process has
    before its clock; eight shards (one per cluster), four per worker.
``workers_dask_defaults``
    the same on a cluster with Dask's default settings (what ``QUIET_WORKERS`` saves).

Printed per run: wall seconds of the run (building it included; the Dask cluster's start
not), the CPU seconds of each process (the coordinator's, and each worker's: the slot's own
and Dask's), the windows, the coordinator's share (routing, while the slots wait; it makes the
next window's arrivals while they advance), the wait for the shards per window (each slot's
CPU before its shards advance, and after replying, making the next window's rows), the
records' return and the merge, and the records' hash (sha256 of ``to_dataframe().to_csv()``: the
same for every case). ``--messages`` adds one more ``serial`` run that pickles every
window's messages and prints their sizes. At the end: each case's min / median / max and
the ratio of the medians of ``single`` to each other case (the speed-up).

    python -m benchmarks.bench_sharded                              # 1M requests, 3 rounds
    python -m benchmarks.bench_sharded --requests 100000 --rounds 3 --messages
    python -m benchmarks.bench_sharded --requests 200000 --delta 1.0 --cases single,workers
    python -m benchmarks.bench_sharded --requests 50000 --deltas 0.05,0.5,2,10   # what Δ does

``--deltas`` prints, per Δ, the single run's TTFT p50/p99 and E2E p99 (the routing's
quality), the windows, both runs' wall times in this process and whether the records match.

This is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

CLUSTERS = 8
PER_CLUSTER = 8


def fleet(requests: int, rate: float, delta: float) -> dict[str, Any]:
    """The benchmark's scenario as plain data."""
    group = {
        "count": PER_CLUSTER,
        "engine": {"max_num_seqs": 128, "max_num_batched_tokens": 4096, "kv_num_blocks": 8192},
        "latency_model": {"kind": "blis_linear", "params": {"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": 1}},
    }
    return {
        "name": "bench_sharded",
        "seed": 11,
        "workload": {
            "aggregate_rate": rate,
            "num_requests": requests,
            "clients": [{
                "id": "users",
                "arrival": {"process": "poisson"},
                "input_distribution": {"type": "lognormal", "params": {"mu": 6.0, "sigma": 0.8}},
                "output_distribution": {"type": "exponential", "params": {"mean": 200}},
            }],
        },
        "serving": {
            "view_refresh_s": delta,
            "view_refresh_fields": "all",
            "cluster_router": {"kind": "least_loaded"},
            "clusters": [
                {"name": f"c{c}", "router": {"kind": "jsq"}, "replica_groups": [{"name": f"c{c}-h100", **group}]}
                for c in range(CLUSTERS)
            ],
        },
    }


def _run(case: str, requests: int, rate: float, delta: float, workers: int, messages: bool) -> dict[str, Any]:
    """One run of *case* in this process; its figures."""
    from simpy_llm import Simulation, scenario_from_dict
    from simpy_llm.explore.sharded import ShardedRun

    scenario = scenario_from_dict(fleet(requests, rate, delta))
    out: dict[str, Any] = {"case": case}
    cpu0 = time.process_time()
    if case == "single":
        t0 = time.perf_counter()
        results = Simulation(scenario).run(progress=False)
        out["wall_s"] = time.perf_counter() - t0
    elif case == "serial":
        run = ShardedRun(scenario, shards=CLUSTERS, measure_messages=messages)
        t0 = time.perf_counter()
        results = run.run()
        out["wall_s"] = time.perf_counter() - t0
    else:
        import dask
        from dask.distributed import Client, LocalCluster

        from simpy_llm.explore.sharded import QUIET_WORKERS

        t0 = time.perf_counter()
        settings = {} if case == "workers_dask_defaults" else QUIET_WORKERS
        with dask.config.set(settings), LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                                                     dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
            # The library's import is not the run's, in either case: the single case's
            # process imported it before its clock too.
            client.run(importlib.import_module, "simpy_llm.explore.sharded_hosts")
            out["cluster_start_s"] = time.perf_counter() - t0
            run = ShardedRun(scenario, client=client, shards=CLUSTERS)
            before = client.run(time.process_time)
            t0 = time.perf_counter()
            results = run.run()
            out["wall_s"] = time.perf_counter() - t0
            after = client.run(time.process_time)
            out["worker_cpu_s"] = [after[a] - before[a] for a in sorted(before)]
    out["cpu_s"] = time.process_time() - cpu0  # this process's: with workers, the coordinator's alone
    if case != "single":
        w = run.windows
        assert w is not None
        out |= {"windows": w.windows, "route_s": w.route_s, "route_cpu_s": w.route_cpu_s, "advance_s": w.advance_s,
                "slowest_s": w.slowest_s, "slowest_cpu_s": w.slowest_cpu_s, "host_busy_s": list(w.host_busy_s),
                "host_cpu_s": list(w.host_cpu_s), "sent_bytes": w.sent_bytes, "reply_bytes": w.reply_bytes,
                "make_s": w.make_s, "make_cpu_s": w.make_cpu_s, "finish_s": w.finish_s, "merge_s": w.merge_s,
                "start_s": w.start_s, "host_prep_cpu_s": list(w.host_prep_cpu_s),
                "host_ahead_cpu_s": list(w.host_ahead_cpu_s)}
    frame = results.to_dataframe()
    out["records"] = len(frame)
    out["sim_s"] = float(results.end_s)
    out["sha256"] = hashlib.sha256(frame.to_csv().encode()).hexdigest()[:12]
    return out


def _child(args: argparse.Namespace, case: str, messages: bool = False) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.bench_sharded", "--child", case, "--requests", str(args.requests),
           "--rate", str(args.rate), "--delta", str(args.delta), "--workers", str(args.workers)]
    if messages:
        cmd.append("--messages")
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _line(r: dict[str, Any]) -> str:
    text = f"{r['case']:8s} {r['wall_s']:8.2f} s (CPU here {r['cpu_s']:.2f} s)  records {r['records']:,}  sim {r['sim_s']:,.0f} s  sha {r['sha256']}"
    if "windows" in r:
        n = r["windows"]
        text += (f"  windows {n:,}  route {r['route_s']:.2f} s ({1e3 * r['route_s'] / n:.2f} ms/window)"
                 f"  wait {r['advance_s']:.2f} s ({1e3 * r['advance_s'] / n:.2f} ms/window)")
        if r["case"].startswith("workers"):
            busy = ", ".join(f"{b:.2f}" for b in r["host_busy_s"])
            cpu = ", ".join(f"{b:.2f}" for b in r["host_cpu_s"])
            prep = ", ".join(f"{b:.2f}" for b in r["host_prep_cpu_s"])
            ahead = ", ".join(f"{b:.2f}" for b in r["host_ahead_cpu_s"])
            text += (f"\n         workers busy {busy} s (CPU {cpu} s, of which {prep} s before the shards advance;"
                     f" and {ahead} s making the next window's rows after replying);"
                     f" slowest per window summed {r['slowest_s']:.2f} s"
                     f" (CPU {r['slowest_cpu_s']:.2f} s); coordinator routing CPU {r['route_cpu_s']:.2f} s, making"
                     f" (overlapped) {r['make_s']:.2f} s (CPU {r['make_cpu_s']:.2f} s); start {r['start_s']:.2f} s,"
                     f" records back {r['finish_s']:.2f} s, merge {r['merge_s']:.2f} s")
            if "worker_cpu_s" in r:
                text += "\n         worker processes' CPU " + ", ".join(f"{c:.2f}" for c in r["worker_cpu_s"]) + " s"
    if "cluster_start_s" in r:
        text += f"  (cluster start {r['cluster_start_s']:.1f} s)"
    if r.get("sent_bytes"):
        text += (f"\n         messages: arrivals {r['sent_bytes'] / 1e6:,.1f} MB ({r['sent_bytes'] / r['records']:.0f} B/request,"
                 f" {r['sent_bytes'] / r['windows'] / 1e3:,.1f} kB/window), snapshots {r['reply_bytes'] / 1e6:,.2f} MB"
                 f" ({r['reply_bytes'] / r['windows']:,.0f} B/window)")
    return text


def delta_table(requests: int, rate: float, deltas: list[float]) -> None:
    """What Δ does to the routing (single run's TTFT) and to a sharded run (its windows and wall
    time in this process), the records checked equal at each Δ."""
    from simpy_llm import Simulation, scenario_from_dict
    from simpy_llm.explore.sharded import ShardedRun

    print(f"delta table: {requests:,} requests at {rate:g}/s")
    print("| Δ s | TTFT p50 ms | TTFT p99 ms | E2E p99 s | windows | single wall s | sharded in process wall s | same records |")
    print("|---|---|---|---|---|---|---|---|")
    for delta in deltas:
        scenario = scenario_from_dict(fleet(requests, rate, delta))
        t0 = time.perf_counter()
        single = Simulation(scenario).run(progress=False)
        single_s = time.perf_counter() - t0
        run = ShardedRun(scenario, shards=CLUSTERS)
        t0 = time.perf_counter()
        sharded = run.run()
        sharded_s = time.perf_counter() - t0
        lat = single.summary()["latency_s"]
        same = sharded.to_dataframe().equals(single.to_dataframe())
        assert run.windows is not None
        print(f"| {delta:g} | {1e3 * lat['ttft']['p50']:.0f} | {1e3 * lat['ttft']['p99']:.0f} | {lat['e2e']['p99']:.2f} | "
              f"{run.windows.windows:,} | {single_s:.1f} | {sharded_s:.1f} | {same} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=640.0)
    parser.add_argument("--delta", type=float, default=2.0, help="the views' refresh period Δ, s (the window)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", default="single,serial,workers")
    parser.add_argument("--messages", action="store_true", help="one more serial run measuring the messages")
    parser.add_argument("--deltas", help="instead: a table of Δ values (comma-separated), in this process")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.deltas:
        delta_table(args.requests, args.rate, [float(d) for d in args.deltas.split(",")])
        return
    if args.child:
        print(json.dumps(_run(args.child, args.requests, args.rate, args.delta, args.workers, args.messages)))
        return
    cases = args.cases.split(",")
    print(f"bench_sharded: {CLUSTERS} clusters x {PER_CLUSTER} replicas, {args.requests:,} requests at {args.rate:g}/s, "
          f"delta {args.delta:g} s, {args.workers} workers; {os.cpu_count()} cores, Python {sys.version.split()[0]}, "
          f"load {os.getloadavg()[0]:.1f}")
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    for k in range(args.rounds):
        for case in cases if k % 2 == 0 else cases[::-1]:
            r = _child(args, case)
            runs[case].append(r)
            print(_line(r), f" load {os.getloadavg()[0]:.1f}", flush=True)
    if args.messages:
        print(_line(_child(args, "serial", messages=True)))
    medians = {c: statistics.median(r["wall_s"] for r in rs) for c, rs in runs.items() if rs}
    for case, rs in runs.items():
        walls = sorted(r["wall_s"] for r in rs)
        ratio = f"  speed-up over single {medians['single'] / medians[case]:.2f}x" if "single" in medians else ""
        print(f"{case:8s} min {walls[0]:.2f}  median {medians[case]:.2f}  max {walls[-1]:.2f} s{ratio}")
    hashes = {r["sha256"] for rs in runs.values() for r in rs}
    print("records identical in every run" if len(hashes) == 1 else f"records DIFFER: {sorted(hashes)}")


if __name__ == "__main__":
    main()
