"""A client's priority as a constant or as a distribution drawn per request.

Frequencies are checked with fixed seeds to 5 standard errors of a proportion,
``sqrt(p (1 - p) / n)``.
"""

from __future__ import annotations

import copy
import itertools
import math
from typing import Any

import numpy as np
import pytest

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.config import ScenarioError
from simpy_llm.config.schema import ClientConfig
from simpy_llm.loading import scenario_to_dict
from simpy_llm.rng import RandomStreams
from simpy_llm.workload.arrivals import PoissonArrivals
from simpy_llm.workload.distributions import Constant, Empirical, Exponential
from simpy_llm.workload.export import generate_requests
from simpy_llm.workload.generator import ClientSource
from tests.helpers import run, tiny_scenario

PMF = {0: 0.7, 1: 0.2, 2: 0.1}
PRIORITY = {"type": "empirical", "params": {"pmf": PMF}}
CLIENT = "workload.clients[0]"


def _client(priority: Any, **extra: Any) -> ClientConfig:
    return ClientConfig(
        id="c",
        rate_fraction=1.0,
        arrival=PoissonArrivals(),
        input_distribution=Exponential(mean=50.0),
        output_distribution=Exponential(mean=20.0),
        priority=priority,
        **extra,
    )


def _rows(client: ClientConfig, n: int, seed: int = 3) -> tuple[dict[str, Any], list[tuple]]:
    src = ClientSource(client, 10.0, RandomStreams(seed), seed)
    return src.base, list(itertools.islice(src.rows(), n))


def _priorities(client: ClientConfig, n: int, seed: int = 3) -> np.ndarray:
    base, rows = _rows(client, n, seed)
    return np.array([{**base, **(extra or {})}["priority"] for *_, extra in rows])


def _with_priority(priority: Any, n: int = 50) -> dict[str, Any]:
    data = tiny_scenario()
    data["workload"]["num_requests"] = n
    data["workload"]["clients"][0]["priority"] = priority
    return data


def test_empirical_priority_frequencies_match_the_pmf() -> None:
    """Priorities drawn from {0: 0.7, 1: 0.2, 2: 0.1} come out at those frequencies (5 SE, 40,000 requests)."""
    n = 40_000
    drawn = _priorities(_client(Empirical.from_pmf(PMF)), n)
    assert set(np.unique(drawn).tolist()) == {0, 1, 2}
    for value, p in PMF.items():
        share = float((drawn == value).mean())
        assert abs(share - p) < 5 * math.sqrt(p * (1 - p) / n), (value, share, p)


def test_drawn_priorities_are_whole_numbers_rounded_half_to_even_and_may_be_negative() -> None:
    """A draw is rounded half to even: -1.5 -> -2, 0.5 -> 0, 2.5 -> 2 (0 and negatives are kept)."""
    drawn = _priorities(_client(Empirical.from_pmf({-1.5: 1, 0.5: 1, 2.5: 1})), 3000)
    assert drawn.dtype.kind == "i"
    assert set(np.unique(drawn).tolist()) == {-2, 0, 2}


def test_a_continuous_priority_distribution_is_rounded_per_request() -> None:
    """A normal(-1, 2) priority gives integers whose mean is -1 (5 SE) and that include negatives, 0 and positives."""
    n = 20_000
    data = _with_priority({"type": "normal", "params": {"mean": -1.0, "std_dev": 2.0}})
    drawn = _priorities(scenario_from_dict(data).workload.clients[0], n)
    # rounding to the nearest integer adds a uniform error of variance 1/12
    assert abs(drawn.mean() + 1.0) < 5 * math.sqrt((4.0 + 1 / 12) / n)
    assert (drawn < 0).any() and (drawn == 0).any() and (drawn > 0).any()


def test_constant_priority_is_carried_on_every_request_as_before() -> None:
    """A constant priority stands in the client's shared fields and no request overrides it."""
    base, rows = _rows(_client(3), 500)
    assert base["priority"] == 3
    assert all(extra is None or "priority" not in extra for *_, extra in rows)
    assert (run(_with_priority(3)).columns["priority"] == 3).all()


def test_drawing_priorities_leaves_every_other_draw_unchanged() -> None:
    """Priorities come from a stream of their own: with a priority distribution the client's
    arrival times and lengths are those it has with a constant priority."""
    _, constant = _rows(_client(1), 3000)
    _, drawn = _rows(_client(Empirical.from_pmf(PMF)), 3000)
    assert [r[:3] for r in constant] == [r[:3] for r in drawn]


def test_priorities_are_drawn_from_the_clients_priority_stream() -> None:
    """The drawn priorities are the distribution's draws from ``workload/<client>/priority``, in order."""
    dist = Empirical.from_pmf(PMF)
    drawn = _priorities(_client(dist), 5000, seed=11)
    expected = dist.sample(RandomStreams(11).stream("workload/c/priority"), 5000)
    np.testing.assert_array_equal(drawn, expected.astype(np.int64))


def test_drawn_priorities_reach_the_records_and_the_generated_table() -> None:
    """The records and the generated workload table carry the same per-request priorities, which vary."""
    data = _with_priority(PRIORITY, n=400)
    records = run(copy.deepcopy(data)).columns
    table = generate_requests(scenario_from_dict(data))
    np.testing.assert_array_equal(table.priority.to_numpy(), records["priority"])
    assert len(set(records["priority"].tolist())) == 3


def test_same_seed_gives_the_same_priorities() -> None:
    """Two runs with one seed give identical priorities; another seed gives others."""
    data = _with_priority(PRIORITY, n=300)
    a = run(data).columns["priority"]
    assert np.array_equal(a, run(data).columns["priority"])
    data["seed"] = 2
    assert not np.array_equal(a, run(data).columns["priority"])


def test_session_rounds_keep_the_first_rounds_priority() -> None:
    """Every round of a multi-turn session carries its first round's drawn priority;
    different sessions draw different priorities."""
    data = _with_priority(PRIORITY, n=120)
    data["workload"]["clients"][0]["multi_turn"] = {
        "max_rounds": 4,
        "think_time": {"type": "constant", "params": {"value": 0.01}},
    }
    data["serving"]["engine"].update(max_num_seqs=64, max_num_batched_tokens=4096, kv_num_blocks=200_000)
    frame = run(data).to_dataframe()
    assert (frame.round_index > 0).sum() > 100
    per_session = frame.groupby("session_id").priority.nunique()
    assert (per_session == 1).all()
    firsts = frame[frame.round_index == 0].priority
    assert set(firsts.tolist()) == {0, 1, 2}


def test_priority_distribution_round_trips_through_scenario_to_dict() -> None:
    """A priority distribution survives scenario_to_dict -> scenario_from_dict; a constant stays an int."""
    s = scenario_from_dict(_with_priority(PRIORITY))
    assert s.workload.clients[0].priority == Empirical.from_pmf(PMF)
    assert scenario_from_dict(scenario_to_dict(s)) == s
    plain = scenario_from_dict(_with_priority(2))
    assert scenario_to_dict(plain)["workload"]["clients"][0]["priority"] == 2


BAD = [
    ("high", f"{CLIENT}.priority", "must be an integer or a length distribution"),
    (1.5, f"{CLIENT}.priority", "must be an integer or a length distribution"),
    (True, f"{CLIENT}.priority", "must be an integer or a length distribution"),
    (2**40, f"{CLIENT}.priority", "must be in [-2147483647, 2147483647]"),
    ({"type": "zipf"}, f"{CLIENT}.priority.type", "unknown length distribution"),
    ({"type": "empirical", "params": {"pmf": {}}}, f"{CLIENT}.priority.params.pmf", "must not be empty"),
    ({"type": "constant", "params": {"value": 2}, "cv": 1}, f"{CLIENT}.priority.cv", "unknown key"),
]


@pytest.mark.parametrize(("priority", "path", "message"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_priority_raises_scenario_error_with_path(priority: Any, path: str, message: str) -> None:
    """A priority that is neither an integer in range nor a valid length distribution is rejected at its key path."""
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(_with_priority(priority))
    assert info.value.paths == [path]
    assert message in info.value.problems[0][1]


def test_a_constant_distribution_gives_a_constant_priority() -> None:
    """``{type: constant, params: {value: 2}}`` gives priority 2 on every request, as ``priority: 2`` does."""
    assert (_priorities(_client(Constant(value=2.0)), 200) == 2).all()


def test_priority_scheduler_serves_drawn_high_priorities_first() -> None:
    """Under the priority scheduler, with one replica saturated, requests with a higher drawn
    priority wait less: on average under a tenth of priority 0's wait (under fcfs they wait alike)."""
    data = _with_priority(PRIORITY, n=600)
    data["workload"]["aggregate_rate"] = 400.0
    data["serving"]["engine"]["scheduler"] = {"kind": "priority"}
    frame = run(data).to_dataframe()
    wait = frame.first_scheduled_s - frame.arrival_s
    assert wait[frame.priority == 2].mean() < 0.1 * wait[frame.priority == 0].mean()
    assert wait[frame.priority == 1].mean() < wait[frame.priority == 0].mean()


def test_simulation_sources_draw_no_priority_stream_for_a_constant() -> None:
    """With a constant priority the simulation's source has no priority distribution to draw from."""
    sim = Simulation(scenario_from_dict(_with_priority(1)))
    assert sim.sources[0].priority_distribution is None
    sim = Simulation(scenario_from_dict(_with_priority(PRIORITY)))
    assert sim.sources[0].priority_distribution == Empirical.from_pmf(PMF)
