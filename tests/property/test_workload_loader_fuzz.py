"""Fuzzing the bare workload spec loader: the shipped workload file, mutated at random key paths
and written back as YAML, loads or raises one ScenarioError naming that file, never anything else;
and a scenario referencing the mutated file (``workload: {file: PATH}``) does the same."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from simpy_llm.config import ScenarioError, WorkloadConfig
from simpy_llm.loading import load_scenario, load_workload, workload_from_dict, workload_to_dict
from tests.property.test_loader_fuzz import _mutate, _paths, keys, nested

WORKLOAD_FILE = Path(__file__).resolve().parents[2] / "scenarios" / "workloads" / "two_clients.yaml"
WORKLOAD: dict[str, Any] = yaml.safe_load(WORKLOAD_FILE.read_text())
WORKLOAD_PATHS = _paths(WORKLOAD)
SERVING = {"latency_model": {"kind": "blis_linear", "params": {"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": 2}}}
WORKLOAD_KEYS = [
    "version", "seed", "category", "aggregate_rate", "num_requests", "horizon_s", "clients",
    "servegen_data", "traces", "file", "workload", "serving",
]  # fmt: skip

# A key path: "" (top level) or key segments joined by "." with "[i]" indices, e.g. a.b[1].c
_PATH = re.compile(r"[^.\[\]]+(?:\[[^\]]*\])*(?:\.[^.\[\]]+(?:\[[^\]]*\])*)*")

mutations = st.tuples(
    st.sampled_from(WORKLOAD_PATHS),
    st.sampled_from(["replace", "delete", "add_key", "wrap_in_list"]),
    nested,
    st.one_of(keys, st.sampled_from(WORKLOAD_KEYS)),
)



@pytest.fixture(scope="module")
def work_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the examples write their files (each example overwrites the previous one's)."""
    return tmp_path_factory.mktemp("workload-fuzz")


def _mutated(edits: list[tuple[Any, ...]]) -> dict[str, Any]:
    data = copy.deepcopy(WORKLOAD)
    for path, how, value, key in edits:
        try:
            _mutate(data, path, how, value, key)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed or replaced this path
    return data


def _check_error(exc: ScenarioError, source: Path) -> None:
    assert exc.source == str(source), exc.source
    assert exc.problems, "a ScenarioError must report at least one problem"
    for path, message in exc.problems:
        assert isinstance(path, str) and (path == "" or _PATH.fullmatch(path)), path
        assert isinstance(message, str) and message


@settings(max_examples=250, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutations, min_size=1, max_size=3))
def test_mutated_workload_file_loads_or_raises_scenario_error(work_dir: Path, edits: list[tuple[Any, ...]]) -> None:
    """The shipped workload spec mutated at random key paths (values NaN, inf, huge, odd keys,
    wrapped in lists, deleted) loads to a WorkloadConfig that round-trips through plain data, or
    raises one ScenarioError whose source is the file and whose key paths are well formed."""
    path = work_dir / "workload.yaml"
    path.write_text(yaml.safe_dump(_mutated(edits), allow_unicode=True))
    try:
        wl = load_workload(path)
    except ScenarioError as exc:
        _check_error(exc, path)
        event("rejected")
        return
    event("still valid")
    assert isinstance(wl, WorkloadConfig)
    assert workload_from_dict(workload_to_dict(wl)) == wl


@settings(max_examples=120, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutations, min_size=1, max_size=2))
def test_scenario_referencing_a_mutated_workload_file_loads_or_raises_scenario_error(work_dir: Path, edits: list[tuple[Any, ...]]) -> None:
    """A scenario whose workload is ``{file: PATH}`` naming a mutated workload file loads to the
    workload ``load_workload`` gives, or raises one ScenarioError about the scenario file whose
    problems all lie under ``workload``."""
    wl_path = work_dir / "referenced.yaml"
    wl_path.write_text(yaml.safe_dump(_mutated(edits), allow_unicode=True))
    scenario_path = work_dir / "scenario.yaml"
    scenario_path.write_text(yaml.safe_dump({"seed": 1, "workload": {"file": wl_path.name}, "serving": SERVING}))
    try:
        scenario = load_scenario(scenario_path)
    except ScenarioError as exc:
        _check_error(exc, scenario_path)
        assert all(p.startswith("workload.") for p in exc.paths), exc.paths
        event("rejected")
        return
    event("still valid")
    assert scenario.workload == load_workload(wl_path)
