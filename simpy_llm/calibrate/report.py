"""The calibration report: what was compared, how well the simulator predicted it, and the caveats.

A :class:`CalibrationReport` gathers the trace's description, the requests
compared and those left out, each metric's :class:`~simpy_llm.calibrate.stats.MetricComparison`,
throughput, the server's scraped time series against the simulated ones, which
server settings the scenario matched, the known limitations and any warnings
(seed 000 §11). It is plain data: :func:`report_to_dict` gives
it as JSON-ready dicts, :func:`write_report` writes ``report.json``,
``report.md`` and the plots, :func:`report_table` lays it out for the terminal.

Writing a report reads no clock and no machine detail: the same report and
samples give byte-identical files.

Examples
--------
>>> import numpy as np
>>> from simpy_llm.calibrate.stats import compare_metric
>>> obs = np.linspace(0.1, 0.5, 40)
>>> rep = CalibrationReport(
...     trace={"path": "obs/trace.csv", "num_requests": 40, "duration_s": 20.0, "server_config_provided": False},
...     request_summary={"total": 40, "ok": 40, "error": 0, "timeout": 0, "cancelled": 0,
...                      "excluded_warm_up": 0, "excluded_failed": 0, "calibrated": 40},
...     metrics={"ttft": compare_metric("ttft", obs, obs * 1.05, n_resamples=100)},
... )
>>> report_to_dict(rep)["metrics"]["ttft"]["rating"], len(rep.known_limitations)
('excellent', 2)
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import yaml

from simpy_llm.calibrate.stats import METRICS, PERCENTILES, MetricComparison, to_dict, valid_pairs
from simpy_llm.calibrate.timeseries import SERIES

__all__ = [
    "KNOWN_LIMITATIONS",
    "REQUEST_SUMMARY_KEYS",
    "CalibrationReport",
    "report_table",
    "report_to_dict",
    "throughput_comparison",
    "write_report",
]

KNOWN_LIMITATIONS: tuple[str, ...] = (
    "Prefix cache divergence: the simulator tells shared prefixes apart by synthetic token streams "
    "(prefix groups and block hashes), not by the prompts' real tokens; its prefix-cache hit rates may "
    "differ from the real server's, especially after evictions.",
    "Speculative decoding: if the real server decodes speculatively, its tokens arrive in bursts that "
    "the simulator's one-token-per-step decode does not reproduce.",
)
"""The limitations every report states (seed 000 §11, "Known Limitations (Always Included)")."""

REQUEST_SUMMARY_KEYS = (
    "total",
    "ok",
    "error",
    "timeout",
    "cancelled",
    "excluded_warm_up",
    "excluded_failed",
    "calibrated",
)
"""The keys of :attr:`CalibrationReport.request_summary`, all request counts."""

_TRACE_REQUIRED = ("path", "num_requests", "duration_s", "server_config_provided")
_TRACE_OPTIONAL = ("server", "hardware", "network", "load_generator")
_WARM_UP_KEYS = ("requests", "seconds")
_EXCLUDED = re.compile(r"excluded_[a-z0-9_]+")
_THROUGHPUT_KEYS = ("output_tokens_per_s", "requests_per_s")
_TIMESERIES_KEYS = (
    "scraped_metric", "simulated_column", "n", "mae", "observed_mean", "simulated_mean", "time_s", "observed", "simulated",
)
_TIMESERIES_LABELS = {"queue_depth": "queue depth (requests)", "running_batch": "running batch (requests)",
                      "kv_usage": "KV-cache use (fraction)"}
_THROUGHPUT_SIDES = ("observed", "simulated", "relative_error")
_RATING_STYLE = {"excellent": "bold green", "good": "green", "fair": "yellow", "poor": "bold red"}


# --- plain data and its checks ------------------------------------------------
def _plain(value: Any, where: str) -> Any:
    """*value* as JSON-ready data: numpy scalars and arrays become Python numbers and
    lists, tuples lists, paths strings; a NaN or infinite float becomes ``None`` (JSON
    has neither). Anything else that JSON cannot hold raises, naming *where*."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Path):
        return value.as_posix()
    if isinstance(value, np.ndarray):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value.tolist())]
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where}: keys must be strings, got {k!r}")
            out[k] = _plain(v, f"{where}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise TypeError(f"{where}: {type(value).__name__} is not plain data (dict, list, str, number, bool or None)")


def _keys(value: Any, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{where} must be a dict, got {type(value).__name__}")
    problems = []
    missing = [k for k in required if k not in value]
    unknown = [k for k in value if k not in required and k not in optional]
    if missing:
        problems.append(f"missing key(s) {', '.join(missing)}")
    if unknown:
        problems.append(f"unknown key(s) {', '.join(map(str, unknown))}")
    if problems:
        raise ValueError(f"{where}: {'; '.join(problems)}; allowed: {', '.join(required + optional)}")
    return _plain(value, where)


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where} must be a count (an integer >= 0), got {value!r}")
    return value


def _number(value: Any, where: str, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        allowed = "a number >= 0" + (" or None" if optional else "")
        raise ValueError(f"{where} must be {allowed}, got {value!r}")
    return value


def _strings(value: Any, where: str) -> list[str]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{where} must be a list of strings, got {value!r}")
    return list(value)


def _trace(value: Any) -> dict[str, Any]:
    out = _keys(value, "CalibrationReport.trace", _TRACE_REQUIRED, _TRACE_OPTIONAL)
    if not isinstance(out["path"], str):
        raise TypeError(f"CalibrationReport.trace.path must be a string, got {out['path']!r}")
    _count(out["num_requests"], "CalibrationReport.trace.num_requests")
    _number(out["duration_s"], "CalibrationReport.trace.duration_s")
    if not isinstance(out["server_config_provided"], bool):
        raise TypeError(f"CalibrationReport.trace.server_config_provided must be true or false, got {out['server_config_provided']!r}")
    for key in _TRACE_OPTIONAL:
        if out.get(key) is not None and not isinstance(out[key], dict):
            raise TypeError(
                f"CalibrationReport.trace.{key} must be a dict (the trace header's block) or None, got {out[key]!r}"
            )
    return out


def _request_summary(value: Any) -> dict[str, int]:
    where = "CalibrationReport.request_summary"
    extra: tuple[str, ...] = ()
    if isinstance(value, Mapping):
        extra = tuple(k for k in value if isinstance(k, str) and _EXCLUDED.fullmatch(k) and k not in REQUEST_SUMMARY_KEYS)
    out = _keys(value, where, REQUEST_SUMMARY_KEYS, extra)
    for key in REQUEST_SUMMARY_KEYS + extra:
        _count(out[key], f"{where}.{key}")
    by_status = out["ok"] + out["error"] + out["timeout"] + out["cancelled"]
    if by_status != out["total"]:
        raise ValueError(f"{where}: ok + error + timeout + cancelled = {by_status}, but total = {out['total']}")
    if out["calibrated"] > out["ok"]:
        raise ValueError(f"{where}: calibrated ({out['calibrated']}) exceeds ok ({out['ok']}): only answered requests are compared")
    return {k: out[k] for k in REQUEST_SUMMARY_KEYS + extra}


def _warm_up(value: Any) -> dict[str, Any]:
    out = _keys(value, "CalibrationReport.warm_up", (), _WARM_UP_KEYS)
    if out.get("requests") is not None:
        _count(out["requests"], "CalibrationReport.warm_up.requests")
    if "seconds" in out:
        _number(out["seconds"], "CalibrationReport.warm_up.seconds", optional=True)
    return out


def _metrics(value: Any) -> dict[str, MetricComparison]:
    where = "CalibrationReport.metrics"
    if not isinstance(value, Mapping):
        raise TypeError(f"{where} must be a dict of MetricComparison, got {type(value).__name__}")
    unknown = [k for k in value if k not in METRICS]
    if unknown:
        raise ValueError(f"{where}: unknown metric(s) {', '.join(map(str, unknown))}; allowed: {', '.join(METRICS)}")
    for key, comp in value.items():
        if not isinstance(comp, MetricComparison):
            raise TypeError(f"{where}.{key} must be a MetricComparison, got {type(comp).__name__}")
        if comp.metric != key:
            raise ValueError(f"{where}.{key} holds the comparison of {comp.metric!r}")
    return {m: value[m] for m in METRICS if m in value}  # the report's order, whatever the caller's


def _throughput(value: Any) -> dict[str, Any]:
    where = "CalibrationReport.throughput"
    out = _keys(value, where, (), _THROUGHPUT_KEYS)
    for key, sides in out.items():
        _keys(sides, f"{where}.{key}", _THROUGHPUT_SIDES)
        for side in ("observed", "simulated"):
            _number(sides[side], f"{where}.{key}.{side}", optional=True)
        if sides["relative_error"] is not None and not isinstance(sides["relative_error"], (int, float)):
            raise TypeError(f"{where}.{key}.relative_error must be a number or None, got {sides['relative_error']!r}")
    return out


def _timeseries(value: Any) -> dict[str, dict[str, Any]]:
    where = "CalibrationReport.timeseries"
    out = _keys(value, where, (), SERIES)
    for name, series in out.items():
        at = f"{where}.{name}"
        _keys(series, at, _TIMESERIES_KEYS)
        for key in ("scraped_metric", "simulated_column"):
            if not isinstance(series[key], str):
                raise TypeError(f"{at}.{key} must be a string, got {series[key]!r}")
        n = _count(series["n"], f"{at}.n")
        for key in ("mae", "observed_mean", "simulated_mean"):
            _number(series[key], f"{at}.{key}", optional=True)
        points = [series[key] for key in ("time_s", "observed", "simulated")]
        if not all(isinstance(p, list) and len(p) == n for p in points):
            raise ValueError(f"{at}: time_s, observed and simulated must be lists of n = {n} numbers each")
        if not all(isinstance(v, (int, float)) for p in points for v in p):
            raise ValueError(f"{at}: time_s, observed and simulated must hold numbers only (no null)")
    return {k: out[k] for k in SERIES if k in out}  # the report's order


def _config_match(value: Any) -> dict[str, list[str]]:
    out = _keys(value, "CalibrationReport.config_match", ("matched", "defaulted"))
    return {k: _strings(out[k], f"CalibrationReport.config_match.{k}") for k in ("matched", "defaulted")}


def _known_limitations(value: Any) -> list[str]:
    extra = _strings(value, "CalibrationReport.known_limitations")
    # The standard limitations are always stated, first; a caller's own follow.
    return [*KNOWN_LIMITATIONS, *(x for i, x in enumerate(extra) if x not in KNOWN_LIMITATIONS and x not in extra[:i])]


def _free_form(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{where} must be a dict, got {type(value).__name__}")
    return _plain(value, where)


def _fit(value: Any) -> dict[str, Any] | None:
    return None if value is None else _free_form(value, "CalibrationReport.fit")


@attrs.frozen(kw_only=True)
class CalibrationReport:
    """One calibration's findings, as plain data (see the module docstring).

    Every field is checked when the report is made: a missing or unknown key
    raises :class:`ValueError` naming the field, the key and what is allowed;
    numpy numbers become Python numbers, and NaN becomes ``None``.
    """

    trace: dict[str, Any] = attrs.field(converter=_trace)
    """The observed trace: ``path``, ``num_requests``, ``duration_s`` (s, first send to last
    answer), ``server_config_provided`` (bool: the trace header described the server), and
    the header's ``server``, ``hardware``, ``network`` and ``load_generator`` (the observer's
    load statistics) blocks when it has them."""
    request_summary: dict[str, int] = attrs.field(converter=_request_summary)
    """Request counts (:data:`REQUEST_SUMMARY_KEYS`): ``total`` = ``ok + error + timeout +
    cancelled``; ``excluded_warm_up`` and ``excluded_failed`` were left out of the
    comparison, and so was any further ``excluded_<reason>`` count given (e.g.
    ``excluded_no_usage``; they follow, in the order given); ``calibrated`` requests were compared."""
    metrics: dict[str, MetricComparison] = attrs.field(converter=_metrics)
    """The comparison of each metric compared, keyed and ordered as :data:`~simpy_llm.calibrate.stats.METRICS`."""
    warm_up: dict[str, Any] = attrs.field(factory=dict, converter=_warm_up)
    """How warm-up was left out: ``requests`` (the first N requests) and/or ``seconds`` (the
    first T seconds of the run); a key absent, ``None`` or 0 was not applied."""
    throughput: dict[str, Any] = attrs.field(factory=dict, converter=_throughput)
    """``output_tokens_per_s`` and ``requests_per_s``, each ``{observed, simulated,
    relative_error}`` (see :func:`throughput_comparison`); either may be absent."""
    timeseries: dict[str, dict[str, Any]] = attrs.field(factory=dict, converter=_timeseries)
    """The server's scraped time series against the simulated ones at the same instants
    (:func:`~simpy_llm.calibrate.timeseries.compare_series`): per series of
    :data:`~simpy_llm.calibrate.timeseries.SERIES` that the scrapes held, ``scraped_metric``, ``simulated_column``,
    ``n`` (scrapes compared), ``mae`` (mean absolute error, in the series' unit: requests, or a
    fraction of the KV cache), ``observed_mean``, ``simulated_mean``, and the points ``time_s``
    (s, the trace's clock), ``observed``, ``simulated``. Empty without scraped samples."""
    config_match: dict[str, list[str]] = attrs.field(
        factory=lambda: {"matched": [], "defaulted": []}, converter=_config_match
    )
    """``matched``: server settings the scenario took from the trace (e.g. ``"max_num_seqs=256"``);
    ``defaulted``: those it had to assume (e.g. ``"kv_num_blocks (no server config)"``)."""
    known_limitations: list[str] = attrs.field(factory=lambda: list(KNOWN_LIMITATIONS), converter=_known_limitations)
    """:data:`KNOWN_LIMITATIONS` (always, first), then the caller's own."""
    scenario: dict[str, Any] = attrs.field(factory=dict, converter=lambda v: _free_form(v, "CalibrationReport.scenario"))
    """The simulated scenario, free-form plain data: its name, the latency model's kind and
    parameters, a summary of the engine."""
    fit: dict[str, Any] | None = attrs.field(default=None, converter=_fit)
    """When the report comes from a fit: the fitted profile's statistics (free-form plain data)."""
    warnings: list[str] = attrs.field(factory=list, converter=lambda v: _strings(v, "CalibrationReport.warnings"))
    """Report-wide warnings (each metric's own are in its comparison)."""


def throughput_comparison(
    *,
    observed_output_tokens_per_s: float | None,
    simulated_output_tokens_per_s: float | None,
    observed_requests_per_s: float | None,
    simulated_requests_per_s: float | None,
) -> dict[str, dict[str, float | None]]:
    """The :attr:`CalibrationReport.throughput` block: each rate observed and simulated, and
    ``relative_error`` = ``(simulated - observed) / observed``. A rate that could not be
    measured (e.g. a run of no duration) is ``None``, and so is the relative error when a
    side is ``None`` or nothing was observed.

    >>> throughput_comparison(observed_output_tokens_per_s=200.0, simulated_output_tokens_per_s=220.0,
    ...                       observed_requests_per_s=2.0, simulated_requests_per_s=2.0)["output_tokens_per_s"]
    {'observed': 200.0, 'simulated': 220.0, 'relative_error': 0.1}
    """

    def one(obs: float | None, sim: float | None, name: str) -> dict[str, float | None]:
        _number(obs, f"observed_{name}", optional=True)
        _number(sim, f"simulated_{name}", optional=True)
        return {
            "observed": None if obs is None else float(obs),
            "simulated": None if sim is None else float(sim),
            "relative_error": (sim - obs) / obs if obs is not None and sim is not None and obs > 0 else None,
        }

    return {
        "output_tokens_per_s": one(observed_output_tokens_per_s, simulated_output_tokens_per_s, "output_tokens_per_s"),
        "requests_per_s": one(observed_requests_per_s, simulated_requests_per_s, "requests_per_s"),
    }


def report_to_dict(report: CalibrationReport) -> dict[str, Any]:
    """*report* as JSON-ready plain data (each comparison through :func:`~simpy_llm.calibrate.stats.to_dict`);
    a copy: changing it leaves the report as it was."""
    return copy.deepcopy({
        "trace": report.trace,
        "request_summary": report.request_summary,
        "warm_up": report.warm_up,
        "metrics": {m: to_dict(c) for m, c in report.metrics.items()},
        "throughput": report.throughput,
        "timeseries": report.timeseries,
        "config_match": report.config_match,
        "known_limitations": list(report.known_limitations),
        "scenario": report.scenario,
        "fit": report.fit,
        "warnings": list(report.warnings),
    })


# --- formatting ------------------------------------------------------------------
def _time(v: float | None) -> str:
    """Seconds as ms below 1 s, else s."""
    if v is None:
        return "-"
    if abs(v) < 1.0:
        ms = v * 1e3
        return f"{ms:.1f} ms" if abs(ms) >= 1.0 else f"{ms:.3f} ms"
    return f"{v:.2f} s"


def _pct(v: float | None, signed: bool = False) -> str:
    return "-" if v is None else f"{v * 100:{'+' if signed else ''}.1f}%"


def _pct_ci(ci: tuple[float, float] | list[float] | None) -> str:
    return "" if ci is None else f" [{ci[0] * 100:.1f}, {ci[1] * 100:.1f}]"


def _r(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _r_ci(ci: tuple[float, float] | list[float] | None) -> str:
    return "" if ci is None else f" [{ci[0]:.3f}, {ci[1]:.3f}]"


def _ks(c: MetricComparison) -> str:
    return "-" if c.ks_statistic is None else f"{c.ks_statistic:.3f} (p {c.ks_pvalue:.3g})"


def _bias(c: MetricComparison) -> str:
    if c.bias is None:
        return "-"
    return _pct(c.bias, signed=True) + (f" {c.bias_direction}" if c.bias_direction else "")


def _q(c: MetricComparison, side: str, key: str) -> float | None:
    quantiles = getattr(c, side)
    return None if quantiles is None else getattr(quantiles, key)


def _level(report: CalibrationReport) -> str:
    levels = sorted({c.confidence_level for c in report.metrics.values()})
    return "/".join(f"{lv * 100:g}%" for lv in levels) or "95%"


def _requests_line(report: CalibrationReport) -> str:
    s = report.request_summary
    left_out = [f"{s['excluded_warm_up']} warm-up", f"{s['excluded_failed']} failed"]
    left_out += [f"{v} {k.removeprefix('excluded_').replace('_', ' ')}" for k, v in s.items() if k not in REQUEST_SUMMARY_KEYS]
    return (
        f"{s['total']} requests: {s['ok']} ok, {s['error']} error, {s['timeout']} timeout, "
        f"{s['cancelled']} cancelled; left out {', '.join(left_out[:-1])} and {left_out[-1]}; "
        f"{s['calibrated']} compared"
    )


def _warm_up_line(report: CalibrationReport) -> str:
    parts = []
    if report.warm_up.get("requests"):
        parts.append(f"the first {report.warm_up['requests']} requests")
    if report.warm_up.get("seconds"):
        parts.append(f"the first {report.warm_up['seconds']:g} s")
    return " and ".join(parts) if parts else "none"


def _plain_value(v: Any) -> str:
    return "-" if v is None else str(v)


def _fit_warnings(report: CalibrationReport) -> list[str]:
    """The warnings of the fit the report comes from (its ``fit.warnings``): shown first."""
    warnings = (report.fit or {}).get("warnings")
    return [str(w) for w in warnings] if isinstance(warnings, list) else []


def _plain_number(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def _markdown(report: CalibrationReport, plots: list[str]) -> str:
    """The text of ``report.md``; *plots* are the plot files' names."""
    lines: list[str] = ["# Calibration report", ""]
    lines += [f"> **Fit warning:** {w}" for w in _fit_warnings(report)]
    if _fit_warnings(report):
        lines.append("")
    t = report.trace
    lines += ["## Summary", ""]
    lines.append(
        f"- Trace `{t['path']}`: {t['num_requests']} requests over {t['duration_s']:g} s; "
        f"server config {'provided' if t['server_config_provided'] else 'not provided'}."
    )
    for key in _TRACE_OPTIONAL:
        if t.get(key):
            label = key.replace("_", " ").capitalize()
            lines.append(f"- {label}: " + ", ".join(f"{k}={_plain_value(v)}" for k, v in t[key].items()))
    lines.append(f"- {_requests_line(report)[:1].upper()}{_requests_line(report)[1:]}.")
    lines.append(f"- Warm-up left out: {_warm_up_line(report)}.")
    if report.scenario.get("name"):
        lines.append(f"- Scenario: {report.scenario['name']}.")
    ratings = [f"{m} {c.rating}" for m, c in report.metrics.items() if c.rating]
    lines.append(f"- Ratings: {', '.join(ratings) if ratings else 'none (no metric had data)'}.")
    lines.append("")

    lines += ["## Metrics", ""]
    lines.append(
        f"Times in ms below 1 s, else in s. Errors are relative to the observed value; "
        f"intervals are {_level(report)} bootstrap confidence intervals over resampled pairs. "
        "KS: two-sample Kolmogorov-Smirnov D and its p-value. Ratings follow the quality table "
        "(excellent: MAPE < 10% and r > 0.95; good: < 20%, > 0.85; fair: < 35%, > 0.70; else poor)."
    )
    lines.append("")
    head = ["metric", "n", "obs p50", "sim p50", "obs p90", "sim p90", "obs p99", "sim p99",
            "MAPE [CI]", "r [CI]", "KS D (p)", "bias", "rating"]
    lines += ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * 11 + ["---"]) + "|"]
    for m, c in report.metrics.items():
        row = [m, str(c.n)]
        for key in ("p50", "p90", "p99"):
            row += [_time(_q(c, "observed", key)), _time(_q(c, "simulated", key))]
        row += [_pct(c.mape) + _pct_ci(c.mape_ci), _r(c.pearson_r) + _r_ci(c.pearson_ci), _ks(c), _bias(c), c.rating or "-"]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")

    lines += ["### Percentile errors", "", "(sim_q - obs_q) / obs_q, with its interval.", ""]
    lines += ["| metric | median APE | " + " | ".join(k for k, _ in PERCENTILES) + " | Spearman r |"]
    lines += ["|---|" + "---:|" * (len(PERCENTILES) + 2)]
    for m, c in report.metrics.items():
        cells = [_pct(c.percentile_error[k], signed=True) + _pct_ci(c.percentile_error_ci[k]) for k, _ in PERCENTILES]
        lines.append(f"| {m} | {_pct(c.median_ape)} | " + " | ".join(cells) + f" | {_r(c.spearman_r)} |")
    lines.append("")

    if report.throughput:
        lines += ["## Throughput", "", "| rate | observed | simulated | relative error |", "|---|---:|---:|---:|"]
        for key, label, fmt in (("output_tokens_per_s", "output tokens/s", ".1f"), ("requests_per_s", "requests/s", ".3f")):
            if key in report.throughput:
                tp = report.throughput[key]
                obs, sim = (("-" if tp[s] is None else f"{tp[s]:{fmt}}") for s in ("observed", "simulated"))
                lines.append(f"| {label} | {obs} | {sim} | {_pct(tp['relative_error'], signed=True)} |")
        lines.append("")

    if report.timeseries:
        lines += ["## Time series", ""]
        lines.append(
            "The server's scraped samples against the simulated state at the same instants (the trace's clock); "
            "MAE: mean absolute error over the scrapes, in the series' unit."
        )
        lines.append("")
        lines += ["| series | scraped metric | simulated | n | MAE | observed mean | simulated mean |",
                  "|---|---|---|---:|---:|---:|---:|"]
        for name, ts in report.timeseries.items():
            lines.append(
                f"| {name} | `{ts['scraped_metric']}` | `{ts['simulated_column']}` | {ts['n']} | {_plain_number(ts['mae'])} | "
                f"{_plain_number(ts['observed_mean'])} | {_plain_number(ts['simulated_mean'])} |"
            )
        lines.append("")

    lines += ["## Configuration match", ""]
    cm = report.config_match
    lines.append("- Matched: " + (", ".join(f"`{x}`" for x in cm["matched"]) or "none"))
    lines.append("- Defaulted: " + (", ".join(f"`{x}`" for x in cm["defaulted"]) or "none"))
    lines.append("")

    for title, block in (("Scenario", report.scenario), ("Fit", report.fit)):
        if block:
            lines += [f"## {title}", "", "```yaml", yaml.safe_dump(block, sort_keys=False, allow_unicode=True).rstrip(), "```", ""]

    lines += ["## Known limitations", ""]
    lines += [f"- {x}" for x in report.known_limitations]
    lines.append("")

    notes = list(report.warnings) + [f"{m}: {w}" for m, c in report.metrics.items() for w in c.warnings]
    lines += ["## Warnings", ""]
    lines += [f"- {w}" for w in notes] if notes else ["None."]
    lines.append("")

    lines += ["## Plots", ""]
    if plots:
        lines.append(
            "QQ (quantiles at 100 evenly spaced probabilities), empirical CDFs and per-pair scatter, "
            "each against y = x where it applies; log axes when the values span more than two decades; "
            "each scraped time series against the simulated one."
        )
        lines.append("")
        lines += [f"- [{name}]({name})" for name in plots]
    else:
        lines.append("None: no metric had data.")
    return "\n".join(lines) + "\n"


# --- plots -----------------------------------------------------------------------
def _matplotlib() -> Any:
    """matplotlib's ``Figure`` and Agg canvas (matplotlib is a dependency: a missing one is
    an ImportError, never a report without its plots).

    Figures are made without pyplot: nothing joins pyplot's global figure list (so there
    is nothing to close) and the caller's pyplot backend is left alone."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    return Figure, FigureCanvasAgg


def _scale(values: np.ndarray) -> tuple[float, str]:
    return (1e3, "ms") if np.abs(values).max() < 1.0 else (1.0, "s")


def _log(values: np.ndarray) -> bool:
    """Log axes when every value is positive and they span more than two decades."""
    return bool(values.size) and bool(values.min() > 0) and values.max() / values.min() > 100.0


def _save(mpl: Any, fig: Any, path: Path) -> None:
    fig.tight_layout()
    # No "Software" entry: the file holds nothing but the picture, identical run to run.
    mpl[1](fig).print_figure(path, format="png", dpi=100, metadata={"Software": None})


def _plot_pairs(mpl: Any, metric: str, x: np.ndarray, y: np.ndarray, path: Path, kind: str) -> None:
    both = np.concatenate([x, y])
    factor, unit = _scale(both)
    fig = mpl[0](figsize=(5.5, 5))
    ax = fig.add_subplot()
    lo, hi = both.min() * factor, both.max() * factor
    ax.plot([lo, hi], [lo, hi], color="0.5", linewidth=1, linestyle="--", label="y = x")
    if kind == "qq":
        ax.plot(x * factor, y * factor, "o", markersize=3, label="quantiles")
        ax.set_title(f"{metric.upper()}: QQ, 100 quantiles")
    else:
        ax.plot(x * factor, y * factor, ".", markersize=2, alpha=0.5, label="pairs")
        ax.set_title(f"{metric.upper()}: per-pair observed vs simulated ({x.size})")
    if _log(both):
        ax.set_xscale("log")
        ax.set_yscale("log")
    # One range on both axes, so that y = x is the diagonal and distances read alike.
    lims = (min(ax.get_xlim()[0], ax.get_ylim()[0]), max(ax.get_xlim()[1], ax.get_ylim()[1]))
    ax.set_xlim(lims)
    ax.set_ylim(lims)
    ax.set_xlabel(f"observed ({unit})")
    ax.set_ylabel(f"simulated ({unit})")
    ax.legend(loc="upper left", fontsize="small")
    _save(mpl, fig, path)


def _plot_cdf(mpl: Any, metric: str, obs: np.ndarray, sim: np.ndarray, path: Path) -> None:
    factor, unit = _scale(np.concatenate([obs, sim]))
    fig = mpl[0](figsize=(6.5, 4))
    ax = fig.add_subplot()
    ax.set_title(f"{metric.upper()}: empirical CDFs")
    for values, label in ((obs, "observed"), (sim, "simulated")):
        v = np.sort(values) * factor
        ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=label)
    if _log(np.concatenate([obs, sim])):
        ax.set_xscale("log")
    ax.set_xlabel(f"{metric} ({unit})")
    ax.set_ylabel("fraction <= x")
    ax.set_ylim(0.0, 1.0)
    ax.legend(loc="lower right", fontsize="small")
    _save(mpl, fig, path)


def _plot_timeseries(mpl: Any, name: str, series: Mapping[str, Any], path: Path) -> None:
    fig = mpl[0](figsize=(8, 3.5))
    ax = fig.add_subplot()
    t = np.asarray(series["time_s"], dtype=np.float64)
    # Each scrape reads the state at its instant: steps that hold until the next scrape.
    ax.step(t, series["observed"], where="post", label=f"observed ({series['scraped_metric']})")
    ax.step(t, series["simulated"], where="post", linestyle="--", label=f"simulated ({series['simulated_column']})")
    mae = "-" if series["mae"] is None else f"{series['mae']:.3g}"
    ax.set_title(f"{_TIMESERIES_LABELS[name]}: MAE {mae} over {series['n']} scrapes")
    ax.set_xlabel("time (s)")
    ax.set_ylabel(_TIMESERIES_LABELS[name])
    ax.legend(loc="upper right", fontsize="small")
    _save(mpl, fig, path)


def _checked_samples(report: CalibrationReport, samples: Mapping[str, Any]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    if not isinstance(samples, Mapping):
        raise TypeError(f"samples must be a dict of (observed, simulated) pairs, got {type(samples).__name__}")
    unknown = [k for k in samples if k not in report.metrics]
    if unknown:
        raise ValueError(
            f"samples: metric(s) {', '.join(map(str, unknown))} are not in the report; "
            f"the report has: {', '.join(report.metrics) or 'none'}"
        )
    out = {}
    for metric, pair in samples.items():
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"samples[{metric!r}] must be an (observed, simulated) pair of arrays")
        obs, sim, _, _ = valid_pairs(*pair)
        if obs.size != report.metrics[metric].n:
            raise ValueError(
                f"samples[{metric!r}] hold {obs.size} valid pairs, but the report's comparison "
                f"of {metric} has n = {report.metrics[metric].n}: they are not the same data"
            )
        out[metric] = (obs, sim)
    return out


def write_report(report: CalibrationReport, samples: Mapping[str, Any], out_dir: str | Path) -> list[Path]:
    """Write *report* into *out_dir* (created if need be); return the paths written.

    Files: ``report.json`` (:func:`report_to_dict`, indent 2), ``report.md`` (summary,
    metrics, percentile errors, throughput, time series, request summary, configuration
    match, scenario, fit, known limitations, warnings), for each metric with data,
    ``qq_<metric>.png`` (from the comparison's QQ points), ``cdf_<metric>.png`` and
    ``scatter_<metric>.png`` (from *samples*), and for each time series with points,
    ``timeseries_<series>.png`` (observed and simulated against time, from the report).

    Parameters
    ----------
    samples
        ``{metric: (observed, simulated)}``, the paired values in seconds each comparison
        was made from (pairs :func:`~simpy_llm.calibrate.stats.valid_pairs` leaves out are
        left out of the plots too). A metric of the report without samples gets its QQ
        plot only.

    Raises
    ------
    ValueError, TypeError
        *samples* name a metric the report lacks, or do not hold the comparison's pairs;
        nothing is written then.
    ImportError
        matplotlib cannot be imported (a broken install: it is a dependency); nothing is
        written then.
    """
    checked = _checked_samples(report, samples)
    mpl = _matplotlib()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "report.json", out / "report.md"]
    written[0].write_text(json.dumps(report_to_dict(report), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    plots: list[Path] = []
    for metric, c in report.metrics.items():
        if c.n == 0:
            continue
        path = out / f"qq_{metric}.png"
        _plot_pairs(mpl, metric, np.asarray(c.qq_observed), np.asarray(c.qq_simulated), path, "qq")
        plots.append(path)
        if metric in checked:
            obs, sim = checked[metric]
            _plot_cdf(mpl, metric, obs, sim, out / f"cdf_{metric}.png")
            _plot_pairs(mpl, metric, obs, sim, out / f"scatter_{metric}.png", "scatter")
            plots += [out / f"cdf_{metric}.png", out / f"scatter_{metric}.png"]
    for name, series in report.timeseries.items():
        if series["n"]:
            path = out / f"timeseries_{name}.png"
            _plot_timeseries(mpl, name, series, path)
            plots.append(path)
    md = _markdown(report, [p.name for p in plots])
    written[1].write_text(md, encoding="utf-8")
    return written + plots


# --- terminal ----------------------------------------------------------------------
def report_table(report: CalibrationReport) -> Any:
    """A :mod:`rich` renderable of *report*: the warnings of the fit it comes from (first),
    one row per metric (n, observed and simulated p50 and p99, MAPE with its interval,
    Pearson r, KS D, bias, rating; times in ms below 1 s, else s), then the request summary,
    each time series' MAE, the warnings and the known limitations."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(title="calibration", header_style="bold", box=box.SIMPLE_HEAD)
    table.add_column("metric")
    for col in ("n", "obs p50", "sim p50", "obs p99", "sim p99", f"MAPE [{_level(report)} CI]", "r", "KS D", "bias"):
        table.add_column(col, justify="right")
    table.add_column("rating")
    for m, c in report.metrics.items():
        table.add_row(
            m,
            str(c.n),
            _time(_q(c, "observed", "p50")),
            _time(_q(c, "simulated", "p50")),
            _time(_q(c, "observed", "p99")),
            _time(_q(c, "simulated", "p99")),
            _pct(c.mape) + _pct_ci(c.mape_ci),
            _r(c.pearson_r),
            "-" if c.ks_statistic is None else f"{c.ks_statistic:.3f}",
            _bias(c),
            Text(c.rating or "-", style=_RATING_STYLE.get(c.rating or "", "")),
        )
    parts: list[Any] = [Text(f"fit warning: {w}", style="bold red") for w in _fit_warnings(report)]
    parts += [table, Text(f"{_requests_line(report)}; warm-up left out: {_warm_up_line(report)}")]
    for name, ts in report.timeseries.items():
        parts.append(Text(
            f"time series {name}: MAE {_plain_number(ts['mae'])} over {ts['n']} scrapes ({ts['scraped_metric']} against "
            f"simulated {ts['simulated_column']}; means {_plain_number(ts['observed_mean'])} and "
            f"{_plain_number(ts['simulated_mean'])})"
        ))
    notes = list(report.warnings) + [f"{m}: {w}" for m, c in report.metrics.items() for w in c.warnings]
    parts += [Text(f"warning: {w}", style="bold yellow") for w in notes]
    parts += [Text(f"limitation: {x}", style="cyan") for x in report.known_limitations]
    return Group(*parts)
