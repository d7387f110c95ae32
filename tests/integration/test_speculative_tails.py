"""Per-round acceptance draws (``draw: beta``, docs/speculative.md "The acceptance pipeline")
in a simulation: the rounds' accepted counts follow the round mixture, computed here with
scipy (a Beta fitted by bisection, the chain integrated by quad), sharing no code with the model."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import yaml
from scipy import integrate, optimize, stats

from simpy_llm import Simulation, scenario_from_dict
from tests.spec_helpers import spec_scenario

MEAN, P95, K = 0.6, 0.95, 4
"""Every position: mean 0.6, 95th percentile 0.95 (a wide spread, so the mixture differs from the means)."""


def tails_curve(tmp_path, draw: str) -> str:
    """A bins file with one bin (every context reads it), positions 1..K at (MEAN, P95); returns its path."""
    data = {"name": f"tails-{draw}", "method": "standard", "source": "hand-written for a test", "draw": draw,
            "bins": [{"context_len": 128, "acceptance": {f"k={i}": {"mean": MEAN, "p95": P95} for i in range(1, K + 1)}}]}
    path = tmp_path / f"tails-{draw}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def run_rounds(curve: str, seed: int = 1) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(requests, verify rounds) of 300 requests of 201 tokens on 30 devices at static γ = K."""
    data = spec_scenario(curve, requests=300, rate=50.0, output=201, devices=30, seed=seed,
                         speculation={"gamma_policy": {"kind": "static", "params": {"gamma": K}}})
    results = Simulation(scenario_from_dict(data)).run(progress=False)
    return results.to_dataframe(), results.spec_rounds()


def mixture_law() -> list[float]:
    """P(M = m), m = 0..K: v uniform, every position's probability the v-quantile of the Beta with
    mean MEAN and 95th percentile P95, so P(M >= m) = integral of q(v)**m."""
    c = math.exp(optimize.bisect(lambda x: stats.beta.ppf(0.95, MEAN * math.exp(x), (1 - MEAN) * math.exp(x)) - P95,
                                 math.log(1e-2), math.log(1e7), xtol=1e-12))
    q = stats.beta(MEAN * c, (1 - MEAN) * c).ppf
    at_least = [1.0] + [integrate.quad(lambda v, m=m: q(v) ** m, 0, 1, limit=500)[0] for m in range(1, K + 1)] + [0.0]
    return [at_least[m] - at_least[m + 1] for m in range(K + 1)]


@pytest.fixture(scope="module")
def beta_runs(tmp_path_factory):
    """The draw: beta scenario run twice with seed 1, and its draw: mean twin once."""
    tmp = tmp_path_factory.mktemp("tails")
    beta = tails_curve(tmp, "beta")
    return run_rounds(beta), run_rounds(beta), run_rounds(tails_curve(tmp, "mean"))


def test_simulated_rounds_follow_the_round_mixture(beta_runs) -> None:
    """Over the full rounds (γ = 4, about 20,000), each accepted count's share is the mixture's
    probability within 4 binomial standard errors, and the means-only law is far outside them."""
    (_, rounds), _, _ = beta_runs
    full = rounds[rounds["gamma"] == K]
    n = len(full)
    assert n > 15_000
    shares = full["accepted"].value_counts(normalize=True).reindex(range(K + 1), fill_value=0.0)
    law = mixture_law()
    for m in range(K + 1):
        assert abs(shares[m] - law[m]) <= 4 * math.sqrt(law[m] * (1 - law[m]) / n), (m, shares[m], law[m])
    means_only_all = MEAN**K
    assert abs(shares[K] - means_only_all) > 20 * math.sqrt(law[K] * (1 - law[K]) / n)


def test_beta_draws_are_deterministic_and_change_the_run(beta_runs) -> None:
    """The same seed gives byte-identical records with draw: beta; draw: mean on the same numbers gives others."""
    (requests, rounds), (requests_again, rounds_again), (_, rounds_mean) = beta_runs
    assert requests.to_csv() == requests_again.to_csv()
    assert rounds.to_csv() == rounds_again.to_csv()
    assert rounds["accepted"].mean() > rounds_mean["accepted"].mean() + 0.1
