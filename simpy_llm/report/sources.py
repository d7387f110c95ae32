"""The pages of the HTML report: a simulation run, an observed trace, a calibration.

Each kind of page is built from what its command wrote, so that ``--html`` at the end of a
command and ``simpy-llm report DIR`` afterwards give the same figures:

========================  =====================================  ==========================================
page                      in memory                              from a directory
========================  =====================================  ==========================================
a run (``run``)           :func:`run_page` (``Results``)         ``records.csv``, ``summary.json``, ``timeseries.csv``
an observed trace         —                                      :func:`observe_page` (``trace.yaml`` + ``trace.csv``,
(``observe``)                                                    ``summary.json``, ``metrics.csv``)
a calibration             :func:`compare_page` (the report and   ``report.json``
(``calibrate compare``)   its samples)
========================  =====================================  ==========================================

:func:`directory_page` tells the three directories apart by their files. A calibration's
``report.json`` does not hold the per-request pairs, so a page made from it alone draws its
CDFs and its observed-against-simulated plot from the report's 100 QQ quantiles of each side
(the caption says so); the page made in memory draws them from every pair.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import yaml

from simpy_llm.config import ScenarioError
from simpy_llm.plot_labels import LATENCY_METRICS
from simpy_llm.report import figures
from simpy_llm.report.html import Page, Plot, Section, Table

if TYPE_CHECKING:
    from simpy_llm.calibrate.report import CalibrationReport
    from simpy_llm.metrics.results import Results

__all__ = ["compare_page", "directory_page", "observe_page", "run_dir_page", "run_page"]

_LATENCY_COLUMNS = ("ttft_s", "tpot_s", "e2e_s")
_STATS = ("count", "mean", "p50", "p90", "p95", "p99")
_SERIES_COLUMNS = {"queue_depth": "waiting", "running_batch": "running", "kv_usage": "kv_utilization"}
"""A scraped series' column of the simulator's time series (simpy_llm.calibrate.timeseries.SIMULATED_COLUMNS),
whose axis label says the series in words."""


def _number(value: Any, scale: float = 1.0, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    return f"{float(value) * scale:.{digits}g}"


def _latency_table(latency: Mapping[str, Any]) -> Table:
    """The ``latency_s`` block of a summary (a run's or an observer's): one row per metric."""
    rows = []
    for metric, words in LATENCY_METRICS.items():
        stats = latency.get(metric)
        if isinstance(stats, Mapping):
            rows.append((words, *(_number(stats.get(k)) for k in _STATS)))
    return Table(("metric", "count", "mean (s)", "p50 (s)", "p90 (s)", "p95 (s)", "p99 (s)"), rows)


def _cdf_plots(prefix: str, series: Mapping[str, Mapping[str, Any]], source: str) -> list[Plot]:
    """One CDF per latency column; *series* maps a column to {side: values}."""
    return [
        Plot(f"{prefix}-cdf-{column.removesuffix('_s')}", figures.cdf_figure(column, sides),
             f"Empirical CDF of `{column}` {source}; y: the share of requests at or below x.")
        for column, sides in series.items()
    ]


# --- a simulation run ------------------------------------------------------------------
def run_page(results: Results, *, title: str | None = None) -> Page:
    """The page of a simulation run: summary table, latency CDFs (TTFT, TPOT, E2E), and
    queue depth, running batch and KV use over time when the run was sampled
    (``simulation.timeseries_interval_s``).

    Examples
    --------
    >>> from simpy_llm import Simulation, load_scenario
    >>> results = Simulation(load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=20"])).run()
    >>> page = run_page(results)
    >>> [p.div_id for s in page.sections for p in s.plots]
    ['run-cdf-ttft', 'run-cdf-tpot', 'run-cdf-e2e']
    """
    name = results.scenario.name or "scenario"
    return _run_page(results.to_dataframe(), results.timeseries(), dict(results.summary()),
                     title or f"Simulation run: {name}", "`Results.to_dataframe()`")


def run_dir_page(directory: str | Path) -> Page:
    """The page of a run from the files ``simpy-llm run --out DIR`` wrote (``records.csv``,
    ``summary.json``, ``timeseries.csv`` when sampled, ``manifest.json`` for the name).

    Raises
    ------
    ScenarioError
        A file is missing or cannot be read, naming it.
    """
    out = Path(directory)
    summary = _json(out / "summary.json")
    records = _csv(out / "records.csv")
    timeseries = _csv(out / "timeseries.csv") if (out / "timeseries.csv").is_file() else pd.DataFrame()
    name = "scenario"
    if (out / "manifest.json").is_file():
        name = str(_json(out / "manifest.json").get("scenario", {}).get("name") or name)
    return _run_page(records, timeseries, summary, f"Simulation run: {name}", "`records.csv`")


def _run_page(records: pd.DataFrame, timeseries: pd.DataFrame, summary: Mapping[str, Any], title: str, source: str) -> Page:
    counts = summary.get("requests", {})
    throughput = summary.get("throughput", {})
    notes = [
        f"Requests: {_number(counts.get('arrived'))} arrived, {_number(counts.get('completed'))} completed, "
        f"{_number(counts.get('dropped'))} dropped; simulated time {_number(summary.get('duration_s'))} s; "
        f"throughput {_number(throughput.get('requests_per_s'))} requests/s, "
        f"{_number(throughput.get('output_tokens_per_s'))} output tokens/s.",
        "Latency statistics of the measured requests (warm-up left out), from the summary's `latency_s`.",
    ]
    measured = records[records["warm_up"] == 0] if "warm_up" in records else records
    sections = [
        Section("Summary", table=_latency_table(summary.get("latency_s", {})), notes=notes),
        Section("Latency distributions", plots=_cdf_plots(
            "run", {c: {"simulated": measured[c].to_numpy(dtype=np.float64)} for c in _LATENCY_COLUMNS if c in measured},
            f"over the measured requests that have it (column of {source}, warm-up left out)",
        )),
    ]
    if len(timeseries):
        by_time = timeseries.groupby("time_s", sort=True)
        columns = {"waiting": by_time["waiting"].sum(), "running": by_time["running"].sum(),
                   "kv_utilization": by_time["kv_utilization"].mean()}
        fig = figures.over_time_figure(columns["waiting"].index.to_numpy(dtype=np.float64), columns)
        caption = ("The replicas' sampled state, `Results.timeseries()` (`timeseries.csv`): `waiting` (queue depth) and "
                   "`running` (running batch) summed over the replicas, `kv_utilization` averaged over them.")
        sections.append(Section("Over time", plots=[Plot("run-over-time", fig, caption)]))
    else:
        sections.append(Section("Over time", notes=[
            "The run was not sampled: set `simulation.timeseries_interval_s` for queue depth, running batch and KV use over time."]))
    return Page(title, sections)


# --- an observed trace ------------------------------------------------------------------
def observe_page(directory: str | Path) -> Page:
    """The page of ``simpy-llm observe``'s output directory: latency table and CDFs, latency
    against send time, the achieved schedule against the target one, and the server's
    Prometheus series (queue depth, running batch, KV use) when ``metrics.csv`` holds them.

    Latencies are those a calibration compares (:func:`~simpy_llm.calibrate.compare.observed_latencies`),
    over the answered (``ok``) requests.

    Raises
    ------
    ScenarioError
        The trace or the metrics file cannot be read, naming the file.

    Examples
    --------
    >>> page = observe_page("tests/data/calibration/llamacpp_short_prompts")
    >>> [p.div_id for s in page.sections for p in s.plots]  # doctest: +NORMALIZE_WHITESPACE
    ['observe-cdf-ttft', 'observe-cdf-tpot', 'observe-cdf-e2e', 'observe-latency-over-time', 'observe-schedule',
     'observe-prometheus']
    """
    from simpy_llm.calibrate.compare import observed_latencies
    from simpy_llm.workload.traces import read_trace_v2, trace_v2_paths

    header_path, _ = trace_v2_paths(directory)
    trace = read_trace_v2(directory)
    header = trace.header
    latencies, _ = observed_latencies(trace)
    ok = latencies[latencies["status"] == "ok"]
    summary_path = header_path.parent / "summary.json"
    load = header.get("load_generator") or {}
    notes = [
        f"Server: `{header.get('server_url', '?')}`, model `{header.get('model', '?')}`, API `{header.get('api', '?')}`; "
        f"{len(trace.frame)} requests, {len(ok)} answered (`ok`).",
        f"Send rate: requested {_number(load.get('requested_rate'))} /s, achieved {_number(load.get('achieved_rate'))} /s; "
        f"schedule delay p50 {_number(load.get('schedule_delay_p50_s'))} s, p99 {_number(load.get('schedule_delay_p99_s'))} s"
        + ("; the client LAGGED behind its schedule." if load.get("lagging") else "."),
    ]
    warnings = ["The load generator could not keep the requested rate (`load_generator.lagging`)."] if load.get("lagging") else []
    if summary_path.is_file():
        table = _latency_table(_json(summary_path).get("latency_s", {}))
        notes.append("Latency statistics from `summary.json`'s `latency_s` (answered requests; ITL per gap).")
    else:
        table = None
        notes.append("No `summary.json` beside the trace (a run cut short): no statistics table.")
    sections = [
        Section("Summary", table=table, notes=notes),
        Section("Latency distributions", plots=_cdf_plots(
            "observe", {c: {"observed": ok[c].to_numpy(dtype=np.float64)} for c in _LATENCY_COLUMNS},
            "over the answered requests that have it (from `trace.csv`: TTFT = first token − send, as `docs/observe.md` defines)",
        )),
        Section("Latency over time", plots=[Plot(
            "observe-latency-over-time",
            figures.over_time_figure(ok["send_s"].to_numpy(dtype=np.float64), {"ttft_s": ok["ttft_s"], "e2e_s": ok["e2e_s"]},
                                     title="TTFT and E2E latency by send time", mode="markers"),
            "One point per answered request at its send time (`send_time_us`): `ttft_s` and `e2e_s`.",
        )]),
        Section("Schedule", plots=[Plot(
            "observe-schedule",
            figures.schedule_figure(trace.frame["arrival_time_us"].to_numpy(dtype=np.float64) / 1e6,
                                    pd.to_numeric(trace.frame["send_time_us"]).to_numpy(dtype=np.float64, na_value=np.nan) / 1e6),
            "Requests sent so far: target = the workload's `arrival_time_us`, sent = `send_time_us` (every request, whatever its fate).",
        )]),
    ]
    metrics_name = header.get("metrics_file") or ("metrics.csv" if (header_path.parent / "metrics.csv").is_file() else None)
    if metrics_name:
        sections.append(_prometheus_section(header_path.parent / str(metrics_name)))
    return Page(f"Observed run: {header.get('model', header_path.parent.name)}", sections, warnings,
                subtitle=f"Trace `{header_path.name}` of mode `{header.get('mode', '?')}`.")


def _prometheus_section(path: Path) -> Section:
    from simpy_llm.calibrate.timeseries import scraped_series

    if not path.is_file():
        return Section("Server metrics", notes=[f"The trace names the metrics file `{path.name}`, which is not beside it."])
    frame = _csv(path, dtype={"metric": str, "labels": str, "error": str}, keep_default_na=False, na_values={"value": [""]})
    missing = [c for c in ("time_s", "metric", "value") if c not in frame]
    if missing:
        raise ScenarioError(str(path), [("line 1", f"missing column(s) {', '.join(missing)}; expected time_s, metric, labels, value, error")],
                            "metrics file")
    series = scraped_series(frame)
    others = sorted(set(frame["metric"].astype(str)) - {s.metric for s in series.values()} - {""})
    if not series:
        return Section("Server metrics", notes=[
            f"`{path.name}` holds none of the series drawn (queue depth, running batch, KV use: vllm:, llamacpp: or sglang: names)."])
    columns = {_SERIES_COLUMNS[name]: s for name, s in series.items()}
    fig = figures.over_time_figure(None, {c: s.value for c, s in columns.items()}, times={c: s.time_s for c, s in columns.items()},
                                   title="The server's own queue depth, running batch and KV use")
    said = ", ".join(f"`{s.metric}`" for s in series.values())
    caption = (f"Scraped from the server's Prometheus endpoint (`{path.name}`, on the trace's clock): {said}; summed over label sets "
               "(KV use averaged)." + (f" Not drawn: {', '.join(f'`{m}`' for m in others)}." if others else ""))
    return Section("Server metrics", plots=[Plot("observe-prometheus", fig, caption)])


# --- a calibration -----------------------------------------------------------------------
def compare_page(report: CalibrationReport | Mapping[str, Any], samples: Mapping[str, Any] | None = None) -> Page:
    """The page of a calibration (``simpy-llm calibrate compare``): its warnings first, the
    per-metric table, and per metric the observed and simulated CDFs and the simulated values
    against the observed ones with the line y = x, then the scraped time series against the
    simulated ones.

    Parameters
    ----------
    report
        A :class:`~simpy_llm.calibrate.report.CalibrationReport`, or its plain data
        (:func:`~simpy_llm.calibrate.report.report_to_dict`, ``report.json``).
    samples
        ``{metric: (observed, simulated)}``, the pairs compared (``Calibration.samples``);
        without them the plots are drawn from the report's QQ quantiles.
    """
    data = _report_dict(report)
    metrics: Mapping[str, Any] = data.get("metrics", {})
    warnings = list(data.get("warnings", []))
    warnings += [f"{metric.upper()}: {w}" for metric, c in metrics.items() for w in c.get("warnings", [])]
    rows = []
    for metric, c in metrics.items():
        pe = c.get("percentile_error") or {}
        rows.append((metric.upper(), _number(c.get("n")), str(c.get("rating") or "-"), _pct(c.get("mape")), _pct(c.get("bias")),
                     _number(c.get("pearson_r"), digits=3), _pct(pe.get("p50")), _pct(pe.get("p99")), _number(c.get("ks_statistic"), digits=3)))
    table = Table(("metric", "pairs", "rating", "MAPE", "bias", "Pearson r", "p50 error", "p99 error", "KS"), rows)
    counts = data.get("request_summary", {})
    trace = data.get("trace", {})
    notes = [f"Trace `{trace.get('path', '?')}`: {_number(counts.get('total'))} requests, {_number(counts.get('calibrated'))} compared "
             f"(warm-up left out: {_number(counts.get('excluded_warm_up'))}, failed: {_number(counts.get('excluded_failed'))}).",
             "Errors are relative, (simulated − observed) / observed; `report.json` holds every figure."]
    sections = [Section("Per-metric comparison", table=table, notes=notes)]
    pairs = {} if samples is None else {m: (np.asarray(o, dtype=np.float64), np.asarray(s, dtype=np.float64)) for m, (o, s) in samples.items()}
    for metric, c in metrics.items():
        if not c.get("n"):
            continue
        column = f"{metric}_s"
        if metric in pairs:
            obs, sim = pairs[metric]
            kind, source = "pairs", "every compared pair"
        else:
            obs, sim = np.asarray(c["qq_observed"], dtype=np.float64), np.asarray(c["qq_simulated"], dtype=np.float64)
            kind, source = "quantiles", "the report's QQ quantiles (`metrics." + metric + ".qq_observed`, `qq_simulated`)"
        plots = [
            Plot(f"compare-cdf-{metric}", figures.cdf_figure(column, {"observed": obs, "simulated": sim}),
                 f"Empirical CDFs of {LATENCY_METRICS[metric]}, observed and simulated, from {source}."),
            Plot(f"compare-scatter-{metric}", figures.pairs_figure(column, obs, sim, kind=kind),
                 f"Simulated against observed {LATENCY_METRICS[metric]} from {source}; on the dashed line y = x the prediction is exact."),
        ]
        sections.append(Section(f"{LATENCY_METRICS[metric]}: rated {c.get('rating') or '-'}", plots=plots))
    series = [(name, s) for name, s in data.get("timeseries", {}).items() if s.get("n")]
    if series:
        sections.append(Section("Server state over time", plots=[
            Plot(f"compare-timeseries-{name}", figures.stepped_comparison_figure(name, s),
                 f"`timeseries.{name}`: the server's `{s['scraped_metric']}` against the simulated `{s['simulated_column']}` "
                 "at every scrape time (MAE in the series' unit).")
            for name, s in series
        ]))
    throughput = data.get("throughput", {})
    if throughput:
        sections.append(Section("Throughput", table=Table(("rate", "observed", "simulated", "relative error"), [
            (key, _number(v.get("observed")), _number(v.get("simulated")), _pct(v.get("relative_error"))) for key, v in throughput.items()
        ])))
    sections.append(Section("Known limitations", notes=list(data.get("known_limitations", []))))
    return Page("Calibration: observed against simulated", sections, warnings,
                subtitle=f"Scenario `{data.get('scenario', {}).get('name', '?')}`.")


def _pct(value: Any) -> str:
    return "-" if value is None else f"{float(value) * 100:+.1f} %"


def _report_dict(report: Any) -> dict[str, Any]:
    if isinstance(report, Mapping):
        return dict(report)
    from simpy_llm.calibrate.report import report_to_dict

    return report_to_dict(report)


# --- files ---------------------------------------------------------------------------------
def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ScenarioError(str(path), [("", "no such file")], "report input") from None
    except (OSError, ValueError) as exc:
        raise ScenarioError(str(path), [("", f"cannot read it as JSON: {exc}")], "report input") from None
    if not isinstance(data, dict):
        raise ScenarioError(str(path), [("", f"must hold a JSON object, got {type(data).__name__}")], "report input")
    return data


def _csv(path: Path, **options: Any) -> pd.DataFrame:
    try:
        return pd.read_csv(path, **options)
    except FileNotFoundError:
        raise ScenarioError(str(path), [("", "no such file")], "report input") from None
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise ScenarioError(str(path), [("", f"cannot read it as CSV: {exc}")], "report input") from None


KINDS: Sequence[tuple[str, str]] = (
    ("report.json", "a calibration (simpy-llm calibrate compare --out DIR)"),
    ("trace.yaml", "an observed trace (simpy-llm observe --out DIR)"),
    ("records.csv", "a simulation run (simpy-llm run --out DIR)"),
    ("bench.json", "a benchmark (simpy-llm bench run / predict / compare --out DIR)"),
)
"""The file that tells each kind of directory apart, first match wins."""


def rate_rows(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A benchmark's runs (``bench.json``'s ``runs``) as the rows of
    :func:`~simpy_llm.report.figures.rate_curves_figure`: each run at its achieved request rate,
    with its p50 and p99 TTFT and E2E latency in seconds (a run that completed nothing is left out).

    Examples
    --------
    >>> rate_rows([{"request_throughput": 2.0, "median_ttft_ms": 100.0, "p99_ttft_ms": 300.0,
    ...             "median_e2el_ms": 900.0, "p99_e2el_ms": 1500.0, "completed": 4}])
    [{'request_rate': 2.0, 'ttft_p50_s': 0.1, 'ttft_p99_s': 0.3, 'e2e_p50_s': 0.9, 'e2e_p99_s': 1.5}]
    """
    return [
        {"request_rate": r["request_throughput"], "ttft_p50_s": r["median_ttft_ms"] / 1e3, "ttft_p99_s": r["p99_ttft_ms"] / 1e3,
         "e2e_p50_s": r["median_e2el_ms"] / 1e3, "e2e_p99_s": r["p99_e2el_ms"] / 1e3}
        for r in runs if r.get("completed")
    ]


_ERROR_WORDS = {"median_ttft_ms": "TTFT p50", "p99_ttft_ms": "TTFT p99", "median_e2el_ms": "E2E p50", "p99_e2el_ms": "E2E p99"}


def bench_page(result: Mapping[str, Any], predicted: Mapping[str, Any] | None = None, errors: Mapping[str, Any] | None = None) -> Page:
    """The page of a benchmark (``simpy-llm bench run``, or ``bench predict`` alone): latency
    against the achieved request rate, and with *predicted* (``bench compare``) the prediction
    overlaid and *errors* (:func:`~simpy_llm.calibrate.bench_predict.bench_errors`) run by run.
    Both need p99 among the benchmark's percentiles."""
    kind = "Predicted benchmark" if result.get("predicted") and predicted is None else "Benchmark"
    title = f"{kind}: {result.get('profile', '?')} ({result.get('dataset', '?')}, {result.get('num_prompts', '?')} prompts)"
    predicted_rows = rate_rows(predicted["runs"]) if predicted is not None else None
    caption = ("p50 and p99 of TTFT and E2E latency at each run's achieved request rate (`request_throughput`), from "
               "`bench.json`" + (", measured (solid) and predicted by the simulator (dashed)." if predicted is not None else "."))
    sections = [Section("Latency against request rate", plots=[
        Plot("bench-rate-curves", figures.rate_curves_figure(rate_rows(result["runs"]), predicted_rows), caption)])]
    rows = [(str(r["run"]), str(r["strategy"]), _number(r["request_rate"]), str(r.get("max_concurrency") or "-"), _number(r["completed"]),
             _number(r["request_throughput"]), _number(r["median_ttft_ms"]), _number(r["p99_ttft_ms"]),
             _number(r["median_e2el_ms"]), _number(r["p99_e2el_ms"])) for r in result["runs"]]
    sections.append(Section("Runs", table=Table(
        ("run", "strategy", "rate", "cap", "completed", "requests/s", "TTFT p50 (ms)", "TTFT p99 (ms)", "E2E p50 (ms)", "E2E p99 (ms)"), rows)))
    if errors is not None:
        err_rows = [(str(r["strategy"]), _number(r["request_rate"]), _number(r["request_throughput"]),
                     *(_pct(r[name]) for name in ("median_ttft_ms", "p99_ttft_ms", "median_e2el_ms", "p99_e2el_ms"))) for r in errors["runs"]]
        sat = errors.get("saturation") or {}
        mape = errors.get("mape") or {}
        notes = [f"Saturation rate: measured {_number(sat.get('measured'))}, predicted {_number(sat.get('predicted'))} "
                 f"requests/s ({_pct(sat.get('error'))}).",
                 "Below saturation, MAPE of " + ", ".join(f"{_ERROR_WORDS[name]} {_pct(value)}" for name, value in mape.items()) + ".",
                 "Errors are relative, (predicted − measured) / measured."]
        sections.append(Section("Prediction errors", table=Table(
            ("strategy", "rate", "measured requests/s", "TTFT p50", "TTFT p99", "E2E p50", "E2E p99"), err_rows), notes=notes))
    return Page(title, sections)


def bench_dir_page(directory: str | Path) -> Page:
    """The page of a benchmark's output directory: ``bench run``'s or ``bench predict``'s alone,
    or ``bench compare``'s (its ``compare.json`` names the measured benchmark) with the
    measured runs, the predicted ones overlaid and the errors."""
    out = Path(directory)
    result = _json(out / "bench.json")
    if (out / "compare.json").is_file():
        scored = _json(out / "compare.json")
        return bench_page(_json(Path(scored["measured"]) / "bench.json"), result, scored["errors"])
    return bench_page(result)


def directory_page(directory: str | Path) -> Page:
    """The page of an output directory of ``run``, ``observe``, ``calibrate compare`` or
    ``bench``, told apart by the file it holds (:data:`KINDS`: ``report.json``, ``trace.yaml``
    of mode ``real``, ``records.csv``, ``bench.json``).

    Raises
    ------
    ScenarioError
        *directory* is not a directory, holds none of those files, or a file cannot be read.

    Examples
    --------
    >>> try:
    ...     directory_page("scenarios")
    ... except ScenarioError as exc:
    ...     print(exc)  # doctest: +ELLIPSIS
    scenarios: 1 problem(s) in report directory
      <top level>: holds none of report.json (a calibration (...)), trace.yaml (...), records.csv (...), bench.json (...)
    """
    out = Path(directory)
    if not out.is_dir():
        raise ScenarioError(str(out), [("", "not a directory: give the output directory of run, observe, calibrate compare or bench")],
                            "report directory")
    if (out / "report.json").is_file():
        return compare_page(_json(out / "report.json"))
    if (out / "trace.yaml").is_file():
        header = yaml.safe_load((out / "trace.yaml").read_text(encoding="utf-8")) or {}
        if isinstance(header, Mapping) and header.get("mode") == "real":
            return observe_page(out)
    if (out / "records.csv").is_file():
        return run_dir_page(out)
    if (out / "bench.json").is_file():
        return bench_dir_page(out)
    said = ", ".join(f"{name} ({what})" for name, what in KINDS)
    raise ScenarioError(str(out), [("", f"holds none of {said}")], "report directory")
