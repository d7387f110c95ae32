"""Acceptance curves in seed 003 §5.4's ``k=N: {mean, p95}`` format (speculative/acceptance.py):
loading, interpolation, the Beta fit, per-round draws and the round mixture's count law.

The references are computed here with scipy.stats and scipy.integrate, sharing no code
with the model: a Beta is fitted by bisection on its concentration with
``scipy.stats.beta.ppf``, and the chain's law is integrated with ``scipy.integrate.quad``.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, optimize, stats

from simpy_llm.config.errors import ScenarioError
from simpy_llm.speculative.acceptance import AcceptanceModel, fit_beta
from simpy_llm.speculative.curve_files import acceptance_from_dict, load_acceptance
from simpy_llm.speculative.curves import acceptance_model

SEED_EXAMPLE = """\
method: eagle
bins:
  - context_len: 128
    acceptance:
      k=1: {mean: 0.92, p95: 0.98}
      k=2: {mean: 0.85, p95: 0.93}
      k=4: {mean: 0.72, p95: 0.88}
  - context_len: 512
    acceptance:
      k=1: {mean: 0.89, p95: 0.97}
      k=2: {mean: 0.78, p95: 0.90}
      k=4: {mean: 0.63, p95: 0.82}
interpolation: linear
source: "SpecBench24"
notes: "Acceptance curves derived from offline evaluation on dataset X."
"""
"""Seed 003 §5.4's example, verbatim."""
MEANS = {128: {1: 0.92, 2: 0.85, 4: 0.72}, 512: {1: 0.89, 2: 0.78, 4: 0.63}}
P95 = {128: {1: 0.98, 2: 0.93, 4: 0.88}, 512: {1: 0.97, 2: 0.90, 4: 0.82}}


def seed_dict(**top) -> dict:
    """The seed's example as a dict, with top-level keys replaced by *top*."""
    data = yaml.safe_load(SEED_EXAMPLE)
    data.update(top)
    return data


def flat(mean: float, p95: float | None, k: int = 4, draw: str = "beta") -> AcceptanceModel:
    """One bin (so every context reads it) with the same mean and p95 at positions 1..k."""
    entry = {"mean": mean} if p95 is None else {"mean": mean, "p95": p95}
    return acceptance_from_dict({"method": "standard", "source": "test", "draw": draw,
                                 "bins": [{"context_len": 128, "acceptance": {f"k={i}": dict(entry) for i in range(1, k + 1)}}]})


def problems(data) -> list[tuple[str, str]]:
    with pytest.raises(ScenarioError) as info:
        acceptance_from_dict(data, "tails.yaml")
    return info.value.problems


def reference_beta(mean: float, p95: float) -> tuple[float, float]:
    """Beta ``(a, b)`` with this mean and 95th percentile: bisection on the concentration with scipy.stats."""
    def gap(log_c):
        c = math.exp(log_c)
        return stats.beta.ppf(0.95, mean * c, (1 - mean) * c) - p95

    log_c = optimize.bisect(gap, math.log(1e-2), math.log(1e7), xtol=1e-12)
    return mean * math.exp(log_c), (1 - mean) * math.exp(log_c)


def reference_chain(pairs: list[tuple[float, float]]) -> list[float]:
    """``S_m = E[q_1(v) ... q_m(v)]`` for v uniform, each q_i the quantile of the Beta with mean and p95 *pairs[i]*."""
    betas = [stats.beta(*reference_beta(m, q)) for m, q in pairs]
    return [integrate.quad(lambda v, n=n: math.prod(b.ppf(v) for b in betas[:n]), 0, 1, limit=500, epsabs=1e-12)[0]
            for n in range(1, len(betas) + 1)]


def law_from_chain(chain: list[float]) -> list[float]:
    """``P(M = m)`` from ``S_m = P(M >= m)``."""
    s = [1.0, *chain, 0.0]
    return [s[m] - s[m + 1] for m in range(len(chain) + 1)]


# --------------------------------------------------------------------------- loading


def test_the_seeds_example_loads_with_its_means(tmp_path) -> None:
    """The seed's example file loads as written: its means are the positions' probabilities at its contexts."""
    path = tmp_path / "eagle-example.yaml"
    path.write_text(SEED_EXAMPLE)
    m = load_acceptance(path)
    assert (m.name, m.method, m.source, m.draw, m.k_max, m.temperatures) == ("eagle-example", "eagle", "SpecBench24", "mean", 4, (0.0,))
    for context, means in MEANS.items():
        p = m.position_probabilities(context, 4)
        assert {k: p[k - 1] for k in means} == means
        assert p[2] == pytest.approx((means[2] + means[4]) / 2, abs=1e-15)   # k=3, between k=2 and k=4
    assert m.curves[0].p95[0] == pytest.approx((0.98, 0.93, 0.905, 0.88), abs=1e-15)


def test_bins_and_rows_describe_the_same_curve() -> None:
    """A bins file without interpolation reads like the rows file of the same numbers, at every context."""
    bins = acceptance_from_dict(seed_dict(interpolation="log_linear"))
    rows = acceptance_from_dict({
        "name": "rows", "drafter": "d", "verifier": "v", "method": "eagle", "source": "same numbers",
        "curves": [{"temperature": 0.0, "context_len": [128, 512],
                    "acceptance": [[0.92, 0.85, 0.785, 0.72], [0.89, 0.78, 0.705, 0.63]]}],
    })
    for c in (1, 100, 128, 200, 300, 511, 512, 10_000):
        assert bins.position_probabilities(c, 4) == pytest.approx(rows.position_probabilities(c, 4), abs=1e-15)


def test_linear_interpolation_is_linear_in_tokens() -> None:
    """interpolation: linear reads the midpoint in tokens (320) as the mean of the two rows."""
    m = acceptance_from_dict(seed_dict())
    for k, (lo, hi) in {1: (0.92, 0.89), 2: (0.85, 0.78), 4: (0.72, 0.63)}.items():
        assert m.position_probabilities(320, 4)[k - 1] == pytest.approx((lo + hi) / 2, abs=1e-15)


def test_bins_with_temperatures_make_a_curve_per_temperature() -> None:
    """Bins that give temperatures are grouped into one curve per temperature, read as rows files are."""
    data = {"method": "standard", "source": "test", "bins": [
        {"context_len": 128, "temperature": 0.0, "acceptance": {"k=1": {"mean": 0.9}}},
        {"context_len": 512, "temperature": 0.0, "acceptance": {"k=1": {"mean": 0.8}}},
        {"context_len": 128, "temperature": 1.0, "acceptance": {"k=1": {"mean": 0.5}}},
    ]}
    m = acceptance_from_dict(data)
    assert m.temperatures == (0.0, 1.0)
    assert [c.context_len for c in m.curves] == [(128, 512), (128,)]
    assert m.position_probabilities(128, 1, temperature=0.5) == pytest.approx((0.7,), abs=1e-15)


@pytest.mark.parametrize(
    ("change", "path"),
    [
        (lambda d: d["bins"][0]["acceptance"]["k=1"].update(std=0.1), "bins[0].acceptance.k=1.std"),
        (lambda d: d["bins"][0]["acceptance"].update({"k1": {"mean": 0.5}}), "bins[0].acceptance.k1"),
        (lambda d: d["bins"][0]["acceptance"].update({"k=65": {"mean": 0.5}}), "bins[0].acceptance.k=65"),
        (lambda d: d["bins"][0]["acceptance"]["k=2"].update(mean=1.5), "bins[0].acceptance.k=2.mean"),
        (lambda d: d["bins"][0]["acceptance"]["k=2"].pop("mean"), "bins[0].acceptance.k=2.mean"),
        (lambda d: d["bins"][1]["acceptance"]["k=2"].pop("p95"), "bins[1].acceptance.k=2.p95"),
        (lambda d: d["bins"][1]["acceptance"].pop("k=4"), "bins[1].acceptance"),
        (lambda d: [b["acceptance"].pop("k=1") for b in d["bins"]], "bins[0].acceptance"),
        (lambda d: d["bins"][1].update(context_len=128), "bins[1].context_len"),
        (lambda d: d["bins"][1].update(context_len=2.5), "bins[1].context_len"),
        (lambda d: d["bins"][0].update(temperature=0.7), "bins[1].temperature"),
        (lambda d: [b.update(temperature=t) for b, t in zip(d["bins"], (0.7, 0.0), strict=True)], "bins[1].temperature"),
        (lambda d: d["bins"][0].update(colour="red"), "bins[0].colour"),
        (lambda d: d.update(draw="lognormal"), "draw"),
        (lambda d: d.update(interpolation="cubic"), "interpolation"),
        (lambda d: d.update(curves=[]), "curves"),
        (lambda d: d.pop("source"), "source"),
        (lambda d: d.update(bins=[]), "bins"),
        (lambda d: [e.pop("p95") for b in d["bins"] for e in b["acceptance"].values()] and d.update(draw="beta"), "draw"),
        (lambda d: d["bins"][0]["acceptance"]["k=2"].update(p95=0.80) or d.update(draw="beta"), "bins[0].acceptance.k=2"),
        (lambda d: d["bins"][0]["acceptance"]["k=4"].update(p95=1.0) or d.update(draw="beta"), "bins[0].acceptance.k=4"),
    ],
)
def test_a_bad_bins_file_is_refused_naming_the_key_path(change, path) -> None:
    """Each mistake in a bins file is a ScenarioError naming its key path (and nothing else is reported)."""
    data = seed_dict()
    change(data)
    found = problems(data)
    assert [p for p, _ in found] == [path], found


def test_an_impossible_tail_says_what_a_beta_needs() -> None:
    """A p95 below the mean, with draw: beta, names the position and says no Beta has it."""
    data = seed_dict(draw="beta")
    data["bins"][1]["acceptance"]["k=1"]["p95"] = 0.5
    [(path, message)] = problems(data)
    assert path == "bins[1].acceptance.k=1"
    assert "no Beta distribution has mean 0.89 and 95th percentile 0.5" in message


_JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**30), st.floats(allow_nan=True, allow_infinity=True),
                  st.text(max_size=5), st.lists(st.floats(-1, 2), max_size=3), st.dictionaries(st.text(max_size=3), st.floats(-1, 2), max_size=2))


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_fuzzed_bins_files_load_or_raise_scenario_error(data) -> None:
    """The seed's example (draw: beta) with values replaced, keys deleted or added loads or raises ScenarioError only."""
    d = seed_dict(draw="beta")
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from([p for p in _paths(d) if p]))
        parent = d
        for key in path[:-1]:
            parent = parent[key]
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = data.draw(_JUNK)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[data.draw(st.sampled_from(["k=3", "k=5", "p95", "mean", "temperature", "x"]))] = data.draw(_JUNK)
        else:
            parent.append(data.draw(_JUNK))
    try:
        m = acceptance_from_dict(copy.deepcopy(d))
    except ScenarioError:
        return
    assert all(0.0 <= x <= 1.0 for x in m.position_probabilities(300, m.k_max, temperature=0.5))


# --------------------------------------------------------------------------- the Beta fit


@pytest.mark.parametrize(("mean", "p95"), [(0.92, 0.98), (0.72, 0.88), (0.5, 0.51), (0.3, 0.9), (0.1, 0.5), (0.99, 0.999)])
def test_the_fitted_beta_has_the_mean_and_p95(mean, p95) -> None:
    """fit_beta's (a, b) has the asked mean and 95th percentile by scipy.stats, and matches a bisection fit."""
    a, b = fit_beta(mean, p95)
    assert stats.beta.mean(a, b) == pytest.approx(mean, abs=1e-12)
    assert stats.beta.ppf(0.95, a, b) == pytest.approx(p95, abs=1e-9)
    assert (a, b) == pytest.approx(reference_beta(mean, p95), rel=1e-6)


@pytest.mark.parametrize(("mean", "p95"), [(0.9, 0.8), (0.5, 1.0), (0.0, 0.1), (1.0, 0.9), (1.2, 0.9), (0.5, math.nan)])
def test_no_beta_fits_an_impossible_pair(mean, p95) -> None:
    """A p95 below the mean, a p95 of 1, a degenerate mean with a spread, or a value outside [0, 1] raise ValueError."""
    with pytest.raises(ValueError, match=r"Beta|\[0, 1\]"):
        fit_beta(mean, p95)


def test_a_p95_equal_to_the_mean_is_no_spread() -> None:
    """p95 == mean is a point mass: with draw: beta, the rounds all use the mean, as draw: mean does."""
    assert fit_beta(0.7, 0.7) == (math.inf, math.inf)
    beta, mean = flat(0.7, 0.7), flat(0.7, 0.7, draw="mean")
    assert beta.position_probabilities(300, 4) == pytest.approx(mean.position_probabilities(300, 4), abs=1e-12)
    assert np.all(beta.sample_round_probabilities(np.random.default_rng(0), 300, 4, 10) == 0.7)


# --------------------------------------------------------------------------- per-round draws


N_ROUNDS = 200_000
"""Rounds drawn to check a distribution: a mean's standard error is sd / 447, a quantile's
coverage has standard error sqrt(0.95 * 0.05 / N) = 0.00049."""


def check_draws(draws: np.ndarray, mean: float, p95: float) -> None:
    """The draws' mean is *mean* within 4 standard errors (their own sd / sqrt(n)), and the
    share of draws <= *p95* is 0.95 within 4 standard errors of a binomial share."""
    n = len(draws)
    assert abs(draws.mean() - mean) <= 4 * draws.std() / math.sqrt(n)
    assert abs((draws <= p95).mean() - 0.95) <= 4 * math.sqrt(0.95 * 0.05 / n)


def test_round_draws_have_the_files_mean_and_p95() -> None:
    """At a grid context (seed 1), each position's drawn probabilities have the file's mean and
    95th percentile; k=3 has the interpolation of k=2 and k=4."""
    m = acceptance_from_dict(seed_dict(draw="beta"))
    draws = m.sample_round_probabilities(np.random.default_rng(1), 512, 4, N_ROUNDS)
    assert draws.shape == (N_ROUNDS, 4)
    for k in (1, 2, 4):
        check_draws(draws[:, k - 1], MEANS[512][k], P95[512][k])
    check_draws(draws[:, 2], (0.78 + 0.63) / 2, (0.90 + 0.82) / 2)


def test_round_draws_between_contexts_have_the_interpolated_mean_and_p95() -> None:
    """Between grid contexts (linear: 224 is a quarter of the way), a position's draws have the
    interpolated mean and p95 (seed 2)."""
    m = acceptance_from_dict(seed_dict(draw="beta"))
    draws = m.sample_round_probabilities(np.random.default_rng(2), 224, 4, N_ROUNDS)
    for k in (1, 2, 4):
        check_draws(draws[:, k - 1], 0.75 * MEANS[128][k] + 0.25 * MEANS[512][k], 0.75 * P95[128][k] + 0.25 * P95[512][k])


def test_a_round_shares_its_quantile_across_positions() -> None:
    """A round's positions come from one uniform: with equal Betas at every position they are equal."""
    draws = flat(0.6, 0.95).sample_round_probabilities(np.random.default_rng(3), 128, 4, 1000)
    assert np.all(draws == draws[:, :1])
    assert draws[:, 0].std() > 0.1


def test_draw_mean_keeps_p95_and_draws_nothing() -> None:
    """With draw: mean, p95 is kept on the curve, every round's probabilities are the means and no uniform is drawn."""
    m = acceptance_from_dict(seed_dict())
    rng = np.random.default_rng(4)
    state = copy.deepcopy(rng.bit_generator.state)
    draws = m.sample_round_probabilities(rng, 128, 4, 5)
    assert rng.bit_generator.state == state
    assert np.all(draws == np.array(m.position_probabilities(128, 4)))
    assert m.curves[0].p95[1] == (0.97, 0.90, 0.86, 0.82)


# --------------------------------------------------------------------------- the round mixture


@pytest.mark.parametrize(("model", "pairs", "context"), [
    ("seed", [(0.92, 0.98), (0.85, 0.93), (0.785, 0.905), (0.72, 0.88)], 128),
    ("flat", [(0.6, 0.95)] * 4, 128),
])
def test_the_count_law_is_the_round_mixture(model, pairs, context) -> None:
    """With draw: beta, P(M = m) is E[q_1(v) ... q_m(v) (1 - q_m+1(v))] over the round's
    quantile v, integrated here independently (quad), within 1e-6 (the model averages over
    1024 strata of v; the error measured is about 3e-7)."""
    m = acceptance_from_dict(seed_dict(draw="beta")) if model == "seed" else flat(0.6, 0.95)
    expected = law_from_chain(reference_chain(pairs))
    assert m.accepted_distribution(context, 4) == pytest.approx(expected, abs=1e-6)
    assert m.expected_tokens(context, 4) == pytest.approx(1 + sum(reference_chain(pairs)), abs=1e-5)


def test_shared_quantiles_raise_later_positions_but_not_the_first() -> None:
    """p_1 is the mean; later conditional probabilities exceed their means (an accepted position
    signals an easy round), so a round emits more tokens than with the means."""
    beta, mean = flat(0.6, 0.95), flat(0.6, 0.95, draw="mean")
    p = beta.position_probabilities(128, 4)
    assert p[0] == pytest.approx(0.6, abs=1e-12)
    assert all(x > 0.6 + 0.05 for x in p[1:])
    assert beta.expected_tokens(128, 4) > mean.expected_tokens(128, 4) + 0.2


def test_drawing_rounds_then_positions_gives_the_count_law() -> None:
    """Rounds drawn with sample_round_probabilities, then each position accepted with its
    round's probability until the first rejection (in the test), give the model's count law:
    each count's share within 4 binomial standard errors (seed 5, 200,000 rounds)."""
    m = acceptance_from_dict(seed_dict(draw="beta"))
    rng = np.random.default_rng(5)
    p = m.sample_round_probabilities(rng, 300, 4, N_ROUNDS)
    accepted = np.logical_and.accumulate(rng.random(p.shape) < p, axis=1).sum(axis=1)
    shares = np.bincount(accepted, minlength=5) / N_ROUNDS
    for share, q in zip(shares, m.accepted_distribution(300, 4), strict=True):
        assert abs(share - q) <= 4 * math.sqrt(q * (1 - q) / N_ROUNDS)


def test_the_shipped_tails_curve_is_the_seeds_example_with_beta_draws() -> None:
    """illustrative-eagle-tails is the seed's example with draw: beta."""
    m = acceptance_model("illustrative-eagle-tails")
    assert (m.draw, m.illustrative, m.k_max) == ("beta", True, 4)
    assert m.curves == acceptance_from_dict(seed_dict(draw="beta")).curves
