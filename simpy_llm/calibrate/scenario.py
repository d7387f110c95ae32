"""The scenario an observed trace implies, and fitted latency profiles.

:func:`scenario_from_trace` turns a trace v2 header's ``server`` block (written
by ``simpy-llm observe``, see ``docs/observe.md``) into the serving system that
recorded it, so a trace can be replayed without writing a scenario by hand:

* ``llamacpp``: the ``llamacpp`` engine preset with the block's ``n_parallel``,
  ``ctx_per_slot``, ``n_batch``, ``n_ubatch``, ``cache_prompt`` and ``kv_unified``.
  Unknown ``kv_unified`` (null or absent) is the preset's default, one KV cache and passes
  in order, and with more than one slot a :class:`~simpy_llm.config.errors.ScenarioWarning` says
  so: a server started with ``--parallel N`` has a KV stream per slot unless
  ``--kv-unified`` is given, and its steps are cut by slot (docs/model.md, "Passes by
  slot"). ``simpy-llm observe --server-config`` can say which;
* ``emulated`` (``simpy-llm serve``): the server's own ``serving`` section, seed and
  engine mode, which it reports about itself;
* ``vllm`` / ``sglang``: the default engine with ``max_num_seqs``, ``block_size``,
  ``max_model_len``, ``max_num_batched_tokens`` and ``enable_prefix_caching``;
* anything else: the default engine.

The latency model comes from a fitted profile (:func:`load_profile`, written by
:mod:`simpy_llm.calibrate.fit`) when one is given, else from the block (only the
emulated server reports one); without either the call fails, naming both ways out.
The workload is the trace itself, replayed at its send times.

A profile file is YAML::

    profile_version: 1
    latency_model: {kind: batch_table, params: {...}}   # what a scenario's latency_model takes
    server: {...}        # the server block of the trace it was fitted on
    fit: {...}           # how: method, trace, requests, losses, errors per metric

and a scenario can name one in place of a latency model: ``latency_model:
{profile: path/to/profile.yaml}`` (relative to the scenario file). The scenario's
latency model then carries the ranges the profile was fitted on (``fitted_ranges``,
from ``fit.ranges``), and a run outside them warns.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from simpy_llm.config import Scenario, ScenarioError
from simpy_llm.config.errors import ScenarioWarning
from simpy_llm.config.profile import PROFILE_VERSION, load_profile, profile_latency_model
from simpy_llm.loading import scenario_from_dict, scenario_to_dict
from simpy_llm.workload.traces import SERVER_BLOCK_KEYS, Trace, read_trace_v2, trace_v2_paths

__all__ = ["PROFILE_VERSION", "apply_profile", "load_profile", "replay_scenario", "scenario_from_trace"]


_LLAMACPP_KEYS = ("n_parallel", "ctx_per_slot", "n_batch", "n_ubatch", "cache_prompt", "kv_unified")
"""The ``llamacpp`` preset's keys a llama.cpp server block gives."""


def _trace(trace: Trace | Path | str) -> tuple[Trace, str | None]:
    if isinstance(trace, Trace):
        return trace, None
    return read_trace_v2(trace), str(trace_v2_paths(trace)[1])


def _engine_from_server(server: Mapping[str, Any], source: str) -> dict[str, Any]:
    kind = server.get("type")
    if kind == "llamacpp":
        if server.get("kv_unified") is None and (server.get("n_parallel") or 1) > 1:
            warnings.warn(
                f"{source}: the llama.cpp server block does not say kv_unified; the replay assumes one KV "
                "cache (passes in order). A server started with --parallel N has a KV stream per slot "
                "unless --kv-unified is given: say which in the observer's --server-config (server.kv_unified)",
                ScenarioWarning,
                stacklevel=3,
            )
        return {"preset": "llamacpp", **{k: server[k] for k in _LLAMACPP_KEYS if server.get(k) is not None}}
    return {field: server[key] for key, field in SERVER_BLOCK_KEYS.items() if server.get(key) is not None}


def replay_scenario(scenario: Scenario | Mapping[str, Any], trace_csv: str, *, per_token: bool = False) -> Scenario:
    """*scenario* with its workload replaced by the observed trace at *trace_csv*, replayed at
    its send times (``arrival_column: send_time_us``; the header's server block is not
    checked: the scenario is what is being tested), and, with *per_token*, in the engine
    mode that reports every token (``event_per_step``; same records as the fast mode)."""
    data = scenario_to_dict(scenario) if isinstance(scenario, Scenario) else dict(scenario)
    data["workload"] = {"traces": [{"path": trace_csv, "format": "trace_v2", "arrival_column": "send_time_us", "server_block": "ignore"}]}
    simulation = dict(data.get("simulation") or {})
    simulation["until_s"] = None
    if per_token:
        simulation["mode"] = "event_per_step"
    data["simulation"] = simulation
    return scenario_from_dict(data, source=f"replay of {trace_csv}")


def scenario_from_trace(
    trace: Trace | Path | str, *, profile: Mapping[str, Any] | Path | str | None = None, trace_csv: str | None = None
) -> Scenario:
    """The scenario that replays *trace* on the serving system its header describes (module
    docstring).

    Parameters
    ----------
    trace
        An observed trace v2 (a :class:`~simpy_llm.workload.traces.Trace`, or its path).
    profile
        A fitted profile (a path, or its data from :func:`load_profile`) giving the latency model.
    trace_csv
        The trace's CSV file (needed when *trace* is given as a ``Trace``).

    Raises
    ------
    ScenarioError
        No latency model is known (no profile, and the header does not report one), or the
        server block does not make a valid engine.
    """
    trace, csv_path = _trace(trace)
    csv_path = trace_csv or csv_path
    if csv_path is None:
        raise ValueError("give trace_csv with a Trace object: the replay reads the trace from its file")
    server = trace.header.get("server") or {}
    if not isinstance(server, Mapping):
        raise ScenarioError(csv_path, [("server", f"the header's server block must be a mapping, got {server!r}")])
    if isinstance(profile, (str, Path)):
        profile = load_profile(profile)
    data: dict[str, Any] = {"name": f"replay of {Path(csv_path).name}"}
    if server.get("type") == "emulated" and isinstance(server.get("serving"), Mapping):
        serving = dict(server["serving"])
        if "seed" in server:
            data["seed"] = server["seed"]
        if server.get("simulation_mode"):
            data["simulation"] = {"mode": server["simulation_mode"]}
    else:
        serving = {"replicas": 1, "engine": _engine_from_server(server, csv_path)}
    if profile is not None:
        serving.pop("replica_groups", None)
        serving["latency_model"] = profile_latency_model(profile)
    elif "latency_model" not in serving and "replica_groups" not in serving:
        raise ScenarioError(
            csv_path,
            [("server", f"the trace's server ({server.get('type', 'unknown type')}) does not report a latency model: "
                        "give a fitted profile (simpy-llm calibrate fit) or a scenario")],
        )
    data["serving"] = serving
    return replay_scenario(data, csv_path)


def apply_profile(scenario: Scenario, profile: Mapping[str, Any] | Path | str) -> Scenario:
    """*scenario* with every replica's latency model replaced by the profile's (with the ranges it
    was fitted on, when it records them: ``fitted_ranges``)."""
    if isinstance(profile, (str, Path)):
        profile = load_profile(profile)
    data = scenario_to_dict(scenario)
    model = profile_latency_model(profile)
    if data["serving"].get("replica_groups"):
        for group in data["serving"]["replica_groups"]:
            group["latency_model"] = model
    else:
        data["serving"]["latency_model"] = model
    return scenario_from_dict(data, source="scenario with a fitted profile")
