"""Output-length predictors: determinism, the stated error distribution, strict YAML structuring."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from simpy_llm.config.errors import FieldValueError, ScenarioError
from simpy_llm.config.schema import PolicySpec
from simpy_llm.config.structure import build_policy
from simpy_llm.entities import Request
from simpy_llm.loading import scenario_from_dict
from simpy_llm.policies import OutputPredictor, SemiClairvoyant, routing_policies


def req(id: int, output: int = 1000, prompt: int = 10) -> Request:
    return Request(id=id, client_id="c", prompt_tokens=prompt, output_tokens=output, arrival_s=0.0)


def test_oracle_returns_the_true_output_length() -> None:
    """kind: oracle predicts request.output_tokens exactly."""
    assert [OutputPredictor(kind="oracle").predict(req(i, output=o)) for i, o in enumerate((1, 77, 4096))] == [
        1.0,
        77.0,
        4096.0,
    ]


def test_noisy_with_zero_sigma_is_the_oracle() -> None:
    """sigma 0 means no error."""
    assert OutputPredictor(kind="noisy", sigma=0.0).predict(req(3, output=321)) == 321.0


def test_noisy_prediction_is_pinned_across_processes() -> None:
    """Predictions come from a fixed counter-based hash, not from any process-dependent state."""
    p = OutputPredictor(kind="noisy", sigma=0.5, seed=0)
    got = [p.predict(req(i)) for i in range(3)]
    assert got == pytest.approx([1073.5486700066924, 354.36568881828464, 1459.8889700724628], rel=1e-12)


def test_noisy_prediction_does_not_depend_on_call_order_or_instance() -> None:
    """The same (seed, request id) gives the same prediction whenever and wherever it is asked."""
    ids = list(range(50))
    p = OutputPredictor(kind="noisy", sigma=0.7, seed=9)
    forward = [p.predict(req(i)) for i in ids]
    backward = [OutputPredictor(kind="noisy", sigma=0.7, seed=9).predict(req(i)) for i in reversed(ids)]
    assert forward == backward[::-1]


def test_noisy_error_depends_on_seed_and_id_only() -> None:
    """The multiplicative error is a function of (seed, id): other request fields do not change it."""
    p = OutputPredictor(kind="noisy", sigma=0.5, seed=1)
    assert p.predict(req(5, output=100, prompt=3)) * 7 == pytest.approx(p.predict(req(5, output=700, prompt=900)))
    assert p.predict(req(5)) != OutputPredictor(kind="noisy", sigma=0.5, seed=2).predict(req(5))
    assert p.predict(req(5)) != p.predict(req(6))


@pytest.mark.parametrize("sigma", [0.3, 0.8])
def test_log_error_has_the_stated_normal_moments(sigma: float) -> None:
    """log(predicted / true) ~ Normal(-sigma^2/2, sigma^2): mean and variance within 4 standard errors, KS passes.

    n = 20000 ids; SE(mean) = sigma / sqrt(n); SE(variance) = sigma^2 sqrt(2 / (n - 1)).
    """
    n = 20000
    p = OutputPredictor(kind="noisy", sigma=sigma, seed=4)
    log_err = np.log([p.predict(req(i, output=1000)) / 1000 for i in range(n)])
    assert abs(log_err.mean() + sigma**2 / 2) < 4 * sigma / math.sqrt(n)
    assert abs(log_err.var(ddof=1) - sigma**2) < 4 * sigma**2 * math.sqrt(2 / (n - 1))
    assert stats.kstest(log_err, stats.norm(loc=-(sigma**2) / 2, scale=sigma).cdf).pvalue > 1e-3


def test_noisy_prediction_is_mean_preserving() -> None:
    """E[predicted] = true: the mean ratio is 1 within 4 standard errors (SE = sqrt(exp(sigma^2) - 1) / sqrt(n))."""
    n, sigma = 20000, 0.5
    p = OutputPredictor(kind="noisy", sigma=sigma, seed=7)
    ratio = np.array([p.predict(req(i, output=1000)) / 1000 for i in range(n)])
    assert abs(ratio.mean() - 1) < 4 * math.sqrt(math.expm1(sigma**2)) / math.sqrt(n)


def test_oracle_rejects_error_settings() -> None:
    """sigma or seed given with kind oracle would change nothing, so they are errors at their key."""
    with pytest.raises(FieldValueError) as info:
        OutputPredictor(kind="oracle", sigma=0.8)
    assert info.value.field == "sigma"
    with pytest.raises(FieldValueError) as info:
        OutputPredictor(kind="oracle", seed=3)
    assert info.value.field == "seed"


@pytest.mark.parametrize(
    ("fields", "key"), [({"kind": "psychic"}, "kind"), ({"kind": "noisy", "sigma": -1.0}, "sigma")]
)
def test_invalid_settings_name_their_key(fields: dict, key: str) -> None:
    """An unknown kind or a negative sigma is a FieldValueError for that key."""
    with pytest.raises(FieldValueError) as info:
        OutputPredictor(**fields)
    assert info.value.field == key


def test_predictor_is_structured_from_a_nested_mapping() -> None:
    """params: {predictor: {kind: noisy, sigma: 0.8}} builds the policy with that predictor."""
    policy = build_policy(
        PolicySpec(kind="semi_clairvoyant", params={"predictor": {"kind": "noisy", "sigma": 0.8, "seed": 2}}),
        routing_policies,
    )
    assert isinstance(policy, SemiClairvoyant)
    assert policy.predictor == OutputPredictor(kind="noisy", sigma=0.8, seed=2)


@pytest.mark.parametrize(
    ("predictor", "path", "message"),
    [
        (
            {"kind": "noisy", "sigmaa": 0.8},
            "serving.router.params.predictor.sigmaa",
            "unknown key; allowed: kind, sigma, seed",
        ),
        ({"sigma": 0.8}, "serving.router.params.predictor.kind", "required key is missing"),
        ({"kind": "oracle", "sigma": 0.8}, "serving.router.params.predictor.sigma", "applies only to kind 'noisy'"),
        ({"kind": "noisy", "seed": 1.5}, "serving.router.params.predictor.seed", "must be an integer"),
    ],
)
def test_scenario_predictor_problems_name_the_key_path(
    quickstart_data: dict, predictor: dict, path: str, message: str
) -> None:
    """A bad nested predictor in a scenario is one problem at its full key path."""
    quickstart_data["serving"]["router"] = {"kind": "semi_clairvoyant", "params": {"predictor": predictor}}
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(quickstart_data)
    assert info.value.paths == [path]
    assert message in info.value.problems[0][1]
