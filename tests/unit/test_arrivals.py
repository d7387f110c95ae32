"""Arrival processes: weibull, constant, on_off and windows against their declared behaviour.

Fixed seeds and 100,000+ arrivals per statistical test. Long-run rates are
checked to 2% (the processes' count dispersion keeps that above 5 standard
errors for the sizes used), gap CVs against the declared ``cv`` (or
``gap_cv(rate)``), gap shapes by KS against scipy at 1%. No timings are
asserted. Bad configurations are checked through :func:`scenario_from_dict`
so each error carries its key path.
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
    ConstantArrivals,
    GammaArrivals,
    OnOffArrivals,
    PoissonArrivals,
    RateWindow,
    WeibullArrivals,
    WindowedArrivals,
    arrival_processes,
    weibull_shape_for_cv,
)
from simpy_llm.workload.distributions import Constant, Exponential
from tests.helpers import run, tiny_scenario

N = 100_000
ALPHA = 0.01
RATE = 20.0


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _arrivals(process: Any, seed: int, rate: float, n: int, chunk: int = 65_536) -> np.ndarray:
    """The first *n* arrival times (or a little more: whole chunks)."""
    out, total = [], 0
    for t in process.times(_rng(seed), rate, chunk):
        out.append(t)
        total += len(t)
        if total >= n:
            break
    return np.concatenate(out)


def _rate_of(t: np.ndarray) -> float:
    """Long-run rate estimate: arrivals per second up to the last arrival."""
    return len(t) / float(t[-1])


def _cv(x: np.ndarray) -> float:
    return float(x.std(ddof=1) / x.mean())


def _assert_ks(x: np.ndarray, reference: Any) -> None:
    result = stats.kstest(x, reference.cdf)
    assert result.pvalue > ALPHA, result


def _load_arrival(arrival: Any) -> Any:
    data = tiny_scenario()
    data["workload"]["clients"][0]["arrival"] = arrival
    return scenario_from_dict(data).workload.clients[0].arrival


# --------------------------------------------------------------------------- weibull


CVS = [0.5, 1.0, 2.0, 4.0]


@pytest.mark.parametrize("cv", [0.01, 0.3, 1.0, 2.0, 7.5, 100.0])
def test_weibull_shape_reproduces_the_cv(cv: float) -> None:
    """The solved shape k gives scipy's weibull_min(k) exactly the requested coefficient of variation."""
    ref = stats.weibull_min(c=weibull_shape_for_cv(cv))
    assert math.sqrt(ref.var()) / ref.mean() == pytest.approx(cv, rel=1e-8)


def test_weibull_shape_is_cached() -> None:
    """Solving the shape again for the same cv is a cache hit."""
    weibull_shape_for_cv(3.25)
    hits = weibull_shape_for_cv.cache_info().hits
    assert WeibullArrivals(cv=3.25).shape == weibull_shape_for_cv(3.25)
    assert weibull_shape_for_cv.cache_info().hits >= hits + 2


@pytest.mark.parametrize("cv", CVS)
def test_weibull_gaps_have_mean_one_over_rate_and_the_declared_cv(cv: float) -> None:
    """Weibull gaps average 1/rate (5 SE) and their variance is (cv/rate)**2 (5 SE, kurtosis from scipy)."""
    p = WeibullArrivals(cv=cv)
    g = p.gaps(_rng(800 + CVS.index(cv)), RATE, 2 * N)
    n = len(g)
    var = (cv / RATE) ** 2
    kurt = float(stats.weibull_min(c=p.shape).stats(moments="k"))
    assert abs(g.mean() - 1 / RATE) < 5 * math.sqrt(var / n)
    assert abs(g.var(ddof=1) / var - 1) < 5 * math.sqrt((kurt + 2) / n)


@pytest.mark.parametrize("cv", CVS)
def test_weibull_gaps_match_scipy_weibull_min(cv: float) -> None:
    """Weibull gaps are not rejected by KS against weibull_min(c=k, scale=1/(rate*Gamma(1+1/k)))."""
    p = WeibullArrivals(cv=cv)
    k = p.shape
    g = p.gaps(_rng(900 + CVS.index(cv)), RATE, N)
    _assert_ks(g, stats.weibull_min(c=k, scale=1 / (RATE * math.gamma(1 + 1 / k))))


@pytest.mark.parametrize("cv", [0.5, 2.0])
def test_weibull_long_run_rate_matches(cv: float) -> None:
    """Arrival times from WeibullArrivals.times come at the requested long-run rate (2%)."""
    t = _arrivals(WeibullArrivals(cv=cv), 1000 + int(cv * 10), RATE, 2 * N)
    assert _rate_of(t) == pytest.approx(RATE, rel=0.02)
    assert np.all(np.diff(t) >= 0)  # (tiny Weibull gaps can vanish in float rounding at large t)


def test_weibull_cv_one_matches_the_exponential() -> None:
    """cv = 1 is the exponential (k = 1): gaps pass KS against expon(scale=1/rate)."""
    _assert_ks(WeibullArrivals(cv=1.0).gaps(_rng(1100), RATE, N), stats.expon(scale=1 / RATE))


# --------------------------------------------------------------------------- constant


def test_constant_gaps_are_exactly_one_over_rate() -> None:
    """ConstantArrivals: every gap is 1/rate, the declared cv is 0, and times are k/rate."""
    p = ConstantArrivals()
    assert p.cv == 0.0
    assert np.all(p.gaps(_rng(0), 8.0, N) == 0.125)
    t = _arrivals(p, 0, 8.0, N)
    np.testing.assert_allclose(t, np.arange(1, len(t) + 1) / 8.0, rtol=1e-12)
    assert _rate_of(t) == pytest.approx(8.0, rel=1e-9)


def test_constant_does_not_consume_randomness() -> None:
    """Constant arrivals leave the generator untouched."""
    rng = _rng(4)
    next(ConstantArrivals().times(rng, 3.0, 100))
    assert rng.random() == _rng(4).random()


# --------------------------------------------------------------------------- on_off


ON_OFF = OnOffArrivals(on_duration=Exponential(mean=0.2), off_duration=Exponential(mean=0.2))


def test_on_off_on_rate_is_solved_for_the_long_run_rate() -> None:
    """r_on satisfies mean_on*r_on + mean_off*r_off = rate*(mean_on + mean_off), with r_off = ratio*r_on."""
    p = OnOffArrivals(on_duration=Exponential(mean=2.0), off_duration=Exponential(mean=6.0), off_rate_ratio=0.25)
    r_on, r_off = p.rates(10.0)
    assert r_off == pytest.approx(0.25 * r_on)
    assert 2.0 * r_on + 6.0 * r_off == pytest.approx(10.0 * 8.0)
    assert ON_OFF.rates(10.0) == (20.0, 0.0)


@pytest.mark.parametrize(
    "process",
    [
        ON_OFF,
        OnOffArrivals(on_duration=Exponential(mean=0.2), off_duration=Exponential(mean=0.3), off_rate_ratio=0.2),
        OnOffArrivals(on_duration=Constant(value=0.3), off_duration=Exponential(mean=0.5)),
    ],
    ids=["exp-silent-off", "exp-ratio-0.2", "constant-on"],
)
def test_on_off_long_run_rate_matches(process: OnOffArrivals) -> None:
    """ON/OFF arrivals with Poisson inside come at the requested long-run rate (2%, ~2M arrivals)."""
    t = _arrivals(process, 1200, 50.0, 20 * N, chunk=200_000)
    assert _rate_of(t) == pytest.approx(50.0, rel=0.02)


def test_on_off_with_gamma_inside_keeps_the_rate_for_long_periods() -> None:
    """With a bursty gamma process restarted in long periods (~2000 arrivals each) the rate is still within 2%."""
    p = OnOffArrivals(on_duration=Constant(value=20.0), off_duration=Constant(value=20.0), on_process=GammaArrivals(cv=2.0))
    t = _arrivals(p, 1300, 50.0, 10 * N, chunk=200_000)
    assert _rate_of(t) == pytest.approx(50.0, rel=0.02)


def test_on_off_gap_cv_matches_the_interrupted_poisson_formula() -> None:
    """For silent OFF periods gap_cv is the IPP's: cv**2 = 1 + 2*r_on*a/(a+b)**2 (a, b the switching rates)."""
    a, b = 1 / 0.2, 1 / 0.2
    r_on = ON_OFF.rates(50.0)[0]
    assert ON_OFF.gap_cv(50.0) == pytest.approx(math.sqrt(1 + 2 * r_on * a / (a + b) ** 2), rel=1e-12)


@pytest.mark.parametrize(
    "process",
    [ON_OFF, OnOffArrivals(on_duration=Exponential(mean=0.2), off_duration=Exponential(mean=0.3), off_rate_ratio=0.2)],
    ids=["ipp", "mmpp"],
)
def test_on_off_gap_cv_matches_the_declared(process: OnOffArrivals) -> None:
    """The sample CV of the gaps matches gap_cv(rate) (the MMPP's phase-type gap) to 3%."""
    declared = process.gap_cv(50.0)
    assert declared is not None and declared > 1
    t = _arrivals(process, 1400, 50.0, 20 * N, chunk=200_000)
    assert _cv(np.diff(t)) == pytest.approx(declared, rel=0.03)


def test_on_off_gap_cv_is_unknown_outside_the_mmpp_case() -> None:
    """gap_cv is None when the periods are not exponential or the inside process is not Poisson."""
    assert OnOffArrivals(on_duration=Constant(value=1.0), off_duration=Exponential(mean=1.0)).gap_cv(5.0) is None
    p = OnOffArrivals(on_duration=Exponential(mean=1.0), off_duration=Exponential(mean=1.0), on_process=GammaArrivals(cv=2.0))
    assert p.gap_cv(5.0) is None


@pytest.mark.parametrize("inside", [PoissonArrivals(), GammaArrivals(cv=3.0)], ids=["poisson", "gamma"])
def test_on_off_has_no_arrivals_in_off_periods(inside: Any) -> None:
    """With off_rate_ratio = 0 every arrival falls in an ON period (ON [5k, 5k+2), OFF [5k+2, 5k+5))."""
    p = OnOffArrivals(on_duration=Constant(value=2.0), off_duration=Constant(value=3.0), on_process=inside)
    t = _arrivals(p, 1500, 10.0, N)
    phase = np.mod(t, 5.0)
    assert phase.max() < 2.0
    assert len(np.unique(np.floor(t / 5.0))) > 0.99 * (t[-1] / 5.0)  # and almost every ON period has some


def test_on_off_on_periods_run_at_r_on() -> None:
    """Arrivals per ON period average r_on * on_length (5 SE of the Poisson count)."""
    p = OnOffArrivals(on_duration=Constant(value=2.0), off_duration=Constant(value=3.0))
    t = _arrivals(p, 1600, 10.0, N)
    cycles = int(t[-1] // 5.0)
    counts = np.bincount((t[t < cycles * 5.0] // 5.0).astype(np.int64), minlength=cycles)
    r_on = p.rates(10.0)[0]
    assert r_on == 25.0
    assert abs(counts.mean() - 2.0 * r_on) < 5 * math.sqrt(2.0 * r_on / cycles)


def test_on_off_restarts_the_inside_process_at_each_period() -> None:
    """The inside process restarts at each ON start: constant gaps give start + k/r_on, never crossing the end."""
    p = OnOffArrivals(on_duration=Constant(value=1.0), off_duration=Constant(value=1.0), on_process=ConstantArrivals())
    t = next(p.times(_rng(0), 2.0, 9))  # r_on = 4: 0.25, 0.5, 0.75 in each ON period [2k, 2k+1)
    np.testing.assert_allclose(t, [0.25, 0.5, 0.75, 2.25, 2.5, 2.75, 4.25, 4.5, 4.75])


def test_on_off_gamma_inside_has_gamma_gaps_from_each_period_start() -> None:
    """Inside ON periods the gaps (the first measured from the period start) are the process's: KS vs gamma."""
    cv, rate = 2.0, 10.0
    p = OnOffArrivals(on_duration=Constant(value=100.0), off_duration=Constant(value=100.0), on_process=GammaArrivals(cv=cv))
    r_on = p.rates(rate)[0]
    t = _arrivals(p, 1700, rate, 4 * N)
    gaps = []
    for k in range(int(t[-1] // 200.0)):
        lo, hi = np.searchsorted(t, [200.0 * k, 200.0 * k + 100.0])
        # ~2000 arrivals per ON period: the first 1000 gaps are not biased by the period end
        gaps.append(np.diff(np.concatenate(([200.0 * k], t[lo:hi])))[:1000])
    g = np.concatenate(gaps)
    assert len(g) >= N
    _assert_ks(g, stats.gamma(a=1 / cv**2, scale=cv**2 / r_on))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"on_duration": Exponential(mean=1.0), "off_duration": Exponential(mean=1.0), "off_rate_ratio": -0.1}, "off_rate_ratio"),
        ({"on_duration": Exponential(mean=1.0), "off_duration": Exponential(mean=1.0), "off_rate_ratio": 1.5}, "off_rate_ratio"),
        ({"on_duration": "1s", "off_duration": Exponential(mean=1.0)}, "on_duration"),
        ({"on_duration": Exponential(mean=1.0), "off_duration": Exponential(mean=1.0), "on_process": 3}, "on_process"),
    ],
    ids=["ratio-negative", "ratio-above-1", "not-a-distribution", "not-a-process"],
)
def test_on_off_invalid_fields_raise_field_value_error(kwargs: dict, field: str) -> None:
    """Bad ON/OFF fields built in Python raise FieldValueError naming the field."""
    with pytest.raises(FieldValueError) as info:
        OnOffArrivals(**kwargs)
    assert info.value.field == field


# --------------------------------------------------------------------------- windows


# Idle [0, 5); window A [5, 15) weight 1 Poisson; idle window [15, 30); window B [30, 40) weight 3 gamma cv 2.
WINDOWS = WindowedArrivals(
    window_s=10.0,
    windows=(
        RateWindow(start_s=5.0, rate=1.0),
        RateWindow(start_s=15.0, rate=0.0),
        RateWindow(start_s=30.0, rate=3.0, process=GammaArrivals(cv=2.0)),
    ),
)
EDGES = [0.0, 5.0, 15.0, 30.0, 40.0]
EXPECTED = np.array([0.0, 200.0, 0.0, 600.0])  # per cycle at rate 20 (rates 20, 0, 60)


def _counts(t: np.ndarray, cycle: float = 40.0) -> np.ndarray:
    """Arrivals per (cycle, segment) over the complete cycles, segments as in EDGES."""
    cycles = int(t[-1] // cycle)
    t = t[t < cycles * cycle]
    c = (t // cycle).astype(np.int64)
    seg = np.searchsorted(EDGES, t - c * cycle, side="right") - 1
    return np.bincount(c * 4 + seg, minlength=cycles * 4).reshape(cycles, 4)


def test_windows_rates_are_normalised_to_the_time_average() -> None:
    """Window rates are the weights scaled so the cycle's time-average rate is the requested rate."""
    rates = WINDOWS.window_rates(RATE)
    assert WINDOWS.cycle_s == 40.0
    np.testing.assert_allclose(rates, [20.0, 0.0, 60.0])
    durations = np.array([10.0, 15.0, 10.0])
    assert float(rates @ durations) / WINDOWS.cycle_s == pytest.approx(RATE)


@pytest.mark.parametrize("chunk", [256, 65_536], ids=["window-batches", "cycle-batches"])
def test_windows_per_window_counts_match_rate_times_duration(chunk: int) -> None:
    """Averaged over many cycles, each window holds rate_i * duration_i arrivals (5%); idle spans hold none."""
    t = _arrivals(WINDOWS, 1800, RATE, 4 * N, chunk=chunk)
    counts = _counts(t)
    assert counts.shape[0] >= 400
    assert np.all(counts[:, [0, 2]] == 0)  # before the first window, and the idle window
    np.testing.assert_allclose(counts.mean(axis=0)[[1, 3]], EXPECTED[[1, 3]], rtol=0.05)


def test_windows_long_run_rate_matches() -> None:
    """The time-average rate over whole cycles is the requested rate (2%)."""
    t = _arrivals(WINDOWS, 1900, RATE, 4 * N)
    counts = _counts(t)
    assert counts.sum() / (counts.shape[0] * 40.0) == pytest.approx(RATE, rel=0.02)


def test_windows_cycle_repeats() -> None:
    """Every cycle has arrivals in both active windows, and early and late cycles hold the same counts (5%)."""
    counts = _counts(_arrivals(WINDOWS, 2000, RATE, 4 * N))
    assert np.all(counts[:, 1] > 0) and np.all(counts[:, 3] > 0)
    half = counts.shape[0] // 2
    np.testing.assert_allclose(counts[:half].mean(axis=0)[[1, 3]], counts[half:].mean(axis=0)[[1, 3]], rtol=0.05)


def test_windows_use_each_windows_own_process() -> None:
    """Gaps in the gamma window (from its start) pass KS against gamma(cv=2) at its rate; the Poisson window's CV is 1."""
    t = _arrivals(WINDOWS, 2100, RATE, 16 * N, chunk=200_000)
    gamma_gaps, poisson_gaps = [], []
    for k in range(int(t[-1] // 40.0)):
        for start, end, out in ((40.0 * k + 30.0, 40.0 * k + 40.0, gamma_gaps), (40.0 * k + 5.0, 40.0 * k + 15.0, poisson_gaps)):
            lo, hi = np.searchsorted(t, [start, end])
            # ~600 / ~200 arrivals per window: the first 100 gaps are not biased by the window end
            out.append(np.diff(np.concatenate(([start], t[lo:hi])))[:100])
    g = np.concatenate(gamma_gaps)
    assert len(g) >= N
    _assert_ks(g, stats.gamma(a=0.25, scale=4.0 / 60.0))
    assert _cv(np.concatenate(poisson_gaps)) == pytest.approx(1.0, rel=0.03)


def test_windows_yield_exact_chunks_in_increasing_order() -> None:
    """Each chunk has exactly *chunk* times and the times increase across chunks."""
    it = WINDOWS.times(_rng(5), RATE, 1000)
    chunks = [next(it) for _ in range(50)]
    assert all(len(c) == 1000 for c in chunks)
    assert np.all(np.diff(np.concatenate(chunks)) >= 0)  # (gamma cv 2 has gaps below float resolution)


def test_windows_servegen_style_yaml_loads() -> None:
    """ServeGen-style windows with per-window gamma/weibull cv load from YAML (process defaults to poisson)."""
    p = _load_arrival(
        {
            "process": "windows",
            "windows": [
                {"start_s": 0, "rate": 2.5, "process": {"process": "gamma", "cv": 3.1}},
                {"start_s": 600, "rate": 0.0},
                {"start_s": 1200, "rate": 1.0, "process": {"process": "weibull", "cv": 1.7}},
            ],
        }
    )
    assert p == WindowedArrivals(
        window_s=600.0,
        windows=(
            RateWindow(start_s=0.0, rate=2.5, process=GammaArrivals(cv=3.1)),
            RateWindow(start_s=600.0, rate=0.0, process=PoissonArrivals()),
            RateWindow(start_s=1200.0, rate=1.0, process=WeibullArrivals(cv=1.7)),
        ),
    )
    assert p.cycle_s == 1800.0


@pytest.mark.parametrize(
    ("windows", "field"),
    [
        ((RateWindow(start_s=0, rate=1), RateWindow(start_s=0, rate=1)), "windows[1].start_s"),
        ((RateWindow(start_s=0, rate=0), RateWindow(start_s=5, rate=0)), "windows"),
    ],
    ids=["not-increasing", "all-idle"],
)
def test_windows_invalid_layout_raises_field_value_error(windows: tuple, field: str) -> None:
    """Windows that do not start in increasing order, or all with rate 0, raise FieldValueError."""
    with pytest.raises(FieldValueError) as info:
        WindowedArrivals(windows=windows)
    assert info.value.field == field


# --------------------------------------------------------------------------- loading, errors, round trips

ARRIVAL = "workload.clients[0].arrival"

NEW_PROCESSES = [
    {"process": "weibull", "cv": 2.0},
    {"process": "constant"},
    {
        "process": "on_off",
        "on_duration": {"type": "exponential", "params": {"mean": 2.0}},
        "off_duration": {"type": "pareto", "params": {"alpha": 2.5, "xm": 1.0}},
        "on_process": {"process": "gamma", "cv": 2.0},
        "off_rate_ratio": 0.1,
    },
    {"process": "on_off", "on_duration": {"type": "constant", "params": {"value": 1}}, "off_duration": {"type": "constant", "params": {"value": 2}}},
    {"process": "windows", "window_s": 5,
     "windows": [{"start_s": 0, "rate": 1}, {"start_s": 5, "rate": 0}, {"start_s": 7, "rate": 2, "process": {"process": "weibull", "cv": 0.5}}]},
]


@pytest.mark.parametrize("arrival", NEW_PROCESSES, ids=lambda a: a["process"])
def test_new_processes_load_and_round_trip(arrival: dict) -> None:
    """Each new process loads from YAML-shaped data and survives scenario_to_dict -> scenario_from_dict."""
    data = tiny_scenario()
    data["workload"]["clients"][0]["arrival"] = arrival
    scenario = scenario_from_dict(data)
    assert type(scenario.workload.clients[0].arrival) is arrival_processes.get(arrival["process"])
    assert scenario_from_dict(scenario_to_dict(scenario)) == scenario


def test_on_off_defaults_to_poisson_inside_and_silent_off() -> None:
    """on_process defaults to poisson and off_rate_ratio to 0."""
    p = _load_arrival(NEW_PROCESSES[3])
    assert p == OnOffArrivals(on_duration=Constant(value=1.0), off_duration=Constant(value=2.0))
    assert p.on_process == PoissonArrivals() and p.off_rate_ratio == 0.0


@pytest.mark.parametrize("arrival", NEW_PROCESSES, ids=lambda a: a["process"])
def test_new_processes_drive_a_simulation(arrival: dict) -> None:
    """A small scenario with each new process runs to completion (every generated request finishes)."""
    data = tiny_scenario()
    data["workload"]["clients"][0]["arrival"] = arrival
    s = run(data).summary()
    assert s["requests"]["arrived"] == 50 and s["requests"]["completed"] == 50


_ON = {"type": "exponential", "params": {"mean": 1.0}}
_OFF = {"type": "exponential", "params": {"mean": 2.0}}

BAD = [
    ({"process": "burst"}, f"{ARRIVAL}.process", "unknown arrival process"),
    ({"process": "weibull", "cv": 0.001}, f"{ARRIVAL}.cv", "must be in"),
    ({"process": "weibull", "cv": 1000.0}, f"{ARRIVAL}.cv", "must be in"),
    ({"process": "weibull", "cv": -1.0}, f"{ARRIVAL}.cv", "must be in"),
    ({"process": "weibull", "cv": math.nan}, f"{ARRIVAL}.cv", "finite"),
    ({"process": "weibull", "cv": math.inf}, f"{ARRIVAL}.cv", "finite"),
    ({"process": "weibull"}, f"{ARRIVAL}.cv", "required key is missing"),
    ({"process": "constant", "cv": 0.0}, f"{ARRIVAL}.cv", "unknown key"),
    ({"process": "on_off", "off_duration": _OFF}, f"{ARRIVAL}.on_duration", "required key is missing"),
    ({"process": "on_off", "on_duration": _ON, "off_duration": _OFF, "off_rate_ratio": -0.5}, f"{ARRIVAL}.off_rate_ratio", "must be in"),
    ({"process": "on_off", "on_duration": _ON, "off_duration": _OFF, "off_rate_ratio": math.nan}, f"{ARRIVAL}.off_rate_ratio", "finite"),
    ({"process": "on_off", "on_duration": {"type": "pareto", "params": {"alpha": 0.9, "xm": 1}}, "off_duration": _OFF},
     f"{ARRIVAL}.on_duration", "finite mean"),
    ({"process": "on_off", "on_duration": {"type": "normal", "params": {"mean": -1, "std_dev": 1}}, "off_duration": _OFF},
     f"{ARRIVAL}.on_duration", "finite mean > 0"),
    ({"process": "on_off", "on_duration": {"type": "exponential", "params": {"mean": -1}}, "off_duration": _OFF},
     f"{ARRIVAL}.on_duration.params.mean", "must be > 0"),
    ({"process": "on_off", "on_duration": _ON, "off_duration": _OFF, "on_process": {"process": "weibull", "cv": 500}},
     f"{ARRIVAL}.on_process.cv", "must be in"),
    ({"process": "windows", "windows": []}, f"{ARRIVAL}.windows", "must not be empty"),
    ({"process": "windows", "windows": [{"start_s": 10, "rate": 1}, {"start_s": 5, "rate": 1}]}, f"{ARRIVAL}.windows[1].start_s", "increasing"),
    ({"process": "windows", "windows": [{"start_s": 0, "rate": 0}, {"start_s": 600, "rate": 0.0}]}, f"{ARRIVAL}.windows", "rate > 0"),
    ({"process": "windows", "windows": [{"start_s": 0, "rate": -1}]}, f"{ARRIVAL}.windows[0].rate", "must be >= 0"),
    ({"process": "windows", "windows": [{"start_s": 0, "rate": math.inf}]}, f"{ARRIVAL}.windows[0].rate", "finite"),
    ({"process": "windows", "windows": [{"start_s": -1, "rate": 1}]}, f"{ARRIVAL}.windows[0].start_s", "must be >= 0"),
    ({"process": "windows", "window_s": 0, "windows": [{"start_s": 0, "rate": 1}]}, f"{ARRIVAL}.window_s", "must be > 0"),
    ({"process": "windows", "windows": [{"start_s": 0, "rate": 1, "process": {"process": "gamma", "cv": 0}}]},
     f"{ARRIVAL}.windows[0].process.cv", "must be > 0"),
    ({"process": "windows", "windows": [{"start_s": 0, "rate": 1, "process": {"process": "zipf"}}]},
     f"{ARRIVAL}.windows[0].process.process", "unknown arrival process"),
]


@pytest.mark.parametrize(("arrival", "path", "message"), BAD, ids=[f"{b[0]['process']}-{i}" for i, b in enumerate(BAD)])
def test_bad_arrival_raises_scenario_error_with_path(arrival: dict, path: str, message: str) -> None:
    """Bad processes and fields raise ScenarioError naming the key path and the problem."""
    data = tiny_scenario()
    data["workload"]["clients"][0]["arrival"] = arrival
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data)
    assert info.value.paths == [path]
    assert message in info.value.problems[0][1]


# --------------------------------------------------------------------------- vectorised draws

ALL = [
    WeibullArrivals(cv=2.0),
    ConstantArrivals(),
    ON_OFF,
    OnOffArrivals(on_duration=Exponential(mean=0.5), off_duration=Exponential(mean=1.0), on_process=WeibullArrivals(cv=2.0), off_rate_ratio=0.1),
    WINDOWS,
]


@pytest.mark.parametrize("process", ALL, ids=lambda p: type(p).__name__)
def test_million_arrival_chunk_is_one_vector(process: Any) -> None:
    """One 1,000,000-arrival chunk comes back as one increasing float vector (vectorised; time not asserted)."""
    t = next(process.times(_rng(11), 100.0, 1_000_000))
    assert t.shape == (1_000_000,) and t.dtype == np.float64
    assert np.all(np.diff(t) >= 0) and t[0] > 0


@pytest.mark.parametrize("process", ALL, ids=lambda p: type(p).__name__)
def test_arrivals_are_reproducible_for_a_seed(process: Any) -> None:
    """The same seed gives the same arrival times."""
    a = next(process.times(_rng(12), 10.0, 5000))
    b = next(process.times(_rng(12), 10.0, 5000))
    np.testing.assert_array_equal(a, b)
