"""The client's cap on requests in flight (``workload.max_concurrency``,
:class:`~simpy_llm.workload.gate.ConcurrencyGate`), checked against closed forms of a
step-time table and, for any arrivals and cap, by counting from the records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simpy_llm.config import ScenarioError
from simpy_llm.loading import load_scenario, scenario_from_dict
from simpy_llm.simulation import Simulation
from simpy_llm.workload.traces import write_trace_v2

D_US = [10_000.0, 12_000.0, 14_000.0, 16_000.0]
PREFILL_STEP_US, PREFILL_TOKEN_US = 20_000.0, 100.0
MODEL = {"kind": "batch_table", "params": {"decode_step_us": D_US, "prefill_step_us": PREFILL_STEP_US, "prefill_token_us": PREFILL_TOKEN_US}}


def _trace(tmp_path: Path, arrivals_s: list[float], prompt: int | list[int] = 100, output: int | list[int] = 8) -> str:
    n = len(arrivals_s)
    frame = pd.DataFrame({
        "request_id": range(n),
        "client_id": ["bench"] * n,
        "arrival_time_us": [round(t * 1e6) for t in arrivals_s],
        "input_tokens": prompt if isinstance(prompt, list) else [prompt] * n,
        "output_tokens": output if isinstance(output, list) else [output] * n,
    })
    _, csv = write_trace_v2(frame, tmp_path / "requests")
    return str(csv)


def _scenario(workload: dict[str, Any], **extra: Any) -> Any:
    return scenario_from_dict({
        "seed": 3,
        "workload": workload,
        "serving": {"replicas": 1, "engine": {"max_num_seqs": 64, "max_num_batched_tokens": 8192}, "latency_model": MODEL},
        **extra,
    })


def _records(workload: dict[str, Any]) -> pd.DataFrame:
    return Simulation(_scenario(workload)).run(progress=False).to_dataframe().sort_values("request_id")


def _most_in_flight(frame: pd.DataFrame) -> int:
    events = sorted([(t, 1) for t in frame["arrival_s"]] + [(t, -1) for t in frame["completion_s"]], key=lambda e: (e[0], e[1]))
    return int(np.max(np.cumsum([d for _, d in events])))


def test_one_slot_sends_each_request_when_the_previous_answer_is_in(tmp_path: Path) -> None:
    """Cap 1, requests due every 50 ms, each taking S = prefill step + 100 prompt tokens + 7
    steps of D(1) = 100 ms alone: request i is sent at max(its due time, send of i-1 + S)."""
    due = [0.05 * i for i in range(8)]
    frame = _records({"traces": [{"path": _trace(tmp_path, due)}], "max_concurrency": 1})
    service = (PREFILL_STEP_US + 100 * PREFILL_TOKEN_US + 7 * D_US[0]) / 1e6
    expected = [due[0]]
    for t in due[1:]:
        expected.append(max(t, expected[-1] + service))
    assert frame["arrival_s"].to_numpy() == pytest.approx(expected, abs=1e-9)
    assert (frame["completion_s"] - frame["arrival_s"]).to_numpy() == pytest.approx([service] * 8, abs=1e-9)


def test_n_slots_of_simultaneous_requests_run_as_rounds(tmp_path: Path) -> None:
    """Cap 4, ten requests due at 0: rounds of four, two then, each round one prefill step of
    the round's prompts and 7 decode steps of the round's size: D(4), D(4), then D(2)."""
    frame = _records({"traces": [{"path": _trace(tmp_path, [0.0] * 10)}], "max_concurrency": 4})

    def round_s(n: int) -> float:
        return (PREFILL_STEP_US + n * 100 * PREFILL_TOKEN_US + 7 * D_US[n - 1]) / 1e6

    ends = np.cumsum([round_s(4), round_s(4), round_s(2)])
    assert frame["completion_s"].to_numpy() == pytest.approx(np.repeat(ends, [4, 4, 2]), abs=1e-9)
    assert frame["arrival_s"].to_numpy() == pytest.approx(np.repeat([0.0, *ends[:2]], [4, 4, 2]), abs=1e-9)


def test_without_a_cap_the_same_requests_are_all_sent_when_due(tmp_path: Path) -> None:
    """The default (no max_concurrency) is the open loop: every request is sent at its due time."""
    frame = _records({"traces": [{"path": _trace(tmp_path, [0.0] * 10)}]})
    assert (frame["arrival_s"] == 0.0).all() and _most_in_flight(frame) == 10


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cap=st.integers(1, 6),
    gaps_ms=st.lists(st.integers(0, 400), min_size=1, max_size=30),
    prompts=st.lists(st.integers(1, 600), min_size=30, max_size=30),
    outputs=st.lists(st.integers(1, 40), min_size=30, max_size=30),
)
def test_every_request_is_sent_once_in_due_order_and_the_cap_holds(
    tmp_path: Path, cap: int, gaps_ms: list[int], prompts: list[int], outputs: list[int]
) -> None:
    """For any arrivals, lengths and cap: every request completes exactly once, none is sent
    before it is due, sends keep the order requests fell due in, and no more than the cap are
    in flight at any instant."""
    due = list(np.cumsum(gaps_ms) / 1e3)
    n = len(due)
    frame = _records({"traces": [{"path": _trace(tmp_path, due, prompts[:n], outputs[:n])}], "max_concurrency": cap})
    assert sorted(frame["request_id"]) == list(range(n)) and (frame["status"] == "completed").all()
    sent = frame["arrival_s"].to_numpy()
    assert (sent >= np.asarray(due) - 1e-9).all() and (np.diff(sent) >= -1e-12).all()
    assert _most_in_flight(frame) <= cap


def test_the_cap_holds_over_closed_loop_sessions() -> None:
    """Multi-turn sessions under cap 3: every round of every session is sent and answered, and
    no more than three rounds are in flight at once."""
    workload = {
        "aggregate_rate": 20.0, "num_requests": 12, "max_concurrency": 3,
        "clients": [{"id": "chat", "arrival": {"process": "poisson"},
                     "input_distribution": {"type": "constant", "params": {"value": 50}},
                     "output_distribution": {"type": "constant", "params": {"value": 5}},
                     "multi_turn": {"max_rounds": 3, "think_time": {"type": "constant", "params": {"value": 0.01}}}}],
    }
    frame = _records(workload)
    assert len(frame) == 36 and (frame["status"] == "completed").all()
    assert _most_in_flight(frame) == 3


@pytest.mark.parametrize(("scenario", "section"), [
    ("scenarios/speculative_modes.yaml", "speculation"),
    ("scenarios/planner_pool_split.yaml", "planner"),
])
def test_a_cap_is_refused_where_it_is_not_modelled(scenario: str, section: str) -> None:
    """max_concurrency with speculation or a planner is refused at workload.max_concurrency."""
    with pytest.raises(ScenarioError) as err:
        load_scenario(scenario, ["workload.max_concurrency=2"])
    assert "workload.max_concurrency" in err.value.paths and f"with a {section} section" in str(err.value)


def test_a_cap_below_one_is_refused(tmp_path: Path) -> None:
    """max_concurrency 0 is refused at its key path."""
    with pytest.raises(ScenarioError) as err:
        _scenario({"traces": [{"path": _trace(tmp_path, [0.0])}], "max_concurrency": 0})
    assert err.value.paths == ["workload.max_concurrency"]
