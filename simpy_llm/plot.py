"""Plots of sweeps and of request-level batch servers, as matplotlib figures.

* :func:`line`: a metric against a setting from a tidy frame such as a
  :func:`~simpy_llm.explore.sweep` (throughput against the number of bins, the
  batch size or the load), one line per value of a third column, with optional
  reference curves (a closed form, a bound);
* :func:`batch_size_over_time`: each batch server's batch sizes, and the dynamic
  batcher's target, against time, from :meth:`Results.batches()
  <simpy_llm.metrics.results.Results.batches>`;
* :func:`sla_attainment_over_time`: the share of requests whose batch met the
  latency target, window by window (the numbers: :func:`sla_attainment`);
* :func:`latency_cdf`: the empirical CDF of a per-request latency, one line per SLO
  class (or any other column of :meth:`Results.to_dataframe()
  <simpy_llm.metrics.results.Results.to_dataframe>`);
* :func:`time_series`: queue length, batch size, KV use over time, per replica, from
  :meth:`Results.timeseries() <simpy_llm.metrics.results.Results.timeseries>`;
* :func:`throughput_latency`: a sweep's latency against its throughput, one curve
  per setting;
* :func:`pareto_front`: every candidate of a sweep, and the non-dominated ones
  joined by a step line;
* :func:`calibration_qq`: observed against predicted quantiles, with y = x.

The sweep plots (:func:`line`, :func:`throughput_latency`, :func:`pareto_front`) cross out,
with a black ``x`` labelled ``overloaded``, the rows whose ``overloaded`` column is 1 (a
:func:`~simpy_llm.explore.sweep` frame's flag for runs whose queues grew through the
arrival window: their latencies describe no steady state); ``mark=`` names another flag
column, or ``None`` for no marks.

**Labels, titles and captions.** An axis says its column in words, with its unit
(:func:`~simpy_llm.plot_labels.axis_label`: ``latency_s.ttft.p99`` is ``TTFT p99 (s)``,
``workload.aggregate_rate`` is ``offered load (requests/s)``, a column no rule knows is
its own label); ``xlabel=`` and ``ylabel=`` replace them. The title says what is compared
(``TTFT p99 against offered load, by replicas``); ``title=`` replaces it, ``title=""``
leaves none. The columns themselves, key paths and all, stay on the figure in a caption:
small grey text under the x-axis label, an annotation with gid ``caption`` (one per axes:
drawing again into the same axes replaces it), which ``layout="constrained"`` and
``savefig(bbox_inches="tight")`` make room for. An axis that shows a count (a key path
:func:`~simpy_llm.plot_labels.is_count` knows, such as ``serving.replicas`` or
``serving.batch_server.bins.count``, or a column whose values are all whole numbers) gets
integer ticks (:class:`matplotlib.ticker.MaxNLocator` with ``integer=True``): no tick at
1.5 replicas.

matplotlib is a dependency, imported only when a figure is drawn. Each function draws into the ``ax`` it is
given, or else into a new :class:`matplotlib.figure.Figure` made without pyplot
(nothing joins pyplot's list of open figures, and the pyplot backend is left alone),
and returns the figure: ``fig.savefig("plot.png")`` writes it.

Kept whole (over 800 lines): each function is one figure kind, read on its own, and all
share the conventions above (labels and captions, count ticks, overload marks, figures
made without pyplot) through the few private functions at the top; the words of the axes
are already apart, in :mod:`simpy_llm.plot_labels`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from numbers import Real
from typing import TYPE_CHECKING, Any

import numpy as np

from simpy_llm.plot_labels import LATENCY_METRICS, axis_label, is_count, legend_label, title_against, title_over_time, title_words

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "SLA_ATTAINMENT_COLUMNS",
    "batch_size_over_time",
    "calibration_qq",
    "latency_cdf",
    "line",
    "pareto_front",
    "sla_attainment",
    "sla_attainment_over_time",
    "throughput_latency",
    "time_series",
]

SLA_ATTAINMENT_COLUMNS = (
    "replica",
    "window",
    "window_start_s",
    "window_end_s",
    "batches",
    "requests",
    "within_sla",
    "share",
)
"""Columns of :func:`sla_attainment`."""

_REFERENCE_STYLES = ("--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)))


def _axes(ax: Axes | None) -> tuple[Any, Axes]:
    """(figure, axes): *ax* and its figure, or a new figure (Agg canvas, no pyplot) with one axes."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            "simpy_llm.plot needs matplotlib, a dependency of simpy-llm that is not installed: "
            "pip install matplotlib (or reinstall, e.g. pip install 'simpy-llm[plots]')"
        ) from exc
    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=(6.5, 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _require(frame: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(
            f"{what} has no column(s) {', '.join(map(repr, missing))}; it has: {', '.join(map(str, frame.columns))}"
        )


def _legend(ax: Axes) -> None:
    if any(not str(artist.get_label()).startswith("_") for artist in ax.lines):
        ax.legend(fontsize="small")


def _counts(path: str, values: Any) -> bool:
    """Whether an axis showing column *path*, whose values are *values*, counts things: by
    its key path, or because every finite value is a whole number (never for values that
    are not numbers, such as a categorical axis's names)."""
    a = np.asarray(values).ravel()
    if a.dtype.kind not in "iuf":
        return False
    if is_count(path) or a.dtype.kind in "iu":
        return True
    a = a[np.isfinite(a)]
    return a.size > 0 and bool(np.all(a == np.round(a)))


def _finish(
    ax: Axes,
    given: tuple[str | None, str | None, str | None],
    default: tuple[str, str, str],
    caption: str,
    *,
    x_counts: bool = False,
    y_counts: bool = False,
) -> None:
    """Set *ax*'s x label, y label and title (each *given* one, else its *default*), give
    count axes integer ticks, and write *caption* under the x-axis label (replacing a
    caption an earlier plot left in *ax*)."""
    from matplotlib.ticker import MaxNLocator  # loaded with the figure, as in _axes

    xlabel, ylabel, title = (d if g is None else g for g, d in zip(given, default, strict=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    for axis, counts in ((ax.xaxis, x_counts), (ax.yaxis, y_counts)):
        # A log axis keeps its own locator: integer steps there would crowd or vanish.
        if counts and axis.get_scale() == "linear":
            axis.set_major_locator(MaxNLocator(nbins="auto", steps=[1, 2, 2.5, 5, 10], integer=True))
    for text in [t for t in ax.texts if t.get_gid() == "caption"]:
        text.remove()
    # Anchored to the x-axis label's box, the caption sits under it whatever the tick labels' height.
    note = ax.annotate(caption, xy=(0.5, 0.0), xycoords=ax.xaxis.label, xytext=(0, -3), textcoords="offset points",
                       ha="center", va="top", fontsize="x-small", color="0.4")
    note.set_gid("caption")


def _finish_sweep(
    ax: Axes, frame: pd.DataFrame, x: str, y: str, by: str | None, given: tuple[str | None, str | None, str | None], what: str = ""
) -> None:
    """:func:`_finish` for a plot of a sweep's column *y* against *x*, one curve per value of
    *by*; *what* names the plot in the default title (``Pareto front``)."""
    title = title_against(y, x, by)
    _finish(ax, given, (axis_label(x), axis_label(y), f"{what}: {title}" if what else title),
            f"x: {x}; y: {y}" + ("" if by is None else f"; by: {by}"), x_counts=_counts(x, frame[x]), y_counts=_counts(y, frame[y]))


def _mark(ax: Axes, frame: pd.DataFrame, x: str, y: str, mark: str | None) -> bool:
    """Cross the rows of *frame* whose column *mark* is 1 at their (*x*, *y*), labelled
    *mark*; whether any was drawn (a frame without the column has none)."""
    if mark is None or mark not in frame.columns:
        return False
    flagged = frame[frame[mark] == 1].dropna(subset=[x, y])
    if not len(flagged):
        return False
    ax.scatter(flagged[x].to_numpy(dtype=np.float64), flagged[y].to_numpy(dtype=np.float64), marker="x", s=60,
               color="k", zorder=3, label=mark)
    return True


def line(
    frame: pd.DataFrame,
    x: str,
    y: str,
    *,
    hue: str | None = None,
    ax: Axes | None = None,
    reference: Mapping[str, float | Sequence[float]] | None = None,
    mark: str | None = "overloaded",
    xlabel: str | None = None, ylabel: str | None = None, title: str | None = None,
) -> Figure:
    """Column *y* against column *x* of a tidy *frame*, one line per value of *hue*.

    Each line goes through the mean of *y* at each value of *x* (sorted), with a marker
    per point; where several rows share an *x* (and *hue*) value, such as the seeds of
    a sweep, each row's value is also drawn as a faint dot (a scatter, not a line).
    Lines follow the sorted values of *hue* and are labelled ``hue=value``.

    Parameters
    ----------
    frame
        One row per observation, e.g. a :func:`~simpy_llm.explore.sweep` result.
    x, y
        Column names: the setting and the (numeric) metric.
    hue
        Column whose values split the rows into lines (``None``: one line).
    ax
        Axes to draw into (default: a new figure's).
    reference
        Curves to compare with, drawn black and dashed after the data, labelled by their
        keys: a sequence holds one *y* per sorted distinct *x* of *frame*; a number is a
        horizontal line.
    mark
        A flag column: rows where it is 1 are crossed out at their own (*x*, *y*), and the
        legend names the column (default ``overloaded``, a sweep's overload flag;
        ``None``: no marks).
    xlabel, ylabel, title
        Replace the axis labels (default: the columns in words, with units) and the title
        (default: what is compared, ``Throughput against k, by policy``; ``""``: none).

    Returns
    -------
    matplotlib.figure.Figure
        The figure drawn into, its key paths in the caption (``x: k; y: throughput; by: policy``).

    Raises
    ------
    ValueError
        If a column is missing, or a reference's length differs from the number of
        distinct *x* values.

    Examples
    --------
    >>> import pandas as pd
    >>> sweep = pd.DataFrame({"k": [4, 1, 2, 1, 2, 4], "policy": ["a", "a", "a", "b", "b", "b"],
    ...                       "throughput": [3.0, 1.0, 1.8, 1.0, 1.5, 2.0]})
    >>> fig = line(sweep, "k", "throughput", hue="policy", reference={"k x 1.0": [1.0, 2.0, 4.0], "cap": 3.5})
    >>> [(l.get_label(), l.get_ydata().tolist()) for l in fig.axes[0].lines[:3]]
    [('policy a', [1.0, 1.8, 3.0]), ('policy b', [1.0, 1.5, 2.0]), ('k x 1.0', [1.0, 2.0, 4.0])]
    """
    fig, ax = _axes(ax)
    _require(frame, [x, y] if hue is None else [x, y, hue], "frame")
    xs = np.sort(frame[x].dropna().unique())
    parts = [(None, frame)] if hue is None else list(frame.groupby(hue, sort=True, dropna=False))
    for value, part in parts:
        values = part[[x, y]].dropna(subset=[x])
        means = values.groupby(x, sort=True)[y].mean()
        label = legend_label(y) if hue is None else legend_label(hue, value)
        (drawn,) = ax.plot(means.index.to_numpy(), means.to_numpy(dtype=np.float64), marker="o", label=label)
        if len(values) > len(means):  # replicated points: show the spread
            ax.scatter(values[x].to_numpy(), values[y].to_numpy(dtype=np.float64), s=10, alpha=0.35, color=drawn.get_color())
    for i, (label, curve) in enumerate((reference or {}).items()):
        style = _REFERENCE_STYLES[i % len(_REFERENCE_STYLES)]
        if isinstance(curve, Real):
            ax.axhline(float(curve), color="k", linestyle=style, linewidth=1, label=str(label))
            continue
        ys = np.asarray(curve, dtype=np.float64)
        if ys.shape != xs.shape:
            raise ValueError(
                f"reference[{label!r}] has {ys.size} values; it needs one per distinct {x} ({xs.size}: {xs.tolist()})"
            )
        ax.plot(xs, ys, color="k", linestyle=style, linewidth=1, label=str(label))
    marked = _mark(ax, frame, x, y, mark)
    _finish_sweep(ax, frame, x, y, hue, (xlabel, ylabel, title))
    if marked:
        ax.legend(fontsize="small")
    elif hue is not None or reference:
        _legend(ax)
    return fig


def batch_size_over_time(
    batches: pd.DataFrame,
    *,
    ax: Axes | None = None,
    xlabel: str | None = None, ylabel: str | None = None, title: str | None = None,
) -> Figure:
    """Batch size against batch start time, a step line per replica; the dynamic batcher's
    ``b_target`` dashed in the same colour where there is one.

    Parameters
    ----------
    batches
        One row per batch with columns ``start_s``, ``size``, ``replica`` and optionally
        ``b_target`` (NaN where the batch had no target), as
        :meth:`Results.batches() <simpy_llm.metrics.results.Results.batches>` gives.
    ax
        Axes to draw into (default: a new figure's).
    xlabel, ylabel
        Axis labels (default ``batch start (s)``, ``batch size (requests)``; the size axis
        has integer ticks).
    title
        The title (default ``Batch size over time, by replica``; ``""``: none).

    Returns
    -------
    matplotlib.figure.Figure
        The figure drawn into. Its lines, replica by replica (ascending): the sizes
        (``replica R``), then the targets (``replica R b_target``) unless every one is
        NaN; both over the replica's batches sorted by ``start_s``, a size holding until
        the next batch starts. NaN targets leave gaps.

    Examples
    --------
    >>> import pandas as pd
    >>> batches = pd.DataFrame({"replica": [0, 0, 0], "start_s": [0.0, 1.0, 2.5],
    ...                         "size": [1, 4, 3], "b_target": [float("nan"), 4.0, 4.0]})
    >>> [(l.get_label(), l.get_ydata().tolist()) for l in batch_size_over_time(batches).axes[0].lines]
    [('replica 0', [1.0, 4.0, 3.0]), ('replica 0 b_target', [nan, 4.0, 4.0])]
    """
    fig, ax = _axes(ax)
    _require(batches, ["start_s", "size", "replica"], "batches")
    targets = False
    for replica, part in batches.groupby("replica", sort=True):
        part = part.sort_values("start_s", kind="stable")
        start = part["start_s"].to_numpy(dtype=np.float64)
        (drawn,) = ax.step(start, part["size"].to_numpy(dtype=np.float64), where="post", label=f"replica {replica}")
        if "b_target" in part.columns:
            target = part["b_target"].to_numpy(dtype=np.float64)
            if not np.isnan(target).all():
                targets = True
                ax.step(start, target, where="post", linestyle="--", color=drawn.get_color(), label=f"replica {replica} b_target")
    _finish(ax, (xlabel, ylabel, title), ("batch start (s)", "batch size (requests)", "Batch size over time, by replica"),
            "x: start_s; y: size" + (", b_target (dashed)" if targets else "") + "; by: replica", y_counts=True)
    _legend(ax)
    return fig


def sla_attainment(batches: pd.DataFrame, d_sla_s: float, window_s: float) -> pd.DataFrame:
    """Per replica and window of batch end times, the share of requests whose batch met the target.

    Time is cut into consecutive windows ``[k window_s, (k+1) window_s)``, k = 0, 1, ...,
    up to the window of the last batch end of any replica. A batch belongs to the window
    of its ``end_s``; it met the target when ``service_s <= d_sla_s``, and counts
    ``size`` times (requests, not batches).

    Parameters
    ----------
    batches
        One row per batch with columns ``replica``, ``size``, ``end_s`` and ``service_s``,
        as :meth:`Results.batches() <simpy_llm.metrics.results.Results.batches>` gives.
    d_sla_s
        The target batch service time, s.
    window_s
        Window length, s (> 0).

    Returns
    -------
    pandas.DataFrame
        One row per (replica, window): every replica with a batch (ascending), each with
        every window from k = 0 to the last batch end's (so replicas share their
        windows): ``replica``, ``window`` (k), ``window_start_s``, ``window_end_s``,
        ``batches`` (ending in the window), ``requests`` (their summed sizes),
        ``within_sla`` (the sizes of those that met the target) and ``share``
        (``within_sla / requests``; NaN for a window without batches).

    Raises
    ------
    ValueError
        If a column is missing, *window_s* is not a positive number, *d_sla_s* is not a
        number, or a batch end is negative or NaN.

    Examples
    --------
    >>> import pandas as pd
    >>> batches = pd.DataFrame({"replica": [0, 0, 0], "size": [4, 2, 3],
    ...                         "end_s": [0.5, 1.5, 3.5], "service_s": [0.2, 0.8, 0.4]})
    >>> sla_attainment(batches, 0.5, 1.0)[["window_start_s", "requests", "within_sla", "share"]].values.tolist()
    [[0.0, 4.0, 4.0, 1.0], [1.0, 2.0, 0.0, 0.0], [2.0, 0.0, 0.0, nan], [3.0, 3.0, 3.0, 1.0]]
    """
    import pandas as pd

    _require(batches, ["replica", "size", "end_s", "service_s"], "batches")
    if isinstance(window_s, bool) or not isinstance(window_s, Real) or not 0 < window_s < math.inf:
        raise ValueError(f"window_s must be a positive number of seconds, got {window_s!r}")
    if isinstance(d_sla_s, bool) or not isinstance(d_sla_s, Real) or math.isnan(d_sla_s):
        raise ValueError(f"d_sla_s must be a number of seconds, got {d_sla_s!r}")
    end = batches["end_s"].to_numpy(dtype=np.float64)
    if np.isnan(end).any() or (end < 0).any():
        raise ValueError("batches: every end_s must be a time >= 0")
    count_dtype = np.int64 if pd.api.types.is_integer_dtype(batches["size"]) else np.float64
    if end.size == 0:
        return pd.DataFrame({name: pd.Series(dtype=np.int64 if name in ("replica", "window", "batches") else np.float64)
                             for name in SLA_ATTAINMENT_COLUMNS}).astype({"requests": count_dtype, "within_sla": count_dtype})
    window = np.floor(end / float(window_s)).astype(np.int64)
    n_windows = int(window.max()) + 1
    size = batches["size"].to_numpy(dtype=np.float64)
    met = batches["service_s"].to_numpy(dtype=np.float64) <= float(d_sla_s)
    replica = batches["replica"].to_numpy()
    ks = np.arange(n_windows, dtype=np.int64)
    parts = []
    for r in np.unique(replica):
        mine = replica == r
        requests = np.bincount(window[mine], weights=size[mine], minlength=n_windows)
        within = np.bincount(window[mine], weights=size[mine] * met[mine], minlength=n_windows)
        share = np.divide(within, requests, out=np.full(n_windows, np.nan), where=requests > 0)
        parts.append(pd.DataFrame({
            "replica": np.full(n_windows, r),
            "window": ks,
            "window_start_s": ks * float(window_s),
            "window_end_s": (ks + 1) * float(window_s),
            "batches": np.bincount(window[mine], minlength=n_windows).astype(np.int64),
            "requests": requests.astype(count_dtype),
            "within_sla": within.astype(count_dtype),
            "share": share,
        }))
    return pd.concat(parts, ignore_index=True)


def sla_attainment_over_time(
    batches: pd.DataFrame,
    d_sla_s: float,
    *,
    window_s: float,
    ax: Axes | None = None,
    xlabel: str | None = None, ylabel: str | None = None, title: str | None = None,
) -> Figure:
    """The share of requests whose batch met ``service_s <= d_sla_s``, window by window of
    batch end times, one line per replica (the numbers are :func:`sla_attainment`'s).

    Parameters
    ----------
    batches
        One row per batch with columns ``replica``, ``size``, ``end_s`` and ``service_s``.
    d_sla_s
        The target batch service time, s.
    window_s
        Window length, s.
    ax
        Axes to draw into (default: a new figure's).
    xlabel, ylabel
        Axis labels (default ``batch end (s), windows of W s`` and ``share of requests
        with service <= D s``).
    title
        The title (default ``SLA attainment (service <= D s) over time, by replica``;
        ``""``: none).

    Returns
    -------
    matplotlib.figure.Figure
        The figure drawn into: per replica (ascending) one line ``replica R`` through
        each window's share at the window's middle; a window without batches leaves a gap.

    Examples
    --------
    >>> import pandas as pd
    >>> batches = pd.DataFrame({"replica": [0, 0, 0], "size": [4, 2, 3],
    ...                         "end_s": [0.5, 1.5, 1.75], "service_s": [0.2, 0.8, 0.4]})
    >>> (drawn,) = sla_attainment_over_time(batches, 0.5, window_s=1.0).axes[0].lines
    >>> drawn.get_xdata().tolist(), drawn.get_ydata().tolist()
    ([0.5, 1.5], [1.0, 0.6])
    """
    table = sla_attainment(batches, d_sla_s, window_s)
    fig, ax = _axes(ax)
    for replica, part in table.groupby("replica", sort=True):
        middle = part["window_start_s"].to_numpy() + float(window_s) / 2
        ax.plot(middle, part["share"].to_numpy(dtype=np.float64), marker="o", label=f"replica {replica}")
    ax.set_ylim(-0.02, 1.02)
    _finish(ax, (xlabel, ylabel, title), (f"batch end (s), windows of {window_s:g} s", f"share of requests with service <= {d_sla_s:g} s",
                                          f"SLA attainment (service <= {d_sla_s:g} s) over time, by replica"),
            f"x: end_s, windows of {window_s:g} s; y: share of size with service_s <= {d_sla_s:g} s; by: replica")
    _legend(ax)
    return fig


def _frame_of(data: Any, method: str) -> pd.DataFrame:
    """*data* itself, or the frame its *method* gives (a Results' ``to_dataframe`` or ``timeseries``)."""
    import pandas as pd

    if not isinstance(data, pd.DataFrame) and hasattr(data, method):
        return getattr(data, method)()
    return data


def latency_cdf(
    records: Any,
    metric: str = "ttft_s",
    by: str | None = "slo_class",
    *,
    ax: Axes | None = None,
    xlabel: str | None = None, ylabel: str | None = None, title: str | None = None,
) -> Figure:
    """The empirical CDF of a per-request metric, one step line per value of *by*.

    Parameters
    ----------
    records
        One row per request, as :meth:`Results.to_dataframe()
        <simpy_llm.metrics.results.Results.to_dataframe>` gives (or the Results itself).
    metric
        The column to plot (``ttft_s``, ``tpot_s``, ``e2e_s``, ...), in seconds.
        Requests without a value (NaN: dropped, not streaming) are left out.
    by
        The column whose values split the requests into lines (``None``: one line).
    ax
        Axes to draw into (default: a new figure's).
    xlabel, ylabel
        Axis labels (default: the metric in words, ``TTFT (s)``, and ``fraction of
        requests <= x``).
    title
        The title (default ``CDF of TTFT, by SLO class``; ``""``: none).

    Returns
    -------
    matplotlib.figure.Figure
        The figure drawn into: per value of *by* (sorted), a post-step line through
        the sorted values ``v_1 <= ... <= v_n`` at heights ``i / n``, labelled
        in words (``SLO class interactive (n=N)``); a class without any value draws nothing.

    Raises
    ------
    ValueError
        If a column is missing.

    Examples
    --------
    >>> import pandas as pd
    >>> records = pd.DataFrame({"slo_class": ["a", "b", "a", "a"], "ttft_s": [0.3, 0.5, 0.1, 0.2]})
    >>> [(l.get_label(), l.get_xdata().tolist(), l.get_ydata().tolist())
    ...  for l in latency_cdf(records).axes[0].lines]  # doctest: +NORMALIZE_WHITESPACE
    [('SLO class a (n=3)', [0.1, 0.2, 0.3], [0.3333333333333333, 0.6666666666666666, 1.0]),
     ('SLO class b (n=1)', [0.5], [1.0])]
    """
    frame = _frame_of(records, "to_dataframe")
    fig, ax = _axes(ax)
    _require(frame, [metric] if by is None else [metric, by], "records")
    parts = [(None, frame)] if by is None else list(frame.groupby(by, sort=True, dropna=False))
    for value, part in parts:
        values = np.sort(part[metric].to_numpy(dtype=np.float64))
        values = values[~np.isnan(values)]
        if values.size == 0:
            continue
        heights = np.arange(1, values.size + 1) / values.size
        label = f"{legend_label(metric) if by is None else legend_label(by, value)} (n={values.size})"
        ax.step(values, heights, where="post", label=label)
    ax.set_ylim(0.0, 1.02)
    split = "" if by is None else f", by {title_words(by)}"
    _finish(ax, (xlabel, ylabel, title), (axis_label(metric), "fraction of requests <= x", f"CDF of {title_words(metric)}{split}"),
            f"x: {metric}" + ("" if by is None else f"; by: {by}"), x_counts=_counts(metric, frame[metric]))
    _legend(ax)
    return fig


def time_series(
    frame: Any,
    y: str | Sequence[str] = ("waiting", "running"),
    *,
    x: str = "time_s",
    by: str | None = "replica",
    ax: Axes | None = None,
    xlabel: str | None = None, ylabel: str | None = None, title: str | None = None,
) -> Figure:
    """Columns of a time-indexed frame against time, one line per (value of *by*, column).

    Parameters
    ----------
    frame
        One row per sample, such as :meth:`Results.timeseries()
        <simpy_llm.metrics.results.Results.timeseries>` (queue length ``waiting``, batch
        size ``running``, ``kv_utilization``, ``busy`` per replica, sampled every
        ``simulation.timeseries_interval_s``; the Results itself is accepted too), or
        :meth:`Results.gamma_timeline() <simpy_llm.metrics.results.Results.gamma_timeline>`.
    y
        The column, or columns, to plot.
    x
        The time column (rows are drawn in its order).
    by
        The column whose values split the rows into lines (``None``, or a frame without
        that column: one line per column of *y*).
    ax
        Axes to draw into (default: a new figure's).
    xlabel, ylabel
        Axis labels (default: the columns in words, with units, ``time (s)`` and
        ``waiting requests, running requests``).
    title
        The title (default ``Waiting requests and running requests over time, by
        replica``; ``""``: none).

    Returns
    -------
    matplotlib.figure.Figure
        The figure drawn into: per value of *by* (sorted), per column of *y* in order,
        a line labelled ``by=value column`` (or ``column`` without *by*).

    Raises
    ------
    ValueError
        If a column is missing, or *frame* has no rows (was
        ``simulation.timeseries_interval_s`` set?).

    Examples
    --------
    >>> import pandas as pd
    >>> ts = pd.DataFrame({"time_s": [0.5, 0.0, 0.0, 0.5], "replica": [0, 0, 1, 1],
    ...                    "waiting": [3, 1, 0, 2], "running": [8, 4, 2, 6]})
    >>> [(l.get_label(), l.get_ydata().tolist()) for l in time_series(ts, "waiting").axes[0].lines]
    [('replica 0: waiting requests', [1, 3]), ('replica 1: waiting requests', [0, 2])]
    """
    frame = _frame_of(frame, "timeseries")
    columns = [y] if isinstance(y, str) else list(y)
    if by is not None and by not in frame.columns:
        by = None
    _require(frame, [x, *columns] if by is None else [x, by, *columns], "frame")
    if len(frame) == 0:
        raise ValueError(
            "frame has no rows: nothing to plot (Results.timeseries() is empty unless the scenario sets "
            "simulation.timeseries_interval_s)"
        )
    fig, ax = _axes(ax)
    parts = [(None, frame)] if by is None else list(frame.groupby(by, sort=True))
    for value, part in parts:
        part = part.sort_values(x, kind="stable")
        for column in columns:
            label = legend_label(column) if by is None else f"{legend_label(by, value)}: {legend_label(column)}"
            ax.plot(part[x].to_numpy(), part[column].to_numpy(), label=label)
    _finish(ax, (xlabel, ylabel, title), (axis_label(x), ", ".join(map(axis_label, columns)), title_over_time(columns, by)),
            f"x: {x}; y: {', '.join(columns)}" + ("" if by is None else f"; by: {by}"),
            x_counts=_counts(x, frame[x]), y_counts=all(_counts(c, frame[c]) for c in columns))
    _legend(ax)
    return fig


def throughput_latency(
    frame: pd.DataFrame,
    x: str,
    y: str,
    by: str | None = None,
    *,
    ax: Axes | None = None,
    mark: str | None = "overloaded",
    xlabel: str | None = None, ylabel: str | None = None, title: str | None = None,
) -> Figure:
    """A throughput-latency curve: one line of markers per value of *by* through the
    points of a sweep, in increasing *x*.

    Parameters
    ----------
    frame
        One row per run, such as a :func:`~simpy_llm.explore.sweep` over the load.
    x
        The throughput column (``throughput.requests_per_s``, ``throughput.output_tokens_per_s``).
    y
        The latency column (``latency_s.ttft.p99``, ...).
    by
        The column whose values split the runs into curves (a policy, a replica count;
        ``None``: one curve).
    ax
        Axes to draw into (default: a new figure's).
    mark
        A flag column whose rows equal to 1 are crossed out (default ``overloaded``;
        ``None``: no marks).
    xlabel, ylabel, title
        Replace the axis labels (default: the columns in words, with units) and the title
        (default: ``TTFT p99 against throughput, by replicas``; ``""``: none).

    Returns
    -------
    matplotlib.figure.Figure
        The figure drawn into: per value of *by* (sorted) a line with a marker per run,
        labelled ``by=value`` (or *y*), through the runs sorted by *x*; runs with a NaN
        in *x* or *y* are left out; then the marked runs' crosses.

    Raises
    ------
    ValueError
        If a column is missing.

    Examples
    --------
    >>> import pandas as pd
    >>> runs = pd.DataFrame({"tput": [18.0, 9.5, 27.0], "p99": [0.9, 0.2, 4.0], "overloaded": [0.0, 0.0, 1.0]})
    >>> ax = throughput_latency(runs, "tput", "p99").axes[0]
    >>> (curve,) = ax.lines
    >>> curve.get_xdata().tolist(), curve.get_ydata().tolist()
    ([9.5, 18.0, 27.0], [0.2, 0.9, 4.0])
    >>> (crosses,) = ax.collections  # the overloaded run
    >>> crosses.get_label(), crosses.get_offsets().tolist()
    ('overloaded', [[27.0, 4.0]])
    """
    fig, ax = _axes(ax)
    _require(frame, [x, y] if by is None else [x, y, by], "frame")
    parts = [(None, frame)] if by is None else list(frame.groupby(by, sort=True, dropna=False))
    for value, part in parts:
        part = part.dropna(subset=[x, y]).sort_values(x, kind="stable")
        label = legend_label(y) if by is None else legend_label(by, value)
        ax.plot(part[x].to_numpy(dtype=np.float64), part[y].to_numpy(dtype=np.float64), marker="o", label=label)
    marked = _mark(ax, frame, x, y, mark)
    _finish_sweep(ax, frame, x, y, by, (xlabel, ylabel, title))
    if marked:
        ax.legend(fontsize="small")
    elif by is not None:
        _legend(ax)
    return fig


def pareto_front(
    frame: pd.DataFrame,
    x: str,
    y: str,
    front: Any = None,
    *,
    maximize: Sequence[str] = (),
    ax: Axes | None = None,
    mark: str | None = "overloaded",
    xlabel: str | None = None, ylabel: str | None = None, title: str | None = None,
) -> Figure:
    """Every point of *frame* in *x*-*y*, and its non-dominated points joined by a step line.

    Parameters
    ----------
    frame
        One row per candidate (a configuration of a sweep).
    x, y
        The two objective columns.
    front
        The non-dominated rows: a frame with columns *x* and *y* (e.g. from a Pareto
        search), or a boolean mask aligned with *frame*'s rows. ``None``: computed
        here, minimising *x* and *y* except the columns named in *maximize*.
    maximize
        Objectives (among *x*, *y*) where more is better; used only when *front* is
        ``None``.
    ax
        Axes to draw into (default: a new figure's).
    mark
        A flag column whose rows equal to 1 are crossed out (default ``overloaded``;
        ``None``: no marks).
    xlabel, ylabel, title
        Replace the axis labels (default: the columns in words, with units) and the title
        (default: ``Pareto front: TTFT p99 against replicas``; ``""``: none).

    Returns
    -------
    matplotlib.figure.Figure
        The figure drawn into: first every point (label ``all``), small, light grey and
        half transparent, under everything else (``zorder`` 1), so that the dominated
        points show and each front point's own dot hides under its marker; then a
        post-step line with markers through the front's points sorted by *x* (label
        ``Pareto front``, ``zorder`` 2.5, over the points and other lines), then the
        marked points' crosses (``zorder`` 3).

    Raises
    ------
    ValueError
        If a column is missing, a mask's length differs from *frame*'s, or *maximize*
        names a column other than *x* or *y*.

    Examples
    --------
    >>> import pandas as pd
    >>> runs = pd.DataFrame({"cost": [1.0, 2.0, 3.0, 2.5], "p99": [5.0, 2.0, 1.0, 3.0]})
    >>> drawn = pareto_front(runs, "cost", "p99").axes[0].lines[0]
    >>> drawn.get_xdata().tolist(), drawn.get_ydata().tolist()
    ([1.0, 2.0, 3.0], [5.0, 2.0, 1.0])
    """
    _require(frame, [x, y], "frame")
    bad = [name for name in maximize if name not in (x, y)]
    if bad:
        raise ValueError(f"maximize names {bad}, which are not the objectives {x!r} and {y!r}")
    if front is None:
        from simpy_llm.explore.pareto import pareto_front as non_dominated

        chosen = non_dominated(frame, {name: "max" if name in maximize else "min" for name in (x, y)})
    elif hasattr(front, "columns"):
        _require(front, [x, y], "front")
        chosen = front
    else:
        mask = np.asarray(front, dtype=bool)
        if mask.shape != (len(frame),):
            raise ValueError(f"front as a mask needs one boolean per row of frame ({len(frame)}), got shape {mask.shape}")
        chosen = frame[mask]
    fig, ax = _axes(ax)
    ax.scatter(frame[x].to_numpy(dtype=np.float64), frame[y].to_numpy(dtype=np.float64),
               color="0.55", alpha=0.6, s=12, linewidths=0, zorder=1, label="all")
    chosen = chosen.sort_values([x, y], kind="stable")
    # The staircase bounds the region the front dominates: it keeps a point's y until the
    # next point when smaller x is better, and takes the next point's y at once otherwise.
    ax.step(chosen[x].to_numpy(dtype=np.float64), chosen[y].to_numpy(dtype=np.float64),
            where="pre" if x in maximize else "post", marker="o", color="C3", zorder=2.5, label="Pareto front")
    _mark(ax, frame, x, y, mark)
    _finish_sweep(ax, frame, x, y, None, (xlabel, ylabel, title), what="Pareto front")
    ax.legend(fontsize="small")
    return fig


def calibration_qq(
    observed: Any,
    predicted: Any = None,
    *,
    metric: str = "",
    ax: Axes | None = None,
    xlabel: str | None = None, ylabel: str | None = None, title: str | None = None,
) -> Figure:
    """Quantile-quantile plot of observed against predicted values, with the line y = x.

    The quantiles are the calibration report's (:mod:`simpy_llm.calibrate.stats`): at
    the probabilities ``(i + 0.5) / QQ_POINTS``, ``i = 0 ... QQ_POINTS - 1``.

    Parameters
    ----------
    observed
        The observed values (s, e.g. a real server's TTFTs), or a
        :class:`~simpy_llm.calibrate.stats.MetricComparison`, whose QQ points are
        plotted as they are (then *predicted* is not given).
    predicted
        The simulated values (s); the two samples may differ in size.
    metric
        Name for the axis labels (``ttft``, said ``TTFT``), or the comparison's.
    ax
        Axes to draw into (default: a new figure's).
    xlabel, ylabel
        Axis labels (default ``observed TTFT quantile (s)``, ``predicted TTFT quantile (s)``).
    title
        The title (default ``Quantiles of TTFT: predicted against observed``; ``""``: none).

    Returns
    -------
    matplotlib.figure.Figure
        The figure drawn into: first the dashed ``y = x`` line over the range of all
        quantiles, then the quantile points (x observed, y predicted) labelled
        ``quantiles``; both axes share one range.

    Raises
    ------
    ValueError
        If a sample is empty (NaN values are left out first), or *predicted* is missing
        (or given with a comparison).

    Examples
    --------
    >>> import numpy as np
    >>> fig = calibration_qq(np.arange(1.0, 101.0), 2 * np.arange(1.0, 101.0), metric="ttft")
    >>> diagonal, points = fig.axes[0].lines
    >>> len(points.get_xdata()), bool(np.allclose(points.get_ydata(), 2 * points.get_xdata()))
    (100, True)
    """
    from simpy_llm.calibrate.stats import QQ_POINTS

    if hasattr(observed, "qq_observed"):
        if predicted is not None:
            raise ValueError("calibration_qq: give a MetricComparison alone, or two samples")
        metric = metric or observed.metric
        qx = np.asarray(observed.qq_observed, dtype=np.float64)
        qy = np.asarray(observed.qq_simulated, dtype=np.float64)
        if qx.size == 0:
            raise ValueError(f"the comparison of {metric!r} has no QQ points (no pairs)")
    else:
        if predicted is None:
            raise ValueError("calibration_qq needs the predicted values (or a MetricComparison)")
        samples = []
        for name, values in (("observed", observed), ("predicted", predicted)):
            a = np.asarray(values, dtype=np.float64).ravel()
            a = a[~np.isnan(a)]
            if a.size == 0:
                raise ValueError(f"calibration_qq: {name} has no values")
            samples.append(a)
        probs = (np.arange(QQ_POINTS) + 0.5) / QQ_POINTS
        qx, qy = (np.quantile(a, probs) for a in samples)
    fig, ax = _axes(ax)
    lo, hi = float(min(qx.min(), qy.min())), float(max(qx.max(), qy.max()))
    ax.plot([lo, hi], [lo, hi], color="0.5", linewidth=1, linestyle="--", label="y = x")
    ax.plot(qx, qy, "o", markersize=3, label="quantiles")
    pad = (hi - lo) * 0.03 or 1.0
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_ylim(lo - pad, hi + pad)
    words = LATENCY_METRICS.get(metric, metric)
    name, of, said = (f"{words} ", f" of {words}", f" {metric}") if metric else ("", "", "")
    _finish(ax, (xlabel, ylabel, title),
            (f"observed {name}quantile (s)", f"predicted {name}quantile (s)", f"Quantiles{of}: predicted against observed"),
            f"x: observed{said}; y: predicted{said}; quantiles at (i + 0.5) / {QQ_POINTS}")
    ax.legend(loc="upper left", fontsize="small")
    return fig
