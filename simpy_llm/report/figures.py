"""Interactive figures (plotly) of a run's, an observed trace's and a calibration's numbers.

Each function takes plain arrays and mappings, not a :class:`~simpy_llm.metrics.results.Results`
or a trace, so that a run in memory and the files it wrote give the same figure
(:mod:`simpy_llm.report.sources` reads both). Axes are said in words with units by
:func:`simpy_llm.plot_labels.axis_label`; the page puts the key paths in each figure's caption.

plotly is the ``report`` extra (``pip install 'simpy-llm[report]'``): it is imported when a
figure is made, so the package imports without it and :func:`require_plotly` says what to install.

Examples
--------
>>> fig = cdf_figure("ttft_s", {"simulated": [0.2, 0.1, 0.3]})
>>> fig.data[0].x.tolist(), fig.data[0].y.tolist()
([0.1, 0.2, 0.3], [0.3333333333333333, 0.6666666666666666, 1.0])
>>> fig.layout.xaxis.title.text
'TTFT (s)'
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from simpy_llm.plot_labels import axis_label, title_words

__all__ = [
    "RATE_ROW_KEYS",
    "cdf_figure",
    "over_time_figure",
    "pairs_figure",
    "rate_curves_figure",
    "require_plotly",
    "schedule_figure",
    "stepped_comparison_figure",
]

RATE_ROW_KEYS: tuple[str, ...] = ("request_rate", "ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "e2e_p99_s")
"""The keys of a row of :func:`rate_curves_figure`: the request rate (requests/s) and the
p50 and p99 of TTFT and E2E at that rate (s)."""

_SHARE = "share of values at or below x"
_SIDE_DASH = {"measured": "solid", "observed": "solid", "predicted": "dash", "simulated": "dash"}


def require_plotly() -> Any:
    """The module ``plotly.graph_objects``.

    Raises
    ------
    ImportError
        plotly is not installed, naming the extra that installs it.
    """
    try:
        import plotly.graph_objects as go  # the report extra: imported only when a figure is made
    except ImportError as exc:
        raise ImportError("the HTML report needs plotly: pip install 'simpy-llm[report]'") from exc
    return go


def _subplots() -> Any:
    from plotly.subplots import make_subplots  # the report extra, as in require_plotly

    return make_subplots


def _layout(fig: Any, title: str, height: int = 420) -> Any:
    fig.update_layout(
        # The legend goes under the x axis's title: above the plot it collides with the title
        # once its entries wrap (a measured and a predicted curve of four statistics do).
        title=title, height=height + 60, template="plotly_white", showlegend=True, margin={"l": 70, "r": 30, "t": 60, "b": 120},
        legend={"orientation": "h", "yanchor": "top", "y": -0.2, "xanchor": "left", "x": 0.0},
    )
    return fig


def _finite(values: Any) -> np.ndarray:
    a = np.asarray(values, dtype=np.float64).ravel()
    return a[np.isfinite(a)]


def _log_axis(values: np.ndarray) -> bool:
    """A log axis when every value is positive and they span more than two decades (as the
    calibration report's PNG plots do)."""
    return bool(values.size) and bool(values.min() > 0) and bool(values.max() / values.min() > 100.0)


def cdf_figure(column: str, series: Mapping[str, Any], *, title: str | None = None) -> Any:
    """Empirical CDFs of one latency column, one line per entry of *series*.

    Parameters
    ----------
    column
        The key path the values are (``ttft_s``, ``e2e_s``): it names the x axis
        (:func:`~simpy_llm.plot_labels.axis_label`).
    series
        Name (``simulated``, ``observed``, ...) -> values in seconds; NaN and infinities
        are left out (a request that has no such latency).
    title
        Default: ``<words of column>: empirical CDF``.

    Returns
    -------
    plotly.graph_objects.Figure
        The fraction of values at or below x: steps at each value, from 1/n to 1.

    Examples
    --------
    >>> fig = cdf_figure("e2e_s", {"observed": [1.0, 2.0], "simulated": [1.5, float("nan")]})
    >>> [(t.name, t.y.tolist()) for t in fig.data]
    [('observed (2)', [0.5, 1.0]), ('simulated (1)', [1.0])]
    """
    go = require_plotly()
    fig = go.Figure()
    everything = []
    for name, values in series.items():
        v = np.sort(_finite(values))
        everything.append(v)
        fig.add_trace(go.Scatter(
            x=v, y=np.arange(1, v.size + 1) / max(v.size, 1), mode="lines", line={"shape": "hv", "dash": _SIDE_DASH.get(name, "solid")},
            name=f"{name} ({v.size})",
        ))
    fig.update_xaxes(title_text=axis_label(column), type="log" if _log_axis(np.concatenate(everything or [np.empty(0)])) else "linear")
    fig.update_yaxes(title_text=_SHARE, range=[0.0, 1.02])
    return _layout(fig, title or f"{title_words(column)}: empirical CDF")


def pairs_figure(column: str, observed: Any, simulated: Any, *, title: str | None = None, kind: str = "pairs") -> Any:
    """Simulated against observed values of one latency column, with the line y = x.

    Parameters
    ----------
    column
        The key path of the values (``ttft_s``): it names both axes.
    observed, simulated
        Paired values, seconds (the same length); pairs with a NaN on either side are left out.
    kind
        ``pairs`` (one point per request) or ``quantiles`` (one point per quantile, a QQ plot).

    Examples
    --------
    >>> fig = pairs_figure("ttft_s", [0.1, 0.2], [0.12, 0.18])
    >>> [t.name for t in fig.data], fig.layout.yaxis.title.text
    (['y = x', 'pairs (2)'], 'TTFT, simulated (s)')
    """
    go = require_plotly()
    obs, sim = np.asarray(observed, dtype=np.float64), np.asarray(simulated, dtype=np.float64)
    if obs.shape != sim.shape:
        raise ValueError(f"observed and simulated must be paired: {obs.size} against {sim.size} values")
    keep = np.isfinite(obs) & np.isfinite(sim)
    obs, sim = obs[keep], sim[keep]
    both = np.concatenate([obs, sim])
    lo, hi = (float(both.min()), float(both.max())) if both.size else (0.0, 1.0)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x", line={"color": "gray", "dash": "dash"}))
    fig.add_trace(go.Scatter(x=obs, y=sim, mode="markers", name=f"{kind} ({obs.size})", marker={"size": 5, "opacity": 0.6}))
    words, unit = _words_unit(axis_label(column))
    log = _log_axis(both)
    # One range on both axes, so that y = x is the diagonal and distances read alike.
    span = [math.log10(lo), math.log10(hi)] if log else [lo, hi]
    pad = 0.03 * ((span[1] - span[0]) or 1.0)
    axes = {"type": "log" if log else "linear", "range": [span[0] - pad, span[1] + pad]}
    fig.update_xaxes(title_text=f"{words}, observed ({unit})", **axes)
    fig.update_yaxes(title_text=f"{words}, simulated ({unit})", **axes)
    what = "QQ, quantiles" if kind == "quantiles" else "per request"
    return _layout(fig, title or f"{title_words(column)}: simulated against observed, {what}", height=480)


def _words_unit(label: str) -> tuple[str, str]:
    if label.endswith(")") and " (" in label:
        words, _, unit = label[:-1].rpartition(" (")
        return words, unit
    return label, ""


def over_time_figure(
    time_s: Any, columns: Mapping[str, Any], *, title: str | None = None, mode: str = "lines", times: Mapping[str, Any] | None = None
) -> Any:
    """One panel per column against time, the panels sharing the time axis.

    Parameters
    ----------
    time_s
        Times, seconds (the x axis of every panel).
    columns
        Key path (``waiting``, ``ttft_s``, a Prometheus metric's name) -> values at those times;
        each panel's y axis is named by :func:`~simpy_llm.plot_labels.axis_label`.
    mode
        ``lines`` (a state held between samples, drawn as steps) or ``markers`` (one point per request).
    times
        Column -> its own times, for columns sampled at other instants than *time_s* (which
        may then be None).

    Examples
    --------
    >>> fig = over_time_figure([0.0, 1.0], {"waiting": [0, 2], "kv_utilization": [0.0, 0.5]})
    >>> len(fig.data), fig.layout.yaxis2.title.text
    (2, 'KV cache use (share of blocks)')
    """
    go = require_plotly()
    names = list(columns)
    fig = _subplots()(rows=max(len(names), 1), cols=1, shared_xaxes=True, vertical_spacing=0.06)
    for row, name in enumerate(names, start=1):
        t = np.asarray(time_s if times is None or name not in times else times[name], dtype=np.float64)
        trace = go.Scatter(x=t, y=np.asarray(columns[name], dtype=np.float64), name=axis_label(name), mode=mode,
                           line={"shape": "hv"} if mode == "lines" else None, marker={"size": 4} if mode == "markers" else None)
        fig.add_trace(trace, row=row, col=1)
        fig.update_yaxes(title_text=axis_label(name), row=row, col=1)
    fig.update_xaxes(title_text=axis_label("time_s"), row=max(len(names), 1), col=1)
    said = [title_words(n) for n in names]
    default = f"{', '.join(said[:-1])} and {said[-1]}" if len(said) > 1 else (said[0] if said else "nothing")
    return _layout(fig, title or f"{default[:1].upper()}{default[1:]} over time", height=max(300, 220 * len(names)))


def schedule_figure(target_s: Any, sent_s: Any) -> Any:
    """Requests sent so far against time: the schedule the workload asked for and what the
    load generator achieved.

    Parameters
    ----------
    target_s
        Each request's target send time (the workload's arrival), seconds on the run's clock.
    sent_s
        Each request's send time; NaN for a request never sent (left out).

    Examples
    --------
    >>> fig = schedule_figure([0.0, 1.0, 2.0], [0.001, 1.002, float("nan")])
    >>> [(t.name, t.y.tolist()) for t in fig.data]
    [('target (3)', [1, 2, 3]), ('sent (2)', [1, 2])]
    """
    go = require_plotly()
    fig = go.Figure()
    for name, values in (("target", target_s), ("sent", sent_s)):
        v = np.sort(_finite(values))
        fig.add_trace(go.Scatter(x=v, y=np.arange(1, v.size + 1), mode="lines", line={"shape": "hv", "dash": _SIDE_DASH.get(name)},
                                 name=f"{name} ({v.size})"))
    fig.update_xaxes(title_text=axis_label("time_s"))
    fig.update_yaxes(title_text="requests sent so far")
    return _layout(fig, "Achieved against target schedule")


def stepped_comparison_figure(name: str, series: Mapping[str, Any]) -> Any:
    """A scraped series against the simulated one at the same instants (a calibration
    report's ``timeseries.<name>``: ``time_s``, ``observed``, ``simulated``, ``scraped_metric``,
    ``simulated_column``, ``n``, ``mae``).

    Examples
    --------
    >>> s = {"time_s": [0.0, 1.0], "observed": [0.0, 2.0], "simulated": [0.0, 1.0], "scraped_metric": "m",
    ...      "simulated_column": "running", "n": 2, "mae": 0.5}
    >>> fig = stepped_comparison_figure("running_batch", s)
    >>> [t.name for t in fig.data], fig.layout.title.text
    (['observed (m)', 'simulated (running)'], 'Running requests: MAE 0.5 over 2 scrapes')
    """
    go = require_plotly()
    fig = go.Figure()
    column = series["simulated_column"]
    t = np.asarray(series["time_s"], dtype=np.float64)
    # Each scrape reads the state at its instant: steps that hold until the next scrape.
    fig.add_trace(go.Scatter(x=t, y=series["observed"], mode="lines", line={"shape": "hv"}, name=f"observed ({series['scraped_metric']})"))
    fig.add_trace(go.Scatter(x=t, y=series["simulated"], mode="lines", line={"shape": "hv", "dash": "dash"}, name=f"simulated ({column})"))
    fig.update_xaxes(title_text=axis_label("time_s"))
    fig.update_yaxes(title_text=axis_label(column))
    mae = "-" if series["mae"] is None else f"{series['mae']:.3g}"
    return _layout(fig, f"{title_words(column)[:1].upper()}{title_words(column)[1:]}: MAE {mae} over {series['n']} scrapes")


def _rate_rows(rows: Sequence[Mapping[str, Any]], where: str) -> np.ndarray:
    """The rows as an array, one row per rate (increasing) and one column per :data:`RATE_ROW_KEYS`."""
    if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Sequence):
        raise TypeError(f"{where} must be a list of mappings with keys {', '.join(RATE_ROW_KEYS)}, got {type(rows).__name__}")
    out = np.empty((len(rows), len(RATE_ROW_KEYS)))
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise TypeError(f"{where}[{i}] must be a mapping with keys {', '.join(RATE_ROW_KEYS)}, got {type(row).__name__}")
        missing = [k for k in RATE_ROW_KEYS if k not in row]
        if missing:
            raise ValueError(f"{where}[{i}]: missing key(s) {', '.join(missing)}; a row needs {', '.join(RATE_ROW_KEYS)}")
        for j, key in enumerate(RATE_ROW_KEYS):
            value = row[key]
            ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
            if value is None:  # a percentile of no request (nothing completed at that rate): no point
                out[i, j] = math.nan
            elif not ok or not math.isfinite(float(value)) or float(value) < 0:
                raise ValueError(f"{where}[{i}].{key} must be a finite number >= 0 (or null for no value), got {value!r}")
            else:
                out[i, j] = float(value)
        if math.isnan(out[i, 0]):
            raise ValueError(f"{where}[{i}].request_rate must be a finite number >= 0, got None")
    return out[np.argsort(out[:, 0], kind="stable")]


def rate_curves_figure(rows_measured: Sequence[Mapping[str, Any]], rows_predicted: Sequence[Mapping[str, Any]] | None = None) -> Any:
    """Latency against request rate: p50 and p99 of TTFT (left) and E2E (right), measured and,
    when given, predicted overlaid (a benchmark sweep's curves, as ``vllm bench`` and guidellm
    users plot them).

    Parameters
    ----------
    rows_measured
        One mapping per rate with the keys :data:`RATE_ROW_KEYS` (numbers >= 0; a latency may
        be ``None`` when no request completed at that rate); any other key is ignored. Rows
        are drawn in increasing rate whatever their order.
    rows_predicted
        The simulator's rows, of the same form, or None.

    Raises
    ------
    ValueError, TypeError
        A row is not a mapping, lacks a key, or holds a value that is not a number >= 0;
        the message names the row (``rows_measured[2].ttft_p99_s``) and what is allowed.

    Examples
    --------
    >>> rows = [{"request_rate": 2.0, "ttft_p50_s": 0.2, "ttft_p99_s": 0.5, "e2e_p50_s": 2.0, "e2e_p99_s": 4.0},
    ...         {"request_rate": 1.0, "ttft_p50_s": 0.1, "ttft_p99_s": 0.3, "e2e_p50_s": 1.5, "e2e_p99_s": 3.0}]
    >>> fig = rate_curves_figure(rows, rows)
    >>> [t.name for t in fig.data][:4], fig.data[0].x.tolist()
    (['TTFT p50, measured', 'TTFT p99, measured', 'TTFT p50, predicted', 'TTFT p99, predicted'], [1.0, 2.0])
    >>> rate_curves_figure([{"request_rate": 1.0, "ttft_p50_s": 0.1}])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: rows_measured[0]: missing key(s) ttft_p99_s, e2e_p50_s, e2e_p99_s; a row needs request_rate, ...
    """
    go = require_plotly()
    sides = [("measured", _rate_rows(rows_measured, "rows_measured"))]
    if rows_predicted is not None:
        sides.append(("predicted", _rate_rows(rows_predicted, "rows_predicted")))
    fig = _subplots()(rows=1, cols=2, subplot_titles=("TTFT", "E2E latency"), horizontal_spacing=0.1)
    colours = {"p50": "#1f77b4", "p99": "#d62728"}
    for col, metric in enumerate(("ttft", "e2e"), start=1):
        for side, data in sides:
            for stat in ("p50", "p99"):
                y = data[:, RATE_ROW_KEYS.index(f"{metric}_{stat}_s")]
                fig.add_trace(go.Scatter(
                    x=data[:, 0], y=y, mode="lines+markers", name=f"{metric.upper()} {stat}, {side}",
                    line={"dash": _SIDE_DASH[side], "color": colours[stat]}, marker={"symbol": "circle" if side == "measured" else "x"},
                ), row=1, col=col)
        fig.update_yaxes(title_text=axis_label(f"latency_s.{metric}.p50").replace(" p50", " p50 and p99"), row=1, col=col)
        fig.update_xaxes(title_text="request rate (requests/s)", row=1, col=col)
    title = "Latency against request rate" + (", measured and predicted" if rows_predicted is not None else "")
    return _layout(fig, title, height=460)
