"""Modulated arrivals (on_off, windows) at rates so low that almost every period is empty.

Drawing every period there takes millions of draws per arrival (a run that never starts);
the processes instead draw the next period that holds an arrival directly, or refuse the
rate with an error naming them. The random generator is wrapped in a counter that fails
the test past a budget of values drawn, so the work per arrival is checked by counting,
not by timing.

Error analysis. With Poisson inside, the arrivals of a cycle of periods form a Poisson
process whose intensity follows the periods; the count in a time T holding whole cycles is
Poisson with mean rate x T (constant periods), or overdispersed by a factor
1 + O(r_on / switching rate) for exponential periods, which is below 1e-5 at the rates
used: 5 standard errors of the Poisson count are the tolerance. A window's chance of
holding an arrival is its gap's CDF at the window length (scipy), each cycle independent:
the number of windows holding one is binomial, again within 5 of its standard errors.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.config import ScenarioError
from simpy_llm.workload.arrivals import (
    MAX_PERIODS_PER_ARRIVAL,
    ConstantArrivals,
    GammaArrivals,
    OnOffArrivals,
    PoissonArrivals,
    RateWindow,
    WeibullArrivals,
    WindowedArrivals,
)
from simpy_llm.workload.distributions import (
    Constant,
    Exponential,
    LogNormal,
    SamplingError,
)
from tests.helpers import tiny_scenario


class CountingRng:
    """A numpy Generator that counts the values it draws and fails past *budget* of them."""

    def __init__(self, seed: int, budget: int) -> None:
        self._rng = np.random.default_rng(seed)
        self.budget = budget
        self.drawn = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._rng, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            out = method(*args, **kwargs)
            self.drawn += int(np.size(out))
            if self.drawn > self.budget:
                raise AssertionError(f"{self.drawn} values drawn, over the budget of {self.budget}")
            return out

        return counted


def _first(process: Any, rng: Any, rate: float, n: int, chunk: int = 4096) -> np.ndarray:
    """The first *n* arrival times (whole chunks)."""
    out, total = [], 0
    for t in process.times(rng, rate, chunk):
        out.append(t)
        total += len(t)
        if total >= n:
            break
    return np.concatenate(out)


def _assert_poisson_count(t: np.ndarray, rate: float, cycle_s: float) -> None:
    """The arrivals in the whole cycles before the last arrival number rate x T within 5 SE."""
    horizon = math.floor(t[-1] / cycle_s) * cycle_s
    count = int(np.count_nonzero(t < horizon))
    expected = rate * horizon
    assert abs(count - expected) < 5 * math.sqrt(expected), (count, expected)


N = 20_000


@pytest.mark.parametrize(
    ("process", "rate"),
    [
        (OnOffArrivals(on_duration=Constant(value=1.0), off_duration=Constant(value=1.0)), 1e-7),
        (OnOffArrivals(on_duration=Constant(value=2.0), off_duration=Constant(value=3.0), off_rate_ratio=0.25), 1e-9),
        (OnOffArrivals(on_duration=Exponential(mean=1.0), off_duration=Exponential(mean=3.0), off_rate_ratio=0.2), 1e-8),
        (OnOffArrivals(on_duration=Constant(value=1.0), off_duration=Exponential(mean=3.0)), 1e-8),
    ],
    ids=["constant", "constant-off-rate", "exponential", "mixed"],
)
def test_on_off_at_a_tiny_rate_draws_a_bounded_number_of_values_at_the_right_rate(process: OnOffArrivals, rate: float) -> None:
    """On/off arrivals (Poisson inside) at 1e-9..1e-7 requests/s, far below one arrival per cycle, come
    with at most 20 draws per arrival and number rate x T over whole cycles (5 SE of the Poisson count)."""
    rng = CountingRng(11, budget=20 * N)
    cycle = float(process.on_duration.mean) + float(process.off_duration.mean)
    t = _first(process, rng, rate, N)
    assert np.all(np.diff(t) >= 0) and t[0] > 0
    # For exponential periods T is not a whole number of cycles: the error is one cycle's
    # worth of arrivals, below 1e-6 of the count.
    _assert_poisson_count(t, rate, cycle)


def test_on_off_at_a_tiny_rate_has_no_arrival_in_silent_off_periods_and_spreads_over_on() -> None:
    """With constant ON [5k, 5k+2) and silent OFF, every arrival at 1e-6/s lies in an ON period,
    uniformly over it (KS), as a Poisson process restarted in each ON period. (Times reach 2e10 s,
    where float64 resolves 4e-6 s: an arrival just before an ON period's end may round onto it.)"""
    p = OnOffArrivals(on_duration=Constant(value=2.0), off_duration=Constant(value=3.0))
    t = _first(p, CountingRng(12, budget=20 * N), 1e-6, N)
    phase = np.mod(t, 5.0)
    assert phase.max() <= 2.0
    assert stats.kstest(phase, stats.uniform(loc=0.0, scale=2.0).cdf).pvalue > 0.01


WINDOWS = WindowedArrivals(
    window_s=10.0,
    windows=(
        RateWindow(start_s=5.0, rate=1.0),
        RateWindow(start_s=15.0, rate=0.0),
        RateWindow(start_s=30.0, rate=3.0, process=GammaArrivals(cv=2.0)),
    ),
)
"""Idle [0, 5); Poisson window [5, 15) weight 1; idle window [15, 30); gamma (cv 2) window [30, 40) weight 3."""


def test_windows_at_a_tiny_rate_hold_arrivals_as_their_gaps_cdf_says() -> None:
    """At 1e-6 requests/s (4e-5 expected arrivals per 40 s cycle) the windows draw at most 20 values
    per arrival; the Poisson window holds rate_A x 10 arrivals per cycle on average and the gamma
    window holds at least one in a share of cycles equal to its gap's CDF at 10 s (5 SE each)."""
    rate = 1e-6
    t = _first(WINDOWS, CountingRng(13, budget=20 * N), rate, N)
    cycles = math.floor(t[-1] / 40.0)
    t = t[t < cycles * 40.0]
    phase = np.mod(t, 40.0)
    assert np.all(((phase >= 5.0) & (phase < 15.0)) | (phase >= 30.0))  # never in the idle spans
    r_a, _, r_b = WINDOWS.window_rates(rate).tolist()
    in_a = int(np.count_nonzero(phase < 15.0))
    assert abs(in_a - r_a * 10.0 * cycles) < 5 * math.sqrt(r_a * 10.0 * cycles)
    busy_b = len(np.unique(np.floor(t[phase >= 30.0] / 40.0)))
    p_b = float(stats.gamma(a=0.25, scale=4.0 / r_b).cdf(10.0))
    assert abs(busy_b - p_b * cycles) < 5 * math.sqrt(p_b * (1 - p_b) * cycles)


def test_windows_of_weibull_and_constant_skip_exactly() -> None:
    """Weibull and constant windows at 1e-6/s: a window holds an arrival in a share of cycles equal
    to its gap's CDF (scipy's weibull_min; a constant gap of 1/rate never fits in a shorter window)."""
    p = WindowedArrivals(
        window_s=10.0,
        windows=(RateWindow(start_s=0.0, rate=1.0, process=WeibullArrivals(cv=3.0)), RateWindow(start_s=10.0, rate=1.0, process=ConstantArrivals())),
    )
    rate = 1e-6
    t = _first(p, CountingRng(14, budget=20 * N), rate, N)
    cycles = math.floor(t[-1] / 20.0)
    t = t[t < cycles * 20.0]
    assert np.all(np.mod(t, 20.0) < 10.0)  # the constant window (gap 1e6 s > 10 s) never holds one
    k = WeibullArrivals(cv=3.0).shape
    p_w = float(stats.weibull_min(c=k, scale=1 / (rate * math.gamma(1 + 1 / k))).cdf(10.0))
    busy = len(np.unique(np.floor(t / 20.0)))
    assert abs(busy - p_w * cycles) < 5 * math.sqrt(p_w * (1 - p_w) * cycles)


@pytest.mark.parametrize(
    ("process", "reference"),
    [
        (PoissonArrivals(), stats.expon(scale=1 / 0.5)),
        (GammaArrivals(cv=2.0), stats.gamma(a=0.25, scale=4.0 / 0.5)),
        (GammaArrivals(cv=0.5), stats.gamma(a=4.0, scale=0.25 / 0.5)),
        (WeibullArrivals(cv=2.0), None),
    ],
    ids=["poisson", "gamma-bursty", "gamma-regular", "weibull"],
)
def test_gap_below_is_the_gap_conditioned_to_fit_and_survival_matches_scipy(process: Any, reference: Any) -> None:
    """log_gap_survival(rate, d) is log of scipy's sf(d), and gap_below draws pass KS against the gap's
    CDF conditioned on gap < d (rate 0.5/s, d = 1.5 s)."""
    rate, d = 0.5, 1.5
    if reference is None:
        k = process.shape
        reference = stats.weibull_min(c=k, scale=1 / (rate * math.gamma(1 + 1 / k)))
    assert process.log_gap_survival(rate, d) == pytest.approx(math.log(reference.sf(d)), rel=1e-9)
    rng = np.random.default_rng(15)
    draws = np.array([process.gap_below(rng, rate, d) for _ in range(20_000)])
    assert draws.max() < d
    assert stats.kstest(draws, lambda x: reference.cdf(x) / reference.cdf(d)).pvalue > 0.01


@pytest.mark.parametrize(
    ("process", "rate"),
    [
        (OnOffArrivals(on_duration=LogNormal(mu=0.0, sigma=1.0), off_duration=Constant(value=1.0)), 1e-7),
        (OnOffArrivals(on_duration=Exponential(mean=1.0), off_duration=Exponential(mean=1.0), on_process=GammaArrivals(cv=2.0)), 1e-7),
        (
            WindowedArrivals(
                window_s=10.0,
                windows=(
                    RateWindow(start_s=0.0, rate=1.0, process=OnOffArrivals(on_duration=Constant(value=1.0), off_duration=Constant(value=1.0))),
                ),
            ),
            1e-3,
        ),
    ],
    ids=["lognormal-lengths", "gamma-in-exponential-lengths", "nested"],
)
def test_a_rate_that_would_spin_without_skipping_is_refused_naming_the_process(process: Any, rate: float) -> None:
    """Periods that cannot be skipped exactly (other length distributions; a non-Poisson process in
    exponential lengths; a nested process) at a rate needing more periods per arrival than allowed raise
    SamplingError naming the process and the bound, before drawing a chunk's worth of periods."""
    with pytest.raises(SamplingError) as info:
        _first(process, CountingRng(16, budget=10_000), rate, 1)
    assert info.value.distribution is process
    assert "periods drawn per arrival" in info.value.message


def test_a_modest_rate_of_an_unskippable_process_still_draws_every_period() -> None:
    """Lognormal ON lengths at 0.05 expected arrivals per cycle (40 periods per arrival, under the
    bound of MAX_PERIODS_PER_ARRIVAL) are drawn period by period at the requested rate (5 SE)."""
    assert 2 / 0.05 < MAX_PERIODS_PER_ARRIVAL
    p = OnOffArrivals(on_duration=LogNormal(mu=0.0, sigma=0.5), off_duration=Constant(value=1.0))
    cycle = float(p.on_duration.mean) + 1.0
    rate = 0.05 / cycle
    t = _first(p, np.random.default_rng(17), rate, N)
    count = len(t)
    assert abs(count - rate * t[-1]) < 5 * math.sqrt(count) + 1


def test_a_scenario_with_a_spinning_rate_fails_with_its_key_path() -> None:
    """A scenario whose client runs lognormal on/off lengths at 1e-7 requests/s stops with a
    ScenarioError at workload.clients[0].arrival, not a run that never advances."""
    data = tiny_scenario()
    data["workload"]["aggregate_rate"] = 1e-7
    data["workload"]["clients"][0]["arrival"] = {
        "process": "on_off",
        "on_duration": {"type": "lognormal", "params": {"mu": 0.0, "sigma": 1.0}},
        "off_duration": {"type": "constant", "params": {"value": 1.0}},
    }
    with pytest.raises(ScenarioError) as info:
        Simulation(scenario_from_dict(data)).run(progress=False)
    assert info.value.paths == ["workload.clients[0].arrival"]
    assert "periods drawn per arrival" in info.value.problems[0][1]


def test_a_scenario_at_a_tiny_rate_runs() -> None:
    """The same scenario with constant on/off lengths at 1e-7 requests/s runs its 50 requests
    (about 5e8 simulated seconds)."""
    data = tiny_scenario()
    data["workload"]["aggregate_rate"] = 1e-7
    data["workload"]["clients"][0]["arrival"] = {
        "process": "on_off",
        "on_duration": {"type": "constant", "params": {"value": 1.0}},
        "off_duration": {"type": "constant", "params": {"value": 1.0}},
    }
    summary = Simulation(scenario_from_dict(data)).run(progress=False).summary()
    assert summary["requests"]["completed"] == 50
