"""The ``distribution`` arrival process: gaps from any registered length distribution, rescaled to the rate.

Fixed seeds and 200,000 gaps per statistical test. The measured rate and gap CV are
checked against the distribution's to 5 standard errors: the mean gap's standard
error is ``cv / (rate sqrt(n))``; the sample CV's comes from the delta method with
the distribution's third and fourth central moments (scipy). Gap shapes are checked
by KS against the rescaled scipy distribution at 1%.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from simpy_llm.config import ScenarioError
from simpy_llm.config.errors import FieldValueError
from simpy_llm.loading import scenario_from_dict, scenario_to_dict
from simpy_llm.workload.arrivals import (
    MAX_NEGATIVE_GAP_SHARE,
    DistributionArrivals,
    OnOffArrivals,
    RateWindow,
    WindowedArrivals,
    arrival_processes,
)
from simpy_llm.workload.distributions import (
    Constant,
    Empirical,
    Exponential,
    Gamma,
    LogNormal,
    Normal,
    Pareto,
    SamplingError,
    Uniform,
)
from tests.helpers import run, tiny_scenario

N = 200_000
RATE = 20.0
ARRIVAL = "workload.clients[0].arrival"

# (distribution, the same distribution in scipy): their mean, variance, skew and kurtosis agree.
CASES: dict[str, tuple[Any, Any]] = {
    "uniform": (Uniform(low=0.5, high=1.5), stats.uniform(loc=0.5, scale=1.0)),
    "gamma-bursty": (Gamma(shape=0.25, scale=2.0), stats.gamma(a=0.25, scale=2.0)),
    "lognormal": (LogNormal(mu=0.0, sigma=0.8), stats.lognorm(s=0.8)),
    "empirical": (Empirical.from_pmf({1: 0.5, 3: 0.5}), stats.rv_discrete(values=([1, 3], [0.5, 0.5]))),
}


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _times(process: Any, seed: int, rate: float, n: int, chunk: int) -> np.ndarray:
    """The first *n* arrival times, drawn *chunk* at a time."""
    out, total = [], 0
    for t in process.times(_rng(seed), rate, chunk):
        out.append(t)
        total += len(t)
        if total >= n:
            break
    return np.concatenate(out)[:n]


def _cv_standard_error(ref: Any, n: int) -> float:
    """Standard error of the sample CV of *n* draws of *ref* (delta method)."""
    m, var, skew, kurt = (float(x) for x in ref.stats(moments="mvsk"))
    sd = math.sqrt(var)
    mu3, mu4 = skew * sd**3, (kurt + 3.0) * var**2
    return math.sqrt(((mu4 - var**2) / (4 * var * m**2) + var**2 / m**4 - mu3 / m**3) / n)


@pytest.mark.parametrize("name", list(CASES))
def test_declared_cv_is_the_distributions(name: str) -> None:
    """The process's cv is the distribution's sqrt(variance) / mean (scipy agrees)."""
    dist, ref = CASES[name]
    assert DistributionArrivals(gaps=dist).cv == pytest.approx(float(ref.std() / ref.mean()), rel=1e-9)


@pytest.mark.parametrize("name", list(CASES))
def test_measured_rate_matches_the_requested_rate(name: str) -> None:
    """Arrival times come at the requested rate, to 5 standard errors of the mean gap."""
    dist, _ref = CASES[name]
    p = DistributionArrivals(gaps=dist)
    t = _times(p, 10 + list(CASES).index(name), RATE, N, chunk=4096)
    mean_gap = float(t[-1]) / len(t)
    se = p.cv / (RATE * math.sqrt(len(t)))
    assert abs(mean_gap - 1 / RATE) < 5 * se, (mean_gap, 1 / RATE, se)


@pytest.mark.parametrize("name", list(CASES))
def test_measured_gap_cv_matches_the_distributions(name: str) -> None:
    """The CV of the gaps between arrival times is the distribution's, to 5 standard errors."""
    dist, ref = CASES[name]
    p = DistributionArrivals(gaps=dist)
    gaps = np.diff(np.concatenate(([0.0], _times(p, 20 + list(CASES).index(name), RATE, N, chunk=4096))))
    measured = float(gaps.std(ddof=1) / gaps.mean())
    assert abs(measured - p.cv) < 5 * _cv_standard_error(ref, len(gaps)), (measured, p.cv)


@pytest.mark.parametrize("name", ["uniform", "gamma-bursty", "lognormal"])
def test_gaps_have_the_distributions_shape_at_mean_one_over_rate(name: str) -> None:
    """Gaps pass KS against the scipy distribution scaled by (1 / rate) / mean."""
    dist, ref = CASES[name]
    g = DistributionArrivals(gaps=dist).gaps(_rng(30), RATE, N // 2)
    m, _v, _s, _k = ref.stats(moments="mvsk")
    scale = (1 / RATE) / float(m)
    result = stats.kstest(g, lambda x: ref.cdf(x / scale))
    assert result.pvalue > 0.01, result


def test_only_the_shape_of_the_distribution_matters() -> None:
    """A distribution and the same one in other units (x100) give the same gaps for one seed."""
    a = DistributionArrivals(gaps=Uniform(low=0.5, high=1.5)).gaps(_rng(40), RATE, 1000)
    b = DistributionArrivals(gaps=Uniform(low=50.0, high=150.0)).gaps(_rng(40), RATE, 1000)
    np.testing.assert_allclose(a, b, rtol=1e-12)
    assert a.min() >= 0.5 / RATE and a.max() < 1.5 / RATE


def test_chunked_generation_gives_the_same_times_for_any_chunk_size() -> None:
    """Drawing 1,000, 4,096 or 65,536 arrivals at a time gives the same times (to float rounding)."""
    p = DistributionArrivals(gaps=Gamma(shape=0.5, scale=3.0))
    ref = _times(p, 50, RATE, 3 * 65_536, chunk=65_536)
    for chunk in (1000, 4096):
        np.testing.assert_allclose(_times(p, 50, RATE, len(ref), chunk=chunk), ref, rtol=1e-12)


def test_chunks_have_exactly_chunk_times_in_increasing_order() -> None:
    """Each chunk has exactly *chunk* times; times do not decrease across chunks."""
    it = DistributionArrivals(gaps=Empirical.from_pmf({0: 0.2, 1: 0.8})).times(_rng(60), RATE, 1000)
    chunks = [next(it) for _ in range(20)]
    assert all(len(c) == 1000 for c in chunks)
    assert np.all(np.diff(np.concatenate(chunks)) >= 0)


def test_arrivals_are_reproducible_for_a_seed() -> None:
    """The same seed gives the same arrival times; another seed does not."""
    p = DistributionArrivals(gaps=LogNormal(mu=0.0, sigma=1.0))
    a = next(p.times(_rng(70), 10.0, 5000))
    np.testing.assert_array_equal(a, next(p.times(_rng(70), 10.0, 5000)))
    assert not np.array_equal(a, next(p.times(_rng(71), 10.0, 5000)))


def test_constant_gaps_are_evenly_spaced() -> None:
    """A constant distribution gives gaps of exactly 1 / rate whatever its value."""
    t = next(DistributionArrivals(gaps=Constant(value=7.0)).times(_rng(0), 4.0, 4))
    np.testing.assert_allclose(t, [0.25, 0.5, 0.75, 1.0], rtol=1e-12)


def test_inside_windows_each_window_keeps_its_rate() -> None:
    """As a window's process (restarted per window) the distribution keeps each window's rate (5 SE)."""
    proc = DistributionArrivals(gaps=Uniform(low=0.5, high=1.5))
    w = WindowedArrivals(window_s=100, windows=(RateWindow(start_s=0, rate=1, process=proc), RateWindow(start_s=100, rate=3, process=proc)))
    t = _times(w, 80, RATE, 400_000, chunk=65_536)
    cycles = math.floor(float(t[-1]) / w.cycle_s)
    t = t[t < cycles * w.cycle_s]
    phase = np.mod(t, w.cycle_s)
    rates = w.window_rates(RATE)
    for i, (lo, hi) in enumerate(((0, 100), (100, 200))):
        count = int(((phase >= lo) & (phase < hi)).sum())
        expected = rates[i] * 100 * cycles
        # per-window counts of a regular renewal process vary less than Poisson counts
        assert abs(count - expected) < 5 * math.sqrt(expected), (i, count, expected)


def test_inside_on_off_periods_the_long_run_rate_holds() -> None:
    """As the process inside long ON periods, the long-run rate is the requested one (2%)."""
    p = OnOffArrivals(
        on_duration=Constant(value=50.0), off_duration=Constant(value=50.0), on_process=DistributionArrivals(gaps=Gamma(shape=4.0, scale=1.0))
    )
    t = _times(p, 90, RATE, 200_000, chunk=65_536)
    assert len(t) / float(t[-1]) == pytest.approx(RATE, rel=0.02)


# --------------------------------------------------------------------------- config


def _load(arrival: Any) -> Any:
    data = tiny_scenario()
    data["workload"]["clients"][0]["arrival"] = arrival
    return scenario_from_dict(data)


UNIFORM_GAPS = {"process": "distribution", "gaps": {"type": "uniform", "params": {"low": 0.5, "high": 1.5}}}


def test_loads_from_yaml_and_round_trips() -> None:
    """``{process: distribution, gaps: {...}}`` loads into DistributionArrivals and survives
    scenario_to_dict -> scenario_from_dict, written back under the key ``gaps``."""
    scenario = _load(UNIFORM_GAPS)
    arrival = scenario.workload.clients[0].arrival
    assert arrival == DistributionArrivals(gaps=Uniform(low=0.5, high=1.5))
    assert arrival_processes.get("distribution") is DistributionArrivals
    written = scenario_to_dict(scenario)
    assert written["workload"]["clients"][0]["arrival"] == {"process": "distribution", "gaps": UNIFORM_GAPS["gaps"]}
    assert scenario_from_dict(written) == scenario


def test_drives_a_simulation() -> None:
    """A small scenario whose client uses the process runs to completion."""
    data = tiny_scenario()
    data["workload"]["clients"][0]["arrival"] = UNIFORM_GAPS
    s = run(data).summary()
    assert s["requests"]["arrived"] == 50 and s["requests"]["completed"] == 50


def test_a_length_distribution_as_the_process_points_to_distribution() -> None:
    """``{process: uniform}`` stays an error, lists ``distribution`` among the processes and
    suggests the form that draws gaps from the uniform distribution."""
    with pytest.raises(ScenarioError) as info:
        _load({"process": "uniform"})
    assert info.value.paths == [f"{ARRIVAL}.process"]
    message = info.value.problems[0][1]
    assert "unknown arrival process 'uniform'" in message
    assert "distribution, gamma" in message  # in the list of allowed processes
    assert "{process: distribution, gaps: {type: uniform, params: {...}}}" in message


def test_an_unknown_name_that_is_no_distribution_gets_no_suggestion() -> None:
    """A process name that is not a length distribution either is reported without the suggestion."""
    with pytest.raises(ScenarioError) as info:
        _load({"process": "burst"})
    assert "distribution, gamma" in info.value.problems[0][1]
    assert "gaps:" not in info.value.problems[0][1]


BAD = [
    ({"process": "distribution"}, f"{ARRIVAL}.gaps", "required key is missing"),
    ({"process": "distribution", "gaps": {"type": "pareto", "params": {"alpha": 1.0, "xm": 1.0}}}, f"{ARRIVAL}.gaps", "finite and > 0"),
    ({"process": "distribution", "gaps": {"type": "normal", "params": {"mean": 0.0, "std_dev": 0.0}}}, f"{ARRIVAL}.gaps", "finite and > 0"),
    ({"process": "distribution", "gaps": {"type": "uniform", "params": {"low": -1.0, "high": 1.5}}}, f"{ARRIVAL}.gaps", "negative gap"),
    ({"process": "distribution", "gaps": {"type": "normal", "params": {"mean": 1.0, "std_dev": 1.0}}}, f"{ARRIVAL}.gaps", "negative gap"),
    ({"process": "distribution", "gaps": {"type": "empirical", "params": {"pmf": {-1: 0.5, 3: 0.5}}}}, f"{ARRIVAL}.gaps", "negative gap"),
    ({"process": "distribution", "gaps": {"type": "zipf"}}, f"{ARRIVAL}.gaps.type", "unknown length distribution"),
    ({"process": "distribution", "gaps": {"type": "uniform", "params": {"low": 1.0, "high": 0.5}}}, f"{ARRIVAL}.gaps.params.high", "must be > low"),
    ({"process": "distribution", "gaps": UNIFORM_GAPS["gaps"], "cv": 2.0}, f"{ARRIVAL}.cv", "unknown key"),
]


@pytest.mark.parametrize(("arrival", "path", "message"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_gaps_raise_scenario_error_with_path(arrival: dict, path: str, message: str) -> None:
    """A missing, unknown or unusable gap distribution is rejected at its key path."""
    with pytest.raises(ScenarioError) as info:
        _load(arrival)
    assert info.value.paths == [path]
    assert message in info.value.problems[0][1]


def test_a_rare_negative_draw_is_allowed_and_counts_as_zero() -> None:
    """A distribution drawing negative values rarely (below MAX_NEGATIVE_GAP_SHARE) is accepted;
    its negative draws become gaps of 0, so times never decrease."""
    dist = Normal(mean=1.0, std_dev=0.32)  # P(< 0) = 9e-4
    assert stats.norm.cdf(0, loc=1.0, scale=0.32) < MAX_NEGATIVE_GAP_SHARE
    g = DistributionArrivals(gaps=dist).gaps(_rng(100), RATE, N)
    assert (g == 0).sum() > 0 and g.min() == 0.0


def test_non_finite_draws_raise_sampling_error_naming_the_distribution() -> None:
    """A (user) distribution that draws NaN stops the run with SamplingError naming it."""

    class Broken:
        mean = 1.0
        variance = 1.0

        def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
            return np.full(n, np.nan)

    broken = Broken()
    with pytest.raises(SamplingError) as info:
        DistributionArrivals(gaps=broken).gaps(_rng(0), RATE, 3)
    assert info.value.distribution is broken


def test_something_that_is_not_a_distribution_is_rejected() -> None:
    """Built from Python with a non-distribution, the process says what it needs."""
    with pytest.raises(FieldValueError) as info:
        DistributionArrivals(gaps=Exponential)  # the class, not an instance
    assert info.value.field == "gaps" and "length distribution" in info.value.message


def test_infinite_variance_gives_an_infinite_cv() -> None:
    """A gap distribution with infinite variance (Pareto alpha <= 2) declares cv = inf and still runs."""
    p = DistributionArrivals(gaps=Pareto(alpha=1.5, xm=1.0))
    assert p.cv == math.inf
    t = next(p.times(_rng(5), RATE, 1000))
    assert np.all(np.diff(t) >= 0) and t[0] >= 0
