"""The scenario-config layer: strict loading, key-path errors, overrides, round trip and hash."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
import yaml

from simpy_llm.config import EngineConfig, FieldValueError, PolicySpec, Scenario, ScenarioError
from simpy_llm.loading import apply_overrides, build_policy, load_scenario, scenario_from_dict, scenario_hash, scenario_to_dict
from simpy_llm.policies.routing import RandomRouting, RoundRobin, routing_policies
from simpy_llm.serving.latency import BlisLinearLatency, latency_models
from simpy_llm.workload.arrivals import GammaArrivals, PoissonArrivals, arrival_processes
from simpy_llm.workload.distributions import ClampedGaussian, Exponential, LogNormal, length_distributions

SOURCE = "scenario.yaml"

# --------------------------------------------------------------------------- helpers


def _steps(path: str) -> list[str | int]:
    """``"a.b[1].c"`` -> ``["a", "b", 1, "c"]`` (the key-path syntax of ScenarioError)."""
    return [int(tok[1:-1]) if tok.startswith("[") else tok for tok in re.findall(r"\[\d+\]|[^.\[\]]+", path)]


def _set(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    *parents, last = _steps(path)
    node: Any = data
    for step in parents:
        node = node[step] if isinstance(step, int) else node.setdefault(step, {})
    node[last] = value
    return data


def _delete(data: dict[str, Any], path: str) -> dict[str, Any]:
    *parents, last = _steps(path)
    node: Any = data
    for step in parents:
        node = node[step]
    del node[last]
    return data


def _error(data: Any) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data, source=SOURCE)
    return info.value


def _assert_one_problem(err: ScenarioError, path: str, *allowed: str) -> None:
    """*err* names the source, exactly *path*, and every string in *allowed*."""
    assert err.source == SOURCE
    assert err.paths == [path]
    text = str(err)
    assert text.startswith(f"{SOURCE}: 1 problem(s)")
    assert f"  {path or '<top level>'}: " in text
    for word in allowed:
        assert word in text, f"{word!r} not in {text!r}"


def _minimal() -> dict[str, Any]:
    return {
        "workload": {
            "aggregate_rate": 2.0,
            "horizon_s": 10.0,
            "clients": [
                {
                    "id": "only",
                    "rate_fraction": 1.0,
                    "arrival": {"process": "poisson"},
                    "input_distribution": {"type": "constant", "params": {"value": 100}},
                    "output_distribution": {"type": "exponential", "params": {"mean": 50}},
                }
            ],
        },
        "serving": {"latency_model": {"kind": "blis_linear", "params": {"beta0_us": 1000.0}}},
    }


# --------------------------------------------------------------------------- valid scenarios


def test_quickstart_loads_with_its_values(quickstart_path: Path) -> None:
    """The shipped quickstart loads into the typed tree with the values written in it."""
    s = load_scenario(quickstart_path)
    assert isinstance(s, Scenario)
    assert (s.name, s.seed, s.workload.num_requests, s.workload.horizon_s) == ("quickstart", 42, 20000, None)
    chat, batch = s.workload.clients
    assert chat.arrival == PoissonArrivals()
    assert chat.input_distribution == LogNormal(mu=6.0, sigma=0.8)
    assert batch.arrival == GammaArrivals(cv=2.0)
    assert batch.input_distribution == ClampedGaussian(mean=1000.0, std_dev=300.0, min=50.0, max=4000.0)
    assert batch.output_distribution == Exponential(mean=300.0)
    assert s.serving.latency_model == PolicySpec(
        kind="blis_linear", params={"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": 2}
    )
    assert s.serving.engine.kv_num_blocks == 4096
    assert s.slo["batch"].e2e_s == 30.0 and s.slo["batch"].ttft_s is None


def test_minimal_scenario_gets_documented_defaults() -> None:
    """Keys left out take the schema defaults (1 replica, round robin, default engine, seed 0)."""
    s = scenario_from_dict(_minimal())
    assert s.seed == 0 and s.name == "" and s.slo == {}
    assert s.serving.replicas == 1
    assert s.serving.router == PolicySpec(kind="round_robin")
    assert s.serving.engine == EngineConfig()
    assert s.simulation.mode == "event_per_change" and s.simulation.until_s is None
    assert s.workload.clients[0].slo_class == "default"


def test_integers_are_accepted_where_floats_are_expected() -> None:
    """An integer YAML value for a float field is accepted and stored as a float."""
    s = scenario_from_dict(_set(_minimal(), "workload.aggregate_rate", 3))
    assert s.workload.aggregate_rate == 3.0
    assert type(s.workload.aggregate_rate) is float


def test_round_trip_gives_an_equal_scenario(quickstart_path: Path) -> None:
    """scenario_to_dict -> scenario_from_dict reproduces an equal Scenario."""
    s = load_scenario(quickstart_path)
    assert scenario_from_dict(scenario_to_dict(s)) == s


def test_round_trip_survives_json(quickstart_path: Path) -> None:
    """The plain-data form is JSON-serialisable and loads back equal (as a manifest would)."""
    s = load_scenario(quickstart_path)
    blob = json.dumps(scenario_to_dict(s))
    assert scenario_from_dict(json.loads(blob)) == s


def test_round_trip_of_minimal_scenario_with_horizon() -> None:
    """A horizon-based scenario with defaults and a constant distribution round-trips too."""
    s = scenario_from_dict(_minimal())
    assert scenario_from_dict(scenario_to_dict(s)) == s


def test_scenario_hash_is_stable(quickstart_path: Path) -> None:
    """Two loads of the same file hash identically (a 64-hex-digit SHA-256)."""
    h1 = scenario_hash(load_scenario(quickstart_path))
    h2 = scenario_hash(load_scenario(quickstart_path))
    assert h1 == h2
    assert re.fullmatch(r"[0-9a-f]{64}", h1)


def test_scenario_hash_survives_round_trip(quickstart_path: Path) -> None:
    """Round-tripping does not change the hash."""
    s = load_scenario(quickstart_path)
    assert scenario_hash(scenario_from_dict(scenario_to_dict(s))) == scenario_hash(s)


def test_scenario_hash_changes_with_a_top_level_value(quickstart_path: Path) -> None:
    """Changing the seed changes the hash."""
    s = load_scenario(quickstart_path)
    assert scenario_hash(attrs.evolve(s, seed=43)) != scenario_hash(s)


def test_scenario_hash_changes_with_a_nested_value(quickstart_path: Path) -> None:
    """Changing one deeply nested value (a client's arrival CV) changes the hash."""
    a = load_scenario(quickstart_path)
    b = load_scenario(quickstart_path, ["workload.clients.1.arrival.cv=2.5"])
    assert b.workload.clients[1].arrival == GammaArrivals(cv=2.5)
    assert scenario_hash(a) != scenario_hash(b)


# --------------------------------------------------------------------------- bad input, one class at a time

UNKNOWN_KEYS = [
    ("bogus", "workload, serving, seed, name, slo, simulation"),
    ("workload.bogus", "clients, aggregate_rate, num_requests, horizon_s, version, category, seed, servegen_data, traces"),
    ("workload.clients[1].arrival.burst", "process, cv"),
    ("workload.clients[0].input_distribution.extra", "type, params"),
    ("workload.clients[0].input_distribution.params.median", "mu, sigma"),
    ("workload.clients[1].input_distribution.params.stddev", "mean, std_dev, min, max"),
    ("serving.engine.max_batch", "max_num_seqs, max_num_batched_tokens"),
    ("serving.router.policy", "kind, params"),
    ("serving.latency_model.params.beta3_us", "model, gpu, tp, beta0_us"),
    ("slo.interactive.p99_s", "ttft_s, tpot_s, e2e_s"),
    ("simulation.speed", "mode, until_s"),
]


@pytest.mark.parametrize(("path", "allowed"), UNKNOWN_KEYS, ids=[p for p, _ in UNKNOWN_KEYS])
def test_unknown_key_is_reported_with_allowed_keys(quickstart_data: dict, path: str, allowed: str) -> None:
    """An unknown key anywhere raises ScenarioError at its path, listing the allowed keys."""
    err = _error(_set(quickstart_data, path, 1))
    _assert_one_problem(err, path, "unknown key", allowed)


def test_router_params_for_a_policy_without_parameters() -> None:
    """Parameters given to a router that takes none are unknown keys (and private fields are not offered)."""
    err = _error(_set(_minimal(), "serving.router", {"kind": "round_robin", "params": {"next": 3}}))
    _assert_one_problem(err, "serving.router.params.next", "unknown key; allowed: none")
    assert "_next" not in str(err)


WRONG_TYPES = [
    ("workload.num_requests", "300", "workload.num_requests", "must be an integer"),
    ("workload.num_requests", 1.5, "workload.num_requests", "must be an integer"),
    ("workload.num_requests", True, "workload.num_requests", "must be an integer"),
    ("seed", None, "seed", "must be an integer"),
    ("workload.aggregate_rate", "fast", "workload.aggregate_rate", "must be a number"),
    ("workload.aggregate_rate", True, "workload.aggregate_rate", "must be a number"),
    ("workload.clients[1].arrival.cv", "2", "workload.clients[1].arrival.cv", "must be a number"),
    ("workload.clients[0].id", 7, "workload.clients[0].id", "must be a string"),
    ("name", ["a"], "name", "must be a string"),
    ("serving.engine.chunked_prefill", "yes", "serving.engine.chunked_prefill", "must be true or false"),
    ("serving.engine.chunked_prefill", 1, "serving.engine.chunked_prefill", "must be true or false"),
    ("serving.latency_model.params", {"beta0_us": "1000"}, "serving.latency_model.params.beta0_us", "must be a number"),
    ("workload", [], "workload", "must be a mapping with keys: clients, aggregate_rate"),
    ("serving.engine", None, "serving.engine", "must be a mapping with keys: max_num_seqs"),
    ("workload.clients", "chat", "workload.clients", "must be a list of mappings with keys: id, rate_fraction"),
    ("workload.clients", {"id": "chat"}, "workload.clients", "must be a list"),
    ("workload.clients[0]", None, "workload.clients[0]", "must be a mapping with keys: id, rate_fraction"),
    ("workload.clients[0].arrival", "poisson", "workload.clients[0].arrival", "must be a mapping"),
    ("workload.clients[0].input_distribution.params", None, "workload.clients[0].input_distribution.params", "must be a mapping"),
    ("serving.router", "round_robin", "serving.router", "must be a mapping (with keys kind and params)"),
    ("serving.latency_model.params", [1], "serving.latency_model.params", "must be a mapping"),
    ("slo", [1], "slo", "must be a mapping of names to mappings with keys: ttft_s, tpot_s, e2e_s"),
    ("slo.interactive", 0.5, "slo.interactive", "must be a mapping with keys: ttft_s, tpot_s, e2e_s"),
]


@pytest.mark.parametrize(
    ("path", "value", "where", "allowed"), WRONG_TYPES, ids=[f"{p}={v!r}" for p, v, _, _ in WRONG_TYPES]
)
def test_wrong_type_is_reported_with_expected_type(
    quickstart_data: dict, path: str, value: Any, where: str, allowed: str
) -> None:
    """A value of the wrong type (no silent coercion) raises ScenarioError at its path, saying what is expected."""
    _assert_one_problem(_error(_set(quickstart_data, path, value)), where, allowed)


def test_non_string_slo_class_name_is_reported() -> None:
    """A non-string key in a name -> value mapping is reported at that key."""
    err = _error(_set(_minimal(), "slo", {3: {"ttft_s": 1.0}}))
    _assert_one_problem(err, "slo[3]", "must be a string")


OUT_OF_RANGE = [
    ("workload.clients[1].arrival.cv", -1.0, "workload.clients[1].arrival.cv", "must be > 0"),
    ("workload.clients[1].arrival.cv", 0, "workload.clients[1].arrival.cv", "must be > 0"),
    ("workload.aggregate_rate", 0, "workload.aggregate_rate", "must be > 0"),
    ("workload.num_requests", 0, "workload.num_requests", "must be >= 1"),
    ("seed", -1, "seed", "must be >= 0"),
    ("workload.clients[0].rate_fraction", -0.5, "workload.clients[0].rate_fraction", "must be >= 0"),
    ("workload.clients[0].input_distribution.params.sigma", -0.1, "workload.clients[0].input_distribution.params.sigma", "must be >= 0"),
    ("workload.clients[1].input_distribution.params.mean", -3, "workload.clients[1].input_distribution.params.mean", "must be > 0"),
    ("workload.clients[1].input_distribution.params.min", 5000, "workload.clients[1].input_distribution.params.max", "must be >= min"),
    ("workload.clients[0].id", "", "workload.clients[0].id", "must not be empty"),
    ("workload.clients[1].id", "chat", "workload.clients", "client ids must be unique; repeated: chat"),
    ("workload.clients", [], "workload.clients", "give clients, servegen_data or traces"),
    ("workload.horizon_s", 60.0, "workload.num_requests", "give exactly one of num_requests or horizon_s"),
    ("serving.replicas", 0, "serving.replicas", "must be >= 1"),
    ("serving.engine.max_num_seqs", 4096, "serving.engine.max_num_batched_tokens", "must be >= max_num_seqs"),
    ("serving.engine.kv_num_blocks", 1, "serving.engine.kv_num_blocks", "must hold at least max_num_batched_tokens"),
    ("serving.engine.max_model_len", 1, "serving.engine.max_model_len", "must be >= 2"),
    ("serving.latency_model.params", {"beta0_us": -1.0}, "serving.latency_model.params.beta0_us", "must be >= 0"),
    ("serving.latency_model.params", {}, "serving.latency_model.params.beta0_us", "every step must take time"),
    ("simulation.mode", "fast", "simulation.mode", "must be one of event_per_change, event_per_step"),
    ("simulation.until_s", -5.0, "simulation.until_s", "must be > 0"),
    ("slo.interactive.ttft_s", 0, "slo.interactive.ttft_s", "must be > 0"),
]


@pytest.mark.parametrize(
    ("path", "value", "where", "allowed"), OUT_OF_RANGE, ids=[f"{p}={v!r}" for p, v, _, _ in OUT_OF_RANGE]
)
def test_out_of_range_value_is_reported_with_allowed_range(
    quickstart_data: dict, path: str, value: Any, where: str, allowed: str
) -> None:
    """A value outside its allowed range raises ScenarioError at its path (or the field it conflicts with)."""
    _assert_one_problem(_error(_set(quickstart_data, path, value)), where, allowed)


def test_all_zero_rate_fractions_are_rejected(quickstart_data: dict) -> None:
    """Clients whose rate fractions sum to zero are reported at workload.clients."""
    _set(quickstart_data, "workload.clients[0].rate_fraction", 0.0)
    _set(quickstart_data, "workload.clients[1].rate_fraction", 0.0)
    _assert_one_problem(_error(quickstart_data), "workload.clients", "rate_fraction > 0")


NON_FINITE = [
    ("workload.clients[1].arrival.cv", math.nan, "workload.clients[1].arrival.cv"),
    ("workload.clients[1].arrival.cv", math.inf, "workload.clients[1].arrival.cv"),
    ("workload.aggregate_rate", -math.inf, "workload.aggregate_rate"),
    ("workload.aggregate_rate", 10**400, "workload.aggregate_rate"),
    ("workload.clients[0].input_distribution.params.mu", math.inf, "workload.clients[0].input_distribution.params.mu"),
    ("workload.clients[1].input_distribution.params.mean", math.nan, "workload.clients[1].input_distribution.params.mean"),
    ("slo.batch.e2e_s", math.nan, "slo.batch.e2e_s"),
    ("serving.latency_model.params", {"beta0_us": math.nan}, "serving.latency_model.params.beta0_us"),
    ("serving.latency_model.params", {"beta0_us": 10**400}, "serving.latency_model.params.beta0_us"),
]


@pytest.mark.parametrize(("path", "value", "where"), NON_FINITE, ids=[f"{p}={v!r}"[:60] for p, v, _ in NON_FINITE])
def test_nan_and_inf_are_rejected(quickstart_data: dict, path: str, value: Any, where: str) -> None:
    """NaN, +-Inf (and integers too large for a float) raise ScenarioError saying a finite number is needed."""
    _assert_one_problem(_error(_set(quickstart_data, path, value)), where, "must be a finite number")


MISSING = [
    ("workload", "workload", "required key is missing"),
    ("serving", "serving", "required key is missing"),
    ("workload.aggregate_rate", "workload.aggregate_rate", "required with clients"),
    ("workload.clients", "workload.clients", "give clients, servegen_data or traces"),
    ("workload.clients[0].id", "workload.clients[0].id", "required key is missing"),
    ("workload.clients[1].arrival.cv", "workload.clients[1].arrival.cv", "required key is missing"),
    ("workload.clients[0].input_distribution.params.mu", "workload.clients[0].input_distribution.params.mu", "required key is missing"),
    ("serving.latency_model", "serving.latency_model", "required key is missing"),
    ("workload.num_requests", "workload.num_requests", "give exactly one of num_requests or horizon_s"),
    ("serving.latency_model.params.tp", "serving.latency_model.params.tp", "a profile needs model, gpu and tp"),
]


@pytest.mark.parametrize(("path", "where", "allowed"), MISSING, ids=[p for p, _, _ in MISSING])
def test_missing_required_key_is_reported(quickstart_data: dict, path: str, where: str, allowed: str) -> None:
    """Leaving out a required key raises ScenarioError at that key's path."""
    _assert_one_problem(_error(_delete(quickstart_data, path)), where, allowed)


TAGS = [
    ("workload.clients[1].arrival.process", arrival_processes),
    ("workload.clients[0].input_distribution.type", length_distributions),
    ("serving.router.kind", routing_policies),
    ("serving.latency_model.kind", latency_models),
]


@pytest.mark.parametrize(("path", "registry"), TAGS, ids=[p for p, _ in TAGS])
def test_missing_implementation_name_lists_the_registered_names(quickstart_data: dict, path: str, registry: Any) -> None:
    """A missing process/type/kind key is reported at its path with every registered name."""
    _assert_one_problem(_error(_delete(quickstart_data, path)), path, "required key is missing", *registry.names())


@pytest.mark.parametrize(("path", "registry"), TAGS, ids=[p for p, _ in TAGS])
def test_unknown_implementation_name_lists_the_registered_names(quickstart_data: dict, path: str, registry: Any) -> None:
    """An unknown distribution / arrival process / router / latency model names what is registered."""
    err = _error(_set(quickstart_data, path, "no_such_thing"))
    _assert_one_problem(err, path, f"unknown {registry.what} 'no_such_thing'", *registry.names())
    assert len(registry.names()) >= 1


@pytest.mark.parametrize(("path", "registry"), TAGS, ids=[p for p, _ in TAGS])
def test_non_string_implementation_name_is_rejected(quickstart_data: dict, path: str, registry: Any) -> None:
    """A process/type/kind that is not a string (here a list) is an unknown name, not a crash."""
    _assert_one_problem(_error(_set(quickstart_data, path, ["poisson"])), path, *registry.names())


def test_unknown_blis_model_lists_known_models(quickstart_data: dict) -> None:
    """A BLIS profile for an unknown model is reported at params.model with the known models."""
    _set(quickstart_data, "serving.latency_model.params.model", "no-such-model-7b")
    _assert_one_problem(
        _error(quickstart_data),
        "serving.latency_model.params.model",
        "no BLIS profile for model 'no-such-model-7b'",
        "known models:",
        "llama-3.1-8b-instruct",
    )


def test_unknown_blis_gpu_lists_the_models_profiles(quickstart_data: dict) -> None:
    """A BLIS profile on a GPU the model has no row for is reported at params.gpu with what exists."""
    _set(quickstart_data, "serving.latency_model.params.gpu", "TPU-v9")
    _assert_one_problem(_error(quickstart_data), "serving.latency_model.params.gpu", "it has:", "H100 tp2")


def test_unknown_blis_parameter_lists_allowed_keys(quickstart_data: dict) -> None:
    """An unknown key in the blis_linear params names the profile keys and coefficients."""
    _set(quickstart_data, "serving.latency_model.params.gamma_us", 1.0)
    _assert_one_problem(
        _error(quickstart_data),
        "serving.latency_model.params.gamma_us",
        "allowed: model, gpu, tp, beta0_us, beta1_us, beta2_us, alpha0_us, alpha1_us, alpha2_us",
    )


def test_random_router_loads_without_params(quickstart_data: dict) -> None:
    """A router whose only field is the injected rng (kind: random) is a valid scenario."""
    _set(quickstart_data, "serving.router", {"kind": "random"})
    assert scenario_from_dict(quickstart_data).serving.router == PolicySpec(kind="random")


def test_router_rng_cannot_be_set_from_the_scenario(quickstart_data: dict) -> None:
    """The router's rng is injected by the simulation; setting it in YAML is an error at its path."""
    _set(quickstart_data, "serving.router", {"kind": "random", "params": {"rng": 1}})
    _assert_one_problem(_error(quickstart_data), "serving.router.params.rng", "set by the simulation")


def test_non_string_unknown_keys_are_reported_not_crashed(quickstart_data: dict) -> None:
    """Unknown keys that are not strings (mixed with string ones) are each reported by name."""
    arrival = quickstart_data["workload"]["clients"][1]["arrival"]
    arrival[1] = "x"
    err = _error(quickstart_data)
    assert err.paths == ["workload.clients[1].arrival.1"]
    quickstart_data[None] = 1
    quickstart_data["zzz"] = 2
    del arrival[1]
    assert _error(quickstart_data).paths == ["None", "zzz"]


def test_top_level_must_be_a_mapping() -> None:
    """A scenario that is not a mapping is one top-level problem (path "")."""
    err = _error([1, 2, 3])
    _assert_one_problem(err, "", "must be a mapping", "list")


def test_every_independent_problem_is_reported_in_order(quickstart_data: dict) -> None:
    """Problems in separate sections are all reported, in document order, in one ScenarioError."""
    _set(quickstart_data, "serving.replicas", 0)
    _set(quickstart_data, "workload.aggregate_rate", -1.0)
    err = _error(quickstart_data)
    assert err.paths == ["workload.aggregate_rate", "serving.replicas"]
    assert str(err).startswith(f"{SOURCE}: 2 problem(s)")


def test_scenario_error_is_a_value_error() -> None:
    """ScenarioError subclasses ValueError and keeps its (path, message) pairs."""
    err = ScenarioError("f.yaml", [("a.b", "must be > 0, got -1"), ("", "bad")])
    assert isinstance(err, ValueError)
    assert err.problems == [("a.b", "must be > 0, got -1"), ("", "bad")]
    assert err.paths == ["a.b", ""]
    assert str(err) == "f.yaml: 2 problem(s) in scenario\n  a.b: must be > 0, got -1\n  <top level>: bad"


def test_numeric_validators_reject_non_numbers_when_built_directly() -> None:
    """Config classes built in code reject strings and bools with a FieldValueError naming the field."""
    with pytest.raises(FieldValueError) as info:
        Exponential(mean="5")  # type: ignore[arg-type]
    assert info.value.field == "mean" and "must be a number" in info.value.message
    with pytest.raises(FieldValueError) as info:
        BlisLinearLatency(beta0_us=True)  # type: ignore[arg-type]
    assert info.value.field == "beta0_us"


def test_numeric_validators_accept_numpy_numbers() -> None:
    """numpy scalars are numbers: a distribution built from them is valid."""
    assert Exponential(mean=np.float64(5.0)).mean == 5.0
    assert GammaArrivals(cv=np.int64(2)).cv == 2


# --------------------------------------------------------------------------- files


def test_invalid_yaml_names_file_and_line(tmp_path: Path) -> None:
    """A YAML syntax error raises ScenarioError naming the file and the line of the error."""
    f = tmp_path / "broken.yaml"
    f.write_text("seed: 1\nworkload: {aggregate_rate: [1, 2\nserving: {}\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(f)
    err = info.value
    assert err.source == str(f) and err.paths == [""]
    assert str(err).startswith(f"{f}: ")
    assert re.search(r"not valid YAML: line \d+, column \d+", str(err))


def test_yaml_error_reports_the_right_line(tmp_path: Path) -> None:
    """The reported line is the (1-based) line where the parser failed."""
    f = tmp_path / "tab.yaml"
    f.write_text("seed: 1\nname: ok\n\tworkload: 3\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(f)
    assert "line 3," in str(info.value)


def test_missing_file_is_a_scenario_error(tmp_path: Path) -> None:
    """A file that does not exist raises ScenarioError naming it (not OSError)."""
    f = tmp_path / "nope.yaml"
    with pytest.raises(ScenarioError) as info:
        load_scenario(f)
    assert info.value.source == str(f) and info.value.paths == [""]
    assert "cannot read file" in str(info.value)


@pytest.mark.parametrize("text", ["", "- 1\n- 2\n", "just a string\n"], ids=["empty", "list", "scalar"])
def test_yaml_that_is_not_a_mapping_is_rejected(tmp_path: Path, text: str) -> None:
    """An empty file, or a YAML list or scalar, is a top-level problem."""
    f = tmp_path / "s.yaml"
    f.write_text(text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(f)
    assert info.value.paths == [""] and "must be a mapping" in str(info.value)


def test_errors_from_a_file_name_the_file(tmp_path: Path, quickstart_data: dict) -> None:
    """Problems found in a file are reported against that file's name."""
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(_set(quickstart_data, "workload.clients[1].arrival.cv", -2.0)))
    with pytest.raises(ScenarioError) as info:
        load_scenario(f)
    assert info.value.source == str(f)
    assert info.value.paths == ["workload.clients[1].arrival.cv"]
    assert str(info.value).startswith(f"{f}: 1 problem(s)")


# --------------------------------------------------------------------------- overrides


def test_overrides_set_nested_values_without_touching_the_input() -> None:
    """apply_overrides parses values as YAML, creates missing mappings and copies its input."""
    data = {"a": {"b": 1}, "l": [{"x": 1}, {"x": 2}]}
    out = apply_overrides(data, ["a.b=2.5", "c.d=[1, 2]", "l.1.x=true", "s=hello"])
    assert out == {"a": {"b": 2.5}, "c": {"d": [1, 2]}, "l": [{"x": 1}, {"x": True}], "s": "hello"}
    assert data == {"a": {"b": 1}, "l": [{"x": 1}, {"x": 2}]}


def test_overrides_apply_when_loading(quickstart_path: Path) -> None:
    """load_scenario applies overrides before validating (list items by index)."""
    s = load_scenario(quickstart_path, ["workload.num_requests=300", "workload.clients.0.rate_fraction=0.5", "seed=7"])
    assert (s.workload.num_requests, s.workload.clients[0].rate_fraction, s.seed) == (300, 0.5, 7)


def test_override_to_a_missing_list_index_names_the_path(quickstart_path: Path) -> None:
    """Addressing a list item that does not exist is a ScenarioError at that path, saying the list's size."""
    with pytest.raises(ScenarioError) as info:
        load_scenario(quickstart_path, ["workload.clients.5.rate_fraction=1"])
    assert info.value.paths == ["workload.clients.5"]
    assert "no list item '5' (the list has 2)" in str(info.value)


def test_override_with_non_numeric_list_index_is_rejected(quickstart_path: Path) -> None:
    """A list addressed by a name instead of an index is a ScenarioError at that path."""
    with pytest.raises(ScenarioError) as info:
        load_scenario(quickstart_path, ["workload.clients.chat.rate_fraction=1"])
    assert info.value.paths == ["workload.clients.chat"]


def test_override_inside_a_scalar_is_rejected(quickstart_path: Path) -> None:
    """Setting a key below a scalar value is a ScenarioError at the offending path."""
    with pytest.raises(ScenarioError) as info:
        load_scenario(quickstart_path, ["seed.low=1"])
    assert info.value.paths == ["seed.low"]
    assert "non-mapping" in str(info.value)


@pytest.mark.parametrize("item", ["seed", "=3", ""])
def test_malformed_override_is_rejected(quickstart_path: Path, item: str) -> None:
    """An override that is not key=value is a top-level ScenarioError showing the expected form."""
    with pytest.raises(ScenarioError) as info:
        load_scenario(quickstart_path, [item])
    assert info.value.paths == [""] and "dotted.key=value" in str(info.value)


def test_override_with_invalid_yaml_value_is_rejected(quickstart_path: Path) -> None:
    """An override whose value is not valid YAML is a ScenarioError at its key."""
    with pytest.raises(ScenarioError) as info:
        load_scenario(quickstart_path, ["workload.clients.1.arrival=[unclosed"])
    assert info.value.paths == ["workload.clients.1.arrival"]
    assert "not valid YAML" in str(info.value)


def test_override_value_is_validated_with_its_path(quickstart_path: Path) -> None:
    """A bad value given by override is reported at its scenario key path."""
    with pytest.raises(ScenarioError) as info:
        load_scenario(quickstart_path, ["workload.clients.1.arrival.cv=.nan"])
    assert info.value.paths == ["workload.clients[1].arrival.cv"]
    assert "finite" in str(info.value)


# --------------------------------------------------------------------------- build_policy


def test_build_policy_structures_params() -> None:
    """build_policy instantiates the named class from its params."""
    spec = PolicySpec(kind="blis_linear", params={"beta0_us": 100.0, "beta2_us": 2.0})
    assert build_policy(spec, latency_models) == BlisLinearLatency(beta0_us=100.0, beta2_us=2.0)
    assert isinstance(build_policy(PolicySpec(kind="round_robin"), routing_policies), RoundRobin)


def test_build_policy_injects_declared_fields_only() -> None:
    """Injected keywords reach classes that declare them (random router's rng) and are ignored by others."""
    rng = np.random.default_rng(123)
    router = build_policy(PolicySpec(kind="random"), routing_policies, rng=rng)
    assert isinstance(router, RandomRouting) and router.rng is rng
    assert isinstance(build_policy(PolicySpec(kind="round_robin"), routing_policies, rng=rng), RoundRobin)


def test_build_policy_refuses_params_that_are_injected() -> None:
    """A param that the simulation injects may not come from the scenario."""
    with pytest.raises(FieldValueError) as info:
        build_policy(PolicySpec(kind="random", params={"rng": 1}), routing_policies, rng=np.random.default_rng(0))
    assert info.value.field == "rng"


def test_blis_profile_tp_must_be_an_integer():
    """A BLIS profile's tp given as a string is reported at params.tp as a type error."""
    from simpy_llm.config.errors import FieldValueError
    from simpy_llm.serving.latency import BlisLinearLatency

    with pytest.raises(FieldValueError) as info:
        BlisLinearLatency.from_params({"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": "2"})
    assert info.value.field == "tp"


def test_blis_profile_unknown_tp_is_blamed_on_tp():
    """A known model and GPU with a TP degree it was never fitted at is reported at params.tp."""
    from simpy_llm.config.errors import FieldValueError
    from simpy_llm.serving.latency import BlisLinearLatency

    with pytest.raises(FieldValueError) as info:
        BlisLinearLatency.from_params({"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": 3})
    assert info.value.field == "tp"
    assert "H100 tp2" in info.value.message
