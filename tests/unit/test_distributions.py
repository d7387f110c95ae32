"""Length distributions and arrival processes against their declared moments and scipy references.

Every statistical test uses a fixed seed and 100,000 samples. Means are
checked to within 5 standard errors; variances to within 5 standard errors
of the sample variance, ``sqrt((excess_kurtosis + 2) / n)`` relative, taken
from the scipy reference; the shape by a Kolmogorov-Smirnov test at 1%.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from simpy_llm.config.errors import FieldValueError
from simpy_llm.workload.arrivals import GammaArrivals, PoissonArrivals
from simpy_llm.workload.distributions import ClampedGaussian, Constant, Exponential, LogNormal, to_tokens
from tests.helpers import assert_moments

N = 100_000
ALPHA = 0.01


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)



def _assert_ks(x: np.ndarray, reference: stats.rv_continuous) -> None:
    result = stats.kstest(x, reference.cdf)
    assert result.pvalue > ALPHA, result


# --------------------------------------------------------------------------- length distributions


def test_constant_always_returns_its_value() -> None:
    """Constant draws exactly its value every time; mean = value, variance = 0."""
    d = Constant(value=64)
    x = d.sample(_rng(0), N)
    assert x.shape == (N,)
    assert np.all(x == 64.0)
    assert (d.mean, d.variance) == (64.0, 0.0)


def test_constant_does_not_consume_randomness() -> None:
    """Sampling a constant leaves the generator untouched (other draws are not shifted)."""
    rng = _rng(1)
    Constant(value=3).sample(rng, 10)
    assert rng.random() == _rng(1).random()


@pytest.mark.parametrize("mean", [1.5, 256.0])
def test_exponential_moments_match_declared(mean: float) -> None:
    """Exponential samples have the declared mean and variance (= mean**2)."""
    d = Exponential(mean=mean)
    assert d.variance == pytest.approx(mean**2)
    assert_moments(d.sample(_rng(11), N), d.mean, d.variance, excess_kurtosis=6.0)


def test_exponential_matches_scipy_reference() -> None:
    """Exponential samples are not rejected by a KS test against scipy's expon(scale=mean)."""
    _assert_ks(Exponential(mean=256.0).sample(_rng(12), N), stats.expon(scale=256.0))


@pytest.mark.parametrize(("mu", "sigma"), [(6.0, 0.8), (3.0, 0.25)])
def test_lognormal_moments_match_declared(mu: float, sigma: float) -> None:
    """LogNormal's declared mean/variance are those of the length, and samples match them."""
    d = LogNormal(mu=mu, sigma=sigma)
    ref = stats.lognorm(s=sigma, scale=math.exp(mu))
    assert d.mean == pytest.approx(ref.mean(), rel=1e-12)
    assert d.variance == pytest.approx(ref.var(), rel=1e-12)
    assert_moments(d.sample(_rng(21), N), d.mean, d.variance, excess_kurtosis=float(ref.stats(moments="k")))


def test_lognormal_matches_scipy_reference() -> None:
    """LogNormal(mu, sigma) samples are not rejected by KS against scipy's lognorm(s=sigma, scale=e**mu)."""
    _assert_ks(LogNormal(mu=6.0, sigma=0.8).sample(_rng(22), N), stats.lognorm(s=0.8, scale=math.exp(6.0)))


def test_lognormal_with_zero_sigma_is_constant() -> None:
    """sigma = 0 gives exp(mu) every time, and zero variance."""
    d = LogNormal(mu=2.0, sigma=0.0)
    assert np.allclose(d.sample(_rng(0), 100), math.exp(2.0))
    assert d.variance == 0.0 and d.mean == pytest.approx(math.exp(2.0))


# Clamped to [800, 1500] around a mean of 1000 (sd 300): ~25% of draws sit at a bound.
GAUSS = {"mean": 1000.0, "std_dev": 300.0, "min": 800.0, "max": 1500.0}


def _clamped_reference(mean: float, std_dev: float, lo: float, hi: float) -> tuple[float, float, float, float]:
    """(P(at min), P(at max), mean, variance) of the clamped normal by numerical integration."""
    from scipy import integrate

    norm = stats.norm(mean, std_dev)
    p_lo, p_hi = norm.cdf(lo), norm.sf(hi)
    m1 = lo * p_lo + hi * p_hi + integrate.quad(lambda t: t * norm.pdf(t), lo, hi)[0]
    m2 = lo**2 * p_lo + hi**2 * p_hi + integrate.quad(lambda t: t * t * norm.pdf(t), lo, hi)[0]
    return p_lo, p_hi, m1, m2 - m1**2


def test_clamped_gaussian_declared_moments_are_those_of_the_clamped_variable() -> None:
    """ClampedGaussian.mean/variance equal the clamped variable's moments (by numerical integration)."""
    d = ClampedGaussian(**GAUSS)
    _, _, m, v = _clamped_reference(1000.0, 300.0, 800.0, 1500.0)
    assert d.mean == pytest.approx(m, rel=1e-6)
    assert d.variance == pytest.approx(v, rel=1e-6)
    assert d.mean != pytest.approx(1000.0, rel=1e-3)  # clamping really moves the mean


def test_clamped_gaussian_sample_moments_match_declared() -> None:
    """Clamped-Gaussian samples have the declared (clamped) mean and variance."""
    d = ClampedGaussian(**GAUSS)
    x = d.sample(_rng(31), N)
    # A variable bounded in [800, 1500] has excess kurtosis >= -2; use a generous 1.0 for the bound.
    assert_moments(x, d.mean, d.variance, excess_kurtosis=1.0)


def test_clamped_gaussian_puts_the_tails_on_the_bounds() -> None:
    """Draws stay in [min, max]; the mass at each bound is the normal's tail probability (5 SE)."""
    x = ClampedGaussian(**GAUSS).sample(_rng(32), N)
    assert x.min() == 800.0 and x.max() == 1500.0
    p_lo, p_hi, _, _ = _clamped_reference(1000.0, 300.0, 800.0, 1500.0)
    for observed, p in ((np.mean(x == 800.0), p_lo), (np.mean(x == 1500.0), p_hi)):
        assert abs(observed - p) < 5 * math.sqrt(p * (1 - p) / N)


def test_clamped_gaussian_interior_matches_truncated_normal() -> None:
    """Draws strictly inside the bounds are not rejected by KS against scipy's truncnorm."""
    x = ClampedGaussian(**GAUSS).sample(_rng(33), N)
    inside = x[(x > 800.0) & (x < 1500.0)]
    a, b = (800.0 - 1000.0) / 300.0, (1500.0 - 1000.0) / 300.0
    _assert_ks(inside, stats.truncnorm(a, b, loc=1000.0, scale=300.0))


def test_gaussian_with_far_bounds_matches_scipy_normal() -> None:
    """With bounds far in the tails the clamped Gaussian is the normal: moments and KS match."""
    d = ClampedGaussian(mean=500.0, std_dev=50.0)
    assert d.mean == pytest.approx(500.0, rel=1e-9)
    assert d.variance == pytest.approx(2500.0, rel=1e-9)
    x = d.sample(_rng(34), N)
    assert_moments(x, d.mean, d.variance, excess_kurtosis=0.0)
    _assert_ks(x, stats.norm(500.0, 50.0))


def test_gaussian_with_zero_std_dev_is_the_clamped_mean() -> None:
    """std_dev = 0 yields the mean clamped into [min, max], with zero variance."""
    d = ClampedGaussian(mean=10.0, std_dev=0.0, min=20.0, max=30.0)
    assert np.all(d.sample(_rng(0), 50) == 20.0)
    assert (d.mean, d.variance) == (20.0, 0.0)


def test_gaussian_min_above_max_is_rejected() -> None:
    """min > max raises FieldValueError on max."""
    with pytest.raises(FieldValueError) as info:
        ClampedGaussian(mean=100.0, std_dev=10.0, min=50.0, max=40.0)
    assert info.value.field == "max"


@pytest.mark.parametrize(
    ("cls", "kwargs", "field"),
    [
        (Constant, {"value": 0}, "value"),
        (Exponential, {"mean": -1.0}, "mean"),
        (Exponential, {"mean": math.inf}, "mean"),
        (LogNormal, {"mu": 1.0, "sigma": -0.5}, "sigma"),
        (LogNormal, {"mu": math.nan, "sigma": 0.5}, "mu"),
        (ClampedGaussian, {"mean": 0.0, "std_dev": 1.0}, "mean_param"),
        (ClampedGaussian, {"mean": 10.0, "std_dev": 1.0, "min": 0.5}, "min"),
        (GammaArrivals, {"cv": 0.0}, "cv"),
    ],
    ids=["constant0", "exp-neg", "exp-inf", "lognorm-sigma", "lognorm-nan", "gauss-mean", "gauss-min", "gamma-cv0"],
)
def test_invalid_parameters_are_rejected(cls: type, kwargs: dict, field: str) -> None:
    """Out-of-range or non-finite parameters raise FieldValueError naming the field."""
    with pytest.raises(FieldValueError) as info:
        cls(**kwargs)
    assert info.value.field == field


def test_to_tokens_rounds_half_to_even_and_clamps_at_one() -> None:
    """to_tokens gives int64 whole tokens >= 1, rounding halves to even."""
    out = to_tokens(np.array([-3.0, 0.0, 0.49, 0.5, 1.5, 2.5, 2.51, 1e6]))
    assert out.dtype == np.int64
    assert out.tolist() == [1, 1, 1, 1, 2, 2, 3, 1_000_000]


# --------------------------------------------------------------------------- arrival processes

RATE = 20.0


def test_poisson_gaps_have_the_declared_mean_and_cv() -> None:
    """Poisson gaps average 1/rate with CV 1 (the declared cv)."""
    p = PoissonArrivals()
    assert p.cv == 1.0
    g = p.gaps(_rng(41), RATE, N)
    assert_moments(g, 1 / RATE, (p.cv / RATE) ** 2, excess_kurtosis=6.0)


def test_poisson_gaps_match_scipy_exponential() -> None:
    """Poisson gaps are not rejected by KS against scipy's expon(scale=1/rate)."""
    _assert_ks(PoissonArrivals().gaps(_rng(42), RATE, N), stats.expon(scale=1 / RATE))


def test_poisson_counts_per_second_are_poisson() -> None:
    """Arrivals counted per unit time have mean = variance = rate (index of dispersion 1, 5 SE)."""
    t = np.cumsum(PoissonArrivals().gaps(_rng(43), RATE, N))
    counts = np.bincount(t[t < math.floor(t[-1])].astype(np.int64))
    k = len(counts)
    assert abs(counts.mean() - RATE) < 5 * math.sqrt(RATE / k)
    assert abs(counts.var(ddof=1) / counts.mean() - 1) < 5 * math.sqrt(2 / (k - 1))


CVS = [0.5, 1.0, 2.0, 4.0]


@pytest.mark.parametrize("cv", CVS)
def test_gamma_gaps_have_the_declared_mean_and_cv(cv: float) -> None:
    """Gamma gaps average 1/rate and have the declared coefficient of variation."""
    g = GammaArrivals(cv=cv).gaps(_rng(500 + CVS.index(cv)), RATE, N)
    shape = 1 / cv**2
    assert_moments(g, 1 / RATE, (cv / RATE) ** 2, excess_kurtosis=6 / shape)


@pytest.mark.parametrize("cv", CVS)
def test_gamma_gaps_match_scipy_gamma(cv: float) -> None:
    """Gamma gaps are not rejected by KS against scipy's gamma(a=1/cv**2, scale=cv**2/rate)."""
    g = GammaArrivals(cv=cv).gaps(_rng(600 + CVS.index(cv)), RATE, N)
    _assert_ks(g, stats.gamma(a=1 / cv**2, scale=cv**2 / RATE))


def test_gamma_with_cv_one_is_not_distinguishable_from_poisson() -> None:
    """GammaArrivals(cv=1) gaps pass a KS test against the exponential, like Poisson."""
    _assert_ks(GammaArrivals(cv=1.0).gaps(_rng(70), RATE, N), stats.expon(scale=1 / RATE))


def test_bursty_gamma_is_rejected_as_exponential() -> None:
    """The KS check has power: gamma gaps with cv=2 are clearly rejected as exponential."""
    g = GammaArrivals(cv=2.0).gaps(_rng(71), RATE, N)
    assert stats.kstest(g, stats.expon(scale=1 / RATE).cdf).pvalue < 1e-6


def test_gaps_are_reproducible_for_a_seed() -> None:
    """The same seed gives the same gaps; a different seed different ones."""
    a = GammaArrivals(cv=2.0).gaps(_rng(5), RATE, 1000)
    b = GammaArrivals(cv=2.0).gaps(_rng(5), RATE, 1000)
    c = GammaArrivals(cv=2.0).gaps(_rng(6), RATE, 1000)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
