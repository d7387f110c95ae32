"""The pre-run check of the files a scenario (or a bare workload spec) references.

Loading a scenario reads the scenario file and nothing it names beyond what loading needs
(``config`` is data). The files the workload replays are read when the simulation is built;
:func:`check_spec_files` reads just enough of each of them, before anything runs, for a
missing or malformed file to be refused with the scenario's key path instead of failing
later: ``simpy-llm validate``, ``run``, ``serve``, ``workload``, ``observe``, ``sweep`` and
``capacity`` call it, and so does building a :class:`~simpy_llm.simulation.Simulation` that
runs the scenario's workload (not one fed by ``external_arrivals``). It checks

* every trace, by :func:`~simpy_llm.workload.traces.check_trace_files`: the file exists and
  can be read, and its header line (or first object, or YAML header) has what its format
  needs; the rows are read, and checked line by line, when the trace is loaded;
* a trace v2 header's ``server`` block against the scenario's engine (``server_block:
  check``, as the simulation always did);
* the ``slo_class`` a trace source gives every row when its file carries no class of its own
  (``azure``, ``mooncake``, ``burstgpt``, a CSV without an ``slo_class`` column): a key of
  the scenario's ``slo`` when it has one;
* the ServeGen data directory: it exists and holds ``chunk-<id>-trace.csv`` files.

:func:`warn_unknown_trace_classes` reports the replayed rows whose own class the ``slo``
section does not define, once the rows are read; :func:`request_slo_classes` lists the
classes a scenario's requests can carry.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simpy_llm.config.errors import WORKLOAD_SPEC, ScenarioError, ScenarioWarning
from simpy_llm.config.schema import Scenario, WorkloadConfig

if TYPE_CHECKING:
    from simpy_llm.config.schema import TraceSource
    from simpy_llm.workload.traces import Trace, TraceFileInfo

__all__ = ["check_spec_files", "request_slo_classes", "spec_source", "warn_unknown_trace_classes"]

_SERVEGEN_TRACE = re.compile(r"chunk-\d+-trace\.csv")


def spec_source(spec: Scenario | WorkloadConfig) -> str:
    """What a :class:`~simpy_llm.config.ScenarioError` about *spec* names as its source: the
    file a scenario was loaded from, else ``scenario 'NAME'`` (``<scenario>`` without a name;
    ``<workload spec>`` for a bare workload spec), as a run's errors name it.

    >>> from simpy_llm.loading import load_scenario, load_workload
    >>> spec_source(load_scenario("scenarios/quickstart.yaml")).endswith("scenarios/quickstart.yaml")
    True
    >>> spec_source(load_workload("scenarios/workloads/two_clients.yaml"))
    '<workload spec>'
    """
    if isinstance(spec, WorkloadConfig):
        return "<workload spec>"
    if spec.loaded_from is not None:
        return spec.loaded_from
    return f"scenario {spec.name!r}" if spec.name else "<scenario>"


def check_spec_files(spec: Scenario | WorkloadConfig, source: str | None = None) -> None:
    """Check the files *spec* references before it runs (see the module docstring).

    Parameters
    ----------
    spec
        A scenario, or a bare workload spec (key paths are then relative to the workload).
    source
        The file *spec* was read from, for the error (default: :func:`spec_source`).

    Raises
    ------
    ScenarioError
        Naming *source*, the key path of each reference that cannot be used
        (``workload.traces[0].path``) and, in its message, the file and what is wrong with
        it. A trace v2 whose ``server`` block contradicts the engine raises the error the
        simulation always raised: naming the trace file and each differing engine key.

    Examples
    --------
    >>> from simpy_llm.loading import load_scenario
    >>> check_spec_files(load_scenario("scenarios/azure_conversation_replay.yaml"))
    >>> check_spec_files(load_scenario("scenarios/azure_conversation_replay.yaml", ["workload.traces.0.format=burstgpt"]),
    ...                  source="replay.yaml")
    Traceback (most recent call last):
    ...
    simpy_llm.config.errors.ScenarioError: replay.yaml: 1 problem(s) in scenario
      workload.traces[0].path: .../AzureLLMInferenceTrace_conv.csv: line 1: missing column(s) Timestamp, ...
    """
    scenario = spec if isinstance(spec, Scenario) else None
    workload = scenario.workload if scenario is not None else spec
    if not isinstance(workload, WorkloadConfig):
        raise TypeError(f"expected a Scenario or a WorkloadConfig, got {type(spec).__name__}")
    source = source if source is not None else spec_source(spec)
    prefix = "workload." if scenario is not None else ""
    problems: list[tuple[str, str]] = []
    headers: list[tuple[int, TraceSource, TraceFileInfo]] = []
    if workload.traces:  # the trace module loads pandas: only when there is a trace
        from simpy_llm.workload.traces import check_trace_files, server_block_mismatches
    for i, trace in enumerate(workload.traces):
        where = f"{prefix}traces[{i}]"
        try:
            info = check_trace_files(trace)
        except ScenarioError as exc:
            problems += [(f"{where}.path", f"{exc.source}: {f'{at}: ' if at else ''}{msg}") for at, msg in exc.problems]
            continue
        headers.append((i, trace, info))
        if scenario is not None and scenario.slo and "slo_class" not in info.fields and trace.slo_class not in scenario.slo:
            message = (
                f"unknown SLO class {trace.slo_class!r} (the {trace.format} file gives its rows no class of their own, "
                f"so every row has this one); the slo section defines: {', '.join(sorted(scenario.slo))}"
            )
            problems.append((f"{where}.slo_class", message))
    if workload.servegen_data is not None:
        problem = _servegen_directory_problem(Path(workload.servegen_data.path))
        if problem is not None:
            problems.append((f"{prefix}servegen_data.path", problem))
    if problems:
        raise ScenarioError(source, problems, "scenario" if scenario is not None else WORKLOAD_SPEC)
    if scenario is None:
        return
    serving = scenario.serving
    for i, trace, info in headers:  # the observed server's settings, as the simulation always checked them
        if trace.format == "trace_v2" and trace.server_block == "check":
            mismatches = [
                (f"serving.{path}engine.{key}", f"{msg}; match it, or set workload.traces[{i}].server_block: ignore")
                for path, group in zip(serving.group_paths(), serving.groups(), strict=True)
                for key, msg in server_block_mismatches(info.header, group.engine)
            ]
            if mismatches:
                raise ScenarioError(str(trace.path), mismatches)


def _servegen_directory_problem(root: Path) -> str | None:
    """Why *root* is not a ServeGen data directory (None when it is one, as far as its names go)."""
    if not root.is_dir():
        return f"{root}: no such directory (expected ServeGen chunk-<id>-trace.csv files)"
    try:
        names = [entry.name for entry in root.iterdir()]
    except OSError as exc:
        return f"{root}: cannot list the directory: {exc.strerror or exc}"
    if not any(_SERVEGEN_TRACE.fullmatch(name) for name in names):
        return f"{root}: no chunk-<id>-trace.csv files in the directory"
    return None


def warn_unknown_trace_classes(
    scenario: Scenario, traces: Sequence[tuple[TraceSource, Trace]], stacklevel: int = 1
) -> None:
    """Issue a :class:`~simpy_llm.config.errors.ScenarioWarning` for each replayed trace
    (loaded: *traces* as :attr:`~simpy_llm.workload.sources.WorkloadSources.traces`) whose
    rows carry SLO classes that the scenario's non-empty ``slo`` section does not define,
    naming the trace's key path, the classes and their row counts.

    Such rows are replayed: a recorded trace's classes are the recording's, and replaying
    it to compare latencies (calibration) must not need them in ``slo``. They have no SLO
    target; the warning says so, because the summary's goodput counts a request without a
    target as meeting it.
    """
    if not scenario.slo:
        return
    for i, (src, trace) in enumerate(traces):
        classes, counts = np.unique(trace.frame["slo_class"].to_numpy(dtype=str), return_counts=True)
        unknown = [(str(c), int(n)) for c, n in zip(classes, counts, strict=True) if c not in scenario.slo]
        if unknown:
            listed = ", ".join(f"{c!r} ({n} rows)" for c, n in unknown)
            warnings.warn(
                f"workload.traces[{i}] ({src.path}): rows of SLO class(es) {listed} have no target in the slo "
                f"section (it defines {', '.join(sorted(scenario.slo))}); the summary's goodput counts them as met",
                ScenarioWarning,
                stacklevel=stacklevel + 1,
            )


def request_slo_classes(scenario: Scenario) -> list[str]:
    """The SLO classes *scenario*'s requests can carry, sorted: its ``slo`` keys, its clients'
    and ServeGen data's classes, and each trace's (the classes in its rows when the file has
    an ``slo_class`` column, read as the simulation reads it, else the source's ``slo_class``).

    >>> from simpy_llm.loading import load_scenario
    >>> request_slo_classes(load_scenario("scenarios/quickstart.yaml"))
    ['batch', 'interactive']
    """
    classes = set(scenario.slo)
    wl = scenario.workload
    if wl.traces:  # the trace module loads pandas: only when there is a trace
        from simpy_llm.workload.traces import check_trace_files, load_trace
    classes.update(c.slo_class for c in wl.clients)
    if wl.servegen_data is not None:
        classes.add(wl.servegen_data.slo_class)
    for trace in wl.traces:
        if "slo_class" in check_trace_files(trace).fields:
            classes.update(load_trace(trace).frame["slo_class"].unique().tolist())
        else:
            classes.add(trace.slo_class)
    return sorted(classes)
