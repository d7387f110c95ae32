"""The server's scraped time series against the simulation's: queue depth, running batch, KV use.

``simpy-llm observe --scrape-metrics`` records the server's Prometheus samples
(``metrics.csv``, :mod:`simpy_llm.observe.scrape`) on the trace's clock. The
replay that :func:`~simpy_llm.calibrate.compare.compare` runs starts its clock
at the same origin (requests arrive at their send times), so the simulated
state at each scrape's instant is the prediction of what the scrape read
(seed 000 §11, "Time-series comparison"). Three series are compared:

=================  ================================================  ===========================
series             scraped (the first of these the file holds)       simulated (``timeseries()``)
=================  ================================================  ===========================
``queue_depth``    ``vllm:num_requests_waiting``,                    ``waiting``
                   ``llamacpp:requests_deferred``,
                   ``sglang:num_queue_reqs``,
                   ``tgi_queue_size``
``running_batch``  ``vllm:num_requests_running``,                    ``running``
                   ``llamacpp:requests_processing``,
                   ``sglang:num_running_reqs``,
                   ``tgi_batch_current_size``
``kv_usage``       ``vllm:kv_cache_usage_perc``,                     ``kv_utilization``
                   ``vllm:gpu_cache_usage_perc``,
                   ``llamacpp:kv_cache_usage_ratio``,
                   ``sglang:token_usage``
=================  ================================================  ===========================

A metric with several label sets (one per replica: vLLM's ``engine`` label,
the emulated server's) is summed over them for the two counts and averaged for
the KV fraction (replicas of one size), and so is the simulation's per-replica
state. The simulated state is sampled at exactly the scrape times
(:func:`sample_at`, recorded through the recorder's ``on_sample``, so
:meth:`~simpy_llm.metrics.results.Results.timeseries` returns those samples);
a failed scrape (a row with an ``error``) has no value and is left out. Per
series the report gives the mean absolute error (MAE) over the scrapes, in the
series' unit (requests, or a fraction of the KV cache), both sides' means, and
the points themselves for the plot.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from simpy_llm.simulation import Simulation

__all__ = [
    "SCRAPED_METRICS",
    "SERIES",
    "SIMULATED_COLUMNS",
    "ScrapedSeries",
    "compare_series",
    "sample_at",
    "scrape_times",
    "scraped_series",
]

SERIES: tuple[str, ...] = ("queue_depth", "running_batch", "kv_usage")
"""The series compared, in the report's order."""

SIMULATED_COLUMNS: dict[str, str] = {"queue_depth": "waiting", "running_batch": "running", "kv_usage": "kv_utilization"}
"""Each series' column of :meth:`~simpy_llm.metrics.results.Results.timeseries`."""

SCRAPED_METRICS: dict[str, tuple[str, ...]] = {
    "queue_depth": ("vllm:num_requests_waiting", "llamacpp:requests_deferred", "sglang:num_queue_reqs", "tgi_queue_size"),
    "running_batch": (
        "vllm:num_requests_running", "llamacpp:requests_processing", "sglang:num_running_reqs", "tgi_batch_current_size"
    ),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "llamacpp:kv_cache_usage_ratio", "sglang:token_usage"),
}
"""Each series' Prometheus metrics, in order of preference (vLLM and the emulated server,
llama.cpp, SGLang, TGI; vLLM's older name for the KV fraction after its current one). TGI
exports no KV-cache fraction (its ``tgi_batch_current_max_tokens`` is the tokens the batch
may reach, not the cache in use), so a TGI run compares the queue and the batch only."""

_AVERAGED = frozenset({"kv_usage"})
"""Series that are a fraction per replica: averaged over replicas, not summed."""


@attrs.frozen(kw_only=True)
class ScrapedSeries:
    """One series read from a scraped metrics file."""

    name: str
    """The series (:data:`SERIES`)."""
    metric: str
    """The Prometheus metric it was read from."""
    time_s: np.ndarray
    """Scrape times, seconds on the trace's clock, increasing."""
    value: np.ndarray
    """The value at each scrape (summed or averaged over label sets, see the module docstring)."""


def scraped_series(metrics: pd.DataFrame) -> dict[str, ScrapedSeries]:
    """The series of :data:`SERIES` that the scraped samples *metrics* hold (the frame of
    :func:`~simpy_llm.observe.scrape.read_metrics`: ``time_s``, ``metric``, ``labels``,
    ``value``, ``error``), each from the first of its :data:`SCRAPED_METRICS` present.

    Examples
    --------
    >>> frame = pd.DataFrame({"time_s": [0.0, 0.0, 1.0, 1.0, 2.0], "labels": ["", "", "", "", ""],
    ...                       "metric": ["llamacpp:requests_processing", "llamacpp:requests_deferred",
    ...                                  "llamacpp:requests_processing", "llamacpp:requests_deferred", ""],
    ...                       "value": [0.0, 0.0, 2.0, 1.0, None], "error": ["", "", "", "", "refused"]})
    >>> s = scraped_series(frame)
    >>> sorted(s), s["running_batch"].metric, s["running_batch"].value.tolist()
    (['queue_depth', 'running_batch'], 'llamacpp:requests_processing', [0.0, 2.0])
    """
    valid = metrics[(metrics["metric"].astype(str) != "") & metrics["value"].notna()]
    if "error" in valid:
        valid = valid[valid["error"].fillna("").astype(str) == ""]
    present = set(valid["metric"].astype(str))
    out: dict[str, ScrapedSeries] = {}
    for name in SERIES:
        metric = next((m for m in SCRAPED_METRICS[name] if m in present), None)
        if metric is None:
            continue
        rows = valid[valid["metric"] == metric]
        grouped = rows.groupby("time_s", sort=True)["value"]
        agg = grouped.mean() if name in _AVERAGED else grouped.sum()
        out[name] = ScrapedSeries(
            name=name,
            metric=metric,
            time_s=agg.index.to_numpy(dtype=np.float64),
            value=agg.to_numpy(dtype=np.float64),
        )
    return out


def scrape_times(series: Mapping[str, ScrapedSeries]) -> np.ndarray:
    """Every scrape time of *series*, once, increasing: the instants to sample the simulation at.

    >>> s = ScrapedSeries(name="running_batch", metric="m", time_s=np.array([0.5, 1.5]), value=np.array([1.0, 0.0]))
    >>> scrape_times({"running_batch": s}).tolist()
    [0.5, 1.5]
    """
    if not series:
        return np.empty(0)
    return np.unique(np.concatenate([s.time_s for s in series.values()]))


def sample_at(sim: Simulation, times_s: Sequence[float] | np.ndarray) -> Generator[Any, Any, None]:
    """A SimPy process that records every replica's state at each of *times_s* (increasing,
    seconds; those before the clock's start are taken at the start) through the recorder's
    ``on_sample``, stamped with the time asked, so ``Results.timeseries()`` holds one row per
    (time, replica): ``waiting``, ``running``, ``kv_used_blocks``, ``busy``. Start it with
    ``sim.env.process(sample_at(sim, times))`` before ``sim.run()``; it only reads the
    replicas, so the run's records are the same with it or without it.

    Yields
    ------
    Timeout
        Until the next time.
    """
    env = sim.env
    on_sample = sim.recorder.on_sample
    replicas = sim.replicas
    for t in times_s:
        t = float(t)
        if t > env.now:
            yield env.timeout(t - env.now)
        for rep in replicas:
            on_sample(t, rep.index, len(rep.waiting), len(rep.running), rep.kv.used_blocks, bool(rep.running))


def _simulated(timeseries: pd.DataFrame, name: str) -> pd.Series:
    """The simulated series *name* per sample time (summed or averaged over replicas)."""
    grouped = timeseries.groupby("time_s", sort=True)[SIMULATED_COLUMNS[name]]
    return (grouped.mean() if name in _AVERAGED else grouped.sum(min_count=1)).astype("float64")


def compare_series(scraped: Mapping[str, ScrapedSeries], timeseries: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Each scraped series against the simulated one at the same instants.

    Parameters
    ----------
    scraped
        From :func:`scraped_series`.
    timeseries
        ``Results.timeseries()`` of a replay sampled at the scrape times (:func:`sample_at`).

    Returns
    -------
    dict
        Per series, in :data:`SERIES` order: ``scraped_metric``, ``simulated_column``, ``n``
        (scrapes with a value on both sides), ``mae`` (mean of ``|observed - simulated|``;
        ``None`` when ``n`` is 0), ``observed_mean``, ``simulated_mean``, and the points
        ``time_s``, ``observed``, ``simulated``.

    Examples
    --------
    >>> s = ScrapedSeries(name="running_batch", metric="vllm:num_requests_running",
    ...                   time_s=np.array([1.0, 2.0, 3.0, 4.0]), value=np.array([0.0, 2.0, 1.0, 0.0]))
    >>> sim = pd.DataFrame({"time_s": [1.0, 2.0, 3.0, 4.0], "replica": 0, "running": [0, 1, 1, 0]})
    >>> compare_series({"running_batch": s}, sim)["running_batch"]["mae"]
    0.25
    """
    out: dict[str, dict[str, Any]] = {}
    for name in SERIES:
        if name not in scraped:
            continue
        s = scraped[name]
        simulated = _simulated(timeseries, name).reindex(s.time_s).to_numpy(dtype=np.float64)
        both = ~np.isnan(s.value) & ~np.isnan(simulated)
        obs, sim = s.value[both], simulated[both]
        n = int(both.sum())
        out[name] = {
            "scraped_metric": s.metric,
            "simulated_column": SIMULATED_COLUMNS[name],
            "n": n,
            "mae": float(np.mean(np.abs(obs - sim))) if n else None,
            "observed_mean": float(obs.mean()) if n else None,
            "simulated_mean": float(sim.mean()) if n else None,
            "time_s": s.time_s[both].tolist(),
            "observed": obs.tolist(),
            "simulated": sim.tolist(),
        }
    return out
