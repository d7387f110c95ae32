"""Figures that read like a paper's: axes in words with units, titles that say what is
compared, the key paths kept in a caption, integer ticks on count axes, and a Pareto plot
whose dominated points show under the front."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from matplotlib.ticker import AutoLocator, MaxNLocator

from simpy_llm.plot import (
    batch_size_over_time,
    calibration_qq,
    latency_cdf,
    line,
    pareto_front,
    sla_attainment_over_time,
    throughput_latency,
    time_series,
)
from simpy_llm.plot_labels import LABELS, axis_label, is_count, title_against, title_over_time, title_words

NAN = math.nan


def _drawn(fig: Figure):
    """The figure's one axes, after a full draw (the caption is placed and nothing fails)."""
    fig.canvas.draw()
    (ax,) = fig.axes
    return ax


def _caption(ax) -> str:
    (note,) = [t for t in ax.texts if t.get_gid() == "caption"]
    return note.get_text()


def _integer_ticks(axis) -> bool:
    """The axis takes integer ticks and every tick it shows is a whole number."""
    ticks = axis.get_majorticklocs()
    return type(axis.get_major_locator()) is MaxNLocator and len(ticks) > 1 and all(t == round(t) for t in ticks)


def _default_ticks(axis) -> bool:
    """The axis keeps matplotlib's default locator (an AutoLocator is a MaxNLocator without integer steps)."""
    return type(axis.get_major_locator()) is AutoLocator


@pytest.fixture
def load_sweep() -> pd.DataFrame:
    """A sweep over replicas (1..3) and offered load, with the summary's key paths as columns."""
    replicas = [1, 1, 2, 2, 3, 3]
    return pd.DataFrame({
        "serving.replicas": replicas,
        "workload.aggregate_rate": [10.0, 20.0] * 3,
        "throughput.requests_per_s": [9.8, 12.0, 10.0, 19.5, 10.0, 19.9],
        "latency_s.ttft.p99": [0.9, 7.5, 0.3, 1.2, 0.2, 0.4],
        "overloaded": [0.0, 1.0, 0.0, 0.0, 0.0, 0.0],
    })


# --- line --------------------------------------------------------------------------
def test_line_labels_title_caption_and_count_ticks(load_sweep):
    """Replicas on x: integer ticks (none at 1.5), words on both axes, the comparison as the
    title and the key paths under the axes."""
    ax = _drawn(line(load_sweep, "serving.replicas", "latency_s.ttft.p99", hue="workload.aggregate_rate"))
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("replicas", "TTFT p99 (s)")
    assert ax.get_title() == "TTFT p99 against replicas, by offered load"
    assert _caption(ax) == "x: serving.replicas; y: latency_s.ttft.p99; by: workload.aggregate_rate"
    assert _integer_ticks(ax.xaxis)
    assert 1.5 not in ax.get_xticks()
    assert _default_ticks(ax.yaxis)  # a latency keeps the default ticks


def test_legend_entries_are_words_with_the_group_value(load_sweep):
    """A sweep's legend names each group in words with its value, and a lone curve by its
    metric in words: no key path and no ``key=value`` in a legend."""
    ax = _drawn(line(load_sweep, "serving.replicas", "latency_s.ttft.p99", hue="workload.aggregate_rate"))
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["offered load 10.0", "offered load 20.0", "overloaded"]
    (lone,) = _drawn(throughput_latency(load_sweep, "throughput.requests_per_s", "latency_s.ttft.p99", mark=None)).lines
    assert lone.get_label() == "TTFT p99"


def test_line_overrides_and_unknown_columns():
    """xlabel=, ylabel= and title= replace the defaults (title="" leaves none); a column no
    rule knows is its own label, and an all-integer column still gets integer ticks."""
    frame = pd.DataFrame({"k": [1, 2, 3], "my_metric": [0.5, 0.25, 0.75]})
    ax = _drawn(line(frame, "k", "my_metric", xlabel="bins k", ylabel="metric (a.u.)", title=""))
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("bins k", "metric (a.u.)", "")
    assert _caption(ax) == "x: k; y: my_metric"
    assert _integer_ticks(ax.xaxis)
    ax = _drawn(line(frame, "k", "my_metric", title="Mine"))
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("k", "my_metric", "Mine")


def test_drawing_again_into_an_axes_keeps_one_caption(load_sweep):
    """A second plot into the same axes replaces the first one's caption."""
    fig = line(load_sweep, "serving.replicas", "latency_s.ttft.p99")
    line(load_sweep, "serving.replicas", "throughput.requests_per_s", ax=fig.axes[0])
    assert _caption(_drawn(fig)) == "x: serving.replicas; y: throughput.requests_per_s"


# --- throughput_latency ------------------------------------------------------------
def test_throughput_latency_labels(load_sweep):
    """Throughput and tail latency in words, by replicas; the y (latency) axis is not a count."""
    ax = _drawn(throughput_latency(load_sweep, "throughput.requests_per_s", "latency_s.ttft.p99", by="serving.replicas"))
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("throughput (requests/s)", "TTFT p99 (s)")
    assert ax.get_title() == "TTFT p99 against throughput, by replicas"
    assert _caption(ax) == "x: throughput.requests_per_s; y: latency_s.ttft.p99; by: serving.replicas"
    assert _default_ticks(ax.xaxis)


# --- pareto_front ------------------------------------------------------------------
def test_pareto_front_labels_and_dominated_points_show(load_sweep):
    """The dominated points are drawn first, smaller and lighter but visible, below the front,
    whose line and markers are on top and in the legend; replicas get integer ticks."""
    ax = _drawn(pareto_front(load_sweep, "serving.replicas", "latency_s.ttft.p99", mark=None))
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("replicas", "TTFT p99 (s)")
    assert ax.get_title() == "Pareto front: TTFT p99 against replicas"
    assert _caption(ax) == "x: serving.replicas; y: latency_s.ttft.p99"
    assert _integer_ticks(ax.xaxis)
    (every,) = ax.collections
    (front,) = ax.lines
    assert every.get_label() == "all" and len(every.get_offsets()) == len(load_sweep)
    assert every.get_visible() and 0 < every.get_alpha() <= 1
    assert every.get_sizes()[0] > 0
    assert every.get_zorder() < front.get_zorder()
    assert front.get_marker() == "o"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["all", "Pareto front"]
    # Drawn first: the renderer draws in zorder, so the points go under the front.
    order = sorted(ax.get_children(), key=lambda artist: artist.get_zorder())
    assert order.index(every) < order.index(front)


# --- latency_cdf -------------------------------------------------------------------
def test_latency_cdf_labels():
    """The metric in words, the classes named in the title, the column in the caption."""
    records = pd.DataFrame({"slo_class": ["a", "b", "a"], "e2e_s": [1.5, 2.0, 0.5], "prompt_tokens": [100, 250, 40]})
    ax = _drawn(latency_cdf(records, "e2e_s"))
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("E2E latency (s)", "fraction of requests <= x")
    assert ax.get_title() == "CDF of E2E latency, by SLO class"
    assert _caption(ax) == "x: e2e_s; by: slo_class"
    ax = _drawn(latency_cdf(records, "prompt_tokens", by=None))
    assert (ax.get_xlabel(), ax.get_title(), _caption(ax)) == ("prompt tokens", "CDF of prompt tokens", "x: prompt_tokens")
    assert _integer_ticks(ax.xaxis)


# --- time_series -------------------------------------------------------------------
def test_time_series_labels_and_count_ticks():
    """Queue and batch sizes are counts: integer ticks on y; time in seconds on x."""
    ts = pd.DataFrame({"time_s": [0.0, 0.5, 1.0, 1.5], "replica": [0, 0, 0, 0],
                       "waiting": [0, 1, 3, 2], "running": [1, 2, 2, 3]})
    ax = _drawn(time_series(ts))
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("time (s)", "waiting requests, running requests")
    assert ax.get_title() == "Waiting requests and running requests over time, by replica"
    assert _caption(ax) == "x: time_s; y: waiting, running; by: replica"
    assert _integer_ticks(ax.yaxis)
    ax = _drawn(time_series(ts.assign(kv_utilization=[0.1, 0.3, 0.35, 0.2]), "kv_utilization", by=None))
    assert (ax.get_ylabel(), ax.get_title()) == ("KV cache use (share of blocks)", "KV cache use over time")
    assert _default_ticks(ax.yaxis)


# --- batch servers -----------------------------------------------------------------
@pytest.fixture
def batches() -> pd.DataFrame:
    return pd.DataFrame({
        "replica": [0, 0, 0, 1],
        "start_s": [0.0, 1.0, 2.0, 0.5],
        "end_s": [0.4, 1.9, 2.3, 0.9],
        "service_s": [0.4, 0.9, 0.3, 0.4],
        "size": [1, 4, 3, 2],
        "b_target": [NAN, 4.0, 4.0, NAN],
    })


def test_batch_size_over_time_labels(batches):
    """Batch sizes are counts: integer ticks on y; the caption names the batch table's columns."""
    ax = _drawn(batch_size_over_time(batches))
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("batch start (s)", "batch size (requests)")
    assert ax.get_title() == "Batch size over time, by replica"
    assert _caption(ax) == "x: start_s; y: size, b_target (dashed); by: replica"
    assert _integer_ticks(ax.yaxis)
    assert _caption(_drawn(batch_size_over_time(batches.drop(columns="b_target")))) == "x: start_s; y: size; by: replica"


def test_sla_attainment_over_time_labels(batches):
    """The target and the windows are said in the labels, the title and the caption."""
    ax = _drawn(sla_attainment_over_time(batches, 0.5, window_s=1.0, ylabel="attainment"))
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("batch end (s), windows of 1 s", "attainment")
    assert ax.get_title() == "SLA attainment (service <= 0.5 s) over time, by replica"
    assert _caption(ax) == "x: end_s, windows of 1 s; y: share of size with service_s <= 0.5 s; by: replica"


# --- calibration_qq ----------------------------------------------------------------
def test_calibration_qq_labels():
    """The metric in words on both axes and in the title; its name in the caption."""
    from simpy_llm.calibrate.stats import QQ_POINTS

    ax = _drawn(calibration_qq(np.arange(1.0, 51.0), np.arange(2.0, 52.0), metric="tpot"))
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("observed TPOT quantile (s)", "predicted TPOT quantile (s)")
    assert ax.get_title() == "Quantiles of TPOT: predicted against observed"
    assert _caption(ax) == f"x: observed tpot; y: predicted tpot; quantiles at (i + 0.5) / {QQ_POINTS}"
    ax = _drawn(calibration_qq([1.0, 2.0], [1.5, 2.5]))
    assert (ax.get_xlabel(), ax.get_title()) == ("observed quantile (s)", "Quantiles: predicted against observed")
    assert _caption(ax).startswith("x: observed; y: predicted;")


# --- the label table ---------------------------------------------------------------
@pytest.mark.parametrize(("path", "label"), [
    ("latency_s.ttft.p99", "TTFT p99 (s)"),
    ("latency_s.tpot.mean", "TPOT mean (s)"),
    ("latency_s.e2e.p50", "E2E p50 (s)"),
    ("latency_s.queue_delay.p90", "queue delay p90 (s)"),
    ("latency_s.ttft.count", "TTFT count"),
    ("throughput.requests_per_s", "throughput (requests/s)"),
    ("throughput.output_tokens_per_s", "output tokens/s"),
    ("goodput.fraction", "goodput (share of requests)"),
    ("goodput.by_class.fraction[interactive]", "goodput of class interactive (share of requests)"),
    ("workload.aggregate_rate", "offered load (requests/s)"),
    ("serving.replicas", "replicas"),
    ("serving.batch_server.bins.count", "bins"),
    ("devices.energy_j", "energy (J)"),
    ("devices.energy_j_per_replica[1]", "energy of replica 1 (J)"),
    ("batch_size.p99", "batch size p99 (requests)"),
    ("batch_servers.requests_per_busy_s[0]", "busy throughput of batch server 0 (requests/s)"),
    ("batch_servers.service_s.p99[1]", "service time p99 of batch server 1 (s)"),
    ("batch_servers.by_bin.e2e_s.mean[0/2]", "E2E latency mean of batch server 0, bin 2 (s)"),
    ("latency_s_by_tenant.tpot.p95[chat]", "TPOT p95 of tenant chat (s)"),
    ("kv_utilization.per_replica[0]", "KV cache use of replica 0 (share of blocks)"),
    ("ttft_s", "TTFT (s)"),
])
def test_axis_label_of_known_paths(path, label):
    assert axis_label(path) == label


@pytest.mark.parametrize("path", ["k", "latency_s.ttft.p42", "batch_servers.nothing[0]", "latency_s", "", "a[b", "x]"])
def test_unknown_paths_are_their_own_label(path):
    """A path no rule knows is its own label, never an error."""
    assert axis_label(path) == path


def test_every_label_of_the_table_is_words():
    """No label of the table is a key path: no dots between words, no underscores."""
    for path, label in LABELS.items():
        assert "_" not in label, (path, label)
        assert not any(part and part[0].isalpha() and "." in part for part in label.split()), (path, label)


def test_titles_and_counts():
    assert title_words("throughput.requests_per_s") == "throughput"
    assert title_against("throughput.requests_per_s", "serving.replicas") == "Throughput against replicas"
    assert title_over_time(["waiting"]) == "Waiting requests over time"
    assert [is_count(p) for p in ("latency_s.ttft.count", "batch_servers.batches[0]", "serving.engine.max_num_seqs")] == [True] * 3
    assert [is_count(p) for p in ("throughput.requests_per_s", "goodput.fraction", "ttft_s")] == [False] * 3
