"""Closed-loop sessions on random scenarios (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import run, tiny_scenario

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


@st.composite
def session_scenarios(draw):
    data = tiny_scenario()
    data["seed"] = draw(st.integers(0, 2**16))
    client = data["workload"]["clients"][0]
    if draw(st.booleans()):
        client["multi_turn"] = {
            "max_rounds": draw(st.integers(1, 5)),
            "think_time": {"type": "exponential", "params": {"mean": draw(st.floats(0.001, 2.0))}},
            "context_growth": draw(st.sampled_from(["accumulate", "fixed"])),
        }
        if draw(st.booleans()):
            client["multi_turn"]["rounds_distribution"] = {"type": "constant", "params": {"value": draw(st.integers(1, 8))}}
    else:
        client["conversational_probability"] = draw(st.floats(0.1, 0.9))
        client["follow_up_think_time"] = {"type": "constant", "params": {"value": draw(st.floats(0.001, 1.0))}}
    data["workload"]["num_requests"] = draw(st.integers(1, 30))
    data["workload"]["aggregate_rate"] = draw(st.floats(1.0, 200.0))
    data["serving"]["engine"]["kv_num_blocks"] = draw(st.integers(16, 80))
    if draw(st.booleans()):
        del data["workload"]["num_requests"]
        data["workload"]["horizon_s"] = draw(st.floats(0.05, 2.0))
    return data


@SETTINGS
@given(session_scenarios())
def test_rounds_of_a_session_never_overlap(data):
    """Round k+1 of a session arrives no earlier than round k completes."""
    frame = run(data).to_dataframe()
    for _sid, group in frame[frame.session_id != ""].groupby("session_id"):
        group = group.sort_values("round_index")
        assert list(group.round_index) == list(range(len(group)))
        done = group.completion_s.to_numpy()[:-1]
        nxt = group.arrival_s.to_numpy()[1:]
        assert np.all(nxt >= done)


@SETTINGS
@given(session_scenarios())
def test_sessions_end_within_max_rounds_with_a_reason(data):
    """Every session has at most max_rounds rounds, and each ends once with a stated reason."""
    res = run(data)
    sessions = res.sessions()
    frame = res.to_dataframe()
    assert sessions.session_id.is_unique
    assert set(sessions.session_id) == set(frame.session_id[frame.session_id != ""])
    mt = data["workload"]["clients"][0].get("multi_turn")
    if mt is not None:
        assert (sessions.rounds <= mt["max_rounds"]).all()
        assert set(sessions.end_reason) <= {"max_rounds", "horizon", "dropped", "in_progress"}
    else:
        assert set(sessions.end_reason) <= {"user_stopped", "horizon", "dropped", "in_progress"}
    counts = frame[frame.session_id != ""].groupby("session_id").size()
    assert (sessions.set_index("session_id").rounds.sort_index() == counts.sort_index()).all()


@SETTINGS
@given(session_scenarios())
def test_accumulated_context_is_exact(data):
    """Under accumulate, a round's prompt is the previous prompt plus its output plus a new question."""
    client = data["workload"]["clients"][0]
    growth = client.get("multi_turn", {}).get("context_growth", "accumulate")
    frame = run(data).to_dataframe()
    for _sid, group in frame[frame.session_id != ""].groupby("session_id"):
        group = group.sort_values("round_index")
        prompts = group.prompt_tokens.to_numpy()
        outputs = group.output_tokens.to_numpy()
        if growth == "accumulate":
            assert np.all(prompts[1:] > prompts[:-1] + outputs[:-1])
        assert np.all(prompts >= 1)


def test_multi_turn_sessions_run_all_rounds_without_a_horizon():
    """Without a horizon, every multi-turn session of 3 rounds runs all 3 (end reason max_rounds)."""
    data = tiny_scenario()
    data["workload"]["clients"][0]["multi_turn"] = {
        "max_rounds": 3,
        "think_time": {"type": "constant", "params": {"value": 0.5}},
    }
    data["serving"]["engine"]["kv_num_blocks"] = 4000  # room for the growing context
    res = run(data)
    sessions = res.sessions()
    assert len(sessions) == 50
    assert set(sessions.end_reason) == {"max_rounds"}
    assert (sessions.rounds == 3).all()
    assert len(res) == 150


def test_sessions_give_identical_records_in_both_engine_modes():
    """Follow-ups depend on completions; both engine modes still give identical records."""
    from tests.helpers import columns_equal

    data = tiny_scenario()
    data["workload"]["clients"][0]["conversational_probability"] = 0.6
    data["workload"]["clients"][0]["follow_up_think_time"] = {"type": "exponential", "params": {"mean": 0.05}}
    data["workload"]["num_requests"] = 200
    data["workload"]["aggregate_rate"] = 200.0
    fast = run(data, "event_per_change")
    ref = run(data, "event_per_step")
    assert len(fast) > 250
    assert columns_equal(fast, ref) == []
    assert fast.sessions().equals(ref.sessions())
