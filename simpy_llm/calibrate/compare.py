"""Compare an observed trace with the simulator's prediction of the same requests.

:func:`compare` replays an observed trace v2 (``simpy-llm observe``) through a
scenario: every request that was sent arrives in the simulation at its send
time with its server-reported prompt and output lengths (sessions are
replayed as recorded, each round at its own send time, its prompt holding the
previous round's prompt and answer so a prefix cache can find them). The
simulated requests are joined to the observed ones by request id and each
latency metric is compared request by request (:mod:`simpy_llm.calibrate.stats`):

========  =================================================  ==========================================
metric    observed (client clock)                            simulated
========  =================================================  ==========================================
``ttft``  first content chunk − send                         first token − arrival (+ measured RTT)
``itl``   gaps between content chunks (``itl_us``)           gaps between the token times, paired by position
``tpot``  (last content − first content) / (output − 1)     the same on the simulated token times
``e2e``   last content chunk − send (done − send unstreamed) completion − arrival (+ measured RTT)
========  =================================================  ==========================================

The last content chunk is the first plus the recorded gaps; traces written
before gaps were recorded use ``last_chunk_time_us``. The header's
``network.measured_rtt_ms`` (one round trip: the request up, the first bytes
down) is added to the simulated TTFT and E2E, as seed 000 §10 does; bandwidth
is not modelled.

Excluded from the statistics (but simulated, since they loaded the server):
requests that did not end ``ok`` (counted by status), the warm-up (the first
``warm_up_requests`` by request id, from the header unless given, and/or those
sent in the first ``warm_up_s`` seconds), and requests the simulation did not
complete (e.g. dropped as longer than the engine's ``max_model_len``; counted).

With a fitted profile, the report's warnings open with the profile's own fit
warnings and each quantity of the trace outside the ranges it was fitted on
(:func:`~simpy_llm.calibrate.ranges.profile_warnings`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pandas as pd

from simpy_llm.calibrate.ranges import profile_warnings
from simpy_llm.calibrate.report import KNOWN_LIMITATIONS, CalibrationReport, throughput_comparison
from simpy_llm.calibrate.scenario import apply_profile, replay_scenario, scenario_from_trace
from simpy_llm.calibrate.stats import METRICS, MetricComparison, compare_metric
from simpy_llm.config import Scenario
from simpy_llm.workload.traces import (
    LLAMACPP_BLOCK_KEYS,
    SERVER_BLOCK_KEYS,
    Trace,
    load_trace,
    read_trace_v2,
    server_block_mismatches,
    trace_v2_paths,
)

__all__ = ["Calibration", "compare", "known_limitations", "observed_latencies", "simulate_trace"]

@attrs.frozen(kw_only=True)
class Calibration:
    """What :func:`compare` found: the report, the joined requests and the per-metric pairs."""

    report: CalibrationReport
    """Everything :func:`~simpy_llm.calibrate.report.write_report` writes."""
    requests: pd.DataFrame
    """One row per replayed request: identity, lengths, ``status``, ``excluded`` (why it is left
    out of the statistics, empty if it is not), ``send_s``, observed and simulated
    ``ttft_s``/``tpot_s``/``e2e_s`` (``*_observed_s``, ``*_simulated_s``) and cached tokens."""
    samples: dict[str, tuple[np.ndarray, np.ndarray]]
    """Per metric, the paired (observed, simulated) values compared, seconds."""

    @property
    def metrics(self) -> dict[str, MetricComparison]:
        """The per-metric comparisons (shortcut to ``report.metrics``)."""
        return self.report.metrics


def _gaps_us(cell: Any) -> np.ndarray:
    if not isinstance(cell, str) or not cell.strip():
        return np.empty(0)
    return np.array(cell.split(), dtype=np.float64)


def _latencies(
    send_us: np.ndarray, first_us: np.ndarray, end_us: np.ndarray, output_tokens: np.ndarray, streaming: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TTFT, TPOT and E2E in seconds from times in microseconds (module docstring)."""
    ttft = np.where(streaming, (first_us - send_us) / 1e6, np.nan)
    e2e = (end_us - send_us) / 1e6
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(streaming & (output_tokens > 1), (end_us - first_us) / 1e6 / (output_tokens - 1), np.nan)
    return ttft, tpot, e2e


def observed_latencies(trace: Trace) -> tuple[pd.DataFrame, dict[int, np.ndarray]]:
    """The observed latencies of every sent request of *trace* (module docstring), and each
    streamed request's inter-token gaps (seconds) by request id.

    Returns a frame indexed like the trace's sent rows with ``request_id``, ``send_s``,
    ``status``, ``streaming``, ``input_tokens``, ``output_tokens``, ``cached_tokens``,
    ``ttft_s``, ``tpot_s`` and ``e2e_s`` (NaN where not measured).
    """
    f = trace.frame
    f = f[f["send_time_us"].notna()]
    # Differences are taken in whole microseconds, then scaled: no rounding error between
    # two sides of a comparison that saw the same instants.
    send_us = f["send_time_us"].astype("float64").to_numpy()

    def col(name: str) -> np.ndarray:
        if name not in f:
            return np.full(len(f), np.nan)
        return np.array(pd.to_numeric(f[name], errors="coerce").astype("float64"), dtype=np.float64)

    first_us = col("first_token_time_us") if "first_token_time_us" in f else col("first_chunk_time_us")
    gaps: dict[int, np.ndarray] = {}
    last_us = col("last_chunk_time_us")
    if "itl_us" in f:
        for i, (rid, cell) in enumerate(zip(f["request_id"].to_numpy(), f["itl_us"].to_numpy(), strict=True)):
            g = _gaps_us(cell)
            if not np.isnan(first_us[i]):
                gaps[int(rid)] = g / 1e6
                last_us[i] = first_us[i] + g.sum()
    streaming = f["streaming"].to_numpy(dtype=bool)
    done_us = col("done_time_us")
    end_us = np.where(streaming, last_us, np.where(np.isnan(done_us), last_us, done_us))
    out_tokens = f["output_tokens"].to_numpy(dtype=np.int64)
    ttft, tpot, e2e = _latencies(send_us, first_us, end_us, out_tokens, streaming)
    send = send_us / 1e6
    cached = pd.to_numeric(f["cached_tokens"], errors="coerce").to_numpy(dtype="float64") if "cached_tokens" in f else np.full(len(f), np.nan)
    frame = pd.DataFrame(
        {
            "request_id": f["request_id"].to_numpy(dtype=np.int64),
            "send_s": send,
            "status": f["status"].astype(str).to_numpy(),
            "streaming": streaming,
            "input_tokens": f["input_tokens"].to_numpy(dtype=np.int64),
            "output_tokens": out_tokens,
            "cached_tokens": cached,
            "ttft_s": ttft,
            "tpot_s": tpot,
            "e2e_s": e2e,
        }
    )
    return frame, gaps


def simulate_trace(
    scenario: Scenario, trace_csv: str, *, per_token: bool = True, latency_model: object = None
) -> tuple[pd.DataFrame, dict[int, list[float]]]:
    """Replay the observed trace at *trace_csv* through *scenario*'s serving system.

    Returns the simulated records, one row per replayed request in the order of the
    replay's source (sent rows ordered by send time), with the observed ``request_id``
    in ``trace_request_id``; and, with *per_token*, each request's token times
    (seconds, as the client would see them) by observed request id. *latency_model*
    replaces the scenario's (the fitter passes candidate coefficients this way).
    """
    from simpy_llm.simulation import Simulation

    replay = replay_scenario(scenario, trace_csv, per_token=per_token)
    source = replay.workload.traces[0]
    rows = load_trace(source).frame  # the replay's own order (see load_trace)
    times: dict[int, list[float]] = {}
    listener = None
    if per_token:

        def listener(req: Any, _tokens: int, visible_s: float) -> None:
            times.setdefault(req.id, []).append(visible_s)

    sim = Simulation(replay, latency_model=latency_model, token_listener=listener)
    records = sim.run(progress=False).to_dataframe()
    if len(records) != len(rows):
        raise RuntimeError(f"the replay simulated {len(records)} requests for {len(rows)} sent rows")
    ids = rows["request_id"].to_numpy(dtype=np.int64)
    records = records.sort_values("request_id", kind="stable").reset_index(drop=True)
    records["trace_request_id"] = ids[records["request_id"].to_numpy()]
    by_trace_id = {int(ids[k]): v for k, v in times.items()}
    return records, by_trace_id


def known_limitations(trace: Trace, scenario: Scenario) -> list[str]:
    """The limitations that apply when *scenario* predicts *trace* (seed 000 §11 lists the first two)."""
    out = list(KNOWN_LIMITATIONS)
    header = trace.header
    network = header.get("network") or {}
    if isinstance(network, Mapping) and network.get("measured_rtt_ms") is not None:
        out.append(f"Network: the measured round trip ({network['measured_rtt_ms']} ms) is added to the simulated TTFT and E2E; bandwidth and jitter are not modelled.")
    else:
        out.append("Network not modelled: the trace has no measured round trip, so simulated latencies are server-side.")
    server = header.get("server") or {}
    engines = [g.engine for g in scenario.serving.groups()]
    caching = any(e.prefix_caching for e in engines)
    if isinstance(server, Mapping):
        real_cache = server.get("cache_prompt", server.get("enable_prefix_caching"))
        if real_cache is True and not caching:
            out.append("Prefix cache off in the scenario while the server had it on: cached prompts are predicted as computed.")
        elif real_cache is False and caching:
            out.append("Prefix cache on in the scenario while the server had it off.")
    if not caching:
        out.append("Prefix cache off: every prompt token is computed.")
    if not server:
        out.append("No server block in the trace: engine settings are the scenario's, not the observed server's.")
    if (trace.frame["session_id"] != "").any():
        out.append("Sessions are replayed open loop at their observed send times (the closed loop already happened).")
    out.append("Client-side overheads (connection set-up, HTTP, SSE parsing) are inside the latency model's per-request and per-token terms.")
    return out


def _config_match(trace: Trace, scenario: Scenario) -> dict[str, list[str]]:
    """The server block's engine settings that the scenario's (first) engine has (``matched``;
    those the server only assumed are ``defaulted``) and those it does not (``mismatched``)."""
    server = trace.header.get("server") or {}
    if not isinstance(server, Mapping) or not server:
        return {"matched": [], "defaulted": ["all engine settings (the trace has no server block)"], "mismatched": []}
    keys = LLAMACPP_BLOCK_KEYS if server.get("type") == "llamacpp" else SERVER_BLOCK_KEYS
    mismatches = server_block_mismatches(trace.header, scenario.serving.groups()[0].engine)
    differing = {field for field, _ in mismatches}
    assumed = set(server.get("defaulted") or ())
    matched, defaulted = [], []
    for key, field in keys.items():
        if server.get(key) is None or field in differing:
            continue
        if key in assumed:
            defaulted.append(f"{key}={server[key]!r} (the server's default, assumed)")
        else:
            matched.append(f"{key}={server[key]!r}")
    return {"matched": matched, "defaulted": defaulted, "mismatched": [message for _, message in mismatches]}


def compare(
    trace: Trace | Path | str,
    scenario: Scenario | None = None,
    *,
    profile: Mapping[str, Any] | Path | str | None = None,
    warm_up_requests: int | None = None,
    warm_up_s: float = 0.0,
    seed: int = 0,
    n_resamples: int = 1000,
    confidence_level: float = 0.95,
    latency_model: object = None,
) -> Calibration:
    """Replay *trace* through *scenario* and compare, metric by metric (module docstring).

    Parameters
    ----------
    trace
        The observed trace v2 (its path: CSV, YAML, stem or directory).
    scenario
        The serving system to test (its workload is replaced by the trace). Default:
        :func:`~simpy_llm.calibrate.scenario.scenario_from_trace`.
    profile
        A fitted latency profile applied to the scenario.
    warm_up_requests
        Exclude the first N requests by request id (default: the header's ``warm_up_requests``).
    warm_up_s
        Also exclude requests sent in the first *warm_up_s* seconds after the first send.
    seed, n_resamples, confidence_level
        Bootstrap settings of the confidence intervals.
    latency_model
        A latency model object used instead of the scenario's.

    Examples
    --------
    >>> from simpy_llm.calibrate import compare
    >>> cal = compare("tests/data/calibration/llamacpp_open_loop",
    ...               profile="tests/data/calibration/llamacpp_open_loop_profile.yaml", n_resamples=200)
    >>> sorted(cal.metrics)
    ['e2e', 'itl', 'tpot', 'ttft']
    """
    if isinstance(trace, Trace):
        raise TypeError("compare reads the trace from its file: pass its path")
    csv_path = str(trace_v2_paths(trace)[1])
    observed = read_trace_v2(trace)
    if scenario is None:
        scenario = scenario_from_trace(observed, profile=profile, trace_csv=csv_path)
    elif profile is not None:
        scenario = apply_profile(scenario, profile)
    obs, obs_gaps = observed_latencies(observed)
    records, sim_times = simulate_trace(scenario, csv_path, latency_model=latency_model)
    joined = _join(obs, records, observed.header, warm_up_requests, warm_up_s)
    samples = _samples(joined, obs_gaps, sim_times)
    metrics = {
        m: compare_metric(m, *samples[m], seed=seed, n_resamples=n_resamples, confidence_level=confidence_level)
        for m in METRICS
    }
    n_warm = int(observed.header.get("warm_up_requests", 0) or 0) if warm_up_requests is None else warm_up_requests
    report = _report(observed, csv_path, scenario, joined, metrics, {"requests": n_warm, "seconds": warm_up_s})
    # What the profile warns of (its fit's warnings, a trace outside its fitted ranges) comes first.
    report = attrs.evolve(report, warnings=[*profile_warnings(profile, scenario, obs, observed.header, warm_up_requests=warm_up_requests,
                                                              warm_up_s=warm_up_s), *report.warnings])
    return Calibration(report=report, requests=joined, samples=samples)


def _join(
    obs: pd.DataFrame, records: pd.DataFrame, header: Mapping[str, Any], warm_up_requests: int | None, warm_up_s: float
) -> pd.DataFrame:
    rtt_s = 0.0
    network = header.get("network") or {}
    if isinstance(network, Mapping) and network.get("measured_rtt_ms") is not None:
        rtt_s = float(network["measured_rtt_ms"]) / 1e3
    sim = records.set_index("trace_request_id")
    joined = obs.set_index("request_id", drop=False).copy()
    sim = sim.reindex(joined.index)
    joined["simulated_status"] = sim["status"].astype(str).to_numpy()
    joined["cached_tokens_simulated"] = sim["cached_tokens"].to_numpy(dtype="float64")
    # The simulated instants on the observer's clock: whole microseconds, the first and last
    # tokens one round trip after the server produced them.
    send_us = np.rint(sim["arrival_s"].to_numpy(dtype="float64") * 1e6)
    first_us = np.rint((sim["first_token_s"].to_numpy(dtype="float64") + rtt_s) * 1e6)
    end_us = np.rint((sim["completion_s"].to_numpy(dtype="float64") + rtt_s) * 1e6)
    simulated = _latencies(send_us, first_us, end_us, joined["output_tokens"].to_numpy(), joined["streaming"].to_numpy())
    for m, values in zip(("ttft_s", "tpot_s", "e2e_s"), simulated, strict=True):
        joined[m.replace("_s", "_observed_s")] = joined.pop(m)
        joined[m.replace("_s", "_simulated_s")] = values
    joined = joined.rename(columns={"cached_tokens": "cached_tokens_observed"})
    n_warm = int(header.get("warm_up_requests", 0) or 0) if warm_up_requests is None else warm_up_requests
    first_send = float(joined["send_s"].min()) if len(joined) else 0.0
    excluded = np.full(len(joined), "", dtype=object)
    ids = joined["request_id"].to_numpy()
    excluded[joined["simulated_status"].to_numpy() != "completed"] = "not_completed_in_simulation"
    excluded[joined["status"].to_numpy() != "ok"] = "failed"
    warm = (ids < n_warm) | (joined["send_s"].to_numpy() - first_send < warm_up_s)
    excluded[warm] = "warm_up"
    joined["excluded"] = excluded
    return joined.reset_index(drop=True)


def _samples(
    joined: pd.DataFrame, obs_gaps: dict[int, np.ndarray], sim_times: dict[int, list[float]]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    kept = joined[joined["excluded"] == ""]
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for m in ("ttft", "tpot", "e2e"):
        pair = kept[[f"{m}_observed_s", f"{m}_simulated_s"]].dropna()
        out[m] = (pair.iloc[:, 0].to_numpy(), pair.iloc[:, 1].to_numpy())
    obs_itl: list[np.ndarray] = []
    sim_itl: list[np.ndarray] = []
    for rid in kept.loc[kept["streaming"], "request_id"].to_numpy():
        o = obs_gaps.get(int(rid))
        t = sim_times.get(int(rid))
        if o is None or t is None or len(t) < 2:
            continue
        s = np.diff(np.rint(np.asarray(t) * 1e6)) / 1e6
        n = min(len(o), len(s))
        obs_itl.append(o[:n])
        sim_itl.append(s[:n])
    out["itl"] = (np.concatenate(obs_itl) if obs_itl else np.empty(0), np.concatenate(sim_itl) if sim_itl else np.empty(0))
    return {m: out[m] for m in METRICS}


def _report(
    trace: Trace,
    csv_path: str,
    scenario: Scenario,
    joined: pd.DataFrame,
    metrics: dict[str, MetricComparison],
    warm_up: dict[str, float],
) -> CalibrationReport:
    from simpy_llm.config import scenario_to_dict

    header = trace.header
    status = joined["status"].value_counts().to_dict()
    excluded = joined["excluded"].value_counts().to_dict()
    ok = joined[joined["status"] == "ok"]
    obs_end = (ok["send_s"] + ok["e2e_observed_s"]).max() if len(ok) else 0.0
    sim_end = (ok["send_s"] + ok["e2e_simulated_s"]).max() if len(ok) else 0.0
    start = float(ok["send_s"].min()) if len(ok) else 0.0
    tokens = float(ok["output_tokens"].sum())
    obs_span, sim_span = float(obs_end - start), float(sim_end - start)
    throughput = throughput_comparison(
        observed_output_tokens_per_s=tokens / obs_span if obs_span > 0 else None,
        simulated_output_tokens_per_s=tokens / sim_span if sim_span > 0 else None,
        observed_requests_per_s=len(ok) / obs_span if obs_span > 0 else None,
        simulated_requests_per_s=len(ok) / sim_span if sim_span > 0 else None,
    )
    serving = scenario_to_dict(scenario)["serving"]
    warnings: list[str] = []
    match = _config_match(trace, scenario)
    for line in match.pop("mismatched"):
        warnings.append(f"server setting differs from the scenario's engine: {line}")
    cached_obs = ok["cached_tokens_observed"].dropna()
    if len(cached_obs):
        # More apart than a token per request (the BOS every prompt shares) and 5 %: worth a look.
        observed, simulated = float(cached_obs.sum()), float(ok.loc[cached_obs.index, "cached_tokens_simulated"].sum())
        if abs(observed - simulated) > max(len(cached_obs), 0.05 * observed):
            warnings.append(
                f"prefix cache: the server reported {int(observed)} cached prompt tokens, the simulation found "
                f"{int(simulated)} for the same requests"
            )
    return CalibrationReport(
        trace={
            "path": csv_path,
            "num_requests": int(len(trace.frame)),
            "duration_s": obs_span,
            "server": header.get("server"),
            "hardware": header.get("hardware"),
            "network": header.get("network"),
            "server_config_provided": bool(header.get("server")),
        },
        request_summary={
            "total": int(len(trace.frame)),
            "ok": int(status.get("ok", 0)),
            "error": int(status.get("error", 0)),
            "timeout": int(status.get("timeout", 0)),
            "cancelled": int(status.get("cancelled", 0)),
            "excluded_warm_up": int(excluded.get("warm_up", 0)),
            "excluded_failed": int(excluded.get("failed", 0)),
            "excluded_not_completed_in_simulation": int(excluded.get("not_completed_in_simulation", 0)),
            "calibrated": int(excluded.get("", 0)),
        },
        warm_up=warm_up,
        metrics=metrics,
        throughput=throughput,
        config_match=match,
        known_limitations=known_limitations(trace, scenario),
        scenario={"name": scenario.name, "latency_model": serving.get("latency_model"), "engine": serving.get("engine"),
                  "replica_groups": serving.get("replica_groups") or None, "replicas": serving.get("replicas")},
        fit=None,
        warnings=warnings,
    )
