"""Fuzzing the scenario loader: any input gives a Scenario or one ScenarioError, never another exception."""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any

import yaml
from hypothesis import event, given, settings
from hypothesis import strategies as st

from simpy_llm.config import Scenario, ScenarioError
from simpy_llm.loading import scenario_from_dict, scenario_hash, scenario_to_dict

QUICKSTART: dict[str, Any] = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.yaml").read_text()
)

# Key names the schema uses, so random data often reaches deep into the tree.
SCHEMA_KEYS = [
    "workload", "serving", "seed", "name", "slo", "simulation", "aggregate_rate", "num_requests",
    "horizon_s", "clients", "id", "rate_fraction", "arrival", "process", "poisson", "gamma", "cv",
    "input_distribution", "output_distribution", "type", "params", "mean", "mu", "sigma", "std_dev",
    "min", "max", "value", "constant", "exponential", "lognormal", "gaussian", "replicas", "router",
    "kind", "round_robin", "random", "rng", "engine", "max_num_seqs", "latency_model", "blis_linear",
    "model", "gpu", "tp", "beta0_us", "mode", "until_s", "ttft_s", "interactive",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**300, max_value=10**400),
    st.integers(min_value=-(10**400), max_value=-(10**300)),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 1e308, 5e-324]),
    st.text(max_size=12),
    st.sampled_from(SCHEMA_KEYS),
)
# Keys never contain the key-path punctuation, so the shape of reported paths can be checked.
keys = st.one_of(
    st.sampled_from(SCHEMA_KEYS),
    st.text(st.characters(exclude_characters=".[]"), max_size=8),
    st.integers(),
    st.none(),
    st.booleans(),
)
nested = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(keys, children, max_size=4),
    ),
    max_leaves=12,
)

# A key path: "" (top level) or key segments joined by "." with "[i]" indices, e.g. a.b[1].c
_PATH = re.compile(r"[^.\[\]]+(?:\[[^\]]*\])*(?:\.[^.\[\]]+(?:\[[^\]]*\])*)*")


def _check_outcome(data: Any) -> Scenario | None:
    """scenario_from_dict(data) returns a Scenario or raises ScenarioError with well-formed paths."""
    try:
        scenario = scenario_from_dict(data, source="fuzz.yaml")
    except ScenarioError as exc:
        assert exc.source == "fuzz.yaml"
        assert exc.problems, "a ScenarioError must report at least one problem"
        for path, message in exc.problems:
            assert isinstance(path, str)
            assert path == "" or _PATH.fullmatch(path), path
            assert isinstance(message, str) and message
        assert str(exc).startswith("fuzz.yaml: ")
        return None
    assert isinstance(scenario, Scenario)
    return scenario


@settings(max_examples=300)
@given(nested)
def test_random_data_gives_scenario_or_scenario_error(data: Any) -> None:
    """Arbitrary nested data (NaN, inf, bools, strings, huge ints, odd keys) never raises anything but ScenarioError."""
    _check_outcome(data)


@settings(max_examples=200)
@given(st.dictionaries(st.sampled_from(["workload", "serving", "seed", "name", "slo", "simulation"]), nested))
def test_random_sections_give_scenario_or_scenario_error(data: dict[str, Any]) -> None:
    """A mapping with the real top-level keys but random contents never raises anything but ScenarioError."""
    _check_outcome(data)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path (as a tuple of dict keys / list indices) in *node*, parents first."""
    out: list[tuple[Any, ...]] = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        out.append((*prefix, k))
        out.extend(_paths(v, (*prefix, k)))
    return out


QUICKSTART_PATHS = _paths(QUICKSTART)

mutations = st.tuples(
    st.sampled_from(QUICKSTART_PATHS),
    st.sampled_from(["replace", "delete", "add_key", "wrap_in_list"]),
    nested,
    keys,
)


def _mutate(data: dict[str, Any], path: tuple[Any, ...], how: str, value: Any, key: Any) -> None:
    parent: Any = data
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if how == "replace":
        parent[last] = value
    elif how == "delete":
        del parent[last]
    elif how == "add_key":
        target = parent[last]
        if isinstance(target, dict):
            target[key] = value
        else:
            parent[last] = {key: value}
    else:
        parent[last] = [parent[last]]


def _top_key(path: str) -> str:
    return re.split(r"[.\[]", path, maxsplit=1)[0]


def _section(path: str, touched: set[str]) -> str:
    """The edited section a problem at *path* follows from: its top key, or ``slo`` for a
    class a client names that an edit of ``slo`` removed."""
    if path.endswith(".slo_class") and _top_key(path) == "workload" and "slo" in touched:
        return "slo"
    return _top_key(path)


@settings(max_examples=300)
@given(st.lists(mutations, min_size=1, max_size=3))
def test_mutated_quickstart_gives_scenario_or_scenario_error(edits: list[tuple[Any, ...]]) -> None:
    """The quickstart mutated at random key paths loads, or raises ScenarioError within the edited sections
    (an edit of ``slo`` may also leave a client's ``slo_class`` naming a class it no longer defines).

    When it still loads, it round-trips through scenario_to_dict to an equal
    Scenario with the same hash.
    """
    data = copy.deepcopy(QUICKSTART)
    touched: set[str] = set()
    for path, how, value, key in edits:
        try:
            _mutate(data, path, how, value, key)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed or replaced this path
        touched.add(str(path[0]))
    scenario = _check_outcome(data)
    event("rejected" if scenario is None else "still valid")
    if scenario is None:
        with_problems = {_section(p, touched) for p in _problem_paths(data)}
        assert with_problems <= touched | {""}, (with_problems, touched)
    else:
        again = scenario_from_dict(scenario_to_dict(scenario))
        assert again == scenario
        assert scenario_hash(again) == scenario_hash(scenario)


def _problem_paths(data: Any) -> list[str]:
    try:
        scenario_from_dict(data)
    except ScenarioError as exc:
        return exc.paths
    return []
