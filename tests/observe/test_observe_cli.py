"""`simpy-llm observe` end to end: a scenario's workload (open-loop and multi-turn clients) sent to
`simpy-llm serve`, recorded, read back, and checked against what the server itself recorded.

The server writes its own trace (``--trace``): the arrival it stamped on each request and the
simulated times of its first and last token. Replaying that trace offline reproduces those times
to the microsecond. The observer's trace is checked against it with exact relations only: the
same requests with the same server-reported lengths, and one server time origin under which every
request was sent no later than the server stamped it and every first token and answer reached the
observer no earlier than its simulated time.

How closely a replay of the observer's own trace (at its send times) predicts the latencies it
observed is a wall-clock figure, not a test: the server stamps a request a loopback connection
after the observer sent it (1-4 ms idle, over 10 ms on a loaded machine), which can move it to
another engine step in the replay. `benchmarks/bench_observe_timing.py` prints it (median, 90th
percentile and max deviation); the test below checks that the replay takes the trace's send times
and lengths exactly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, NamedTuple

import attrs
import numpy as np
import pandas as pd
import pytest
import yaml

from simpy_llm import Simulation, load_scenario
from simpy_llm.cli import main
from simpy_llm.config.schema import TraceSource, WorkloadConfig
from simpy_llm.observe.emulate import replay_scenario
from simpy_llm.observe.scrape import read_metrics
from simpy_llm.workload.traces import read_trace_v2, us_from_s
from tests.observe.emulate.conftest import SLOW
from tests.observe.serve_process import cli, serve_process

PREFIX, QUESTION, ANSWER, ROUNDS = 20, 30, 6, 3
SLACK_US = 1
"""Allowed in the exact comparisons across the observer's and the server's stamps: both are
rounded to whole microseconds."""


class Observed(NamedTuple):
    """One observe run against `simpy-llm serve`."""

    scenario: Path
    out: Path
    """The observer's output directory."""
    served: Path
    """The server's own trace (its ``--trace``)."""
    code: int
    """The observe command's exit status."""


def _scenario_file(tmp_path: Path) -> Path:
    data: dict[str, Any] = json.loads(json.dumps(SLOW))
    data["workload"] = {
        "aggregate_rate": 40.0,
        "num_requests": 24,
        "clients": [
            {
                "id": "chat",
                "rate_fraction": 0.5,
                "arrival": {"process": "poisson"},
                "prefix_group": "assistant",
                "prefix_length": PREFIX,
                "input_distribution": {"type": "constant", "params": {"value": QUESTION}},
                "output_distribution": {"type": "constant", "params": {"value": ANSWER}},
                "multi_turn": {"max_rounds": ROUNDS, "think_time": {"type": "constant", "params": {"value": 0.2}}},
            },
            {
                "id": "batch",
                "rate_fraction": 0.5,
                "streaming": 0.5,
                "arrival": {"process": "poisson"},
                "input_distribution": {"type": "uniform", "params": {"low": 50, "high": 250}},
                "output_distribution": {"type": "uniform", "params": {"low": 4, "high": 12}},
            },
        ],
    }
    path = tmp_path / "observe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Observed:
    """One observe run against `simpy-llm serve` (which writes its own trace)."""
    tmp = tmp_path_factory.mktemp("observe")
    scenario = _scenario_file(tmp)
    out, served = tmp / "run", tmp / "served"
    with serve_process(scenario, tmp, "--trace", str(served)) as server:
        code = main(["observe", str(scenario), "--url", server.url, "--out", str(out), "--scrape-metrics", "--scrape-interval", "0.2"])
    assert server.returncode == 0
    return Observed(scenario, out, served, code)


def test_observe_writes_every_file(observed: Observed) -> None:
    """The command exits 0 and writes the trace (header naming the server, model and metrics file),
    summary.json, sessions.csv and metrics.csv with the server's samples."""
    out, code = observed.out, observed.code
    assert code == 0
    trace = read_trace_v2(out / "trace")
    assert trace.header["mode"] == "real" and trace.header["server_url"].startswith("http://127.0.0.1:")
    assert trace.header["model"] and trace.header["metrics_file"] == "metrics.csv"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status_counts"] == {"ok": len(trace)} and summary["n_requests"] == len(trace)
    metrics = read_metrics(out / "metrics.csv")
    assert (metrics.error == "").all() and metrics.metric.str.startswith("vllm:").any()
    assert metrics.time_s.max() > 0


def test_the_header_records_the_connection_cap(observed: Observed) -> None:
    """Without --max-connections the run keeps the client's default cap, and the header says so."""
    from simpy_llm.observe.client import MAX_CONNECTIONS

    assert read_trace_v2(observed.out / "trace").header["load"]["max_connections"] == MAX_CONNECTIONS


def test_the_header_records_the_body_budget(observed: Observed) -> None:
    """Without --prepare-bytes the run builds bodies ahead within the load generator's default
    budget, and the header says so."""
    from simpy_llm.observe.loadgen import PREPARE_BYTES

    assert read_trace_v2(observed.out / "trace").header["load"]["prepare_bytes"] == PREPARE_BYTES


def test_sessions_ran_closed_loop(observed: Observed) -> None:
    """Each chat session ran all its rounds; the trace holds them with their round index, and
    sessions.csv reports them as finished after max_rounds."""
    out = observed.out
    f = read_trace_v2(out / "trace").frame
    sessions = pd.read_csv(out / "sessions.csv")
    assert len(sessions) > 0 and (sessions.rounds == ROUNDS).all() and (sessions.end_reason == "max_rounds").all()
    chat = f[f.client_id == "chat"]
    assert len(chat) == ROUNDS * len(sessions)
    assert sorted(chat.groupby("session_id").round_index.apply(sorted).tolist()) == [list(range(ROUNDS))] * len(sessions)


def test_server_counts_match_the_requested_lengths(observed: Observed) -> None:
    """The server counts a prompt word as a token, so the reported counts equal the requested
    ones, follow-up rounds included (their prompt carries the whole conversation)."""
    f = read_trace_v2(observed.out / "trace").frame
    assert (f.input_tokens == f.requested_input_tokens).all() and (f.output_tokens == f.requested_output_tokens).all()
    follow = f[f.round_index == ROUNDS - 1]
    assert (follow.input_tokens == PREFIX + ROUNDS * QUESTION + (ROUNDS - 1) * ANSWER).all()


def test_observed_trace_replays_at_its_send_times(observed: Observed) -> None:
    """The observer's trace is a replayable workload: replayed at its send times, every request
    arrives at its send time to the microsecond with the server-reported lengths and completes,
    in a run that queueing shaped."""
    scenario = load_scenario(observed.scenario)
    replay = attrs.evolve(
        scenario,
        workload=WorkloadConfig(traces=(TraceSource(path=str(observed.out / "trace.csv"), arrival_column="send_time_us"),)),
    )
    predicted = Simulation(replay).run().to_dataframe().sort_values("arrival_s", kind="stable").reset_index(drop=True)
    f = read_trace_v2(observed.out / "trace").frame.sort_values("send_time_us", kind="stable").reset_index(drop=True)
    assert len(predicted) == len(f) and (predicted.status == "completed").all()
    assert predicted.ttft_s.max() > 0.1 and (predicted.queue_delay_s > 0.01).sum() >= 5  # queueing shaped the run
    assert (abs(predicted.arrival_s.to_numpy() * 1e6 - f.send_time_us.to_numpy(dtype=float)) < 1).all()
    assert sorted(zip(predicted.prompt_tokens, predicted.output_tokens, strict=True)) == sorted(zip(f.input_tokens, f.output_tokens, strict=True))


def test_server_trace_replays_exactly(observed: Observed) -> None:
    """Replaying the server's own trace offline reproduces its first- and last-token times to the
    microsecond (sessions, prefix groups and a full KV cache included)."""
    served = read_trace_v2(observed.served).frame.sort_values("arrival_time_us").reset_index(drop=True)
    predicted = Simulation(replay_scenario(load_scenario(observed.scenario), observed.served)).run().to_dataframe()
    predicted = predicted.sort_values("arrival_s").reset_index(drop=True)
    assert len(served) == len(predicted) > 0 and (served.status == "ok").all()
    assert served.arrival_time_us.tolist() == [us_from_s(t) for t in predicted.arrival_s]
    assert served.first_chunk_time_us.tolist() == [us_from_s(t) for t in predicted.first_token_s]
    assert served.last_chunk_time_us.tolist() == [us_from_s(t) for t in predicted.completion_s]


def test_observed_trace_agrees_with_the_server_trace(observed: Observed) -> None:
    """The observer recorded exactly the requests the server served, with the server's lengths and
    streaming flags, on a time base one origin fits: sent no later than the server stamped them,
    first tokens (streamed) and answers received no earlier than their simulated times.

    The observer cannot tell which server row is which of its requests, but the relations hold
    for every request, so they hold between the sorted columns too (if a_j <= b_j for every j,
    the k-th smallest a is at most the k-th smallest b): a necessary condition, exact."""
    f = read_trace_v2(observed.out / "trace").frame
    s = read_trace_v2(observed.served).frame
    assert len(f) == len(s) and (f.status == "ok").all() and (s.status == "ok").all()
    key = ["input_tokens", "output_tokens", "streaming"]
    assert sorted(map(tuple, f[key].to_numpy().tolist())) == sorted(map(tuple, s[key].to_numpy().tolist()))

    def col(frame: pd.DataFrame, name: str) -> np.ndarray:
        return np.sort(frame[name].to_numpy(dtype=float))

    streamed_f, streamed_s = f[f.streaming], s[s.streaming]
    assert len(streamed_f) > 0
    # origin >= sent - stamped arrival, origin <= received - simulated time
    lows = col(f, "send_time_us") - col(s, "arrival_time_us")
    highs = np.concatenate([
        col(f, "done_time_us") - col(s, "last_chunk_time_us"),
        col(streamed_f, "first_token_time_us") - col(streamed_s, "first_chunk_time_us"),
    ])
    lo, hi = float(lows.max()), float(highs.min())
    assert lo <= hi + SLACK_US, f"no single server time origin fits: needs >= {lo:.0f} us and <= {hi:.0f} us"


def test_sigint_stops_cleanly_with_every_row_written(tmp_path: Path) -> None:
    """SIGINT (sent to the observer's PID) mid-run: exit status 0, one trace row per request of the
    workload (the finished ones ok, the rest cancelled), summary.json marked stopped."""
    data = yaml.safe_load(_scenario_file(tmp_path).read_text())
    data["workload"]["num_requests"] = 2000  # 50 s at 40/s: far longer than the test waits
    scenario = tmp_path / "long.yaml"
    scenario.write_text(yaml.safe_dump(data))
    out = tmp_path / "run"
    with serve_process(scenario, tmp_path) as server:
        cmd = [*cli(), "observe", str(scenario), "--url", server.url, "--out", str(out)]
        with (tmp_path / "observe-stdout.txt").open("wb") as sink:
            proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                csv_file = out / "trace.csv"
                if csv_file.exists() and len(csv_file.read_text().splitlines()) > 6:
                    break
                time.sleep(0.05)
            os.kill(proc.pid, signal.SIGINT)
            code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
    assert code == 0, (tmp_path / "observe-stdout.txt").read_text()
    f = read_trace_v2(out / "trace").frame
    first_rounds = f[f.round_index == 0]
    assert sorted(first_rounds.request_id) == list(range(2000))
    assert set(f.status) == {"ok", "cancelled"} and (f.status == "ok").sum() >= 5
    assert f.request_id.is_unique
    assert json.loads((out / "summary.json").read_text())["stopped"] is True


def test_the_scraped_series_are_compared_with_the_replay(observed: Observed) -> None:
    """The emulated server's scraped vLLM gauges (one label set per replica) become the report's
    three time series, one point per successful scrape, on the replay of the observer's trace;
    the header's load statistics are the run's."""
    from simpy_llm.calibrate import compare

    cal = compare(observed.out, load_scenario(observed.scenario), n_resamples=50)
    metrics = read_metrics(observed.out / "metrics.csv")
    scrapes = metrics[(metrics.error == "") & (metrics.metric == "vllm:num_requests_running")].time_s.nunique()
    ts = cal.report.timeseries
    assert [(name, s["scraped_metric"]) for name, s in ts.items()] == [
        ("queue_depth", "vllm:num_requests_waiting"), ("running_batch", "vllm:num_requests_running"),
        ("kv_usage", "vllm:kv_cache_usage_perc"),
    ]
    assert all(s["n"] == scrapes > 0 and s["mae"] is not None for s in ts.values())
    stats = read_trace_v2(observed.out / "trace").header["load_generator"]
    summary = json.loads((observed.out / "summary.json").read_text())
    assert (stats["requests"], stats["sent"], stats["achieved_rate"]) == (summary["n_requests"], summary["n_sent"], summary["achieved_rate"])
