"""One function builds a workload's request sources (``build_sources``): the simulation, the
workload export and the observer's sessions all use it, so one spec and seed give one set of
requests; a bare workload spec is an input as good as a scenario."""

from __future__ import annotations

import warnings
from pathlib import Path

import attrs
import numpy as np
import pandas as pd
import pytest

from simpy_llm import Simulation, load_scenario, scenario_from_dict
from simpy_llm.config import ScenarioError
from simpy_llm.config.errors import ScenarioWarning
from simpy_llm.loading import load_workload, load_workload_or_scenario, override_spec, workload_from_dict
from simpy_llm.observe.loadgen import load_requests
from simpy_llm.observe.sessions import Conversations, has_sessions
from simpy_llm.workload.export import generate_requests
from simpy_llm.workload.generator import merge_sources
from simpy_llm.workload.sources import WorkloadSources, build_sources, spec_workload, workload_seed
from simpy_llm.workload.traces import Trace, write_trace_v2
from tests.helpers import NanDistribution, tiny_scenario

REPO = Path(__file__).resolve().parents[2]
TWO_CLIENTS = REPO / "scenarios" / "workloads" / "two_clients.yaml"


def _rows(sources: WorkloadSources, n: int) -> list[tuple[float, int, int, int]]:
    """The first *n* merged rows ``(arrival_s, source index, prompt, output)``."""
    return [row[:4] for row in merge_sources([rows for _, rows in sources.generator_sources()], n)]


def test_the_simulation_uses_the_sources_build_sources_makes() -> None:
    """A Simulation's client sources and streams are those of build_sources for its workload and
    seed: the same clients, rates and rows."""
    scenario = load_scenario(REPO / "scenarios" / "two_clients.yaml", ["workload.num_requests=300"])
    sim = Simulation(scenario)
    built = build_sources(scenario.workload, default_seed=scenario.seed)
    assert sim.workload_sources is not None and sim.sources == sim.workload_sources.clients
    assert [(s.client.id, s.rate) for s in sim.sources] == [(s.client.id, s.rate) for s in built.clients]
    assert _rows(sim.workload_sources, 300) == _rows(built, 300)


def test_the_workload_seed_wins_over_the_default() -> None:
    """The streams' root seed is the workload's own seed, else the default given, else 0."""
    wl = load_workload(TWO_CLIENTS)
    assert build_sources(wl, default_seed=5).seed == 42
    unseeded = attrs.evolve(wl, seed=None)
    assert build_sources(unseeded, default_seed=5).seed == 5 and build_sources(unseeded).seed == 0
    assert workload_seed(unseeded, 9) == 9


def test_spec_workload_takes_a_scenario_or_a_bare_workload() -> None:
    """A scenario gives its workload and (for an unseeded workload) its own seed; a bare spec its own seed or 0."""
    scenario = load_scenario(REPO / "scenarios" / "quickstart.yaml")
    assert spec_workload(scenario) == (scenario.workload, 42)
    wl = load_workload(TWO_CLIENTS)
    assert spec_workload(wl) == (wl, 42) and spec_workload(attrs.evolve(wl, seed=None))[1] == 0
    with pytest.raises(TypeError):
        spec_workload("scenarios/quickstart.yaml")  # type: ignore[arg-type]


def test_a_bare_workload_generates_what_the_scenario_with_its_seed_generates() -> None:
    """generate_requests of the shipped bare spec (seed 42) equals that of the two_clients scenario
    (root seed 42, unseeded workload) cut to the same number of requests, whichever form is given."""
    scenario = load_scenario(REPO / "scenarios" / "two_clients.yaml", ["workload.num_requests=2000"])
    expected = generate_requests(scenario)
    pd.testing.assert_frame_equal(generate_requests(load_workload(TWO_CLIENTS)), expected)
    pd.testing.assert_frame_equal(generate_requests(load_workload_or_scenario(TWO_CLIENTS)), expected)
    pd.testing.assert_frame_equal(generate_requests(load_workload_or_scenario(str(TWO_CLIENTS), ["num_requests=2000"])), expected)


def test_overrides_of_a_loaded_spec_reach_the_generated_requests() -> None:
    """Overrides applied to a loaded scenario or bare spec (keys relative to a bare spec) decide
    what generate_requests generates."""
    assert len(generate_requests(override_spec(load_workload(TWO_CLIENTS), ["workload.num_requests=25"]))) == 25
    assert len(generate_requests(override_spec(load_scenario(REPO / "scenarios" / "quickstart.yaml"), {"workload.num_requests": 30}))) == 30


def test_a_zero_rate_client_of_a_bare_spec_is_named_by_its_own_key_path() -> None:
    """In a bare workload spec the left-out client's key path has no ``workload.`` prefix, and the
    warning points at the caller's line."""
    data = tiny_scenario()["workload"]
    data["clients"].append({**data["clients"][0], "id": "idle", "rate_fraction": 0.0})
    with pytest.warns(ScenarioWarning) as caught:
        table = generate_requests(workload_from_dict(data))
    assert "(clients[1].rate_fraction)" in str(caught[0].message)
    assert Path(caught[0].filename).resolve() == Path(__file__).resolve()
    assert set(table.client_id) == {"c0"}



def test_a_distribution_drawing_nan_in_a_bare_spec_names_its_key_path() -> None:
    """A sampling failure while generating a bare spec's requests is a ScenarioError at the
    distribution's key path inside the workload (in a scenario: under ``workload.``)."""
    data = tiny_scenario(name="nan")
    wl = workload_from_dict(data["workload"])
    wl = attrs.evolve(wl, clients=(attrs.evolve(wl.clients[0], output_distribution=NanDistribution()),))
    with pytest.raises(ScenarioError) as err:
        generate_requests(wl)
    assert err.value.paths == ["clients[0].output_distribution"] and err.value.source == "<workload spec>"
    with pytest.raises(ScenarioError) as err:
        generate_requests(attrs.evolve(scenario_from_dict(data), workload=wl))
    assert err.value.paths == ["workload.clients[0].output_distribution"] and err.value.source == "scenario 'nan'"


def test_generating_needs_no_serving_side_and_the_simulation_checks_the_server_block(tmp_path: Path) -> None:
    """A replayed trace whose header describes a server unlike the engine generates its requests
    (the export needs no serving section), while the simulation refuses it, naming the trace and
    the engine key."""
    trace = Trace({"server": {"type": "vllm", "max_num_seqs": 4}}, {"arrival_time_us": [0, 500], "input_tokens": [10, 20], "output_tokens": [3, 4]})
    csv_path = write_trace_v2(trace, tmp_path / "observed")[1]
    data = tiny_scenario()
    data["workload"] = {"traces": [{"path": str(csv_path)}]}
    assert len(generate_requests(workload_from_dict(data["workload"]))) == 2
    with pytest.raises(ScenarioError) as err:
        Simulation(scenario_from_dict(data))
    assert err.value.source == str(csv_path) and err.value.paths == ["serving.engine.max_num_seqs"]


def test_conversations_take_a_bare_spec_and_match_the_scenario_form() -> None:
    """The observer's sessions accept a bare workload spec; its client sources draw as those of the
    scenario holding the same workload and seed."""
    data = tiny_scenario(seed=4)
    data["workload"]["clients"][0]["multi_turn"] = {"max_rounds": 3, "think_time": {"type": "constant", "params": {"value": 0.1}}}
    data["workload"]["clients"][0]["multi_turn"]["rounds_distribution"] = {"type": "uniform", "params": {"low": 1, "high": 3}}
    scenario = scenario_from_dict(data)
    bare = workload_from_dict({**data["workload"], "seed": 4})
    assert has_sessions(scenario) and has_sessions(bare)
    requests = load_requests(generate_requests(bare))
    a, b = Conversations(scenario, requests), Conversations(bare, load_requests(generate_requests(scenario)))
    assert set(a.sources) == set(b.sources) == {"c0"}
    draws_a = a.sources["c0"].stream("session").random(5)
    draws_b = b.sources["c0"].stream("session").random(5)
    assert np.array_equal(draws_a, draws_b)
    for req in requests[:5]:
        assert a.messages(req) is not None and b.messages(req) is not None
        assert a.live[req.fields["session_id"]].session.iterations == b.live[req.fields["session_id"]].session.iterations


def test_conversations_accept_sources_already_built() -> None:
    """Given a WorkloadSources, Conversations uses its client sources as they are."""
    data = tiny_scenario()
    data["workload"]["clients"][0]["conversational_probability"] = 0.5
    data["workload"]["clients"][0]["follow_up_think_time"] = {"type": "constant", "params": {"value": 0.1}}
    sources = build_sources(workload_from_dict(data["workload"]))
    conv = Conversations(sources, [])
    assert conv.sources["c0"] is sources.client("c0")


def test_building_warns_only_for_zero_rate_clients() -> None:
    """A workload whose clients all send requests builds without a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sources = build_sources(load_workload(TWO_CLIENTS))
    assert sources.client("nobody") is None and set(sources.by_client_id) == {"high-volume-batch", "realtime-chat"}
