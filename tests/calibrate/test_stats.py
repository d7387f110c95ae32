"""The comparison statistics against independent numpy/scipy computations, the bootstrap's
coverage of a known population value, the quality table at its boundaries, and the edge cases."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

import simpy_llm.calibrate.stats as stats_module
from simpy_llm.calibrate.stats import METRICS, MetricComparison, compare_metric, rate, to_dict, valid_pairs

EXACT = 1e-12
"""Relative tolerance where the test recomputes a statistic with the same arithmetic in another
order (sums of a few hundred float64 values): rounding differs by a few ulps, far below this."""

PCT_KEYS = ("p50", "p90", "p95", "p99")


def _pairs(n: int, seed: int, sigma: float = 0.25, mu: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Lognormal observed latencies and simulated ones off by a lognormal factor."""
    rng = np.random.default_rng(seed)
    obs = rng.lognormal(-2.0, 0.8, n)
    return obs, obs * np.exp(rng.normal(mu, sigma, n))


def _population_mape(mu: float, sigma: float) -> float:
    """E|exp(Z) - 1| for Z ~ N(mu, sigma^2), in closed form: split at Z = 0 and use
    E[exp(Z) 1{Z > 0}] = exp(mu + sigma^2/2) Phi((mu + sigma^2) / sigma)."""
    a = (mu + sigma * sigma) / sigma
    phi = scipy.stats.norm.cdf
    return math.exp(mu + sigma * sigma / 2) * (phi(a) - phi(-a)) - phi(mu / sigma) + phi(-mu / sigma)


# --- point statistics against independent references --------------------------------------
def test_mape_median_ape_and_bias_equal_numpy_formulas():
    """MAPE, median APE and bias are mean |s-o|/o, median |s-o|/o and mean (s-o)/o, as numpy computes them."""
    obs, sim = _pairs(500, 1)
    c = compare_metric("e2e", obs, sim, n_resamples=50)
    assert c.mape == pytest.approx(np.mean(np.abs(sim - obs) / obs), rel=EXACT)
    assert c.median_ape == pytest.approx(np.median(np.abs(sim / obs - 1.0)), rel=EXACT)
    assert c.bias == pytest.approx(np.mean(sim / obs - 1.0), rel=1e-9)


def test_pearson_and_spearman_equal_scipy():
    """pearson_r and spearman_r equal scipy.stats.pearsonr and spearmanr, ties included."""
    obs, sim = _pairs(400, 2, sigma=0.6)
    sim = np.round(sim, 2)  # ties on the simulated side: Spearman's mean ranks
    c = compare_metric("ttft", obs, sim, n_resamples=50)
    assert c.pearson_r == pytest.approx(scipy.stats.pearsonr(obs, sim).statistic, rel=EXACT)
    assert c.spearman_r == pytest.approx(scipy.stats.spearmanr(obs, sim).statistic, rel=EXACT)


def test_percentile_errors_equal_numpy_percentile():
    """Each percentile error is (sim_q - obs_q) / obs_q with numpy.percentile of each side."""
    obs, sim = _pairs(333, 3, sigma=0.4)
    c = compare_metric("tpot", obs, sim, n_resamples=50)
    for key, q in zip(PCT_KEYS, (50, 90, 95, 99), strict=True):
        qo, qs = np.percentile(obs, q), np.percentile(sim, q)
        assert c.percentile_error[key] == pytest.approx((qs - qo) / qo, rel=1e-9)


def test_quantiles_and_qq_points_equal_numpy():
    """The quantiles are numpy's mean and percentiles; the QQ points numpy.quantile at (i + 0.5)/100."""
    obs, sim = _pairs(250, 4)
    c = compare_metric("e2e", obs, sim, n_resamples=50)
    assert c.observed.mean == pytest.approx(obs.mean(), rel=EXACT)
    assert c.simulated.p99 == pytest.approx(np.percentile(sim, 99), rel=EXACT)
    probs = (np.arange(100) + 0.5) / 100
    np.testing.assert_allclose(c.qq_observed, np.quantile(obs, probs), rtol=EXACT)
    np.testing.assert_allclose(c.qq_simulated, np.quantile(sim, probs), rtol=EXACT)
    assert len(c.qq_observed) == len(c.qq_simulated) == 100


def test_ks_of_identical_samples_is_zero_with_p_one():
    """Two identical samples give KS D = 0 and p = 1."""
    obs, _ = _pairs(300, 5)
    c = compare_metric("e2e", obs, obs.copy(), n_resamples=50)
    assert (c.ks_statistic, c.ks_pvalue) == (0.0, 1.0)


def test_ks_equals_scipy_and_rejects_a_shifted_distribution():
    """KS equals scipy's ks_2samp, and 2000 pairs whose simulated side is 30 % slower reject sameness."""
    obs, sim = _pairs(2000, 6, sigma=0.1, mu=math.log(1.3))
    c = compare_metric("e2e", obs, sim, n_resamples=50)
    ref = scipy.stats.ks_2samp(obs, sim)
    assert c.ks_statistic == pytest.approx(ref.statistic, rel=EXACT)
    assert c.ks_pvalue == pytest.approx(ref.pvalue, rel=1e-9)
    assert c.ks_pvalue < 1e-6


def test_ks_does_not_reject_two_samples_of_one_distribution():
    """Observed and simulated drawn independently from one distribution: p well above 0.05."""
    rng = np.random.default_rng(7)
    c = compare_metric("e2e", rng.lognormal(size=2000), rng.lognormal(size=2000), n_resamples=50)
    assert c.ks_pvalue > 0.05


# --- bootstrap ----------------------------------------------------------------------------
def test_closed_form_population_mape_matches_a_huge_sample():
    """The closed form used by the coverage test agrees with the mean of 10^6 draws within 5 standard errors."""
    rng = np.random.default_rng(11)
    ape = np.abs(np.exp(rng.normal(0.05, 0.3, 1_000_000)) - 1.0)
    se = ape.std() / math.sqrt(ape.size)
    assert abs(ape.mean() - _population_mape(0.05, 0.3)) < 5 * se


@pytest.mark.slow
def test_mape_interval_covers_the_population_value_at_the_nominal_rate():
    """Over 400 independent samples of 200 lognormal pairs, the 95 % MAPE interval covers the
    population MAPE (closed form) in 95 % of them, within a binomial band.

    With a correct interval the number of covers is Binomial(400, 0.95): standard deviation
    sqrt(400 * 0.95 * 0.05) = 4.36. The band is +-3.5 standard deviations, 365 to 395 covers
    (a correct interval falls outside it with probability < 0.1 %). The percentile bootstrap is
    first-order accurate and undercovers a little for this skewed statistic at n = 200: these
    seeds give 374 covers (93.5 %), 1.4 standard deviations low, well inside the band, while an
    interval half as wide as it should be would cover about 67 %. Seeds are fixed, so the
    count is too."""
    mu, sigma, n, reps = 0.05, 0.3, 200, 400
    true = _population_mape(mu, sigma)
    covers = 0
    for i in range(reps):
        rng = np.random.default_rng([2024, i])
        obs = rng.lognormal(-2.0, 0.8, n)
        sim = obs * np.exp(rng.normal(mu, sigma, n))
        lo, hi = compare_metric("e2e", obs, sim, seed=i).mape_ci
        covers += lo <= true <= hi
    sd = math.sqrt(reps * 0.95 * 0.05)
    assert abs(covers - 0.95 * reps) <= 3.5 * sd, covers


def test_mape_interval_width_matches_normal_theory():
    """At n = 2000 the 95 % MAPE interval is as wide as 2 x 1.96 x the standard error of a mean,
    within 15 % (the bootstrap's own estimate of that error varies by a few percent)."""
    obs, sim = _pairs(2000, 8, sigma=0.3)
    c = compare_metric("e2e", obs, sim)
    ape = np.abs(sim - obs) / obs
    expected = 2 * 1.959964 * ape.std(ddof=1) / math.sqrt(ape.size)
    assert (c.mape_ci[1] - c.mape_ci[0]) == pytest.approx(expected, rel=0.15)
    assert c.mape_ci[0] < c.mape < c.mape_ci[1]


def test_bootstrap_batches_do_not_change_the_intervals(monkeypatch):
    """Splitting the resamples into small batches (as large inputs are) gives the same intervals."""
    obs, sim = _pairs(500, 9)
    whole = compare_metric("itl", obs, sim, n_resamples=300)
    monkeypatch.setattr(stats_module, "_BATCH_ELEMENTS", 500 * 7)
    assert compare_metric("itl", obs, sim, n_resamples=300) == whole


def test_same_inputs_and_seed_give_equal_results_and_another_seed_other_intervals():
    """compare_metric is deterministic for a seed; the seed drives the resampling."""
    obs, sim = _pairs(120, 10)
    a = compare_metric("ttft", obs, sim, seed=3, n_resamples=200)
    assert compare_metric("ttft", obs, sim, seed=3, n_resamples=200) == a
    b = compare_metric("ttft", obs, sim, seed=4, n_resamples=200)
    assert b.mape == a.mape and b.mape_ci != a.mape_ci


def test_confidence_level_widens_the_intervals():
    """A 99 % interval contains the 80 % one of the same resamples."""
    obs, sim = _pairs(300, 12)
    wide = compare_metric("e2e", obs, sim, confidence_level=0.99, n_resamples=400)
    narrow = compare_metric("e2e", obs, sim, confidence_level=0.80, n_resamples=400)
    assert wide.mape_ci[0] < narrow.mape_ci[0] < narrow.mape_ci[1] < wide.mape_ci[1]
    assert wide.confidence_level == 0.99


def test_pearson_interval_leaves_out_resamples_where_r_is_undefined():
    """With one distinct pair among ties, many resamples are constant: r's interval comes from
    the others, and the warnings count the undefined ones."""
    obs = np.r_[np.full(9, 1.0), 2.0]
    sim = np.r_[np.full(9, 1.1), 2.6]
    c = compare_metric("ttft", obs, sim, n_resamples=500)
    assert c.pearson_r == pytest.approx(1.0)
    assert c.pearson_ci == pytest.approx((1.0, 1.0))
    assert any("undefined in" in w and "of 500 resamples" in w for w in c.warnings)


# --- bias direction -----------------------------------------------------------------------
def test_bias_direction_follows_the_sign_of_a_clear_bias():
    """Simulated values 20 % high are an over-prediction, 20 % low an under-prediction."""
    obs, _ = _pairs(200, 13)
    noise = np.exp(np.random.default_rng(13).normal(0.0, 0.05, 200))
    assert compare_metric("e2e", obs, obs * 1.2 * noise, n_resamples=200).bias_direction == "over-predict"
    assert compare_metric("e2e", obs, obs * 0.8 * noise, n_resamples=200).bias_direction == "under-predict"


def test_bias_direction_is_neutral_when_the_interval_contains_zero():
    """Errors of +10 % and -10 % in turn: bias 0, its interval contains 0, direction neutral."""
    obs, _ = _pairs(200, 14)
    sim = obs * np.where(np.arange(200) % 2 == 0, 1.1, 0.9)
    c = compare_metric("e2e", obs, sim, n_resamples=200)
    assert c.bias_ci[0] <= 0.0 <= c.bias_ci[1]
    assert c.bias_direction == "neutral"


# --- the quality table ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("mape", "grade"),
    [(0.0, "excellent"), (0.0999, "excellent"), (0.10, "good"), (0.1001, "good"), (0.1999, "good"),
     (0.20, "fair"), (0.2001, "fair"), (0.3499, "fair"), (0.35, "poor"), (0.3501, "poor"), (5.0, "poor")],
)
def test_mape_grades_at_and_around_each_boundary(mape, grade):
    """With a perfect r, the grade is MAPE's: a value exactly on a boundary gets the worse grade."""
    assert rate(mape, 1.0) == grade


@pytest.mark.parametrize(
    ("r", "grade"),
    [(1.0, "excellent"), (0.9501, "excellent"), (0.95, "good"), (0.9499, "good"), (0.8501, "good"),
     (0.85, "fair"), (0.8499, "fair"), (0.7001, "fair"), (0.70, "poor"), (0.6999, "poor"), (-1.0, "poor")],
)
def test_pearson_grades_at_and_around_each_boundary(r, grade):
    """With MAPE 0, the grade is r's: a value exactly on a boundary gets the worse grade."""
    assert rate(0.0, r) == grade


@pytest.mark.parametrize(
    ("mape", "r", "grade"),
    [(0.15, 0.99, "good"), (0.05, 0.90, "good"), (0.05, 0.5, "poor"), (0.5, 0.99, "poor"), (0.25, 0.9, "fair")],
)
def test_rating_is_the_worse_of_the_two_grades(mape, r, grade):
    """The rating is the worse of the MAPE grade and the r grade."""
    assert rate(mape, r) == grade


def test_rating_without_r_is_the_mape_grade():
    """With r undefined the MAPE grade alone decides."""
    assert [rate(m, None) for m in (0.05, 0.15, 0.25, 0.5)] == ["excellent", "good", "fair", "poor"]


@pytest.mark.parametrize(("mape", "r"), [(-0.1, None), (float("nan"), None), (float("inf"), 0.9), (0.1, 1.5), (0.1, float("nan")), (None, 0.9)])
def test_rate_rejects_values_outside_their_domain(mape, r):
    """A negative or non-finite MAPE, or an r outside [-1, 1], is an error naming the argument."""
    with pytest.raises(ValueError, match=r"mape|pearson_r"):
        rate(mape, r)


# --- edge cases -----------------------------------------------------------------------------
def test_identical_arrays_are_a_perfect_excellent_match():
    """Identical observed and simulated values: MAPE 0, r 1, D 0, neutral, excellent, no warning."""
    obs, _ = _pairs(100, 15)
    c = compare_metric("ttft", obs, obs.copy(), n_resamples=200)
    assert (c.mape, c.median_ape, c.bias, c.pearson_r, c.spearman_r, c.ks_statistic) == (0.0, 0.0, 0.0, 1.0, 1.0, 0.0)
    assert c.mape_ci == (0.0, 0.0)
    assert (c.bias_direction, c.rating, c.warnings) == ("neutral", "excellent", ())


def test_no_pairs_give_none_everywhere_and_no_rating():
    """n = 0: every statistic is None, the QQ points empty, the rating None, and a warning says so."""
    c = compare_metric("itl", [], [])
    assert c.n == 0 and c.rating is None and c.bias_direction is None
    assert all(getattr(c, f) is None for f in ("observed", "simulated", "mape", "median_ape", "bias", "pearson_r",
                                               "spearman_r", "ks_statistic", "ks_pvalue", "mape_ci", "bias_ci", "pearson_ci"))
    assert c.qq_observed == c.qq_simulated == ()
    assert set(c.percentile_error.values()) == set(c.percentile_error_ci.values()) == {None}
    assert "No valid pairs of itl" in c.warnings[0]


def test_one_pair_has_errors_but_no_intervals_and_no_r():
    """n = 1: quantiles, MAPE and KS exist; no interval, no r, no direction; the rating is MAPE's."""
    c = compare_metric("e2e", [2.0], [2.5])
    assert c.n == 1 and c.mape == 0.25 and c.observed.p99 == 2.0 and c.ks_statistic == 1.0
    assert c.mape_ci is None and c.pearson_r is None and c.bias_direction is None
    assert c.rating == "fair"
    assert any("no confidence intervals" in w for w in c.warnings)


def test_two_pairs_have_intervals_but_no_r():
    """n = 2: the bootstrap runs; r is undefined (two points always lie on a line)."""
    c = compare_metric("e2e", [1.0, 2.0], [1.1, 2.2], n_resamples=100)
    assert c.pearson_r is None and c.spearman_r is None and c.pearson_ci is None
    assert c.mape_ci == pytest.approx((0.1, 0.1))
    assert c.rating == "good"


def test_nan_infinite_and_non_positive_observed_pairs_are_left_out_and_counted():
    """Pairs with NaN, inf or an observed value <= 0 are dropped; the warning gives each count."""
    obs = [0.1, np.nan, 0.2, 0.0, -0.3, 0.4, 0.5]
    sim = [0.1, 0.2, np.inf, 0.1, 0.1, np.nan, 0.6]
    c = compare_metric("ttft", obs, sim, n_resamples=50)
    assert c.n == 2
    assert c.mape == pytest.approx((0.0 + 0.2) / 2)
    assert "Left out 5 of 7 pairs: 3 with a NaN or infinite value, 2 with an observed value <= 0." in c.warnings


def test_pandas_missing_values_count_as_nan():
    """A nullable pandas column's <NA> is a missing value, left out like NaN."""
    obs = pd.Series([0.1, None, 0.3], dtype="Float64")
    sim = pd.Series([0.2, 0.2, 0.3], dtype="Float64")
    o, s, non_finite, non_positive = valid_pairs(obs, sim)
    assert o.tolist() == [0.1, 0.3] and s.tolist() == [0.2, 0.3] and (non_finite, non_positive) == (1, 0)


def test_length_mismatch_is_an_error_giving_both_lengths():
    """Arrays that do not pair up one to one raise ValueError with both lengths."""
    with pytest.raises(ValueError, match="3 observed and 2 simulated"):
        compare_metric("e2e", [1.0, 2.0, 3.0], [1.0, 2.0])


def test_constant_sides_leave_r_undefined_and_rate_on_mape():
    """A constant observed (or simulated) side: r and its interval are None; the rating rests on MAPE."""
    obs, sim = _pairs(50, 16)
    for o, s in ((np.full(50, 0.2), sim), (obs, np.full(50, 0.2))):
        c = compare_metric("e2e", o, s, n_resamples=100)
        assert c.pearson_r is None and c.spearman_r is None and c.pearson_ci is None
        assert c.rating == rate(c.mape, None)
        assert any("all equal" in w for w in c.warnings)


def test_few_pairs_warn_of_insufficient_significance_in_the_metric_unit():
    """Below 30 pairs the warning of seed 000 §11 is given, in requests or (ITL) token gaps; not at 30."""
    obs, sim = _pairs(30, 17)
    assert "Insufficient requests for statistical significance (N < 30): N = 29." in compare_metric(
        "ttft", obs[:29], sim[:29], n_resamples=50).warnings
    assert any(w.startswith("Insufficient token gaps") for w in compare_metric("itl", obs[:29], sim[:29], n_resamples=50).warnings)
    assert not any("Insufficient" in w for w in compare_metric("ttft", obs, sim, n_resamples=50).warnings)


def test_an_interval_across_a_grade_boundary_is_flagged():
    """When the MAPE interval includes a grade boundary, a warning says the rating is uncertain."""
    rng = np.random.default_rng(18)
    obs = rng.lognormal(size=60)
    sim = obs * (1.0 + rng.choice([-1.0, 1.0], 60) * rng.uniform(0.0, 0.2, 60))  # MAPE about 10 %
    c = compare_metric("e2e", obs, sim, n_resamples=300)
    assert c.mape_ci[0] < 0.10 <= c.mape_ci[1]
    assert any("includes the 10% boundary between excellent and good" in w for w in c.warnings)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"metric": "latency"}, "metric must be one of ttft, itl, tpot, e2e"), ({"n_resamples": 0}, "n_resamples"),
     ({"confidence_level": 1.0}, "confidence_level"), ({"seed": -1}, "seed")],
)
def test_bad_arguments_are_errors_naming_what_is_allowed(kwargs, match):
    """An unknown metric, zero resamples, a confidence level of 1 or a negative seed raise ValueError."""
    args = {"metric": "e2e", **kwargs}
    metric = args.pop("metric")
    with pytest.raises(ValueError, match=match):
        compare_metric(metric, [1.0, 2.0], [1.0, 2.0], **args)


def test_two_dimensional_input_is_an_error():
    """A 2-D array is not a list of pairs."""
    with pytest.raises(ValueError, match="one-dimensional"):
        compare_metric("e2e", np.ones((2, 2)), np.ones((2, 2)))


# --- plain data -----------------------------------------------------------------------------
def _builtin_only(value) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _builtin_only(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_builtin_only(v) for v in value)
    return value is None or type(value) in (bool, int, float, str)


def test_to_dict_is_json_ready_builtin_data_with_every_field():
    """to_dict holds only dicts, lists and builtin scalars, has every field, and survives JSON unchanged."""
    obs, sim = _pairs(80, 19)
    c = compare_metric("tpot", obs, sim, n_resamples=100)
    d = to_dict(c)
    assert _builtin_only(d)
    assert set(d) == {f.name for f in MetricComparison.__attrs_attrs__}
    assert json.loads(json.dumps(d, allow_nan=False)) == d
    assert d["observed"]["p90"] == c.observed.p90 and d["percentile_error_ci"]["p99"] == list(c.percentile_error_ci["p99"])


def test_metrics_are_the_four_of_the_seed():
    """The metrics compared are TTFT, ITL, TPOT and E2E."""
    assert METRICS == ("ttft", "itl", "tpot", "e2e")


# --- properties -------------------------------------------------------------------------------
_latency = st.floats(min_value=1e-6, max_value=1e4, allow_nan=False, allow_infinity=False)


@settings(max_examples=60)
@given(st.lists(st.tuples(_latency, _latency), min_size=0, max_size=40), st.integers(0, 2**16))
def test_properties_hold_for_any_positive_pairs(pairs, seed):
    """For any finite positive pairs: MAPE, median APE >= 0; |bias| <= MAPE; r within [-1, 1];
    every interval ordered low <= high; quantiles ordered; KS D and p within [0, 1]."""
    obs = [o for o, _ in pairs]
    sim = [s for _, s in pairs]
    c = compare_metric("e2e", obs, sim, seed=seed, n_resamples=40)
    assert c.n == len(pairs)
    if c.n == 0:
        assert c.rating is None
        return
    assert c.mape >= 0 and c.median_ape >= 0
    assert abs(c.bias) <= c.mape * (1 + 1e-9) + 1e-300
    for r in (c.pearson_r, c.spearman_r):
        assert r is None or -1.0 <= r <= 1.0
    intervals = [c.mape_ci, c.bias_ci, c.pearson_ci, *c.percentile_error_ci.values()]
    assert all(ci is None or ci[0] <= ci[1] for ci in intervals)
    if c.n >= 2:
        assert c.mape_ci[0] >= 0
    for q in (c.observed, c.simulated):
        assert q.p50 <= q.p90 <= q.p95 <= q.p99
    assert 0.0 <= c.ks_statistic <= 1.0 and 0.0 <= c.ks_pvalue <= 1.0
    assert c.rating in ("excellent", "good", "fair", "poor")
