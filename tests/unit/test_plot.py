"""simpy_llm.plot: the data each figure draws, and the windowed SLA attainment, on hand-built frames."""

from __future__ import annotations

import io
import math
import sys

import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from simpy_llm.plot import (
    SLA_ATTAINMENT_COLUMNS,
    batch_size_over_time,
    calibration_qq,
    latency_cdf,
    line,
    pareto_front,
    sla_attainment,
    sla_attainment_over_time,
    throughput_latency,
    time_series,
)

NAN = math.nan


def _xy(drawn):
    return drawn.get_xdata().tolist(), drawn.get_ydata().tolist()


@pytest.fixture
def sweep_frame() -> pd.DataFrame:
    """A sweep-like frame: bins k in {1, 2, 4} x two policies, rows out of order."""
    return pd.DataFrame({
        "k": [4, 1, 2, 2, 4, 1],
        "policy": ["fifo", "fifo", "fifo", "edf", "edf", "edf"],
        "throughput": [3.0, 1.0, 1.8, 1.5, 2.0, 1.0],
    })


@pytest.fixture
def batches() -> pd.DataFrame:
    """Two replicas' batches, rows not in time order; replica 1 has no dynamic target."""
    return pd.DataFrame({
        "replica": [0, 1, 0, 0, 1],
        "start_s": [1.0, 0.0, 0.0, 2.0, 1.5],
        "size": [4, 2, 1, 3, 5],
        "b_target": [4.0, NAN, NAN, 5.0, NAN],
    })


# --- line --------------------------------------------------------------------------
def test_line_draws_one_sorted_line_per_hue(sweep_frame):
    """One line per hue value (sorted), through y at the sorted x values, labelled in words with the value."""
    ax = line(sweep_frame, "k", "throughput", hue="policy").axes[0]
    assert [d.get_label() for d in ax.lines] == ["policy edf", "policy fifo"]
    assert _xy(ax.lines[0]) == ([1, 2, 4], [1.0, 1.5, 2.0])
    assert _xy(ax.lines[1]) == ([1, 2, 4], [1.0, 1.8, 3.0])
    assert ax.lines[0].get_marker() == "o"
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("k", "throughput")


def test_line_without_hue_is_one_line(sweep_frame):
    """Without hue there is one line, labelled by y, through the mean at each x."""
    ax = line(sweep_frame, "k", "throughput").axes[0]
    (drawn,) = ax.lines
    assert drawn.get_label() == "throughput"
    assert _xy(drawn) == ([1, 2, 4], [1.0, pytest.approx(1.65), 2.5])


def test_line_averages_replicates_and_scatters_them():
    """Rows sharing x (seeds) are averaged on the line; each value is also drawn as a dot."""
    frame = pd.DataFrame({"rate": [10, 10, 20, 20], "seed": [1, 2, 1, 2], "tp": [9.0, 11.0, 18.0, 20.0]})
    ax = line(frame, "rate", "tp").axes[0]
    assert _xy(ax.lines[0]) == ([10, 20], [10.0, 19.0])
    (dots,) = ax.collections
    assert dots.get_offsets().tolist() == [[10, 9.0], [10, 11.0], [20, 18.0], [20, 20.0]]


def test_line_no_scatter_without_replicates(sweep_frame):
    """With one row per (hue, x) nothing but the lines is drawn."""
    assert len(line(sweep_frame, "k", "throughput", hue="policy").axes[0].collections) == 0


def test_line_reference_curves(sweep_frame):
    """A reference sequence is drawn dashed over the sorted distinct x; a number is a horizontal line."""
    ax = line(sweep_frame, "k", "throughput", hue="policy", reference={"closed form": [1.0, 2.0, 4.0], "cap": 3.5}).axes[0]
    curve, cap = ax.lines[2:]
    assert curve.get_label() == "closed form"
    assert _xy(curve) == ([1, 2, 4], [1.0, 2.0, 4.0])
    assert curve.get_linestyle() == "--"
    assert cap.get_label() == "cap"
    assert list(cap.get_ydata()) == [3.5, 3.5]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["policy edf", "policy fifo", "closed form", "cap"]


def test_line_reference_of_wrong_length_is_an_error(sweep_frame):
    """A reference sequence that does not give one y per distinct x is a ValueError."""
    with pytest.raises(ValueError, match="one per distinct k"):
        line(sweep_frame, "k", "throughput", reference={"bad": [1.0, 2.0]})


def test_line_missing_column_is_an_error(sweep_frame):
    """A column the frame lacks is a ValueError listing the frame's columns."""
    with pytest.raises(ValueError, match=r"no column.*'tput'.*throughput"):
        line(sweep_frame, "k", "tput")


def test_line_draws_into_the_given_axes(sweep_frame):
    """Given an ax, the figure returned is that ax's and the lines are drawn there."""
    fig = Figure()
    ax = fig.add_subplot()
    assert line(sweep_frame, "k", "throughput", ax=ax) is fig
    assert len(ax.lines) == 1


def test_new_figure_has_an_agg_canvas_and_saves(sweep_frame):
    """A new figure is made without pyplot, on an Agg canvas, and writes a PNG."""
    fig = line(sweep_frame, "k", "throughput")
    assert isinstance(fig.canvas, FigureCanvasAgg)
    out = io.BytesIO()
    fig.savefig(out, format="png")
    assert out.getvalue().startswith(b"\x89PNG")


# --- batch_size_over_time ----------------------------------------------------------
def test_batch_size_steps_per_replica_with_target(batches):
    """Per replica (ascending) a post-step line of sizes in start order, then its non-NaN target dashed."""
    ax = batch_size_over_time(batches).axes[0]
    assert [d.get_label() for d in ax.lines] == ["replica 0", "replica 0 b_target", "replica 1"]
    sizes, target, other = ax.lines
    assert _xy(sizes) == ([0.0, 1.0, 2.0], [1.0, 4.0, 3.0])
    np.testing.assert_array_equal(target.get_xdata(), [0.0, 1.0, 2.0])
    np.testing.assert_array_equal(target.get_ydata(), [NAN, 4.0, 5.0])
    assert _xy(other) == ([0.0, 1.5], [2.0, 5.0])
    assert sizes.get_drawstyle() == target.get_drawstyle() == "steps-post"
    assert target.get_linestyle() == "--"
    assert target.get_color() == sizes.get_color()


def test_batch_size_without_target_column(batches):
    """A frame without b_target draws the sizes only."""
    ax = batch_size_over_time(batches.drop(columns="b_target")).axes[0]
    assert [d.get_label() for d in ax.lines] == ["replica 0", "replica 1"]


def test_batch_size_missing_column_is_an_error(batches):
    """A frame without start_s, size or replica is a ValueError."""
    with pytest.raises(ValueError, match="'start_s'"):
        batch_size_over_time(batches.drop(columns="start_s"))


# --- sla_attainment ----------------------------------------------------------------
@pytest.fixture
def served() -> pd.DataFrame:
    """Batches of two replicas with known end and service times (target 0.5 s, windows of 2 s).

    Replica 0: window 0 [0, 2) has sizes 4 (met) and 2 (missed) -> 4/6; window 1 [2, 4)
    nothing; window 2 [4, 6) size 3 (met exactly at the target) -> 1. Replica 1: window
    1 size 5 (missed) -> 0; window 2 sizes 1 (met) and 1 (missed), one ending at 4.0
    exactly (a window starts at its lower edge) -> 1/2.
    """
    return pd.DataFrame({
        "replica": [0, 0, 0, 1, 1, 1],
        "size": [4, 2, 3, 5, 1, 1],
        "end_s": [0.25, 1.5, 5.0, 3.0, 4.0, 5.75],
        "service_s": [0.25, 0.75, 0.5, 1.0, 0.125, 0.625],
    })


def test_sla_attainment_exact_values(served):
    """Shares are size-weighted per replica and window of end_s, every window from 0 to the last."""
    table = sla_attainment(served, 0.5, 2.0)
    assert tuple(table.columns) == SLA_ATTAINMENT_COLUMNS
    assert table["replica"].tolist() == [0, 0, 0, 1, 1, 1]
    assert table["window"].tolist() == [0, 1, 2, 0, 1, 2]
    assert table["window_start_s"].tolist() == [0.0, 2.0, 4.0] * 2
    assert table["window_end_s"].tolist() == [2.0, 4.0, 6.0] * 2
    assert table["batches"].tolist() == [2, 0, 1, 0, 1, 2]
    assert table["requests"].tolist() == [6, 0, 3, 0, 5, 2]
    assert table["within_sla"].tolist() == [4, 0, 3, 0, 0, 1]
    np.testing.assert_array_equal(table["share"].to_numpy(), [4 / 6, NAN, 1.0, NAN, 0.0, 0.5])
    assert table["requests"].dtype == np.int64


def test_sla_attainment_empty_frame(served):
    """No batches give an empty table with the same columns."""
    table = sla_attainment(served.iloc[:0], 0.5, 2.0)
    assert tuple(table.columns) == SLA_ATTAINMENT_COLUMNS
    assert len(table) == 0


@pytest.mark.parametrize("window_s", [0.0, -1.0, NAN, math.inf, True])
def test_sla_attainment_bad_window_is_an_error(served, window_s):
    """A window that is not a positive finite number is a ValueError."""
    with pytest.raises(ValueError, match="window_s"):
        sla_attainment(served, 0.5, window_s)


def test_sla_attainment_missing_column_is_an_error(served):
    """A frame without service_s is a ValueError."""
    with pytest.raises(ValueError, match="'service_s'"):
        sla_attainment(served.drop(columns="service_s"), 0.5, 2.0)


def test_sla_attainment_over_time_plots_the_table(served):
    """One line per replica through each window's share at the window's middle."""
    ax = sla_attainment_over_time(served, 0.5, window_s=2.0).axes[0]
    assert [d.get_label() for d in ax.lines] == ["replica 0", "replica 1"]
    np.testing.assert_array_equal(ax.lines[0].get_xdata(), [1.0, 3.0, 5.0])
    np.testing.assert_array_equal(ax.lines[0].get_ydata(), [4 / 6, NAN, 1.0])
    np.testing.assert_array_equal(ax.lines[1].get_ydata(), [NAN, 0.0, 0.5])


# --- latency_cdf -------------------------------------------------------------------
@pytest.fixture
def records() -> pd.DataFrame:
    """Five requests of two classes, one without a TTFT (NaN: dropped)."""
    return pd.DataFrame({
        "slo_class": ["interactive", "batch", "interactive", "interactive", "batch"],
        "ttft_s": [0.4, 2.0, 0.1, NAN, 1.0],
        "e2e_s": [3.0, 9.0, 2.0, NAN, 8.0],
    })


def test_latency_cdf_steps_through_sorted_values_at_i_over_n(records):
    """Per class (sorted) a post-step line through the sorted values at heights i/n, NaN left out."""
    ax = latency_cdf(records).axes[0]
    assert [d.get_label() for d in ax.lines] == ["SLO class batch (n=2)", "SLO class interactive (n=2)"]
    assert _xy(ax.lines[0]) == ([1.0, 2.0], [0.5, 1.0])
    assert _xy(ax.lines[1]) == ([0.1, 0.4], [0.5, 1.0])
    assert ax.lines[0].get_drawstyle() == "steps-post"
    assert ax.get_xlabel() == "TTFT (s)"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["SLO class batch (n=2)", "SLO class interactive (n=2)"]


def test_latency_cdf_other_metric_without_classes(records):
    """by=None pools every request into one line labelled by the metric."""
    (drawn,) = latency_cdf(records, "e2e_s", by=None).axes[0].lines
    assert drawn.get_label() == "E2E latency (n=4)"
    assert _xy(drawn) == ([2.0, 3.0, 8.0, 9.0], [0.25, 0.5, 0.75, 1.0])


def test_latency_cdf_accepts_results():
    """Given a Results, the CDF is drawn from its to_dataframe(), one line per class with a TTFT."""
    from simpy_llm import Simulation, load_scenario

    results = Simulation(load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=40"])).run()
    frame = results.to_dataframe()
    ax = latency_cdf(results).axes[0]
    for drawn in ax.lines:
        cls = drawn.get_label().split(" (n=")[0].removeprefix("SLO class ")
        expected = np.sort(frame.loc[frame["slo_class"] == cls, "ttft_s"].dropna().to_numpy())
        np.testing.assert_array_equal(drawn.get_xdata(), expected)
    assert len(ax.lines) == frame["slo_class"][frame["ttft_s"].notna()].nunique()


def test_latency_cdf_missing_column_is_an_error(records):
    """A metric the records lack is a ValueError naming it."""
    with pytest.raises(ValueError, match="'tpot_s'"):
        latency_cdf(records, "tpot_s")


# --- time_series -------------------------------------------------------------------
@pytest.fixture
def samples() -> pd.DataFrame:
    """Samples of two replicas, out of time order."""
    return pd.DataFrame({
        "time_s": [1.0, 0.0, 0.0, 1.0],
        "replica": [0, 0, 1, 1],
        "waiting": [5, 2, 0, 1],
        "running": [8, 4, 3, 6],
    })


def test_time_series_one_line_per_replica_and_column(samples):
    """Per replica (ascending), per column in order, a line through the samples in time order."""
    ax = time_series(samples).axes[0]
    assert [d.get_label() for d in ax.lines] == [
        "replica 0: waiting requests", "replica 0: running requests", "replica 1: waiting requests", "replica 1: running requests"]
    assert _xy(ax.lines[0]) == ([0.0, 1.0], [2, 5])
    assert _xy(ax.lines[3]) == ([0.0, 1.0], [3, 6])
    assert ax.get_xlabel() == "time (s)"


def test_time_series_without_by_column(samples):
    """A frame without the by column (or by=None) gives one line per column, labelled by it in words."""
    ax = time_series(samples.drop(columns="replica").iloc[:2], "waiting").axes[0]
    assert [(d.get_label(), *_xy(d)) for d in ax.lines] == [("waiting requests", [0.0, 1.0], [2, 5])]


def test_time_series_of_results_timeseries():
    """Given a Results, it draws its timeseries(): one queue line per replica over the samples."""
    from simpy_llm import Simulation, load_scenario

    overrides = ["workload.num_requests=30", "simulation.timeseries_interval_s=0.5"]
    results = Simulation(load_scenario("scenarios/quickstart.yaml", overrides)).run()
    (drawn,) = time_series(results, "waiting").axes[0].lines
    ts = results.timeseries()
    assert drawn.get_xdata().tolist() == ts["time_s"].tolist()
    assert drawn.get_ydata().tolist() == ts["waiting"].tolist()


def test_time_series_empty_frame_is_an_error(samples):
    """No samples is a ValueError pointing at simulation.timeseries_interval_s."""
    with pytest.raises(ValueError, match="timeseries_interval_s"):
        time_series(samples.iloc[:0])


# --- throughput_latency ------------------------------------------------------------
def test_throughput_latency_curve_per_setting_sorted_by_throughput():
    """Per value of by (sorted), a marked line through the runs sorted by throughput, NaN runs left out."""
    runs = pd.DataFrame({
        "replicas": [1, 1, 1, 2, 2, 2],
        "tput": [20.0, 10.0, NAN, 19.0, 40.0, 10.0],
        "p99": [2.0, 0.5, 1.0, 0.3, 1.5, 0.2],
    })
    ax = throughput_latency(runs, "tput", "p99", by="replicas").axes[0]
    assert [d.get_label() for d in ax.lines] == ["replicas 1", "replicas 2"]
    assert _xy(ax.lines[0]) == ([10.0, 20.0], [0.5, 2.0])
    assert _xy(ax.lines[1]) == ([10.0, 19.0, 40.0], [0.2, 0.3, 1.5])
    assert ax.lines[0].get_marker() == "o"
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("tput", "p99")


# --- pareto_front ------------------------------------------------------------------
@pytest.fixture
def candidates() -> pd.DataFrame:
    """Five candidates; minimising both, (1, 5), (2, 2) and (3, 1) are non-dominated."""
    return pd.DataFrame({"cost": [3.0, 2.0, 4.0, 1.0, 2.5], "p99": [1.0, 2.0, 2.0, 5.0, 3.0]})


def test_pareto_front_computed_when_not_given(candidates):
    """Without a front, the non-dominated points (both minimised) are joined by a step line sorted by x."""
    ax = pareto_front(candidates, "cost", "p99").axes[0]
    (drawn,) = ax.lines
    assert drawn.get_label() == "Pareto front"
    assert _xy(drawn) == ([1.0, 2.0, 3.0], [5.0, 2.0, 1.0])
    assert drawn.get_drawstyle() == "steps-post"
    (every,) = ax.collections
    assert every.get_offsets().tolist() == candidates.to_numpy().tolist()


def test_pareto_front_from_mask_and_frame(candidates):
    """A boolean mask or a frame of front rows is drawn as given, sorted by x."""
    mask = [True, False, False, True, False]
    assert _xy(pareto_front(candidates, "cost", "p99", mask).axes[0].lines[0]) == ([1.0, 3.0], [5.0, 1.0])
    front = candidates.iloc[[4, 1]]
    assert _xy(pareto_front(candidates, "cost", "p99", front).axes[0].lines[0]) == ([2.0, 2.5], [2.0, 3.0])


def test_pareto_front_maximize(candidates):
    """Maximising y keeps the points no other beats on lower x and higher y."""
    drawn = pareto_front(candidates, "cost", "p99", maximize=["p99"]).axes[0].lines[0]
    assert _xy(drawn) == ([1.0], [5.0])


def test_pareto_front_staircase_follows_the_better_side_of_x(candidates):
    """The staircase bounds what the front dominates: it holds a point's y until the next
    point when smaller x is better (steps-post), and rises to it at once when larger x is
    better (steps-pre)."""
    assert pareto_front(candidates, "cost", "p99").axes[0].lines[0].get_drawstyle() == "steps-post"
    drawn = pareto_front(candidates, "cost", "p99", maximize=["cost"]).axes[0].lines[0]
    assert drawn.get_drawstyle() == "steps-pre"
    assert _xy(drawn) == ([3.0, 4.0], [1.0, 2.0])


def test_pareto_front_bad_mask_is_an_error(candidates):
    """A mask whose length is not the frame's is a ValueError."""
    with pytest.raises(ValueError, match="one boolean per row"):
        pareto_front(candidates, "cost", "p99", [True, False])


# --- calibration_qq ----------------------------------------------------------------
def test_calibration_qq_points_are_the_reports_quantiles():
    """The points are each sample's quantiles at (i + 0.5) / QQ_POINTS, after the y = x line."""
    from simpy_llm.calibrate.stats import QQ_POINTS

    rng = np.random.default_rng(1)
    observed, predicted = rng.exponential(1.0, 300), rng.exponential(1.2, 200)
    diagonal, points = calibration_qq(observed, predicted, metric="ttft").axes[0].lines
    probs = (np.arange(QQ_POINTS) + 0.5) / QQ_POINTS
    np.testing.assert_allclose(points.get_xdata(), np.quantile(observed, probs))
    np.testing.assert_allclose(points.get_ydata(), np.quantile(predicted, probs))
    assert diagonal.get_label() == "y = x"
    np.testing.assert_array_equal(diagonal.get_xdata(), diagonal.get_ydata())


def test_calibration_qq_of_a_comparison():
    """A MetricComparison's own QQ points are plotted as they are, named by its metric."""
    from simpy_llm.calibrate.stats import compare_metric

    rng = np.random.default_rng(2)
    obs = rng.uniform(0.1, 1.0, 50)
    comparison = compare_metric("ttft", obs, obs * 1.1, n_resamples=10)
    ax = calibration_qq(comparison).axes[0]
    assert ax.lines[1].get_xdata().tolist() == list(comparison.qq_observed)
    assert ax.lines[1].get_ydata().tolist() == list(comparison.qq_simulated)
    assert "TTFT" in ax.get_xlabel()


def test_calibration_qq_empty_sample_is_an_error():
    """A sample without values (after NaN are left out) is a ValueError naming it."""
    with pytest.raises(ValueError, match="predicted has no values"):
        calibration_qq([1.0, 2.0], [NAN])


# --- overloaded rows ---------------------------------------------------------------
@pytest.fixture
def flagged(sweep_frame) -> pd.DataFrame:
    """The sweep frame with a sweep's overload flag: the fifo runs at k = 4 and 2 overloaded,
    the edf run at k = 1 too short to judge (NaN)."""
    return sweep_frame.assign(overloaded=[1.0, 0.0, 1.0, 0.0, 0.0, NAN])


def _crosses(ax):
    return [(c.get_label(), c.get_offsets().tolist()) for c in ax.collections if c.get_label() == "overloaded"]


def test_line_crosses_out_the_overloaded_runs(flagged):
    """Each overloaded row is crossed at its own (x, y), under the legend entry ``overloaded``;
    rows flagged 0 or NaN are not."""
    ax = line(flagged, "k", "throughput", hue="policy").axes[0]
    assert _crosses(ax) == [("overloaded", [[4.0, 3.0], [2.0, 1.8]])]
    assert "overloaded" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_pareto_front_and_throughput_latency_cross_out_the_overloaded_runs(flagged):
    """The other sweep plots mark the same rows; mark=None draws no marks."""
    assert _crosses(pareto_front(flagged, "k", "throughput").axes[0]) == [("overloaded", [[4.0, 3.0], [2.0, 1.8]])]
    assert _crosses(throughput_latency(flagged, "throughput", "k").axes[0]) == [("overloaded", [[3.0, 4.0], [1.8, 2.0]])]
    assert _crosses(line(flagged, "k", "throughput", mark=None).axes[0]) == []


# --- without matplotlib ------------------------------------------------------------
def test_missing_matplotlib_names_the_plots_extra(monkeypatch, sweep_frame):
    """Without matplotlib a plot raises ImportError naming the plots extra; the numbers still work."""
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    with pytest.raises(ImportError, match=r"simpy-llm\[plots\]"):
        line(sweep_frame, "k", "throughput")
    assert len(sla_attainment(pd.DataFrame({"replica": [0], "size": [1], "end_s": [0.5], "service_s": [0.1]}), 0.5, 1.0)) == 1
