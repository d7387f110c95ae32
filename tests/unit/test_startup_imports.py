"""``simpy-llm run`` imports what a run needs: the heavy libraries and the components a
scenario does not use are loaded on first use (``benchmarks/bench_startup.py`` times it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"

LAZY = (
    # libraries of the observer, the calibrator, the report, the explorer and optional extras
    "pandas", "scipy", "plotly", "aiohttp", "prometheus_client", "dask", "optuna", "sklearn", "matplotlib",
    "networkx", "pyarrow", "uvloop",
    # what the command line's other verbs run
    "simpy_llm.calibrate.compare", "simpy_llm.calibrate.fit", "simpy_llm.calibrate.stats", "simpy_llm.observe.client",
    "simpy_llm.observe.run", "simpy_llm.observe.bench.run", "simpy_llm.report.html", "simpy_llm.explore.sweeps",
    # latency models, arrival processes and policies the quickstart does not name
    "simpy_llm.serving.lut", "simpy_llm.serving.profiled", "simpy_llm.workload.servegen", "simpy_llm.policies.gamma",
    "simpy_llm.policies.mode", "simpy_llm.policies.drafter_selection", "simpy_llm.policies.latency_head",
    # features it does not use: speculative decoding, networks, disaggregation
    "simpy_llm.speculative", "simpy_llm.network.topology", "simpy_llm.network.link", "simpy_llm.network.client",
    "simpy_llm.serving.disaggregation",
    # the other verbs' argument parsers and the --html check's figures
    "simpy_llm.calibrate", "simpy_llm.observe", "simpy_llm.explore", "simpy_llm.report.figures",
    # the planner, batch servers, the autoscaler's process and the device catalogue
    "simpy_llm.serving.planner", "simpy_llm.policies.planning", "simpy_llm.serving.batching", "simpy_llm.policies.batching",
    "simpy_llm.serving.devices",
    # the summary's printing, after the run
    "rich",
)
"""Modules a quickstart run has no use for before its first event."""


def _fresh(code: str) -> object:
    """The JSON that *code*, run in a fresh interpreter from the repository root, prints last."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_run_loads_no_lazy_module_before_its_first_event() -> None:
    """``simpy-llm run`` of the quickstart (its main(), as the command calls it) has loaded
    none of :data:`LAZY` when the simulation's first event has been processed."""
    code = f"""
import contextlib, io, json, sys
import simpy_llm.kernel as kernel

seen = []
def first_step(env):
    del kernel.Environment.step  # back to SimPy's own
    env.step()
    seen.extend(sys.modules)

kernel.Environment.step = first_step
from simpy_llm.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(["run", {str(QUICKSTART)!r}, "--set", "workload.num_requests=20", "--progress", "off"])
lazy = {LAZY!r}
print(json.dumps([code, bool(seen), sorted(m for m in seen if m in lazy or m.startswith(tuple(f"{{x}}." for x in lazy)))]))
"""
    assert _fresh(code) == [0, True, []]


def test_a_latency_kind_of_a_module_not_loaded_is_found() -> None:
    """``latency_models`` lists and finds the kinds of modules not imported yet (lut, profile,
    roofline), importing them on that lookup."""
    code = """
import json, sys
from simpy_llm.serving.latency import latency_models
before = "simpy_llm.serving.lut" in sys.modules
found = latency_models.get("lut").__module__
print(json.dumps([before, found, latency_models.names()]))
"""
    assert _fresh(code) == [False, "simpy_llm.serving.lut", ["batch_table", "blis_linear", "lut", "profile", "roofline"]]


def test_a_scenario_naming_a_lazily_loaded_kind_loads() -> None:
    """A scenario whose latency model is ``roofline`` loads and runs in a fresh interpreter,
    as it did when every kind was imported up front."""
    code = f"""
import json
from simpy_llm import Simulation, load_scenario
scenario = load_scenario({str(QUICKSTART)!r}, ["workload.num_requests=20", "serving.latency_model.kind=roofline",
    "serving.latency_model.params={{model: llama-3.1-8b-instruct, gpu: H100, tp: 2}}"])
print(json.dumps([scenario.serving.latency_model.kind, Simulation(scenario).run().summary()["requests"]["completed"]]))
"""
    assert _fresh(code) == ["roofline", 20]


def test_calibrate_exports_the_functions_whatever_module_loaded_first() -> None:
    """``simpy_llm.calibrate.compare`` and ``.fit`` are the functions, also when their modules
    were imported (by the command line's verbs) before the package's name was read."""
    code = """
import json
import simpy_llm.calibrate.fit
from simpy_llm.calibrate import compare, fit
print(json.dumps([callable(compare) and compare.__name__, callable(fit) and fit.__name__]))
"""
    assert _fresh(code) == ["compare", "fit"]


def _loaded_by_a_run(scenario: str, overrides: list[str], modules: list[str]) -> object:
    """``[completed requests, which of *modules* are loaded]`` after a fresh interpreter ran
    *scenario* (relative to the repository root) with *overrides*, as ``simpy-llm run`` loads it."""
    code = f"""
import json, sys
from simpy_llm import Simulation, load_scenario
results = Simulation(load_scenario({scenario!r}, {overrides!r})).run()
print(json.dumps([results.summary()["requests"]["completed"], [m for m in {modules!r} if m in sys.modules]]))
"""
    return _fresh(code)


def test_a_scenario_with_a_planner_loads_the_planner() -> None:
    """The planner's module, left out of a quickstart run, is imported by a run whose scenario
    has a ``planner`` section, and that run completes its requests."""
    got = _loaded_by_a_run("scenarios/planner_pool_split.yaml", ["workload.num_requests=40"],
                           ["simpy_llm.serving.planner", "simpy_llm.policies.planning"])
    assert got == [40, ["simpy_llm.serving.planner", "simpy_llm.policies.planning"]]


def test_a_scenario_with_batch_servers_loads_the_batch_server() -> None:
    """The batch server's module and the batching policies, left out of a quickstart run, are
    imported by a run of a fleet of batch servers, which completes its requests."""
    got = _loaded_by_a_run("scenarios/continuous_vs_static.yaml", ["workload.num_requests=40"],
                           ["simpy_llm.serving.batching", "simpy_llm.policies.batching"])
    assert got == [40, ["simpy_llm.serving.batching", "simpy_llm.policies.batching"]]


def test_a_scenario_with_an_autoscaler_loads_its_fleet_control() -> None:
    """The autoscaler's fleet control (in the planner's module, left out of a quickstart run)
    is imported by a run whose scenario has an ``autoscaler`` section (20 s of 15 requests/s)."""
    got = _loaded_by_a_run("tests/data/autoscaler/step.yaml", ["workload.horizon_s=20"], ["simpy_llm.serving.planner"])
    assert got == [300, ["simpy_llm.serving.planner"]]


def test_a_verb_of_another_module_still_parses() -> None:
    """``simpy-llm --help`` lists the verbs declared in other modules (calibrate, sweep, report,
    bench) beside the command line's own, as before ``run`` stopped building their parsers."""
    out = subprocess.run([sys.executable, "-m", "simpy_llm.cli", "--help"], capture_output=True, text=True, cwd=ROOT)
    verbs = out.stdout.split("{", 1)[1].split("}", 1)[0].split(",")
    assert {"run", "validate", "calibrate", "sweep", "report", "bench", "capacity", "deploy", "catalogue"} <= set(verbs)


def _blas_threads(code: str, env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if env_value is not None:
        env["OPENBLAS_NUM_THREADS"] = env_value
    script = f"import os; {code}; print(os.environ.get('OPENBLAS_NUM_THREADS', 'unset'))"
    return subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_command_runs_one_blas_thread_unless_its_user_set_a_number():
    """Importing the command line sets ``OPENBLAS_NUM_THREADS=1`` before numpy loads, keeps a value
    the user gave, and importing the library alone sets nothing."""
    assert _blas_threads("import simpy_llm.cli", None) == "1"
    assert _blas_threads("import simpy_llm.cli", "4") == "4"
    assert _blas_threads("from simpy_llm import Simulation, load_scenario", None) == "unset"
