"""The truth test: what a client measures against the emulated server is what the simulator predicts.

A workload is sent open-loop with the observer's :class:`LoadGenerator` (chat and completions,
streamed and not); the server writes the arrivals it saw as a trace v2; the scenario is then
simulated offline with that trace as its workload (:func:`replay_scenario`, the normal replay
path). For every request:

* **exact**: the server's simulated arrival, first-token and completion times equal the offline
  prediction (the same simulation, driven by the same microsecond arrival times);
* **exact, on one clock**: the client sent the request before the server stamped its arrival, the
  server stamped it before the response headers reached the client, and the first token
  (streamed) and the end of the answer reached the client no earlier than their simulated times.
  The observed TTFT (or E2E) minus the predicted one is ``(arrival - sent) + (received - due)``,
  so both terms being >= 0 is the statement that the client never sees a token early;
* **derived from the event loop's lag measured during the run**: each term is at most what the
  loop's hold-ups in that request's own window explain (:class:`tests.observe.lag.LagProbe`: a
  timer on the same loop, due every 2 ms, whose lateness is recorded): ``WORK_S +
  turns * (largest lateness in the window + probe period)``, with :data:`ENTRY_TURNS` turns from
  the send to the arrival stamp (connect, accept, read, handler) and :data:`EXIT_TURNS` from a
  token's due time to the client's stamp (the server's timer writes it, the client reads it). On
  an idle machine that is about 7 ms for a delivery and 11 ms for an arrival; a token sent a step
  (15-30 ms) late fails unless the loop was held up for as long at that very moment.

With the server in this process (first test) the client, the server and the probe share one
loop, and the server's clock is read against the client's directly. With ``simpy-llm serve`` as
a process (second test) the server's time origin is not known to the client: the exact relations
above must then hold for one origin for all requests (which checks the server's time base), and
the lag-derived bounds use the least favourable origin in the feasible interval. The server
process's own hold-ups are invisible to this process's probe; one more turn of the longer of the
longest hold-up this process saw while the requests ran and the most the server's own timer fired
late (the served trace's ``emulator_timing``) stands for them.
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
from simpy_llm.observe import LoadGenerator, ObservedRequest, OpenAIClient, RequestSpec
from simpy_llm.observe.emulate import EmulatedServer, replay_scenario
from simpy_llm.observe.loadgen import LoadRequest
from simpy_llm.workload.traces import read_trace_v2, us_from_s
from tests.observe.lag import LagProbe, perf_minus_loop_s
from tests.observe.serve_process import serve_process

SLACK_S = 1e-5
"""Allowed in the exact comparisons across the client's and the server's clocks: reading their
offset (under a microsecond) and whole-microsecond trace stamps."""
ENTRY_TURNS = 4
"""Loop turns from the client's send to the server's arrival stamp (connect, accept, read, handler)."""
EXIT_TURNS = 2
"""Loop turns from a token's due time to the client's stamp (the server's timer writes it, the client reads it)."""
QUIET = 1e9  # the load generator's lag warning is not what these tests check


class _Tagged(LoadGenerator):
    """Sends each request's id as its ``user`` field: the server records it as the client id,
    so its trace rows (and the offline prediction) can be matched to the client's records."""

    def spec(self, req: LoadRequest) -> RequestSpec:
        spec = super().spec(req)
        return attrs.evolve(spec, extra_body={**spec.extra_body, "user": f"r{req.request_id}"})


@attrs.frozen
class _Seen:
    """A request as the client measured it, with its client's clock origin (``perf_counter`` s)."""

    record: ObservedRequest
    base_s: float

    def at(self, t_s: float | None) -> float:
        """A record time as an absolute ``perf_counter`` time."""
        assert t_s is not None
        return self.base_s + t_s


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


async def _observe(url: str, rows: list[dict[str, Any]]) -> dict[int, _Seen]:
    """Send *rows* open-loop (two load generators, one per endpoint, started together)."""
    async with OpenAIClient(url) as chat, OpenAIClient(url) as completions:
        gens = [
            _Tagged(chat, [r for r in rows if r["request_id"] % 2 == 0], endpoint="chat", lag_threshold_s=QUIET),
            _Tagged(completions, [r for r in rows if r["request_id"] % 2 == 1], endpoint="completions", lag_threshold_s=QUIET),
        ]
        await asyncio.gather(*(g.run() for g in gens))
    return {i: _Seen(rec, g.client.run_start) for g in gens for i, rec in g.records.items()}


def _predict(scenario: Scenario, trace: Path) -> pd.DataFrame:
    """The offline prediction: the scenario replaying the served trace, indexed by client id."""
    return Simulation(replay_scenario(scenario, trace)).run().to_dataframe().set_index("client_id")


def _check_counts(rows: list[dict[str, Any]], seen: dict[int, _Seen], predicted: pd.DataFrame) -> None:
    """Every request completed, with the requested lengths both as the client saw them and as simulated."""
    assert len(predicted) == len(rows) and (predicted.status == "completed").all()
    for row in rows:
        i = row["request_id"]
        rec, pred = seen[i].record, predicted.loc[f"r{i}"]
        assert rec.status == "ok", rec.error_message
        assert (rec.prompt_tokens, rec.completion_tokens) == (row["input_tokens"], row["output_tokens"])
        assert (pred.prompt_tokens, pred.output_tokens) == (row["input_tokens"], row["output_tokens"])
        assert rec.e2e_s is not None and rec.ttft_s is not None
        if row["streaming"]:
            assert len(rec.content_times_s) == row["output_tokens"]
        else:
            assert rec.ttft_s == rec.e2e_s  # the whole body at once


def _check_times(
    rows: list[dict[str, Any]],
    seen: dict[int, _Seen],
    predicted: pd.DataFrame,
    probe: LagProbe,
    origin_s: float | None,
    server_lateness_s: float = 0.0,
) -> None:
    """The exact and the lag-derived timing relations of the module docstring.

    *origin_s* is the absolute ``perf_counter`` time of the server's simulated time 0 (the server
    runs on this loop), or ``None`` for a server in another process: then the origin is solved
    for, and every allowance gets one more turn of the server process's own hold-ups: the
    longest of the hold-up the probe saw between the first send and the last reception and
    *server_lateness_s*, the most the server's timer fired late (its served trace's
    ``emulator_timing.lateness_max_ms``).
    """
    # Per request: (id, sent, headers, simulated arrival, [(what, simulated due, received)]).
    cases = []
    for row in rows:
        i = row["request_id"]
        s, pred = seen[i], predicted.loc[f"r{i}"]
        rec = s.record
        due = [("answer", pred.completion_s, s.at(rec.done_s))]
        if row["streaming"]:
            due.append(("first token", pred.first_token_s, s.at(rec.first_content_s)))
        cases.append((i, s.at(rec.sent_s), s.at(rec.headers_s), pred.arrival_s, due))

    # Exact: sent <= origin + arrival <= headers, and origin + due <= received.
    lows = [(sent - arrival, i, "sent after the server stamped its arrival") for i, sent, _, arrival, _ in cases]
    highs = [(headers - arrival, i, "headers before the arrival stamp") for i, _, headers, arrival, _ in cases]
    highs += [(got - t, i, f"{what} received before its simulated time") for i, _, _, _, due in cases for what, t, got in due]
    lo, hi = max(lows), min(highs)
    server_turn_s = 0.0
    if origin_s is None:
        span = (min(sent for _, sent, *_ in cases), max(got for *_, due in cases for _, _, got in due))
        server_turn_s = max(probe.lateness_s(*span), server_lateness_s) + probe.period_s
    if origin_s is not None:
        assert lo[0] <= origin_s + SLACK_S, (lo[1], lo[2], (lo[0] - origin_s) * 1e3, "ms")
        assert origin_s <= hi[0] + SLACK_S, (hi[1], hi[2], (origin_s - hi[0]) * 1e3, "ms")
        lo_s = hi_s = origin_s
    else:
        assert lo[0] <= hi[0] + SLACK_S, ("no single server time origin fits", lo, hi)
        lo_s, hi_s = lo[0], max(hi[0], lo[0])
    spread_s = hi_s - lo_s  # how far the estimates below may exceed the truth

    # Lag-derived: each request's entry and each delivery within what the loop's hold-ups explain.
    for i, sent, _, arrival, due in cases:
        stamped = hi_s + arrival
        allowed = probe.allowance_s(sent, stamped, ENTRY_TURNS) + server_turn_s + spread_s
        assert stamped - sent <= allowed, (i, "arrival stamped late (ms)", (stamped - sent) * 1e3, allowed * 1e3)
        for what, t, got in due:
            due_abs = lo_s + t
            allowed = probe.allowance_s(due_abs, got, EXIT_TURNS) + server_turn_s + spread_s
            assert got - due_abs <= allowed, (i, f"{what} received late (ms)", (got - due_abs) * 1e3, allowed * 1e3)


def _assert_workload_mattered(predicted: pd.DataFrame) -> None:
    """The scenario is not trivial: requests queued, were preempted, and spread over a wide latency range."""
    assert (predicted.queue_delay_s > 0.01).sum() >= 5
    assert predicted.num_preemptions.sum() > 0
    assert predicted.ttft_s.max() > 0.2 and predicted.e2e_s.max() > 0.5


def test_observed_ttft_and_e2e_match_the_offline_simulation(slow_scenario: Scenario, tmp_path: Path) -> None:
    """40 requests (chat and completions, streamed and not) sent open-loop to an in-process
    server: the server's simulated times equal the offline simulation of the served trace
    exactly; on the shared clock no request is stamped before it was sent and no token reaches
    the client before its simulated time; and every arrival and delivery is within the allowance
    derived from the event loop's lag measured in its own window during this run."""
    rows = _workload(40, seed=11)

    async def go() -> tuple[dict[int, _Seen], list[Any], LagProbe, float]:
        async with EmulatedServer(slow_scenario, trace=tmp_path / "served") as server:
            async with LagProbe() as probe:
                seen = await _observe(server.url, rows)
            assert server.driver is not None
            origin_s = server.driver.loop_time(0.0) + perf_minus_loop_s(asyncio.get_running_loop())
        return seen, server.served, probe, origin_s

    seen, served, probe, origin_s = asyncio.run(go())
    predicted = _predict(slow_scenario, tmp_path / "served")
    _assert_workload_mattered(predicted)
    for s in served:
        pred = predicted.loc[s.client_id]
        assert (s.arrival_s, s.first_token_s, s.completion_s) == (pred.arrival_s, pred.first_token_s, pred.completion_s)
    _check_counts(rows, seen, predicted)
    assert probe.samples > 100
    _check_times(rows, seen, predicted, probe, origin_s)


def test_cli_server_matches_the_offline_simulation(slow_data: dict, tmp_path: Path) -> None:
    """`simpy-llm serve` started as a process (port 0, --trace): after /health answers, 20
    requests are served; the trace's simulated times equal the offline simulation of it to the
    microsecond; one server time origin fits every request's send, arrival stamp, headers and
    token times; arrivals and deliveries are within the allowance derived from the lag measured
    during this run; SIGTERM (sent to its PID) stops it cleanly with exit status 0."""
    scenario_file = tmp_path / "slow.yaml"
    scenario_file.write_text(yaml.safe_dump(slow_data))
    rows = _workload(20, seed=5)

    async def go(url: str) -> tuple[dict[int, _Seen], LagProbe]:
        async with LagProbe() as probe:
            seen = await _observe(url, rows)
        return seen, probe

    with serve_process(scenario_file, tmp_path, "--trace", str(tmp_path / "served")) as server:
        seen, probe = asyncio.run(go(server.url))
    assert server.returncode == 0, server.output.read_text()
    assert "stopped after 20 requests" in server.output.read_text()
    predicted = _predict(load_scenario(scenario_file), tmp_path / "served")
    served = read_trace_v2(tmp_path / "served")
    timing = served.header["emulator_timing"]
    assert timing["timer_fires"] > 0 and 0 <= timing["lateness_mean_ms"] <= timing["lateness_max_ms"]
    trace = served.frame.set_index("client_id")
    assert len(trace) == 20
    for client_id, row in trace.iterrows():
        pred = predicted.loc[client_id]
        stamps = (row.arrival_time_us, row.first_chunk_time_us, row.last_chunk_time_us)
        assert stamps == (us_from_s(pred.arrival_s), us_from_s(pred.first_token_s), us_from_s(pred.completion_s))
    _check_counts(rows, seen, predicted)
    assert probe.samples > 100
    _check_times(rows, seen, predicted, probe, None, timing["lateness_max_ms"] / 1e3)
