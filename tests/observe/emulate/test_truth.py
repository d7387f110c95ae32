"""The truth test: what a client measures against the emulated server is what the simulator predicts.

A workload is sent open-loop with the observer's :class:`LoadGenerator` (chat and completions,
streamed and not); the server writes the arrivals it saw as a trace v2; the scenario is then
simulated offline with that trace as its workload (:func:`replay_scenario`, the normal replay
path). For every request:

* the server's simulated first-token and completion times equal the offline prediction
  exactly (the same simulation, driven by the same microsecond arrival times);
* the client's observed TTFT and E2E equal the predicted ones within :data:`TOLERANCE_S`.

Tolerance: the observed latencies start at the client's send and end when the bytes are read,
the predicted ones run from the server's arrival stamp to the simulated time. The gap is a
localhost connection and request parse (about 1 ms), timer lateness of the event loop (epoll
waits in whole milliseconds, so up to about 1 ms), and the time to write and read a chunk
while a few dozen streams share one Python process (a few ms at worst). 15 ms covers that with a
margin for a busy test machine while staying far below the latencies checked (20 ms to
about a second) and near one engine step (15-30 ms): a token sent a step early or late fails.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pandas as pd
import yaml

from simpy_llm import Scenario, Simulation, load_scenario
from simpy_llm.observe.emulate import EmulatedServer, replay_scenario
from simpy_llm.observe import LoadGenerator, OpenAIClient, RequestRecord, RequestSpec
from simpy_llm.observe.loadgen import LoadRequest
from simpy_llm.workload.traces import read_trace_v2
from tests.observe.serve_process import serve_process

TOLERANCE_S = 0.015
"""Largest accepted |observed - predicted| for TTFT and E2E (see the module docstring)."""
QUIET = 1e9  # the load generator's lag warning is not what these tests check


class _Tagged(LoadGenerator):
    """Sends each request's id as its ``user`` field: the server records it as the client id,
    so its trace rows (and the offline prediction) can be matched to the client's records."""

    def spec(self, req: LoadRequest) -> RequestSpec:
        spec = super().spec(req)
        return attrs.evolve(spec, extra_body={**spec.extra_body, "user": f"r{req.request_id}"})


def _workload(n: int, seed: int) -> list[dict[str, Any]]:
    """*n* requests: a burst of 6 long ones 4-10 ms apart (the KV cache overflows: preemptions),
    then requests 50-150 ms apart. Even ids go to chat, odd ones to completions, and streaming
    alternates in pairs, so every endpoint is seen streamed and not."""
    rng = np.random.default_rng(seed)
    burst = np.arange(n) < 6
    gaps = np.where(burst, rng.uniform(0.004, 0.01, n), rng.uniform(0.05, 0.15, n))
    times = np.cumsum(gaps) + 0.05
    inputs = np.where(burst, rng.integers(250, 320, n), rng.integers(20, 320, n))
    outputs = np.where(burst, rng.integers(30, 40, n), rng.integers(2, 40, n))
    return [
        {
            "request_id": i,
            "arrival_time_s": float(times[i]),
            "input_tokens": int(inputs[i]),
            "output_tokens": int(outputs[i]),
            "streaming": (i // 2) % 2 == 0,
        }
        for i in range(n)
    ]


async def _observe(url: str, rows: list[dict[str, Any]]) -> dict[int, RequestRecord]:
    """Send *rows* open-loop (two load generators, one per endpoint, started together)."""
    async with OpenAIClient(url) as chat, OpenAIClient(url) as completions:
        gens = [
            _Tagged(chat, [r for r in rows if r["request_id"] % 2 == 0], endpoint="chat", lag_threshold_s=QUIET),
            _Tagged(completions, [r for r in rows if r["request_id"] % 2 == 1], endpoint="completions", lag_threshold_s=QUIET),
        ]
        await asyncio.gather(*(g.run() for g in gens))
    return {i: rec for g in gens for i, rec in g.records.items()}


def _predict(scenario: Scenario, trace: Path) -> pd.DataFrame:
    """The offline prediction: the scenario replaying the served trace, indexed by client id."""
    return Simulation(replay_scenario(scenario, trace)).run().to_dataframe().set_index("client_id")


def _check(rows: list[dict[str, Any]], records: dict[int, RequestRecord], predicted: pd.DataFrame) -> dict[str, float]:
    """Assert every request matches its prediction; returns the largest deviations."""
    assert len(predicted) == len(rows) and (predicted.status == "completed").all()
    worst = {"ttft": 0.0, "e2e": 0.0}
    for row in rows:
        i = row["request_id"]
        rec, pred = records[i], predicted.loc[f"r{i}"]
        assert rec.status == "ok", rec.error_message
        assert (rec.prompt_tokens, rec.completion_tokens) == (row["input_tokens"], row["output_tokens"])
        assert (pred.prompt_tokens, pred.output_tokens) == (row["input_tokens"], row["output_tokens"])
        assert rec.e2e_s is not None and rec.ttft_s is not None
        e2e = rec.e2e_s - pred.e2e_s
        worst["e2e"] = max(worst["e2e"], abs(e2e))
        assert abs(e2e) <= TOLERANCE_S, (i, rec.e2e_s, pred.e2e_s)
        if row["streaming"]:
            assert len(rec.content_times_s) == row["output_tokens"]
            ttft = rec.ttft_s - pred.ttft_s
            worst["ttft"] = max(worst["ttft"], abs(ttft))
            assert abs(ttft) <= TOLERANCE_S, (i, rec.ttft_s, pred.ttft_s)
        else:
            assert rec.ttft_s == rec.e2e_s  # the whole body at once
    return worst


def _assert_workload_mattered(predicted: pd.DataFrame) -> None:
    """The scenario is not trivial: requests queued, were preempted, and spread over a wide latency range."""
    assert (predicted.queue_delay_s > 0.01).sum() >= 5
    assert predicted.num_preemptions.sum() > 0
    assert predicted.ttft_s.max() > 0.2 and predicted.e2e_s.max() > 0.5


def test_observed_ttft_and_e2e_match_the_offline_simulation(slow_scenario: Scenario, tmp_path: Path) -> None:
    """40 requests (chat and completions, streamed and not) sent open-loop to an in-process
    server: each one's observed TTFT and E2E are within 15 ms of the offline simulation of the
    served trace, and the server's own simulated times equal that simulation's exactly."""
    rows = _workload(40, seed=11)

    async def go() -> tuple[dict[int, RequestRecord], list[Any]]:
        async with EmulatedServer(slow_scenario, trace=tmp_path / "served") as server:
            records = await _observe(server.url, rows)
        return records, server.served

    records, served = asyncio.run(go())
    predicted = _predict(slow_scenario, tmp_path / "served")
    _assert_workload_mattered(predicted)
    for s in served:
        pred = predicted.loc[s.client_id]
        assert (s.arrival_s, s.first_token_s, s.completion_s) == (pred.arrival_s, pred.first_token_s, pred.completion_s)
    _check(rows, records, predicted)


def test_cli_server_matches_the_offline_simulation(slow_data: dict, tmp_path: Path) -> None:
    """`simpy-llm serve` started as a process (port 0, --trace): after /health answers, 20
    requests get observed TTFT and E2E within 15 ms of the offline simulation of its trace;
    SIGTERM (sent to its PID) stops it cleanly with exit status 0."""
    scenario_file = tmp_path / "slow.yaml"
    scenario_file.write_text(yaml.safe_dump(slow_data))
    with serve_process(scenario_file, tmp_path, "--trace", str(tmp_path / "served")) as server:
        rows = _workload(20, seed=5)
        records = asyncio.run(_observe(server.url, rows))
    assert server.returncode == 0, server.output.read_text()
    assert "stopped after 20 requests" in server.output.read_text()
    predicted = _predict(load_scenario(scenario_file), tmp_path / "served")
    assert len(read_trace_v2(tmp_path / "served")) == 20
    _check(rows, records, predicted)
