"""Closed-loop sessions in the load generator: rounds wait for answers, contexts grow by what the server said."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from simpy_llm import scenario_from_dict
from simpy_llm.observe.client import OpenAIClient
from simpy_llm.observe.loadgen import OBSERVER_COLUMNS, LoadGenerator, load_requests, prefix_text
from simpy_llm.observe.sessions import Conversations
from simpy_llm.workload.export import generate_requests
from simpy_llm.workload.traces import TraceV2Writer, read_trace_v2
from tests.helpers import tiny_scenario
from tests.observe.fake_server import OK_TOKENS, PROMPT_TOKENS, FakeServer, serve

THINK_S = 0.05
PREFIX = 8
INPUT = 20


def _scenario(output_tokens: int = OK_TOKENS, rounds: int = 3, sessions: int = 3, think_s: float = THINK_S) -> Any:
    data = tiny_scenario()
    data["workload"] = {
        "aggregate_rate": 40.0,
        "num_requests": sessions,
        "clients": [
            {
                "id": "chat",
                "rate_fraction": 1.0,
                "arrival": {"process": "poisson"},
                "prefix_group": "sys",
                "prefix_length": PREFIX,
                "input_distribution": {"type": "constant", "params": {"value": INPUT - PREFIX}},
                "output_distribution": {"type": "constant", "params": {"value": output_tokens}},
                "multi_turn": {"max_rounds": rounds, "think_time": {"type": "constant", "params": {"value": think_s}}},
            }
        ],
    }
    return scenario_from_dict(data)


def _run(scenario: Any, path: Path, endpoint: str = "chat") -> tuple[FakeServer, Conversations]:
    requests = load_requests(generate_requests(scenario))
    conversations = Conversations(scenario, requests)

    async def go() -> FakeServer:
        async with serve() as fake, OpenAIClient(fake.url, timeout_s=2.0) as client:
            with TraceV2Writer(path, extra_columns=OBSERVER_COLUMNS) as writer:
                gen = LoadGenerator(
                    client, requests, writer, endpoint=endpoint, conversations=conversations, lag_threshold_s=1e9
                )
                await gen.run()
        return fake

    return asyncio.run(go()), conversations


def test_rounds_wait_for_the_previous_answer_plus_think_time(tmp_path: Path) -> None:
    """Every session runs all its rounds; round k+1 is sent no earlier than round k's end plus the think time."""
    _run(_scenario(), tmp_path / "t")
    f = read_trace_v2(tmp_path / "t").frame
    assert len(f) == 9 and (f.status == "ok").all()
    for _, rounds in f.groupby("session_id"):
        rounds = rounds.sort_values("round_index")
        assert rounds.round_index.tolist() == [0, 1, 2]
        done = rounds.done_time_us.to_numpy()
        sent = rounds.send_time_us.to_numpy()
        assert (sent[1:] >= done[:-1] + THINK_S * 1e6 - 1).all()
        target = rounds.arrival_time_us.to_numpy()[1:]
        assert (abs(target - (done[:-1] + round(THINK_S * 1e6))) <= 1).all()  # microsecond rounding


def test_input_grows_by_the_server_reported_counts(tmp_path: Path) -> None:
    """A follow-up's requested input is the previous round's reported prompt and completion tokens plus a new question."""
    _run(_scenario(), tmp_path / "t")
    f = read_trace_v2(tmp_path / "t").frame
    follow = f[f.round_index > 0]
    question = INPUT - PREFIX
    assert (follow.requested_input_tokens == PROMPT_TOKENS + OK_TOKENS + question).all()
    assert (f.input_tokens == PROMPT_TOKENS).all()  # what the server reported


def test_chat_messages_alternate_and_carry_the_replies(tmp_path: Path) -> None:
    """A third round sends system prefix, then user/assistant turns with the server's replies, then the new question."""
    fake, _ = _run(_scenario(), tmp_path / "t")
    third = [b["messages"] for b in fake.bodies if len(b["messages"]) == 6]
    assert len(third) == 3
    for messages in third:
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
        assert messages[0]["content"] == prefix_text("sys", PREFIX)
        reply = "".join(f" t{i}" for i in range(OK_TOKENS))
        assert messages[2]["content"] == reply and messages[4]["content"] == reply
        assert all(len(m["content"].split()) == INPUT - PREFIX for m in messages if m["role"] == "user")


def test_completions_api_joins_the_turns(tmp_path: Path) -> None:
    """With the completions API a follow-up's prompt is the conversation's text in order."""
    fake, _ = _run(_scenario(rounds=2, sessions=1), tmp_path / "t", endpoint="completions")
    prompts = [b["prompt"] for b in fake.bodies]
    assert len(prompts) == 2
    assert prompts[1].startswith(prefix_text("sys", PREFIX)) and "t4" in prompts[1]
    assert len(prompts[1].split()) == PREFIX + 2 * (INPUT - PREFIX) + OK_TOKENS


def test_a_failed_round_ends_its_session(tmp_path: Path) -> None:
    """A round whose stream breaks is recorded as an error and ends its session as dropped."""
    _, conversations = _run(_scenario(output_tokens=7), tmp_path / "t")  # 7 tokens: the fake server truncates
    f = read_trace_v2(tmp_path / "t").frame
    assert len(f) == 3 and (f.status == "error").all() and (f.round_index == 0).all()
    assert [s["end_reason"] for s in conversations.ended()] == ["dropped"] * 3
    assert all(s["rounds"] == 1 for s in conversations.ended())


def test_sessions_end_after_max_rounds(tmp_path: Path) -> None:
    """Each session reports max_rounds with the planned number of rounds."""
    _, conversations = _run(_scenario(rounds=2), tmp_path / "t")
    assert [(s["rounds"], s["end_reason"]) for s in conversations.ended()] == [(2, "max_rounds")] * 3


def test_stop_during_think_time_writes_the_waiting_rounds_as_cancelled(tmp_path: Path) -> None:
    """Stopping while follow-up rounds wait out their think time writes them as cancelled, never sent;
    their sessions are reported in progress."""
    scenario = _scenario(sessions=2, think_s=30.0)
    requests = load_requests(generate_requests(scenario))
    conversations = Conversations(scenario, requests)

    async def go() -> LoadGenerator:
        async with serve() as fake, OpenAIClient(fake.url, timeout_s=2.0) as client:
            with TraceV2Writer(tmp_path / "t", extra_columns=OBSERVER_COLUMNS) as writer:
                gen = LoadGenerator(client, requests, writer, conversations=conversations, lag_threshold_s=1e9)
                task = asyncio.create_task(gen.run())
                while len(gen.requests) < 4:
                    await asyncio.sleep(0.01)
                gen.stop()
                await task
        return gen

    gen = asyncio.run(go())
    f = read_trace_v2(tmp_path / "t").frame.sort_values("request_id")
    assert f.status.tolist() == ["ok", "ok", "cancelled", "cancelled"]
    assert f.send_time_us.isna().tolist() == [False, False, True, True]
    assert gen.summary is not None and gen.summary.stopped
    assert [s["end_reason"] for s in conversations.ended()] == ["in_progress"] * 2
