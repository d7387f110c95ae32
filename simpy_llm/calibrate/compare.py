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
``ttft``  first content chunk − send                         first token − arrival (+ network)
``itl``   gaps between content chunks (``itl_us``)           gaps between the token times, paired by position
``tpot``  (last content − first content) / (output − 1)     the same on the simulated token times
``e2e``   last content chunk − send (done − send unstreamed) completion − arrival (+ network)
========  =================================================  ==========================================

The last content chunk is the first plus the recorded gaps; traces written
before gaps were recorded use ``last_chunk_time_us``.

The network between the client and the server (seed 000 §10) is added to the
simulated side from the header's ``network`` block: the measured round trip
``measured_rtt_ms`` (the request up, the first bytes down) to TTFT and E2E,
and, when the block gives the client's bandwidth ``bandwidth_mbps`` (megabits
per second each way; ``bytes_per_token``, default 4, the bytes of a token on
the wire), the transfer times: the prompt's upload
(``input_tokens x bytes_per_token / bandwidth``) to TTFT and E2E; for a
streamed answer, one token's download to the first and to the last token
(tokens cross the link as they are made, as the simulator's own client network
does, ``docs/network.md``), so TPOT and ITL are unchanged; for an answer sent
in one piece, the whole answer's download (``output_tokens x bytes_per_token /
bandwidth``) to E2E, as the seed writes it. Without a bandwidth, transfers
take no time.

With the server's scraped Prometheus samples (the header's ``metrics_file``,
``simpy-llm observe --scrape-metrics``), the replay also samples its state at
every scrape time, and the report compares queue depth, running batch and KV
use (:mod:`simpy_llm.calibrate.timeseries`). The report's warnings about the
run itself (no usage, a saturated load generator, one prefix group, few
requests, a busy machine under the emulated server) are
:mod:`simpy_llm.calibrate.caveats`.

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

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pandas as pd

from simpy_llm.calibrate.caveats import run_warnings
from simpy_llm.calibrate.ranges import profile_warnings
from simpy_llm.calibrate.report import KNOWN_LIMITATIONS, CalibrationReport, throughput_comparison
from simpy_llm.calibrate.scenario import apply_profile, replay_scenario, scenario_from_trace
from simpy_llm.calibrate.stats import METRICS, MetricComparison, compare_metric
from simpy_llm.calibrate.timeseries import compare_series, sample_at, scrape_times, scraped_series
from simpy_llm.config import Scenario, ScenarioError
from simpy_llm.loading import scenario_to_dict
from simpy_llm.serving.latency import LatencyModel
from simpy_llm.simulation import Simulation
from simpy_llm.workload.traces import (
    LLAMACPP_BLOCK_KEYS,
    SERVER_BLOCK_KEYS,
    Trace,
    load_trace,
    read_trace_v2,
    server_block_mismatches,
    trace_v2_paths,
)

__all__ = [
    "Calibration",
    "ClientNetwork",
    "client_network",
    "compare",
    "known_limitations",
    "observed_latencies",
    "simulate_trace",
]

DEFAULT_BYTES_PER_TOKEN = 4.0
"""Bytes of a token on the wire when the header's network block does not say (a 32-bit token
id: seed 000 §10, and the simulator's client network default)."""


@attrs.frozen(kw_only=True)
class ClientNetwork:
    """The client's network as the trace header's ``network`` block gives it (module docstring)."""

    rtt_s: float = 0.0
    """The measured round trip, s (0 when not measured)."""
    bandwidth_bytes_per_s: float = math.inf
    """Each way, bytes per second (inf: not given, transfers take no time)."""
    bytes_per_token: float = DEFAULT_BYTES_PER_TOKEN
    """Bytes of a token on the wire."""

    def token_s(self) -> float:
        """Seconds to move one token's bytes (0 without a bandwidth)."""
        return self.bytes_per_token / self.bandwidth_bytes_per_s


def client_network(header: Mapping[str, Any], source: str = "<trace header>") -> ClientNetwork:
    """The client's network of the trace *header* (its ``network`` block: ``measured_rtt_ms``,
    ``bandwidth_mbps``, ``bytes_per_token``; each may be absent or null).

    Raises
    ------
    ScenarioError
        A value that is not a number in its range, naming *source* (the header file) and the
        key path.

    Examples
    --------
    >>> n = client_network({"network": {"measured_rtt_ms": 2.0, "bandwidth_mbps": 8.0}})
    >>> n.rtt_s, n.bandwidth_bytes_per_s, n.token_s()
    (0.002, 1000000.0, 4e-06)
    >>> client_network({"network": {"bandwidth_mbps": 0}})
    Traceback (most recent call last):
    ...
    simpy_llm.config.errors.ScenarioError: <trace header>: 1 problem(s) in trace header
      network.bandwidth_mbps: must be a number > 0 (megabits per second, each way) or null, got 0
    """
    network = header.get("network")
    if network is None:
        return ClientNetwork()
    if not isinstance(network, Mapping):
        raise ScenarioError(source, [("network", f"must be a mapping, got {network!r}")], "trace header")
    problems = []
    values: dict[str, float | None] = {}
    rules = {
        "measured_rtt_ms": ("a number >= 0 (milliseconds)", 0.0, True),
        "bandwidth_mbps": ("a number > 0 (megabits per second, each way)", 0.0, False),
        "bytes_per_token": ("a number > 0 (bytes of a token on the wire)", 0.0, False),
    }
    for key, (allowed, low, inclusive) in rules.items():
        v = network.get(key)
        number = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if v is None:
            values[key] = None
        elif number and (v >= low if inclusive else v > low):
            values[key] = float(v)
        else:
            problems.append((f"network.{key}", f"must be {allowed} or null, got {v!r}"))
    if problems:
        raise ScenarioError(source, problems, "trace header")
    rtt_ms, mbps, bpt = values["measured_rtt_ms"], values["bandwidth_mbps"], values["bytes_per_token"]
    return ClientNetwork(
        rtt_s=0.0 if rtt_ms is None else rtt_ms / 1e3,
        bandwidth_bytes_per_s=math.inf if mbps is None else mbps * 1e6 / 8,
        bytes_per_token=DEFAULT_BYTES_PER_TOKEN if bpt is None else bpt,
    )

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
    scenario: Scenario, trace_csv: str, *, per_token: bool = True, latency_model: LatencyModel | None = None
) -> tuple[pd.DataFrame, dict[int, list[float]]]:
    """Replay the observed trace at *trace_csv* through *scenario*'s serving system.

    Returns the simulated records, one row per replayed request in the order of the
    replay's source (sent rows ordered by send time), with the observed ``request_id``
    in ``trace_request_id``; and, with *per_token*, each request's token times
    (seconds, as the client would see them) by observed request id. *latency_model*
    replaces the scenario's (the fitter passes candidate coefficients this way).
    """
    records, by_trace_id, _ = _replay(scenario, trace_csv, per_token=per_token, latency_model=latency_model)
    return records, by_trace_id


def _replay(
    scenario: Scenario,
    trace_csv: str,
    *,
    per_token: bool = True,
    latency_model: LatencyModel | None = None,
    sample_times_s: np.ndarray | None = None,
) -> tuple[pd.DataFrame, dict[int, list[float]], pd.DataFrame]:
    """:func:`simulate_trace`, and the replay's ``Results.timeseries()``: every replica's state at
    each of *sample_times_s* (:func:`~simpy_llm.calibrate.timeseries.sample_at`; empty without)."""

    replay = replay_scenario(scenario, trace_csv, per_token=per_token)
    source = replay.workload.traces[0]
    rows = load_trace(source).frame  # the replay's own order (see load_trace)
    times: dict[int, list[float]] = {}
    listener = None
    if per_token:

        def listener(req: Any, _tokens: int, visible_s: float) -> None:
            times.setdefault(req.id, []).append(visible_s)

    sim = Simulation(replay, latency_model=latency_model, token_listener=listener)
    if sample_times_s is not None and len(sample_times_s):
        sim.env.process(sample_at(sim, sample_times_s))
    results = sim.run(progress=False)
    records = results.to_dataframe()
    if len(records) != len(rows):
        raise RuntimeError(f"the replay simulated {len(records)} requests for {len(rows)} sent rows")
    ids = rows["request_id"].to_numpy(dtype=np.int64)
    records = records.sort_values("request_id", kind="stable").reset_index(drop=True)
    records["trace_request_id"] = ids[records["request_id"].to_numpy()]
    by_trace_id = {int(ids[k]): v for k, v in times.items()}
    return records, by_trace_id, results.timeseries()


def known_limitations(trace: Trace, scenario: Scenario) -> list[str]:
    """The limitations that apply when *scenario* predicts *trace* (seed 000 §11 lists the first two)."""
    out = list(KNOWN_LIMITATIONS)
    header = trace.header
    network = header.get("network") or {}
    measured = isinstance(network, Mapping) and network.get("measured_rtt_ms") is not None
    bandwidth = network.get("bandwidth_mbps") if isinstance(network, Mapping) else None
    if measured and bandwidth is not None:
        out.append(
            f"Network: the measured round trip ({network['measured_rtt_ms']} ms) and the transfer of each prompt and "
            f"answer at {bandwidth} Mbit/s ({network.get('bytes_per_token') or DEFAULT_BYTES_PER_TOKEN:g} bytes per token) "
            "are added to the simulated TTFT and E2E; jitter is not modelled."
        )
    elif measured:
        out.append(
            f"Network: the measured round trip ({network['measured_rtt_ms']} ms) is added to the simulated TTFT and E2E; "
            "the header gives no bandwidth (network.bandwidth_mbps), so transfers take no time; jitter is not modelled."
        )
    elif bandwidth is not None:
        out.append(
            f"Network: no measured round trip; the transfer of each prompt and answer at {bandwidth} Mbit/s is added "
            "to the simulated TTFT and E2E."
        )
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
    latency_model: LatencyModel | None = None,
) -> Calibration:
    """Replay *trace* through *scenario* and compare, metric by metric, with the network the
    header gives added to the simulated side; with scraped samples, compare the server's
    time series too; warn about the run itself (module docstring).

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

    Raises
    ------
    ScenarioError
        The header's ``network`` block holds a value out of range, or the metrics file it
        names cannot be read (naming the file and the key or line).

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
    header_path, csv = trace_v2_paths(trace)
    csv_path = str(csv)
    observed = read_trace_v2(trace)
    network = client_network(observed.header, str(header_path))
    own_serving_system = scenario is None and profile is None and latency_model is None
    if scenario is None:
        scenario = scenario_from_trace(observed, profile=profile, trace_csv=csv_path)
    elif profile is not None:
        scenario = apply_profile(scenario, profile)
    scraped, series_warnings = _scraped(observed.header, header_path)
    obs, obs_gaps = observed_latencies(observed)
    records, sim_times, timeseries = _replay(
        scenario, csv_path, latency_model=latency_model, sample_times_s=scrape_times(scraped)
    )
    joined = _join(obs, records, observed.header, warm_up_requests, warm_up_s, network)
    samples = _samples(joined, obs_gaps, sim_times)
    metrics = {
        m: compare_metric(m, *samples[m], seed=seed, n_resamples=n_resamples, confidence_level=confidence_level)
        for m in METRICS
    }
    n_warm = int(observed.header.get("warm_up_requests", 0) or 0) if warm_up_requests is None else warm_up_requests
    report = _report(observed, csv_path, scenario, joined, metrics, {"requests": n_warm, "seconds": warm_up_s})
    warnings = [
        # What the profile warns of (its fit's warnings, a trace outside its fitted ranges) comes first.
        *profile_warnings(profile, scenario, obs, observed.header, warm_up_requests=warm_up_requests, warm_up_s=warm_up_s),
        *report.warnings,
        *run_warnings(observed.header, observed.frame, joined, own_serving_system=own_serving_system),
    ]
    report = attrs.evolve(
        report, timeseries=compare_series(scraped, timeseries), warnings=warnings + series_warnings
    )
    return Calibration(report=report, requests=joined, samples=samples)


def _scraped(header: Mapping[str, Any], header_path: Path) -> tuple[dict[str, Any], list[str]]:
    """The series of the scraped metrics file the header names (``metrics_file``, relative to the
    header's folder), and the warnings when it names one that cannot be compared."""
    name = header.get("metrics_file")
    if not name:
        return {}, []
    path = header_path.parent / str(name)
    if not path.is_file():
        return {}, [f"The trace names the metrics file {name!r}, which is not beside it: no time-series comparison."]
    try:
        frame = pd.read_csv(path, dtype={"metric": str, "labels": str, "error": str}, keep_default_na=False, na_values={"value": [""]})
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise ScenarioError(str(path), [("", f"cannot read the scraped metrics: {exc}")], "metrics file") from None
    missing = [c for c in ("time_s", "metric", "value") if c not in frame]
    if missing:
        raise ScenarioError(
            str(path), [("line 1", f"missing column(s) {', '.join(missing)}; expected time_s, metric, labels, value, error")],
            "metrics file",
        )
    series = scraped_series(frame)
    if not series:
        message = (
            f"The metrics file {name!r} holds none of the series compared (queue depth, running batch, KV use: "
            "vllm:, llamacpp: or sglang: names): no time-series comparison."
        )
        return {}, [message]
    return series, []


def _join(
    obs: pd.DataFrame,
    records: pd.DataFrame,
    header: Mapping[str, Any],
    warm_up_requests: int | None,
    warm_up_s: float,
    network: ClientNetwork | None = None,
) -> pd.DataFrame:
    network = network if network is not None else client_network(header)
    sim = records.set_index("trace_request_id")
    joined = obs.set_index("request_id", drop=False).copy()
    sim = sim.reindex(joined.index)
    joined["simulated_status"] = sim["status"].astype(str).to_numpy()
    joined["cached_tokens_simulated"] = sim["cached_tokens"].to_numpy(dtype="float64")
    # The simulated instants on the observer's clock, in whole microseconds: the first and
    # last tokens one round trip after the server produced them, plus the prompt's upload
    # and the answer's download (module docstring).
    streaming = joined["streaming"].to_numpy(dtype=bool)
    token_s = network.token_s()
    upload_s = joined["input_tokens"].to_numpy(dtype="float64") * token_s
    download_s = np.where(streaming, token_s, joined["output_tokens"].to_numpy(dtype="float64") * token_s)
    send_us = np.rint(sim["arrival_s"].to_numpy(dtype="float64") * 1e6)
    first_us = np.rint((sim["first_token_s"].to_numpy(dtype="float64") + network.rtt_s + upload_s + token_s) * 1e6)
    end_us = np.rint((sim["completion_s"].to_numpy(dtype="float64") + network.rtt_s + upload_s + download_s) * 1e6)
    simulated = _latencies(send_us, first_us, end_us, joined["output_tokens"].to_numpy(), streaming)
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
            "num_requests": len(trace.frame),
            "duration_s": obs_span,
            "server": header.get("server"),
            "hardware": header.get("hardware"),
            "network": header.get("network"),
            "load_generator": header.get("load_generator"),
            "server_config_provided": bool(header.get("server")),
        },
        request_summary={
            "total": len(trace.frame),
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
