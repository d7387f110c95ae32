"""The traces one fit reads (:func:`~simpy_llm.calibrate.fit.fit`): one, or several of one server.

A fit on several traces (a short synchronous run and a run at one rate, say) reads each with
its own header: its requests, its serving system (from its header unless a scenario is given)
and its server's counters. They must describe one serving system: the server blocks of their
headers (less the keys of :data:`_NOT_COMPARED`) and the model must agree, or
:func:`read_fit_traces` refuses them, naming the traces and the key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import pandas as pd

from simpy_llm.calibrate.batch_steps import PLACEHOLDER_MODEL
from simpy_llm.calibrate.compare import observed_latencies
from simpy_llm.calibrate.scenario import scenario_from_trace
from simpy_llm.config import Scenario
from simpy_llm.workload.traces import Trace, read_trace_v2, trace_v2_paths

__all__ = ["FitTrace", "read_fit_traces", "summed_counters", "trace_list"]

_NOT_COMPARED = ("discovered", "defaulted", "scenario", "seed")
"""Keys of a header's server block that say how it was filled in (``discovered``,
``defaulted``) or name the run rather than the server (a simulated server's ``scenario`` name
and ``seed``), not what the server is."""


@attrs.frozen(kw_only=True)
class FitTrace:
    """One trace of a fit, read once."""

    csv_path: str
    """Its CSV file (what the replays read)."""
    trace: Trace
    """The trace as read."""
    scenario: Scenario
    """The serving system it is replayed through."""
    obs: pd.DataFrame
    """Its requests' observed latencies (:func:`~simpy_llm.calibrate.compare.observed_latencies`)."""


def trace_list(traces: Path | str | Sequence[Path | str]) -> list[Path | str]:
    """*traces* as a list: one path, or a sequence of them (at least one)."""
    out = [traces] if isinstance(traces, (str, Path)) else list(traces)
    if not out:
        raise ValueError("no trace to fit: give one trace or several")
    return out


def read_fit_traces(traces: Sequence[Path | str], scenario: Scenario | None) -> list[FitTrace]:
    """Each of *traces* read, with the serving system it is replayed through (*scenario*, else
    from its header); ``ValueError`` naming the traces and the key when their headers describe
    different servers."""
    out = []
    for given in traces:
        csv_path = str(trace_v2_paths(given)[1])
        observed = read_trace_v2(given)
        replayed = scenario if scenario is not None else scenario_from_trace(
            observed, profile={"latency_model": PLACEHOLDER_MODEL}, trace_csv=csv_path)
        out.append(FitTrace(csv_path=csv_path, trace=observed, scenario=replayed, obs=observed_latencies(observed)[0]))
    first = out[0]
    for other in out[1:]:
        key = _first_difference(_system(first.trace.header), _system(other.trace.header))
        if key is not None:
            raise ValueError(
                f"the traces {first.csv_path} and {other.csv_path} describe different serving systems: their headers' "
                f"{key} differ ({_at(first.trace.header, key)!r} and {_at(other.trace.header, key)!r}); a fit on several "
                "traces needs traces of one server"
            )
    return out


def _system(header: Mapping[str, Any]) -> dict[str, Any]:
    server = header.get("server")
    block = {k: v for k, v in server.items() if k not in _NOT_COMPARED} if isinstance(server, Mapping) else server
    return {"model": header.get("model"), "server": block}


def _first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The first key path where *a* and *b* differ (``server.n_parallel``), None when equal."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for key in list(a) + [k for k in b if k not in a]:
            found = _first_difference(a.get(key), b.get(key), f"{path}.{key}" if path else str(key))
            if found is not None:
                return found
        return None
    return None if a == b else (path or "server")


def _at(header: Mapping[str, Any], path: str) -> Any:
    value: Any = header
    for key in path.split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def summed_counters(counters: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The growth of the server's counters over several runs (each as
    :func:`~simpy_llm.calibrate.fit.server_counters` gives it): the counts summed, the seconds
    per prompt and per generated token recomputed from the sums."""
    out: dict[str, float] = {}
    for one in counters:
        for key, value in one.items():
            if not key.endswith("_per_token"):
                out[key] = out.get(key, 0.0) + value
    if out.get("prompt_tokens"):
        out["prompt_seconds_per_token"] = out.get("prompt_seconds", float("nan")) / out["prompt_tokens"]
    if out.get("predicted_tokens"):
        out["predicted_seconds_per_token"] = out.get("predicted_seconds", float("nan")) / out["predicted_tokens"]
    return out
