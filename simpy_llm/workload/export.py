"""Generate a workload without simulating it: a table of requests and its summary.

``simpy-llm workload SPEC --out DIR`` uses these (SPEC: a scenario or a bare
workload spec). Only open-loop arrivals are generated: follow-up rounds of
sessions depend on completions, which only a simulation produces (the table
marks each session's first round).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from simpy_llm.workload.distributions import SamplingError
from simpy_llm.workload.generator import merge_sources, sampling_scenario_error
from simpy_llm.workload.sources import build_sources, spec_workload
from simpy_llm.workload.traces import V2_COLUMNS

if TYPE_CHECKING:
    import pandas as pd

    from simpy_llm.config.schema import Scenario, WorkloadConfig

__all__ = ["TRACE_COLUMNS", "generate_requests", "workload_summary"]

#: Columns of the generated table: trace v2's per-request columns (arrival in seconds
#: here; the trace writer converts it) plus the client's priority.
TRACE_COLUMNS = (*V2_COLUMNS[: V2_COLUMNS.index("arrival_time_us")], "priority", "arrival_time_s")

_DEFAULTS = {
    "session_id": "",
    "round_index": 0,
    "prefix_group": "",
    "streaming": True,
    "text_tokens": 0,
    "image_tokens": 0,
    "audio_tokens": 0,
    "video_tokens": 0,
    "reason_ratio": 0.0,
    "priority": 0,
}


def generate_requests(spec: Scenario | WorkloadConfig) -> pd.DataFrame:
    """The open-loop requests of a workload, in arrival order, as a DataFrame.

    Request ids and arrival times equal those the simulation gives the same
    requests (the same sources from :func:`~simpy_llm.workload.sources.build_sources`,
    the same merge).

    Parameters
    ----------
    spec
        A :class:`~simpy_llm.config.schema.Scenario` (its workload, with the scenario's
        seed unless the workload has its own), a bare workload spec
        (:class:`~simpy_llm.config.schema.WorkloadConfig`; seed 0 unless it has its own),
        as :func:`~simpy_llm.loading.load_workload_or_scenario` reads either from a file.

    Raises
    ------
    ScenarioError
        A bad spec, or a distribution that draws NaN or an infinity (naming its key path).

    Examples
    --------
    >>> from simpy_llm import load_scenario
    >>> frame = generate_requests(load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=100"]))
    >>> len(frame), bool(frame.arrival_time_s.is_monotonic_increasing)
    (100, True)
    >>> from simpy_llm.loading import load_workload
    >>> len(generate_requests(load_workload("scenarios/workloads/two_clients.yaml", ["num_requests=50"])))
    50
    """
    import pandas as pd


    wl, seed = spec_workload(spec)
    sources = build_sources(wl, default_seed=seed, key_prefix="" if wl is spec else "workload.", stacklevel=2)
    generator_sources = sources.generator_sources()
    bases = [base for base, _ in generator_sources]
    rows = [rows for _, rows in generator_sources]
    session_clients = sources.session_source_indices()
    cols: dict[str, list[Any]] = {name: [] for name in TRACE_COLUMNS}
    try:
        for n, (t, si, prompt, output, extra) in enumerate(merge_sources(rows, wl.num_requests, wl.horizon_s)):
            fields = {**_DEFAULTS, **bases[si], **(extra or {})}
            cols["request_id"].append(n)
            cols["client_id"].append(fields["client_id"])
            cols["tenant_id"].append(fields.get("tenant_id") or fields["client_id"])
            cols["slo_class"].append(fields.get("slo_class", "default"))
            cols["session_id"].append(f"{fields['client_id']}/{n}" if si in session_clients else fields["session_id"])
            cols["round_index"].append(fields["round_index"])
            cols["prefix_group"].append(fields["prefix_group"])
            cols["streaming"].append(bool(fields["streaming"]))
            cols["input_tokens"].append(prompt)
            cols["output_tokens"].append(output)
            for name in ("text_tokens", "image_tokens", "audio_tokens", "video_tokens", "reason_ratio", "priority"):
                cols[name].append(fields[name])
            cols["arrival_time_s"].append(t)
    except SamplingError as exc:
        raise sampling_scenario_error(exc, spec, sources.clients) from None
    return pd.DataFrame(cols)


def _quantiles(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {}
    qs = np.percentile(values, [10, 50, 90, 99])
    return {"mean": float(values.mean()), "p10": float(qs[0]), "p50": float(qs[1]), "p90": float(qs[2]), "p99": float(qs[3])}


def workload_summary(frame: pd.DataFrame) -> dict[str, Any]:
    """Per-client request count, rate, inter-arrival CV and length quantiles, and the totals."""
    out: dict[str, Any] = {"requests": len(frame), "clients": {}}
    span = float(frame.arrival_time_s.max()) if len(frame) else 0.0
    out["duration_s"] = span
    out["rate_per_s"] = len(frame) / span if span > 0 else None
    for client, group in frame.groupby("client_id", sort=True):
        t = group.arrival_time_s.to_numpy()
        gaps = np.diff(t)
        out["clients"][str(client)] = {
            "requests": len(group),
            "rate_per_s": len(group) / span if span > 0 else None,
            "interarrival_cv": float(gaps.std() / gaps.mean()) if gaps.size > 1 and gaps.mean() > 0 else None,
            "input_tokens": _quantiles(group.input_tokens.to_numpy()),
            "output_tokens": _quantiles(group.output_tokens.to_numpy()),
        }
    out["input_tokens"] = _quantiles(frame.input_tokens.to_numpy())
    out["output_tokens"] = _quantiles(frame.output_tokens.to_numpy())
    return out


def plot_histograms(frame: pd.DataFrame, directory: Any) -> list[Any]:
    """Write PNG histograms of inter-arrival gaps and input/output lengths per client;
    returns the paths.

    The figures are made without pyplot (matplotlib's ``Figure`` on an Agg canvas), so the
    caller's pyplot state and backend (a notebook's inline plots) are left alone.
    """
    from pathlib import Path

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    panels = (
        ("interarrival_s", "inter-arrival gap (s)", lambda g: np.diff(g.arrival_time_s.to_numpy())),
        ("input_tokens", "input tokens", lambda g: g.input_tokens.to_numpy()),
        ("output_tokens", "output tokens", lambda g: g.output_tokens.to_numpy()),
    )
    for name, label, values_of in panels:
        fig = Figure(figsize=(7, 4))
        FigureCanvasAgg(fig)
        ax = fig.subplots()
        for client, group in frame.groupby("client_id", sort=True):
            values = values_of(group)
            if values.size:
                ax.hist(values, bins=60, histtype="step", label=str(client))
        ax.set_xlabel(label)
        ax.set_ylabel("requests")
        if frame.client_id.nunique() <= 12:
            ax.legend(fontsize="small")
        fig.tight_layout()
        path = out / f"hist_{name}.png"
        fig.savefig(path, dpi=100)
        paths.append(path)
    return paths
