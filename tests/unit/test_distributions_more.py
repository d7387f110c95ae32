"""The added length distributions against their declared moments and scipy references.

Same conventions as ``test_distributions.py``: fixed seeds, 100,000 samples
(200,000 for the discrete chi-square test), means within 5 standard errors,
variances within 5 standard errors of the sample variance
(``sqrt((excess_kurtosis + 2) / n)`` relative, the kurtosis taken from the
reference), shapes by a Kolmogorov-Smirnov test at 1%. Where a moment is
infinite the declared value must be ``math.inf`` and quantiles stand in.
Bad parameters are checked through :func:`scenario_from_dict`, so each
error must carry its key path.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from scipy import stats

from simpy_llm.config import ScenarioError
from simpy_llm.config.errors import FieldValueError
from simpy_llm.loading import load_scenario, scenario_from_dict, scenario_to_dict
from simpy_llm.workload.distributions import (
    Empirical,
    Gamma,
    Normal,
    Pareto,
    ParetoLogNormal,
    Uniform,
    Weibull,
    length_distributions,
    to_tokens,
)
from tests.helpers import assert_moments, tiny_scenario

N = 100_000
ALPHA = 0.01


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)



def _assert_ks(x: np.ndarray, cdf: Any) -> None:
    result = stats.kstest(x, cdf)
    assert result.pvalue > ALPHA, result


def _assert_quantile(x: np.ndarray, q: float, expected: float, density: float) -> None:
    """The sample *q*-quantile is within 5 standard errors of *expected* (SE from the density there)."""
    se = math.sqrt(q * (1 - q) / len(x)) / density
    assert abs(np.quantile(x, q) - expected) < 5 * se, (np.quantile(x, q), expected)


def _kurtosis_from_raw(m1: float, m2: float, m3: float, m4: float) -> float:
    """Excess kurtosis from the first four raw moments."""
    var = m2 - m1**2
    c4 = m4 - 4 * m1 * m3 + 6 * m1**2 * m2 - 3 * m1**4
    return c4 / var**2 - 3


def _load_input(dist: Any) -> Any:
    """Load *dist* as client 0's input distribution through the scenario loader."""
    data = tiny_scenario()
    data["workload"]["clients"][0]["input_distribution"] = dist
    return scenario_from_dict(data).workload.clients[0].input_distribution


def _load_error(dist: Any) -> ScenarioError:
    data = tiny_scenario()
    data["workload"]["clients"][0]["input_distribution"] = dist
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data)
    return info.value


INPUT = "workload.clients[0].input_distribution"

# --------------------------------------------------------------------------- uniform


def test_uniform_moments_match_declared() -> None:
    """Uniform(low, high) samples have mean (low+high)/2 and variance (high-low)**2/12, as declared."""
    d = Uniform(low=100.0, high=300.0)
    ref = stats.uniform(loc=100.0, scale=200.0)
    assert (d.mean, d.variance) == (pytest.approx(ref.mean()), pytest.approx(ref.var()))
    assert_moments(d.sample(_rng(101), N), d.mean, d.variance, excess_kurtosis=-1.2)


def test_uniform_matches_scipy_reference() -> None:
    """Uniform samples are not rejected by KS against scipy's uniform(loc=low, scale=high-low)."""
    _assert_ks(Uniform(low=100.0, high=300.0).sample(_rng(102), N), stats.uniform(loc=100.0, scale=200.0).cdf)


# --------------------------------------------------------------------------- normal (unclamped)


def test_normal_moments_match_declared() -> None:
    """Normal(mean, std_dev) samples have the declared mean and variance std_dev**2."""
    d = Normal(mean=500.0, std_dev=80.0)
    assert d.variance == 6400.0
    assert_moments(d.sample(_rng(111), N), d.mean, d.variance, excess_kurtosis=0.0)


def test_normal_matches_scipy_reference() -> None:
    """Normal samples are not rejected by KS against scipy's norm(mean, std_dev)."""
    _assert_ks(Normal(mean=500.0, std_dev=80.0).sample(_rng(112), N), stats.norm(500.0, 80.0).cdf)


def test_normal_is_not_clamped_until_rounded_to_tokens() -> None:
    """Normal draws may be below 1 (even negative); to_tokens turns each such draw into 1 token."""
    x = Normal(mean=2.0, std_dev=5.0).sample(_rng(113), N)
    assert x.min() < 0
    tokens = to_tokens(x)
    assert tokens.min() == 1
    assert np.mean(tokens == 1) == pytest.approx(np.mean(x < 1.5))


# --------------------------------------------------------------------------- pareto


def test_pareto_moments_match_declared() -> None:
    """Classical Pareto(alpha=6, xm) has mean alpha xm/(alpha-1) and the scipy variance; samples match."""
    d = Pareto(alpha=6.0, xm=100.0)
    ref = stats.pareto(b=6.0, scale=100.0)
    assert d.mean == pytest.approx(ref.mean(), rel=1e-12)
    assert d.variance == pytest.approx(ref.var(), rel=1e-12)
    assert_moments(d.sample(_rng(121), N), d.mean, d.variance, excess_kurtosis=float(ref.stats(moments="k")))


@pytest.mark.parametrize("alpha", [0.8, 1.5, 6.0])
def test_pareto_matches_scipy_reference(alpha: float) -> None:
    """Pareto samples (minimum xm, not numpy's Lomax) are not rejected by KS against scipy's pareto(b, scale=xm)."""
    x = Pareto(alpha=alpha, xm=100.0).sample(_rng(122 + int(alpha * 10)), N)
    assert x.min() >= 100.0
    _assert_ks(x, stats.pareto(b=alpha, scale=100.0).cdf)


@pytest.mark.parametrize(("alpha", "mean_inf", "var_inf"), [(0.8, True, True), (1.5, False, True), (2.0, False, True)])
def test_pareto_infinite_moments_are_inf(alpha: float, mean_inf: bool, var_inf: bool) -> None:
    """Pareto reports mean = inf for alpha <= 1 and variance = inf for alpha <= 2."""
    d = Pareto(alpha=alpha, xm=10.0)
    assert math.isinf(d.mean) == mean_inf
    assert math.isinf(d.variance) == var_inf


def test_heavy_pareto_quantiles_match() -> None:
    """With infinite mean (alpha=0.8) the sample median and 90% quantile stand in: xm * (1-q)**(-1/alpha)."""
    alpha, xm = 0.8, 100.0
    x = Pareto(alpha=alpha, xm=xm).sample(_rng(125), N)
    ref = stats.pareto(b=alpha, scale=xm)
    for q in (0.5, 0.9):
        _assert_quantile(x, q, xm * (1 - q) ** (-1 / alpha), float(ref.pdf(ref.ppf(q))))


# --------------------------------------------------------------------------- pareto_lognormal


PLN = {"alpha": 6.0, "xm": 100.0, "mu": 5.0, "sigma": 0.5, "mix_weight": 0.3}


def _pln_cdf(p: dict[str, float]) -> Any:
    pareto = stats.pareto(b=p["alpha"], scale=p["xm"])
    lognormal = stats.lognorm(s=p["sigma"], scale=math.exp(p["mu"]))
    w = p["mix_weight"]
    return lambda x: w * pareto.cdf(x) + (1 - w) * lognormal.cdf(x)


def test_pareto_lognormal_declared_moments_are_the_mixtures() -> None:
    """ParetoLogNormal.mean/variance equal the mixture's, from the branches' raw moments."""
    d = ParetoLogNormal(**PLN)
    a, xm, mu, s, w = PLN["alpha"], PLN["xm"], PLN["mu"], PLN["sigma"], PLN["mix_weight"]
    raw = [w * a * xm**k / (a - k) + (1 - w) * math.exp(k * mu + k * k * s * s / 2) for k in (1, 2)]
    assert d.mean == pytest.approx(raw[0], rel=1e-12)
    assert d.variance == pytest.approx(raw[1] - raw[0] ** 2, rel=1e-9)


def test_pareto_lognormal_moments_match_declared() -> None:
    """ParetoLogNormal samples have the declared mean and variance."""
    d = ParetoLogNormal(**PLN)
    a, xm, mu, s, w = PLN["alpha"], PLN["xm"], PLN["mu"], PLN["sigma"], PLN["mix_weight"]
    raw = [w * a * xm**k / (a - k) + (1 - w) * math.exp(k * mu + k * k * s * s / 2) for k in (1, 2, 3, 4)]
    assert a > 4  # the fourth moment exists, so the variance check's SE is defined
    assert_moments(d.sample(_rng(131), N), d.mean, d.variance, excess_kurtosis=_kurtosis_from_raw(*raw))


@pytest.mark.parametrize("alpha", [6.0, 1.5])
def test_pareto_lognormal_matches_mixture_reference(alpha: float) -> None:
    """ParetoLogNormal samples are not rejected by KS against w*pareto.cdf + (1-w)*lognorm.cdf."""
    params = {**PLN, "alpha": alpha}
    _assert_ks(ParetoLogNormal(**params).sample(_rng(132 + int(alpha)), N), _pln_cdf(params))


def test_pareto_lognormal_branch_weight_is_the_pareto_share() -> None:
    """mix_weight is the probability of the Pareto branch: with xm above the log-normal's reach, P(X >= xm) = w."""
    d = ParetoLogNormal(alpha=3.0, xm=1e6, mu=3.0, sigma=0.2, mix_weight=0.25)
    share = float(np.mean(d.sample(_rng(134), N) >= 1e6))
    assert abs(share - 0.25) < 5 * math.sqrt(0.25 * 0.75 / N)


def test_pareto_lognormal_heavy_tail_reports_inf_variance() -> None:
    """With alpha <= 2 and weight > 0 the variance is inf (mean finite for alpha > 1); with weight 0 it is the log-normal's."""
    assert math.isinf(ParetoLogNormal(**{**PLN, "alpha": 1.5}).variance)
    assert math.isfinite(ParetoLogNormal(**{**PLN, "alpha": 1.5}).mean)
    assert math.isinf(ParetoLogNormal(**{**PLN, "alpha": 0.9}).mean)
    only_lognormal = ParetoLogNormal(**{**PLN, "alpha": 0.9, "mix_weight": 0.0})
    ref = stats.lognorm(s=PLN["sigma"], scale=math.exp(PLN["mu"]))
    assert only_lognormal.mean == pytest.approx(ref.mean())
    assert only_lognormal.variance == pytest.approx(ref.var())


# --------------------------------------------------------------------------- weibull, gamma


@pytest.mark.parametrize("shape", [0.7, 1.5, 3.0])
def test_weibull_moments_match_declared(shape: float) -> None:
    """Weibull(shape, scale) has scipy's weibull_min mean/variance, and samples match them."""
    d = Weibull(shape=shape, scale=200.0)
    ref = stats.weibull_min(c=shape, scale=200.0)
    assert d.mean == pytest.approx(ref.mean(), rel=1e-12)
    assert d.variance == pytest.approx(ref.var(), rel=1e-9)
    assert_moments(d.sample(_rng(141), N), d.mean, d.variance, excess_kurtosis=float(ref.stats(moments="k")))


def test_weibull_matches_scipy_reference() -> None:
    """Weibull samples are not rejected by KS against scipy's weibull_min(c=shape, scale=scale)."""
    _assert_ks(Weibull(shape=1.5, scale=200.0).sample(_rng(142), N), stats.weibull_min(c=1.5, scale=200.0).cdf)


@pytest.mark.parametrize("shape", [0.5, 2.5])
def test_gamma_moments_match_declared(shape: float) -> None:
    """Gamma(shape, scale) has mean shape*scale and variance shape*scale**2; samples match."""
    d = Gamma(shape=shape, scale=40.0)
    assert (d.mean, d.variance) == (pytest.approx(shape * 40.0), pytest.approx(shape * 1600.0))
    assert_moments(d.sample(_rng(151), N), d.mean, d.variance, excess_kurtosis=6 / shape)


def test_gamma_matches_scipy_reference() -> None:
    """Gamma samples are not rejected by KS against scipy's gamma(a=shape, scale=scale)."""
    _assert_ks(Gamma(shape=2.5, scale=40.0).sample(_rng(152), N), stats.gamma(a=2.5, scale=40.0).cdf)


# --------------------------------------------------------------------------- empirical


PMF = {64: 0.1, 128: 0.25, 200: 0.05, 256: 0.4, 1024: 0.2}


def test_empirical_normalises_and_states_moments() -> None:
    """Weights are normalised to sum to 1; mean and variance are the PMF's."""
    d = Empirical(values=(1.0, 2.0, 4.0), probabilities=(1.0, 1.0, 2.0))
    assert d.probabilities == (0.25, 0.25, 0.5)
    assert d.mean == pytest.approx(2.75)
    assert d.variance == pytest.approx(0.25 * 1 + 0.25 * 4 + 0.5 * 16 - 2.75**2)


def test_empirical_moments_match_declared() -> None:
    """Empirical samples have the declared mean and variance."""
    d = Empirical.from_pmf(PMF)
    v, p = np.array(d.values), np.array(d.probabilities)
    c4 = float(np.dot((v - d.mean) ** 4, p))
    assert_moments(d.sample(_rng(161), N), d.mean, d.variance, excess_kurtosis=c4 / d.variance**2 - 3)


def test_empirical_frequencies_pass_chi_square() -> None:
    """Counts per support point are not rejected by a chi-square test against the PMF (200k draws)."""
    d = Empirical.from_pmf(PMF)
    n = 2 * N
    x = d.sample(_rng(162), n)
    counts = np.array([np.sum(x == v) for v in d.values])
    assert counts.sum() == n  # nothing off the support
    assert stats.chisquare(counts, n * np.array(d.probabilities)).pvalue > ALPHA


def test_empirical_sample_cdf_matches_at_support_points() -> None:
    """The sample CDF at each support point is within 5 SE of the PMF's cumulative sum."""
    d = Empirical.from_pmf(PMF)
    x = d.sample(_rng(163), N)
    for v, f in zip(d.values, np.cumsum(d.probabilities), strict=True):
        if f < 1:
            assert abs(np.mean(x <= v) - f) < 5 * math.sqrt(f * (1 - f) / N)


def test_empirical_never_draws_zero_probability_values() -> None:
    """Values with probability 0 never appear, wherever they sit in the support."""
    d = Empirical(values=(5.0, 1.0, 7.0, 3.0), probabilities=(0.0, 0.5, 0.0, 0.5))
    assert set(np.unique(d.sample(_rng(164), N)).tolist()) == {1.0, 3.0}


def test_empirical_from_pmf_sorts_values_and_accepts_string_keys() -> None:
    """from_pmf sorts by value and accepts numeric string keys (as JSON objects have)."""
    d = Empirical.from_pmf({"256": 1, "64": 3})
    assert d.values == (64.0, 256.0)
    assert d.probabilities == (0.75, 0.25)


def test_empirical_single_point_is_constant() -> None:
    """A one-point PMF always draws that value, with zero variance."""
    d = Empirical.from_pmf({42: 1.0})
    assert np.all(d.sample(_rng(0), 1000) == 42.0)
    assert (d.mean, d.variance) == (42.0, 0.0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"values": (), "probabilities": ()}, "values"),
        ({"values": (1.0, 2.0), "probabilities": (1.0,)}, "probabilities"),
        ({"values": (1.0, 2.0), "probabilities": (0.5, -0.1)}, "probabilities"),
        ({"values": (1.0, 2.0), "probabilities": (0.5, math.nan)}, "probabilities"),
        ({"values": (1.0, 2.0), "probabilities": (0.0, 0.0)}, "probabilities"),
        ({"values": (1.0, math.inf), "probabilities": (0.5, 0.5)}, "values"),
    ],
    ids=["empty", "length", "negative", "nan", "zero-sum", "inf-value"],
)
def test_empirical_invalid_pmf_raises_field_value_error(kwargs: dict, field: str) -> None:
    """Empty, mismatched, negative, NaN, zero-sum or non-finite PMFs raise FieldValueError on the field."""
    with pytest.raises(FieldValueError) as info:
        Empirical(**kwargs)
    assert info.value.field == field


def test_empirical_inline_pmf_loads_from_yaml() -> None:
    """``{type: empirical, params: {pmf: {128: 0.5, 256: 0.5}}}`` loads as Empirical."""
    d = _load_input(yaml.safe_load("{type: empirical, params: {pmf: {128: 0.5, 256: 0.5}}}"))
    assert d == Empirical(values=(128.0, 256.0), probabilities=(0.5, 0.5))


def test_empirical_inline_servegen_string_loads() -> None:
    """An inline PMF may be ServeGen's string form, a Python dict literal."""
    d = _load_input({"type": "empirical", "params": {"pmf": "{128: 0.25, 256: 0.75}"}})
    assert d == Empirical(values=(128.0, 256.0), probabilities=(0.25, 0.75))


def test_empirical_file_with_json_object_loads(tmp_path: Path) -> None:
    """``params: {file: path}`` reads a JSON object value -> probability."""
    path = tmp_path / "pmf.json"
    path.write_text(json.dumps({"10": 0.2, "20": 0.8}))
    assert _load_input({"type": "empirical", "params": {"file": str(path)}}) == Empirical(values=(10.0, 20.0), probabilities=(0.2, 0.8))


def test_empirical_file_with_servegen_string_loads(tmp_path: Path) -> None:
    """A JSON file holding ServeGen's PMF string (a dict literal in a JSON string) loads."""
    path = tmp_path / "pmf.json"
    path.write_text(json.dumps("{10: 0.2, 20: 0.8}"))
    assert _load_input({"type": "empirical", "params": {"file": str(path)}}) == Empirical(values=(10.0, 20.0), probabilities=(0.2, 0.8))


def test_empirical_file_key_selects_a_servegen_dataset_entry(tmp_path: Path) -> None:
    """``key`` picks an entry of a ServeGen chunk-*-dataset.json (window id, then field)."""
    path = tmp_path / "chunk-0-dataset.json"
    path.write_text(json.dumps({"0": {"input_tokens": "{224: 0.5, 225: 0.5}", "output_tokens": "{40: 1.0}"}}))
    d = _load_input({"type": "empirical", "params": {"file": str(path), "key": ["0", "output_tokens"]}})
    assert d == Empirical(values=(40.0,), probabilities=(1.0,))


def test_empirical_relative_file_is_relative_to_the_scenario(tmp_path: Path) -> None:
    """A relative PMF path is resolved against the scenario file's directory (resolve_path)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "pmf.json").write_text(json.dumps({"7": 1.0}))
    data = tiny_scenario()
    data["workload"]["clients"][0]["input_distribution"] = {"type": "empirical", "params": {"file": "data/pmf.json"}}
    scenario_path = tmp_path / "s.yaml"
    scenario_path.write_text(yaml.safe_dump(data))
    assert load_scenario(scenario_path).workload.clients[0].input_distribution == Empirical(values=(7.0,), probabilities=(1.0,))


def test_empirical_round_trips_through_scenario_to_dict(tmp_path: Path) -> None:
    """A file-loaded Empirical is written inline (values, probabilities) and loads back equal."""
    path = tmp_path / "pmf.json"
    path.write_text(json.dumps("{10: 1, 20: 3}"))
    data = tiny_scenario()
    data["workload"]["clients"][0]["input_distribution"] = {"type": "empirical", "params": {"file": str(path)}}
    scenario = scenario_from_dict(data)
    plain = scenario_to_dict(scenario)
    assert plain["workload"]["clients"][0]["input_distribution"]["params"] == {"values": [10.0, 20.0], "probabilities": [0.25, 0.75]}
    assert scenario_from_dict(plain) == scenario


# --------------------------------------------------------------------------- loading the others / errors


@pytest.mark.parametrize(
    ("dist", "expected"),
    [
        ({"type": "uniform", "params": {"low": 1, "high": 9}}, Uniform(low=1.0, high=9.0)),
        ({"type": "normal", "params": {"mean": 100, "std_dev": 10}}, Normal(mean=100.0, std_dev=10.0)),
        ({"type": "pareto", "params": {"alpha": 2.5, "xm": 50}}, Pareto(alpha=2.5, xm=50.0)),
        ({"type": "pareto_lognormal", "params": PLN}, ParetoLogNormal(**PLN)),
        ({"type": "weibull", "params": {"shape": 1.2, "scale": 300}}, Weibull(shape=1.2, scale=300.0)),
        ({"type": "gamma", "params": {"shape": 2, "scale": 30}}, Gamma(shape=2.0, scale=30.0)),
    ],
    ids=["uniform", "normal", "pareto", "pareto_lognormal", "weibull", "gamma"],
)
def test_new_distributions_load_and_round_trip(dist: dict, expected: Any) -> None:
    """Each new distribution loads from ``{type, params}`` and survives scenario_to_dict -> scenario_from_dict."""
    assert _load_input(dist) == expected
    data = tiny_scenario()
    data["workload"]["clients"][0]["input_distribution"] = dist
    scenario = scenario_from_dict(data)
    assert scenario_from_dict(scenario_to_dict(scenario)) == scenario


BAD = [
    ({"type": "zipf", "params": {}}, f"{INPUT}.type", "unknown length distribution"),
    ({"type": "uniform", "params": {"low": 5, "high": 1}}, f"{INPUT}.params.high", "must be > low"),
    ({"type": "uniform", "params": {"low": -math.inf, "high": 1}}, f"{INPUT}.params.low", "finite"),
    ({"type": "normal", "params": {"mean": 10, "std_dev": -1}}, f"{INPUT}.params.std_dev", "must be >= 0"),
    ({"type": "normal", "params": {"mean": math.nan, "std_dev": 1}}, f"{INPUT}.params.mean", "finite"),
    ({"type": "pareto", "params": {"alpha": -1, "xm": 1}}, f"{INPUT}.params.alpha", "must be > 0"),
    ({"type": "pareto", "params": {"alpha": 2, "xm": math.inf}}, f"{INPUT}.params.xm", "finite"),
    ({"type": "pareto_lognormal", "params": {**PLN, "mix_weight": 1.5}}, f"{INPUT}.params.mix_weight", "must be in"),
    ({"type": "pareto_lognormal", "params": {**PLN, "sigma": -0.1}}, f"{INPUT}.params.sigma", "must be >= 0"),
    ({"type": "pareto_lognormal", "params": {**PLN, "mu": math.nan}}, f"{INPUT}.params.mu", "finite"),
    ({"type": "weibull", "params": {"shape": 0, "scale": 1}}, f"{INPUT}.params.shape", "must be > 0"),
    ({"type": "weibull", "params": {"shape": 1, "scale": math.inf}}, f"{INPUT}.params.scale", "finite"),
    ({"type": "gamma", "params": {"shape": 1, "scale": -2}}, f"{INPUT}.params.scale", "must be > 0"),
    ({"type": "gamma", "params": {"shape": math.nan, "scale": 2}}, f"{INPUT}.params.shape", "finite"),
    ({"type": "gamma", "params": {"shape": 1, "scale": 2, "loc": 0}}, f"{INPUT}.params.loc", "unknown key"),
    ({"type": "empirical", "params": {"pmf": "{128: 0.5, 256"}}, f"{INPUT}.params.pmf", "malformed PMF string"),
    ({"type": "empirical", "params": {"pmf": "__import__('os').getcwd()"}}, f"{INPUT}.params.pmf", "malformed PMF string"),
    ({"type": "empirical", "params": {"pmf": "[1, 2]"}}, f"{INPUT}.params.pmf", "malformed PMF string"),
    ({"type": "empirical", "params": {"pmf": {128: 0, 256: 0}}}, f"{INPUT}.params.pmf", "sum to 0"),
    ({"type": "empirical", "params": {"pmf": {128: -0.5, 256: 1}}}, f"{INPUT}.params.pmf", "must be >= 0"),
    ({"type": "empirical", "params": {"pmf": {128: math.nan, 256: 1}}}, f"{INPUT}.params.pmf", "finite"),
    ({"type": "empirical", "params": {"pmf": {128: math.inf}}}, f"{INPUT}.params.pmf", "finite"),
    ({"type": "empirical", "params": {"pmf": {"many": 1}}}, f"{INPUT}.params.pmf", "not a number"),
    ({"type": "empirical", "params": {"pmf": {}}}, f"{INPUT}.params.pmf", "must not be empty"),
    ({"type": "empirical", "params": {"pmf": [128, 256]}}, f"{INPUT}.params.pmf", "must be a mapping"),
    ({"type": "empirical", "params": {}}, f"{INPUT}.params.pmf", "give exactly one of"),
    ({"type": "empirical", "params": {"pmf": {1: 1}, "values": [1], "probabilities": [1]}}, f"{INPUT}.params.values", "give exactly one of"),
    ({"type": "empirical", "params": {"pmf": {1: 1}, "weights": [1]}}, f"{INPUT}.params.weights", "unknown key"),
    ({"type": "empirical", "params": {"values": [1, 2], "probabilities": [1]}}, f"{INPUT}.params.probabilities", "one entry per value"),
    ({"type": "empirical", "params": {"file": 3}}, f"{INPUT}.params.file", "must be a file path"),
]


@pytest.mark.parametrize(("dist", "path", "message"), BAD, ids=[f"{b[0]['type']}-{i}" for i, b in enumerate(BAD)])
def test_bad_distribution_raises_scenario_error_with_path(dist: dict, path: str, message: str) -> None:
    """Bad types, parameters and PMFs raise ScenarioError naming the key path and the problem."""
    err = _load_error(dist)
    assert err.paths == [path]
    assert message in err.problems[0][1]


def test_missing_pmf_file_names_the_file(tmp_path: Path) -> None:
    """A missing PMF file is reported at params.file, and the message names the file."""
    missing = tmp_path / "nope.json"
    err = _load_error({"type": "empirical", "params": {"file": str(missing)}})
    assert err.paths == [f"{INPUT}.params.file"]
    assert str(missing) in err.problems[0][1]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (json.dumps("{10: 0.5, 20"), "malformed PMF string"),
        (json.dumps({"10": 0.0}), "sum to 0"),
        (json.dumps({"10": -1.0, "20": 2.0}), "must be >= 0"),
        (json.dumps([1, 2]), "must hold a JSON object"),
    ],
    ids=["malformed-string", "zero-sum", "negative", "list"],
)
def test_bad_pmf_file_content_names_the_file(tmp_path: Path, content: str, message: str) -> None:
    """A PMF file with bad content is reported at params.file, naming the file and the problem."""
    path = tmp_path / "bad.json"
    path.write_text(content)
    err = _load_error({"type": "empirical", "params": {"file": str(path)}})
    assert err.paths == [f"{INPUT}.params.file"]
    assert str(path) in err.problems[0][1] and message in err.problems[0][1]


def test_pmf_file_key_that_is_missing_is_reported(tmp_path: Path) -> None:
    """A ``key`` not present in the PMF file is reported at params.key, naming the file."""
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"0": {"input_tokens": "{1: 1}"}}))
    err = _load_error({"type": "empirical", "params": {"file": str(path), "key": ["0", "output_tokens"]}})
    assert err.paths == [f"{INPUT}.params.key"]
    assert str(path) in err.problems[0][1]


# --------------------------------------------------------------------------- vectorised draws

ALL = [
    Uniform(low=1.0, high=100.0),
    Normal(mean=100.0, std_dev=10.0),
    Pareto(alpha=1.5, xm=10.0),
    ParetoLogNormal(**PLN),
    Weibull(shape=1.5, scale=100.0),
    Gamma(shape=2.0, scale=50.0),
    Empirical.from_pmf(PMF),
]


def test_every_registered_distribution_is_exercised_here_or_in_test_distributions() -> None:
    """The registry holds exactly the built-ins these two test modules cover."""
    assert set(length_distributions.names()) == {
        "constant", "exponential", "lognormal", "gaussian",
        "uniform", "normal", "pareto", "pareto_lognormal", "weibull", "gamma", "empirical",
    }  # fmt: skip


@pytest.mark.parametrize("dist", ALL, ids=lambda d: type(d).__name__)
def test_million_sample_draw_is_one_vector(dist: Any) -> None:
    """A 1,000,000-sample draw returns one float vector of that length (vectorised; time is not asserted)."""
    x = dist.sample(_rng(7), 1_000_000)
    assert x.shape == (1_000_000,) and x.dtype == np.float64
    assert np.isfinite(x).all()


@pytest.mark.parametrize("dist", ALL, ids=lambda d: type(d).__name__)
def test_draws_are_reproducible_for_a_seed(dist: Any) -> None:
    """The same seed gives the same draws."""
    np.testing.assert_array_equal(dist.sample(_rng(9), 1000), dist.sample(_rng(9), 1000))
