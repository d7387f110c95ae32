"""Closed-loop multi-turn chat against the real llama.cpp server, through `observe()` (the
`simpy-llm observe` command's engine), with Prometheus scraping.

As in test_llamacpp.py, no check depends on how fast or how busy the machine is: the observed
latencies are compared with the processing time the server reports in its own counters, and the
server's speed is a figure printed by ``benchmarks/bench_observe_timing.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from simpy_llm.observe.llamacpp import LlamaCppServer
from simpy_llm.observe.run import observe
from simpy_llm.observe.scrape import read_metrics
from simpy_llm.workload.traces import read_trace_v2

pytestmark = pytest.mark.real_server

SESSIONS, ROUNDS, PREFIX, QUESTION, ANSWER = 3, 3, 30, 40, 8


def _workload(tmp_path: Path) -> Path:
    data: dict[str, Any] = {
        "seed": 5,
        "workload": {
            "aggregate_rate": 1.5,
            "num_requests": SESSIONS,
            "clients": [
                {
                    "id": "chat",
                    "rate_fraction": 1.0,
                    "arrival": {"process": "poisson"},
                    "prefix_group": "system",
                    "prefix_length": PREFIX,
                    "input_distribution": {"type": "constant", "params": {"value": QUESTION}},
                    "output_distribution": {"type": "constant", "params": {"value": ANSWER}},
                    "multi_turn": {"max_rounds": ROUNDS, "think_time": {"type": "constant", "params": {"value": 0.3}}},
                }
            ],
        },
        # The serving section is not used by the observer; it keeps the file a valid scenario.
        "serving": {"latency_model": {"kind": "blis_linear", "params": {"beta0_us": 1000.0}}},
    }
    path = tmp_path / "chat.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory: pytest.TempPathFactory, llamacpp_server: LlamaCppServer) -> Path:
    """The output directory of one closed-loop chat run against the shared server."""
    assert llamacpp_server.returncode is None and llamacpp_server.url is not None
    out = tmp_path_factory.mktemp("chat") / "run"
    observe(
        _workload(out.parent),
        llamacpp_server.url,
        out,
        api="chat",
        timeout_s=120.0,
        scrape_metrics=llamacpp_server.url + "/metrics",
        scrape_interval_s=0.5,
    )
    return out


def test_every_round_ends_ok_with_usage(chat_run: Path) -> None:
    """All sessions run all rounds; at least 95% of rounds end ok, each with the server's usage
    counts and exactly the requested number of output tokens."""
    f = read_trace_v2(chat_run / "trace").frame
    assert len(f) == SESSIONS * ROUNDS
    ok = f[f.status == "ok"]
    assert len(ok) >= 0.95 * len(f), f[f.status != "ok"][["request_id", "status", "error_message"]]
    assert (ok.prompt_tokens_source == "usage").all() and (ok.completion_tokens_source == "usage").all()
    assert (ok.output_tokens == ANSWER).all()
    sessions = pd.read_csv(chat_run / "sessions.csv")
    assert len(sessions) == SESSIONS and (sessions.end_reason == "max_rounds").all()


def test_rounds_follow_answers_and_contexts_grow(chat_run: Path) -> None:
    """A round is sent after the previous answer ended; the server's prompt count of each round
    exceeds the previous round's prompt plus answer (the conversation is sent back), and the
    requested length (reported counts plus the new question) is within the chat template's few
    tokens per turn of what the server counted."""
    f = read_trace_v2(chat_run / "trace").frame
    for _, rounds in f.groupby("session_id"):
        r = rounds.sort_values("round_index")
        assert r.round_index.tolist() == list(range(ROUNDS))
        assert (r.send_time_us.to_numpy()[1:] >= r.done_time_us.to_numpy()[:-1]).all()
        prompt, output = r.input_tokens.to_numpy(), r.output_tokens.to_numpy()
        assert (prompt[1:] > prompt[:-1] + output[:-1]).all()
        requested = r.requested_input_tokens.to_numpy()[1:]
        assert (requested <= prompt[1:]).all() and (prompt[1:] <= requested * 1.1 + 20).all()


def test_latencies_enclose_the_server_processing_times(chat_run: Path) -> None:
    """Every round's times are ordered (sent, first token, last chunk, end), and the rounds' TTFTs
    add up to at least the prompt-processing seconds the server's counters grew by during the run,
    their E2Es to at least the prompt plus generation seconds: the server starts on a prompt after
    it arrived and produces the last token before the answer ends, so each client span encloses
    the server's (its own clock, whatever the load on the machine)."""
    f = read_trace_v2(chat_run / "trace").frame
    assert (f.status == "ok").all()
    sent, first = f.send_time_us.to_numpy(dtype=float), f.first_token_time_us.to_numpy(dtype=float)
    last, done = f.last_chunk_time_us.to_numpy(dtype=float), f.done_time_us.to_numpy(dtype=float)
    assert (sent < first).all() and (first <= last).all() and (last <= done).all()
    m = read_metrics(chat_run / "metrics.csv")

    def growth_s(name: str) -> float:
        series = m[m.metric == name].sort_values("time_s").value
        return float(series.iloc[-1] - series.iloc[0])

    prompt_s, generate_s = growth_s("llamacpp:prompt_seconds_total"), growth_s("llamacpp:tokens_predicted_seconds_total")
    assert prompt_s > 0 and generate_s > 0
    assert prompt_s <= (first - sent).sum() / 1e6
    assert prompt_s + generate_s <= (done - sent).sum() / 1e6


def test_metrics_were_scraped_during_the_run(chat_run: Path) -> None:
    """metrics.csv holds llama.cpp's counters over the run: the prompt-token counter grows, by at
    most the prompt tokens the trace reports (the prompt cache saves some), and the generated-token
    counter by exactly the answers' tokens."""
    m = read_metrics(chat_run / "metrics.csv")
    f = read_trace_v2(chat_run / "trace").frame

    def growth(name: str) -> float:
        series = m[m.metric == name].sort_values("time_s").value
        assert len(series) >= 2 and series.is_monotonic_increasing
        return float(series.iloc[-1] - series.iloc[0])

    assert 0 < growth("llamacpp:prompt_tokens_total") <= f.input_tokens.sum()
    assert growth("llamacpp:tokens_predicted_total") == f.output_tokens.sum()
