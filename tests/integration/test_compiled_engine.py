"""The engine compiled by the wheel's build hook (``hatch_build.py``) is the same engine: the same
records, summaries and event counts as the source on scenarios that exercise its paths, and a
replica class still open to subclasses written in Python.

The compilation needs mypyc (mypy, the test extra), setuptools and a C compiler with Python's
headers. Without them these tests skip, saying so, unless ``SIMPY_LLM_REQUIRE_EXTRAS`` names
``compiler`` (CI, whose ``.ci/run`` installs one): then they fail.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
try:
    import hatch_build
finally:
    sys.path.pop(0)

RUN = r"""
import hashlib, json, sys
import simpy_llm.serving.engine as engine
from simpy_llm import Simulation, load_scenario

out = {"engine_file": engine.__file__}
for name, path, overrides in json.loads(sys.argv[1]):
    results = Simulation(load_scenario(path, overrides)).run()
    summary = results.summary()
    summary.pop("wall_s", None)
    out[name] = [
        hashlib.sha256(results.to_dataframe().to_csv().encode()).hexdigest(),
        hashlib.sha256(json.dumps(summary, sort_keys=True, default=str).encode()).hexdigest(),
        results.events,
    ]

class Checked(engine.Replica):  # a subclass written in Python, as a user's or a test's
    def statistics(self):
        return super().statistics()

out["subclass"] = Checked.__mro__[1].__name__
print(json.dumps(out))
"""

SCENARIOS = [
    ("quickstart", "quickstart.yaml", ["workload.num_requests=3000"]),
    ("quickstart_per_step", "quickstart.yaml", ["workload.num_requests=1000", "simulation.mode=event_per_step"]),
    ("preemptions", "quickstart.yaml", ["workload.num_requests=1500", "serving.engine.kv_num_blocks=600"]),
    ("multi_turn_chat", "multi_turn_chat.yaml", []),
    ("agentic_react", "agentic_react.yaml", []),
    ("disaggregated", "disaggregated.yaml", ["workload.num_requests=3000"]),
    ("heterogeneous_fleet", "heterogeneous_fleet.yaml", ["workload.num_requests=3000"]),
    ("speculative_modes", "speculative_modes.yaml", []),
    ("llamacpp_cpu", "llamacpp_cpu.yaml", []),
    ("two_clients", "two_clients.yaml", ["workload.num_requests=3000"]),
]
"""Scenarios whose runs go through the engine's paths: stretches and cuts, one event per step,
preemptions, prefix caching in sessions, disaggregation, speculative verification, llama.cpp's
slots, several clients."""


def _required() -> bool:
    return "compiler" in {e.strip() for e in os.environ.get("SIMPY_LLM_REQUIRE_EXTRAS", "").split(",")}


class _App:
    """What hatchling gives a hook to speak through: here, a record of its warnings."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def display_warning(self, message: str) -> None:
        self.warnings.append(message)


def _hook(version_root: Path = ROOT) -> Any:
    """The build hook as hatchling makes it for a wheel of the repository at *version_root*."""
    pytest.importorskip("hatchling", reason="the hook's own tests need hatchling (the test extra)")
    return hatch_build.CompileHook(str(version_root), {}, None, None, str(version_root / "dist"), "wheel", _App())


def _source_tree(tree: Path) -> Path:
    """The package's sources alone in *tree*, laid out as a wheel holds them."""
    shutil.copytree(ROOT / "simpy_llm", tree / "simpy_llm", ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"))
    shutil.copytree(ROOT / "profiles", tree / "simpy_llm" / "_profiles")  # where the wheel puts them (pyproject.toml)
    return tree


@pytest.fixture(scope="module")
def compiled_tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The package as the hook's wheel lays it out: every source, and the compiled modules the
    hook made, at their places in the wheel."""
    hook = _hook()
    build_data: dict[str, Any] = {"force_include": {}, "artifacts": []}
    try:
        hook.initialize("standard", build_data)
        if hook.app.warnings:
            message = f"the engine could not be compiled here: {hook.app.warnings[0]}"
            if _required():
                pytest.fail(f"SIMPY_LLM_REQUIRE_EXTRAS requires compiler: {message}", pytrace=False)
            pytest.skip(message)
        tree = _source_tree(tmp_path_factory.mktemp("wheel"))
        for source, target in build_data["force_include"].items():
            (tree / target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tree / target)
        assert build_data["pure_python"] is False and build_data["infer_tag"] is True
        yield tree
    finally:
        hook.finalize("standard", build_data, "")


def _run(pythonpath: Path) -> dict[str, Any]:
    cases = [(name, str(ROOT / "scenarios" / path), overrides) for name, path, overrides in SCENARIOS]
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "PYTHONHASHSEED": "0"}
    done = subprocess.run([sys.executable, "-c", RUN, json.dumps(cases)], cwd=pythonpath, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_compiled_engine_gives_the_sources_records_summaries_and_event_counts(compiled_tree: Path, tmp_path: Path) -> None:
    """Every scenario's records, summary and SimPy event count are the same, hash for hash, from
    the compiled engine as from its source, and the compiled one is what the wheel's package
    imports."""
    compiled, source = _run(compiled_tree), _run(_source_tree(tmp_path))
    assert compiled.pop("engine_file").endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    assert source.pop("engine_file").endswith("engine.py")
    assert compiled == source
    assert compiled["subclass"] == "Replica"


def test_an_editable_build_is_not_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """An editable install compiles nothing (an edit to the source must take effect)."""
    monkeypatch.setattr(hatch_build, "compile_in_place", lambda tree: pytest.fail("compiled an editable build"))
    build_data: dict[str, Any] = {"force_include": {}}
    hook = _hook()
    hook.initialize("editable", build_data)
    hook.finalize("editable", build_data, "")
    assert build_data == {"force_include": {}}


def _failing(tree: Path) -> list[Path]:
    raise subprocess.CalledProcessError(1, ["cc"], output="", stderr="error: command 'gcc' failed: No such file or directory\n")


def test_a_machine_that_cannot_compile_gets_a_pure_python_wheel_and_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """By default a failed compilation leaves the wheel pure Python, with a warning naming why."""
    monkeypatch.delenv("SIMPY_LLM_COMPILE", raising=False)
    monkeypatch.setattr(hatch_build, "compile_in_place", _failing)
    build_data: dict[str, Any] = {"force_include": {}}
    hook = _hook()
    hook.initialize("standard", build_data)
    hook.finalize("standard", build_data, "")
    assert build_data == {"force_include": {}}
    assert len(hook.app.warnings) == 1 and "command 'gcc' failed" in hook.app.warnings[0]


def test_compile_1_fails_the_build_when_it_cannot_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """``SIMPY_LLM_COMPILE=1`` makes a failed compilation fail the build, with the compiler's words."""
    monkeypatch.setenv("SIMPY_LLM_COMPILE", "1")
    monkeypatch.setattr(hatch_build, "compile_in_place", _failing)
    hook = _hook()
    with pytest.raises(RuntimeError, match="command 'gcc' failed"):
        hook.initialize("standard", {"force_include": {}})
    hook.finalize("standard", {}, "")


def test_compile_0_builds_pure_python_without_trying(monkeypatch: pytest.MonkeyPatch) -> None:
    """``SIMPY_LLM_COMPILE=0`` builds pure Python without trying to compile."""
    monkeypatch.setenv("SIMPY_LLM_COMPILE", "0")
    monkeypatch.setattr(hatch_build, "compile_in_place", lambda tree: pytest.fail("tried to compile"))
    build_data: dict[str, Any] = {"force_include": {}}
    hook = _hook()
    hook.initialize("standard", build_data)
    assert build_data == {"force_include": {}} and not hook.app.warnings


@pytest.mark.parametrize("value", ["yes", "2", "true"])
def test_an_unknown_compile_setting_is_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """``SIMPY_LLM_COMPILE`` other than auto, 0 or 1 stops the build, naming what is allowed."""
    monkeypatch.setenv("SIMPY_LLM_COMPILE", value)
    with pytest.raises(ValueError, match=r"SIMPY_LLM_COMPILE='.*': expected one of auto, 0, 1"):
        _hook().initialize("standard", {"force_include": {}})
