"""Fuzzing whole runs: every shipped scenario, mutated at random, loads and runs (shortened)
to Results, or stops with one ScenarioError whose key paths name real keys.

Each example takes a shipped scenario, shortens it (few requests, a short horizon, a
small ``simulation.until_s``, few ServeGen clients, few trace rows), then replaces one
to three of its leaves with extreme or odd values: huge integers, 1e300, NaN, infinities,
negative numbers, zero, tiny floats, the old value scaled by powers of ten, strings,
None, lists and mappings. The shortening is applied first, so a mutation may override
it. If the loader accepts the result the scenario is built and run. Nothing but a
:class:`~simpy_llm.config.ScenarioError` may come out.

Every run is also capped at a number of SimPy events (a mutation may legitimately ask for
a long run); reaching the cap ends the example as a success. Set
``SIMPY_LLM_FUZZ_EXAMPLES`` to run more examples than the suite's default, e.g.
``SIMPY_LLM_FUZZ_EXAMPLES=3000 pytest tests/property/test_scenario_mutation_fuzz.py
--hypothesis-seed=1``: such a run is not derandomized (the suite's default run is, as every
test is), so each ``--hypothesis-seed`` tries other examples, and a run without one reports
the seed that reproduces a failure.
"""

from __future__ import annotations

import copy
import itertools
import math
import os
import re
import warnings
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from simpy_llm import Simulation
from simpy_llm.config import ScenarioError
from simpy_llm.config.errors import ScenarioWarning
from simpy_llm.config.paths import base_dir
from simpy_llm.config.validators import MAX_KV_BLOCK_SIZE, MAX_REPLICAS, MAX_SEED, MAX_TIME_S, MAX_TOKENS
from simpy_llm.loading import scenario_from_dict
from simpy_llm.loading.loader import _with_workload_file_read

SCENARIO_DIR = Path(__file__).resolve().parents[2] / "scenarios"


def _read(path: Path) -> dict[str, Any]:
    """The scenario file's data; a workload given as ``{file: PATH}`` also holds the file's
    keys (``file`` kept), as ``load_scenario`` reads it before applying overrides, so that
    the workload's leaves are mutated and shortened like any other."""
    with base_dir(SCENARIO_DIR):
        return _with_workload_file_read(yaml.safe_load(path.read_text()))


SCENARIOS: dict[str, Any] = {p.name: _read(p) for p in sorted(SCENARIO_DIR.glob("*.yaml"))}

EXAMPLES = int(os.environ.get("SIMPY_LLM_FUZZ_EXAMPLES", "800"))
"""Examples per run of the test (the suite's default keeps it to well under a minute)."""
LONG_RUN = "SIMPY_LLM_FUZZ_EXAMPLES" in os.environ
"""A run asked for by its example count: its examples come from ``--hypothesis-seed`` (or a
random seed), not from the test's digest (a derandomized run ignores the seed)."""

SHORT_REQUESTS = 20
SHORT_HORIZON_S = 20.0
SHORT_UNTIL_S = 5.0
SHORT_SERVEGEN_CLIENTS = 3
EVENT_BUDGET = 20_000
"""SimPy events one example may take before it counts as having run."""

ODD_VALUES: list[Any] = [
    2**70, -(2**70), 10**300, 2**63, 2**31, 2**24 + 1, 100_001,
    MAX_TOKENS, MAX_REPLICAS, MAX_SEED, MAX_TIME_S, MAX_KV_BLOCK_SIZE,
    1e300, -1e300, 1e12, 1e9, 1e6, 1e3, 7, 2, 1, 0, -1, -0.0, 0.5,
    1e-3, 1e-9, 1e-300, 5e-324,
    math.nan, math.inf, -math.inf,
    True, False, None, "", "7", "auto", "poisson", [], [1, 2], [0, 1e300], {}, {"x": 1},
]  # fmt: skip


def _shortened(data: dict[str, Any]) -> dict[str, Any]:
    """*data* with its run cut short (the keys set here are mutable like any other)."""
    wl = data["workload"]
    if "num_requests" in wl:
        wl["num_requests"] = min(wl["num_requests"], SHORT_REQUESTS)
    if "horizon_s" in wl:
        wl["horizon_s"] = min(wl["horizon_s"], SHORT_HORIZON_S)
    if "servegen_data" in wl:
        wl["servegen_data"]["max_clients"] = SHORT_SERVEGEN_CLIENTS
    for trace in wl.get("traces", []):
        trace["max_requests"] = SHORT_REQUESTS
    data.setdefault("simulation", {})["until_s"] = SHORT_UNTIL_S
    return data


def _leaves(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Key paths (tuples of keys and indices) of every scalar in *node*."""
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _leaves(v, (*prefix, k))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _leaves(v, (*prefix, i))]
    return [prefix]


def _get(data: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        data = data[step]
    return data


SHORT: dict[str, Any] = {name: _shortened(copy.deepcopy(data)) for name, data in SCENARIOS.items()}
LEAVES = {name: _leaves(data) for name, data in SHORT.items()}
NUMERIC_LEAVES = {
    name: [p for p in paths if isinstance(_get(SHORT[name], p), (int, float)) and not isinstance(_get(SHORT[name], p), bool)]
    for name, paths in LEAVES.items()
}


@st.composite
def mutated_scenarios(draw: st.DrawFn) -> tuple[str, dict[str, Any], list[str]]:
    """(scenario file name, its shortened data with one to three leaves replaced, the edits)."""
    name = draw(st.sampled_from(sorted(SHORT)))
    data = copy.deepcopy(SHORT[name])
    edits = []
    for _ in range(draw(st.integers(1, 3))):
        pool = NUMERIC_LEAVES[name] if draw(st.integers(0, 3)) else LEAVES[name]
        path = draw(st.sampled_from(pool))
        old = _get(data, path)
        if isinstance(old, (int, float)) and not isinstance(old, bool) and draw(st.booleans()):
            k = draw(st.sampled_from([k for k in range(-12, 13) if k]))  # the old value scaled, type kept
            if isinstance(old, int):
                new = old * 10**k if k > 0 else old // 10**-k
            else:
                new = old * 10.0**k
        else:
            new = draw(
                st.one_of(
                    st.sampled_from(ODD_VALUES),
                    st.integers(-(2**80), 2**80),
                    st.floats(allow_nan=True, allow_infinity=True),
                )
            )
        _get(data, path[:-1])[path[-1]] = new
        edits.append(f"{'.'.join(map(str, path))} = {new!r}")
    return name, data, edits


class _Budget(Exception):
    """The example used up its SimPy events."""


def _capped(sim: Simulation, events: int) -> None:
    """Stop *sim* with :class:`_Budget` after *events* SimPy events."""
    step = sim.env.step
    counter = itertools.count()

    def limited() -> None:
        if next(counter) >= events:
            raise _Budget
        step()

    sim.env.step = limited  # type: ignore[method-assign]


_INDEX = re.compile(r"\[(\d+)\]")


def _segments(path: str) -> list[Any]:
    """``"a.b[1].c"`` -> ``["a", "b", 1, "c"]``."""
    out: list[Any] = []
    for part in path.split("."):
        head = part.split("[", 1)[0]
        if head:
            out.append(head)
        out.extend(int(i) for i in _INDEX.findall(part))
    return out


def _names_real_key(data: Any, path: str) -> bool:
    """Whether *path* leads through *data* to a key that is there, or to a missing key of a
    mapping that is there (a required key left out), or to a parameter of a registered
    class that a policy's ``params`` mapping leaves out. A mapping's key may itself hold
    dots (``planner.constraints.latency_s.ttft.p95`` names the key ``latency_s.ttft.p95``)."""
    segments = _segments(path)
    return bool(segments) and _leads_to_key(data, segments, None)


def _leads_to_key(node: Any, segments: list[Any], previous: Any) -> bool:
    """:func:`_names_real_key` from *node* along the remaining *segments* (*previous*: the
    segment that led to *node*)."""
    if not segments:
        return True
    seg, rest = segments[0], segments[1:]
    if isinstance(node, list):
        return isinstance(seg, int) and seg < len(node) and _leads_to_key(node[seg], rest, seg)
    if isinstance(node, dict):
        for n in range(len(segments), 0, -1):  # the longest dotted key first
            head = segments[:n]
            key = ".".join(map(str, head))
            if all(isinstance(h, str) for h in head) and key in node and _leads_to_key(node[key], segments[n:], head[-1]):
                return True
        if not rest and isinstance(seg, str):
            return True  # a missing key of a mapping that is there
    # a parameter of a registered class that a policy's params mapping leaves out
    return isinstance(seg, str) and previous == "params" and node is not None and not rest


def _named_files(data: Any) -> list[Path]:
    """The files and directories *data* names (string leaves, relative to the scenarios)."""
    out = []
    for path in _leaves(data):
        value = _get(data, path)
        if isinstance(value, str) and value:
            out.append((SCENARIO_DIR / value).resolve())
    return out


def _check_error(exc: ScenarioError, data: dict[str, Any], source: str) -> None:
    """*exc* reports problems with messages; about the scenario, each names a real key path;
    about a data file the scenario names (a ServeGen directory, a trace), its paths are
    inside that file."""
    assert exc.problems, "a ScenarioError must report at least one problem"
    about_scenario = exc.source in (source, f"scenario {data.get('name')!r}")
    for path, message in exc.problems:
        assert isinstance(message, str) and message
        if about_scenario:
            assert _names_real_key(data, path), (path, message)
    if not about_scenario:
        named = Path(exc.source).resolve()
        assert any(named == f or f in named.parents for f in _named_files(data)), exc.source


def _check_warnings(caught: list[warnings.WarningMessage], scenario: Any) -> None:
    """Building warns exactly for the clients a mutation gave rate_fraction 0, naming each."""
    idle = sorted(repr(c.id) for c in scenario.workload.clients if c.rate_fraction == 0)
    for w in caught:
        assert issubclass(w.category, ScenarioWarning), w  # (any other warning is re-raised as an error)
    named = sorted(str(w.message).split(" has rate_fraction 0")[0].removeprefix("client ") for w in caught)
    assert named == idle, (named, idle)


def _load_and_run(name: str, data: dict[str, Any]) -> str:
    """Load and run *data* as scenario *name*; the outcome for ``event``."""
    source = str(SCENARIO_DIR / name)
    try:
        with base_dir(SCENARIO_DIR):
            scenario = scenario_from_dict(data, source=source)
    except ScenarioError as exc:
        _check_error(exc, data, source)
        return "rejected by the loader"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ScenarioWarning)
            sim = Simulation(scenario)
        _check_warnings(caught, scenario)
        _capped(sim, EVENT_BUDGET)
        sim.run()
    except ScenarioError as exc:
        _check_error(exc, data, source)
        return "rejected when built or run"
    except _Budget:
        return "ran (event cap reached)"
    return "ran to the end"


@settings(
    max_examples=EXAMPLES, derandomize=not LONG_RUN, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(mutated_scenarios())
def test_mutated_scenarios_run_or_raise_scenario_error(case: tuple[str, dict[str, Any], list[str]]) -> None:
    """A shipped scenario with extreme or odd values in one to three leaves either loads and runs
    (shortened) or raises ScenarioError naming real keys; no other exception escapes."""
    name, data, _edits = case  # the edits show in a failing example's report
    event(_load_and_run(name, data))


def test_shortened_scenarios_run() -> None:
    """Every shipped scenario, shortened as the fuzz test shortens it, loads and runs unchanged
    (so a rejection in the fuzz test is the mutation's doing)."""
    for name, data in SHORT.items():
        assert _load_and_run(name, copy.deepcopy(data)) in ("ran to the end", "ran (event cap reached)"), name


def test_names_real_key_follows_the_data() -> None:
    """The key-path check accepts keys that are in the data (or missing from a mapping that is)
    and refuses paths through keys that are not there."""
    data = {"workload": {"clients": [{"id": "a", "input_distribution": {"type": "lognormal", "params": {"mu": 1}}}]}}
    assert _names_real_key(data, "workload.clients[0].input_distribution.params.mu")
    assert _names_real_key(data, "workload.clients[0].output_distribution")
    assert _names_real_key(data, "workload.clients[0].input_distribution.params.sigma")
    assert not _names_real_key(data, "workload.clients[3].id")
    assert not _names_real_key(data, "workload.nothing.here")
    assert not _names_real_key(data, "")


def test_names_real_key_takes_keys_with_dots() -> None:
    """A mapping key holding dots (a planner constraint's summary path) is a real key, and a
    path through it goes on below it."""
    data = {"planner": {"constraints": {"latency_s.ttft.p95": 0.5}, "x": {"a.b": {"c": 1}}}}
    assert _names_real_key(data, "planner.constraints.latency_s.ttft.p95")
    assert _names_real_key(data, "planner.x.a.b.c")
    assert not _names_real_key(data, "planner.constraints.latency_s.ttft.p95.more")
    assert not _names_real_key(data, "planner.x.a.c.d")
