"""Plots of sweeps and of request-level batch servers, as matplotlib figures.

* :func:`line`: a metric against a setting from a tidy frame such as a
  :func:`~simpy_llm.explore.sweep` (throughput against the number of bins, the
  batch size or the load), one line per value of a third column, with optional
  reference curves (a closed form, a bound);
* :func:`batch_size_over_time`: each batch server's batch sizes, and the dynamic
  batcher's target, against time, from :meth:`Results.batches()
  <simpy_llm.metrics.results.Results.batches>`;
* :func:`sla_attainment_over_time`: the share of requests whose batch met the
  latency target, window by window (the numbers: :func:`sla_attainment`).

matplotlib is optional (the ``plots`` extra: ``pip install 'simpy-llm[plots]'``) and
imported only when a figure is drawn. Each function draws into the ``ax`` it is
given, or else into a new :class:`matplotlib.figure.Figure` made without pyplot
(nothing joins pyplot's list of open figures, and the pyplot backend is left alone),
and returns the figure: ``fig.savefig("plot.png")`` writes it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from numbers import Real
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["SLA_ATTAINMENT_COLUMNS", "batch_size_over_time", "line", "sla_attainment", "sla_attainment_over_time"]

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
            "simpy_llm.plot needs matplotlib, which is not installed: pip install 'simpy-llm[plots]'"
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


def line(
    frame: pd.DataFrame,
    x: str,
    y: str,
    *,
    hue: str | None = None,
    ax: Axes | None = None,
    reference: Mapping[str, float | Sequence[float]] | None = None,
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

    Returns
    -------
    matplotlib.figure.Figure
        The figure drawn into.

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
    [('policy=a', [1.0, 1.8, 3.0]), ('policy=b', [1.0, 1.5, 2.0]), ('k x 1.0', [1.0, 2.0, 4.0])]
    """
    fig, ax = _axes(ax)
    _require(frame, [x, y] if hue is None else [x, y, hue], "frame")
    xs = np.sort(frame[x].dropna().unique())
    parts = [(None, frame)] if hue is None else list(frame.groupby(hue, sort=True, dropna=False))
    for value, part in parts:
        values = part[[x, y]].dropna(subset=[x])
        means = values.groupby(x, sort=True)[y].mean()
        label = y if hue is None else f"{hue}={value}"
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
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if hue is not None or reference:
        _legend(ax)
    return fig


def batch_size_over_time(batches: pd.DataFrame, *, ax: Axes | None = None) -> Figure:
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
    for replica, part in batches.groupby("replica", sort=True):
        part = part.sort_values("start_s", kind="stable")
        start = part["start_s"].to_numpy(dtype=np.float64)
        (drawn,) = ax.step(start, part["size"].to_numpy(dtype=np.float64), where="post", label=f"replica {replica}")
        if "b_target" in part.columns:
            target = part["b_target"].to_numpy(dtype=np.float64)
            if not np.isnan(target).all():
                ax.step(start, target, where="post", linestyle="--", color=drawn.get_color(), label=f"replica {replica} b_target")
    ax.set_xlabel("batch start (s)")
    ax.set_ylabel("batch size (requests)")
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
    batches: pd.DataFrame, d_sla_s: float, *, window_s: float, ax: Axes | None = None
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
    ax.set_xlabel(f"batch end (s), windows of {window_s:g} s")
    ax.set_ylabel(f"share of requests with service <= {d_sla_s:g} s")
    _legend(ax)
    return fig
