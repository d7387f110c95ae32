"""Bounds on numeric settings, the tail rule of length distributions, and sampling errors
reported as ScenarioErrors naming the distribution's key path."""

from __future__ import annotations

import copy
import math
import re
from typing import Any

import attrs
import numpy as np
import pytest

from simpy_llm import Simulation
from simpy_llm.config import ScenarioError
from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.validators import (
    MAX_ITEMS_PER_REQUEST,
    MAX_TOKENS,
    all_of,
    at_least,
    at_most,
    in_range,
    interval_within,
    unless,
)
from simpy_llm.loading import scenario_from_dict
from simpy_llm.rng import RandomStreams
from simpy_llm.workload.distributions import (
    MAX_TAIL_SHARE,
    ClampedGaussian,
    Constant,
    Exponential,
    Gamma,
    LogNormal,
    Normal,
    Pareto,
    ParetoLogNormal,
    SamplingError,
    Weibull,
    draw_tokens,
    to_tokens,
)
from simpy_llm.workload.generator import ClientSource, sampling_scenario_error, to_counts
from tests.helpers import NanDistribution, tiny_scenario

CLIENT = "workload.clients[0]"


def _set(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """Set the dotted *path* (``a.b[0].c``) in *data*, creating mappings on the way."""
    steps = [int(t[1:-1]) if t.startswith("[") else t for t in re.findall(r"\[\d+\]|[^.\[\]]+", path)]
    node: Any = data
    for step in steps[:-1]:
        node = node[step] if isinstance(step, int) else node.setdefault(step, {})
    node[steps[-1]] = value
    return data


def _error(data: dict[str, Any]) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data)
    return info.value


# --------------------------------------------------------------------------- validators


@attrs.frozen
class _Holder:
    n: float = attrs.field(validator=all_of(at_least(0), at_most(10)))


def test_at_most_states_the_bound() -> None:
    """at_most rejects a value above the bound with "must be <= bound, got value"."""
    with pytest.raises(FieldValueError, match=r"n: must be <= 10, got 11"):
        _Holder(11)


def test_all_of_reports_the_first_failing_validator() -> None:
    """all_of applies its validators in order: a negative value fails at_least first."""
    with pytest.raises(FieldValueError, match=r"must be >= 0, got -1"):
        _Holder(-1)
    assert _Holder(10).n == 10


def test_at_most_rejects_an_int_too_large_for_a_float() -> None:
    """An integer beyond float range is reported as not finite, not as an OverflowError."""
    with pytest.raises(FieldValueError, match="finite"):
        _Holder(10**400)


@pytest.mark.parametrize("value", [(5.0, 2.0), (-1.0, 2.0), (0.0, 1e10), (1.0,), "ab", (0.0, math.nan)])
def test_interval_within_rejects_bad_pairs(value: Any) -> None:
    """interval_within needs a pair start < end inside [low, high] of finite numbers."""

    @attrs.frozen
    class Span:
        span_s: Any = attrs.field(validator=interval_within(0, 1e9))

    with pytest.raises(FieldValueError):
        Span(value)
    assert Span((1.0, 2.0)).span_s == (1.0, 2.0)


def test_unless_skips_the_literal() -> None:
    """unless("auto", v) accepts "auto" and applies v to anything else."""

    @attrs.frozen
    class Blocks:
        n: Any = attrs.field(validator=unless("auto", in_range(1, 5)))

    assert Blocks("auto").n == "auto"
    with pytest.raises(FieldValueError, match="must be in"):
        Blocks(6)


# --------------------------------------------------------------------------- scenario keys

OUT_OF_BOUNDS = [
    ("serving.replicas", 2**70, "serving.replicas", "must be <= 100000"),
    ("serving.engine.kv_num_blocks", 2**40, "serving.engine.kv_num_blocks", "must be <= 2147483648"),
    ("serving.engine.kv_block_size", 2**20, "serving.engine.kv_block_size", "must be <= 65536"),
    ("serving.engine.max_num_seqs", 2**30, "serving.engine.max_num_seqs", f"must be <= {MAX_TOKENS}"),
    ("serving.engine.max_num_batched_tokens", 2**30, "serving.engine.max_num_batched_tokens", f"must be <= {MAX_TOKENS}"),
    ("serving.engine.max_model_len", 2**30, "serving.engine.max_model_len", f"must be <= {MAX_TOKENS}"),
    ("seed", 2**63, "seed", "must be <= 9223372036854775807"),
    ("workload.seed", 2**64, "workload.seed", "must be <= 9223372036854775807"),
    ("workload.aggregate_rate", 1e300, "workload.aggregate_rate", "must be in [1e-09, 1000000.0]"),
    ("workload.aggregate_rate", 1e-12, "workload.aggregate_rate", "must be in [1e-09, 1000000.0]"),
    ("workload.num_requests", 2**40, "workload.num_requests", "must be <= 2147483648"),
    ("simulation.until_s", 1e12, "simulation.until_s", "must be <= 1000000000.0"),
    ("slo.chat.ttft_s", 1e300, "slo.chat.ttft_s", "must be <= 1000000000.0"),
    (f"{CLIENT}.priority", 2**70, f"{CLIENT}.priority", "must be in [-2147483647, 2147483647]"),
    (f"{CLIENT}.prefix_length", 2**30, f"{CLIENT}.prefix_length", f"must be <= {MAX_TOKENS}"),
    (f"{CLIENT}.network", {"rtt_ms": 1e300}, f"{CLIENT}.network.rtt_ms", "must be <="),
    (f"{CLIENT}.network", {"bandwidth_mbps": 1e300}, f"{CLIENT}.network.bandwidth_mbps", "must be <="),
    (f"{CLIENT}.lifecycle", {"windows": [{"start_s": 0, "end_s": 1e300}]}, f"{CLIENT}.lifecycle.windows[0].end_s", "must be <="),
    (f"{CLIENT}.arrival", {"process": "gamma", "cv": 1e200}, f"{CLIENT}.arrival.cv", "must be in [0.01, 100.0]"),
    (
        f"{CLIENT}.multi_turn",
        {"max_rounds": 2**70, "think_time": {"type": "constant", "params": {"value": 1}}},
        f"{CLIENT}.multi_turn.max_rounds",
        "must be <= 2147483648",
    ),
]


@pytest.mark.parametrize(("key", "value", "path", "message"), OUT_OF_BOUNDS, ids=[f"{c[0]}={c[1]!r:.20}" for c in OUT_OF_BOUNDS])
def test_out_of_bounds_value_is_rejected_with_its_range(key: str, value: Any, path: str, message: str) -> None:
    """A value beyond what the simulation represents is a ScenarioError naming the key and the range."""
    err = _error(_set(tiny_scenario(), key, value))
    assert err.paths == [path]
    assert message in err.problems[0][1]


def test_client_rate_below_min_rate_is_rejected() -> None:
    """A client whose share of the aggregate rate is below MIN_RATE is rejected at its rate_fraction."""
    data = tiny_scenario()
    data["workload"]["clients"].append({**copy.deepcopy(data["workload"]["clients"][0]), "id": "c1", "rate_fraction": 1e-300})
    err = _error(data)
    assert err.paths == ["workload.clients[1].rate_fraction"]
    assert "must be >= 1e-09" in err.problems[0][1]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [("rate_scale", 1e6, "must be in [0.001, 100.0]"), ("rate_scale", 1e-9, "must be in"), ("span_s", [5, 1], "start < end")],
)
def test_servegen_scales_and_span_are_bounded(key: str, value: Any, message: str) -> None:
    """ServeGen's rate_scale lies in [MIN_SCALE, MAX_SCALE] and span_s is an increasing pair."""
    data = tiny_scenario()
    data["workload"] = {"horizon_s": 10.0, "servegen_data": {"path": "somewhere", key: value}}
    err = _error(data)
    assert err.paths == [f"workload.servegen_data.{key}"]
    assert message in err.problems[0][1]


@pytest.mark.parametrize(("key", "value"), [("time_scale", 1e9), ("rate_scale", 1e-9), ("max_requests", 2**40)])
def test_trace_scales_and_counts_are_bounded(key: str, value: Any) -> None:
    """A trace's time_scale and rate_scale lie in [MIN_SCALE, MAX_SCALE]; max_requests is at most MAX_REQUESTS."""
    data = tiny_scenario()
    data["workload"] = {"traces": [{"path": "trace.csv", key: value}]}
    err = _error(data)
    assert err.paths == [f"workload.traces[0].{key}"]
    assert "must be" in err.problems[0][1]


def test_values_at_the_bounds_are_accepted() -> None:
    """Values exactly at the bounds load."""
    data = tiny_scenario()
    _set(data, "seed", 2**63 - 1)
    _set(data, "serving.engine.kv_num_blocks", 2**31)
    _set(data, "serving.engine.kv_block_size", 2**16)
    _set(data, f"{CLIENT}.prefix_length", MAX_TOKENS)
    _set(data, "workload.aggregate_rate", 1e6)
    assert scenario_from_dict(data).seed == 2**63 - 1


# --------------------------------------------------------------------------- the tail rule

TAILS = [
    ({"type": "lognormal", "params": {"mu": 2**70, "sigma": 0.5}}, "mu"),
    ({"type": "lognormal", "params": {"mu": 17.0, "sigma": 0.0}}, "mu"),  # median e**17 > MAX_TOKENS
    ({"type": "lognormal", "params": {"mu": 15.0, "sigma": 1.0}}, "mu"),  # 5% above
    ({"type": "lognormal", "params": {"mu": 0.0, "sigma": 21.0}}, "sigma"),
    ({"type": "exponential", "params": {"mean": 1e7}}, "mean"),
    ({"type": "constant", "params": {"value": 2**25}}, "value"),
    ({"type": "gaussian", "params": {"mean": 2e7, "std_dev": 10}}, "mean"),
    ({"type": "normal", "params": {"mean": 1e7, "std_dev": 1e7}}, "std_dev"),
    ({"type": "normal", "params": {"mean": -1e300, "std_dev": 1}}, "mean"),
    ({"type": "uniform", "params": {"low": 0, "high": 2**25}}, "high"),
    ({"type": "pareto", "params": {"alpha": 0.2, "xm": 1}}, "alpha"),
    ({"type": "pareto", "params": {"alpha": 0.01, "xm": 1e-300}}, "alpha"),
    ({"type": "pareto", "params": {"alpha": 3, "xm": 2**25}}, "xm"),
    ({"type": "pareto_lognormal", "params": {"alpha": 3, "xm": 10, "mu": 30, "sigma": 1, "mix_weight": 0.5}}, "mu"),
    ({"type": "pareto_lognormal", "params": {"alpha": 0.1, "xm": 10, "mu": 3, "sigma": 1, "mix_weight": 0.5}}, "alpha"),
    ({"type": "pareto_lognormal", "params": {"alpha": 3, "xm": 10, "mu": 1e300, "sigma": 1, "mix_weight": 0.999}}, "mu"),
    ({"type": "weibull", "params": {"shape": 0.05, "scale": 1}}, "scale"),
    ({"type": "weibull", "params": {"shape": 5e-324, "scale": 5e-324}}, "scale"),
    ({"type": "gamma", "params": {"shape": 1, "scale": 1e7}}, "scale"),
    ({"type": "empirical", "params": {"pmf": {2**30: 0.5, 10: 0.5}}}, "pmf"),
    ({"type": "empirical", "params": {"values": [10, 2**30], "probabilities": [0.9, 0.1]}}, "values"),
]


@pytest.mark.parametrize(("dist", "key"), TAILS, ids=[f"{d['type']}-{i}" for i, (d, _) in enumerate(TAILS)])
def test_distribution_beyond_max_tokens_is_rejected_at_its_parameter(dist: dict[str, Any], key: str) -> None:
    """A length distribution putting more than 1% of its draws above MAX_TOKENS (or with a
    shape that overflows float64) is rejected when loaded, naming the parameter."""
    err = _error(_set(tiny_scenario(), f"{CLIENT}.input_distribution", dist))
    assert err.paths == [f"{CLIENT}.input_distribution.params.{key}"]


@pytest.mark.parametrize(
    "dist",
    [
        LogNormal(mu=10.0, sigma=2.5),
        Exponential(mean=3e6),
        Pareto(alpha=0.3, xm=1.0),
        Pareto(alpha=0.05, xm=5e-324),
        Weibull(shape=0.1, scale=1.0),
        Gamma(shape=1.0, scale=3e6),
        Normal(mean=1e6, std_dev=6e6),
        ClampedGaussian(mean=1e7, std_dev=1e6),
        ParetoLogNormal(alpha=1.5, xm=50, mu=5.5, sigma=1.2, mix_weight=0.3),
    ],
    ids=repr,
)
def test_accepted_distributions_draw_at_most_the_tail_share_above_max_tokens(dist: Any) -> None:
    """An accepted distribution's draws above MAX_TOKENS are at most MAX_TAIL_SHARE (within 5 standard errors)."""
    n = 200_000
    share = float(np.mean(dist.sample(np.random.default_rng(7), n) > MAX_TOKENS))
    assert share <= MAX_TAIL_SHARE + 5 * math.sqrt(MAX_TAIL_SHARE * (1 - MAX_TAIL_SHARE) / n)


def test_mixture_may_hold_a_rare_branch_with_a_wide_tail() -> None:
    """A log-normal branch that alone would be rejected (45% above MAX_TOKENS) is allowed at weight
    0.5%: the mixture's share above MAX_TOKENS stays under 1%, and its moments are those of the mixture."""
    d = ParetoLogNormal(alpha=3.0, xm=10.0, mu=16.0, sigma=5.0, mix_weight=0.995)
    with pytest.raises(FieldValueError):
        LogNormal(mu=16.0, sigma=5.0)
    assert d.mean == pytest.approx(0.995 * 15.0 + 0.005 * math.exp(16.0 + 12.5))


def test_heavy_tail_draws_are_clamped_to_max_tokens() -> None:
    """A Pareto with alpha 0.3 draws beyond MAX_TOKENS now and then; as tokens they are MAX_TOKENS, not an error."""
    tokens = draw_tokens(Pareto(alpha=0.3, xm=1.0), np.random.default_rng(3), 20_000)
    assert tokens.max() == MAX_TOKENS
    assert 0 < np.count_nonzero(tokens == MAX_TOKENS) < 20_000 * MAX_TAIL_SHARE


# --------------------------------------------------------------------------- sampling errors


def test_to_tokens_clamps_to_max_tokens() -> None:
    """to_tokens maps lengths into [1, MAX_TOKENS] as int64."""
    out = to_tokens(np.array([-5.0, 0.4, 3.6, 2.0**40, 1e300]))
    assert out.tolist() == [1, 1, 4, MAX_TOKENS, MAX_TOKENS]
    assert out.dtype == np.int64


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_to_tokens_rejects_non_finite_draws_naming_the_distribution(bad: float) -> None:
    """to_tokens raises SamplingError for NaN or an infinity, carrying the distribution it is given."""
    dist = Constant(value=3)
    with pytest.raises(SamplingError, match="not finite") as info:
        to_tokens(np.array([1.0, bad]), dist)
    assert info.value.distribution is dist


def test_to_counts_clamps_and_rejects_non_finite() -> None:
    """to_counts maps counts into [0, MAX_ITEMS_PER_REQUEST] and raises SamplingError on NaN."""
    assert to_counts(np.array([-1.0, 2.4, 1e12])).tolist() == [0, 2, MAX_ITEMS_PER_REQUEST]
    with pytest.raises(SamplingError):
        to_counts(np.array([math.nan]))


def _forced(dist: Any, **fields: float) -> Any:
    """*dist* with *fields* set past its validators (parameters no scenario can give)."""
    for name, value in fields.items():
        object.__setattr__(dist, name, value)
    return dist


@pytest.mark.parametrize(
    "dist",
    [
        _forced(LogNormal(mu=1.0, sigma=1.0), mu=800.0),
        _forced(Exponential(mean=1.0), mean=math.inf),
        _forced(Normal(mean=0.0, std_dev=1.0), std_dev=1e308),
        _forced(Pareto(alpha=1.0, xm=1.0), alpha=1e-3),
        _forced(Gamma(shape=1.0, scale=1.0), scale=math.inf),
        _forced(Weibull(shape=1.0, scale=1.0), scale=1e308, shape=0.01),
    ],
    ids=lambda d: type(d).__name__,
)
def test_builtin_samplers_reject_non_finite_draws(dist: Any) -> None:
    """Every built-in sampler raises SamplingError naming itself when its draws overflow."""
    with pytest.raises(SamplingError) as info:
        dist.sample(np.random.default_rng(1), 2000)
    assert info.value.distribution is dist



def _with_client(data: dict[str, Any], **fields: Any) -> Any:
    """The scenario of *data* with the first client's *fields* replaced by objects."""
    scenario = scenario_from_dict(data)
    client = attrs.evolve(scenario.workload.clients[0], **fields)
    return attrs.evolve(scenario, workload=attrs.evolve(scenario.workload, clients=(client,)))


@pytest.mark.parametrize("field", ["input_distribution", "output_distribution"])
def test_run_reports_a_sampling_error_as_scenario_error_naming_the_client_distribution(field: str) -> None:
    """A distribution drawing NaN during the run ends it with a ScenarioError at the client's distribution."""
    scenario = _with_client(tiny_scenario(name="nan"), **{field: NanDistribution()})
    with pytest.raises(ScenarioError) as info:
        Simulation(scenario).run()
    assert info.value.paths == [f"{CLIENT}.{field}"]
    assert "not finite" in info.value.problems[0][1]
    assert info.value.source == "scenario 'nan'"


def test_run_reports_an_overflowing_think_time_at_its_key_path() -> None:
    """A multi-turn think time that overflows is reported at workload.clients[0].multi_turn.think_time."""
    data = tiny_scenario()
    data["workload"]["clients"][0]["multi_turn"] = {"max_rounds": 3, "think_time": {"type": "constant", "params": {"value": 1}}}
    scenario = scenario_from_dict(data)
    think = _forced(LogNormal(mu=1.0, sigma=1.0), mu=800.0)
    mt = attrs.evolve(scenario.workload.clients[0].multi_turn, think_time=think)
    scenario = _with_client(data, multi_turn=mt)
    with pytest.raises(ScenarioError) as info:
        Simulation(scenario).run()
    assert info.value.paths == [f"{CLIENT}.multi_turn.think_time"]


def test_sampling_error_of_a_servegen_client_names_servegen_data() -> None:
    """A sampling error of a client loaded from ServeGen data is reported at workload.servegen_data, naming the client."""
    data = tiny_scenario()
    data["workload"] = {"horizon_s": 10.0, "servegen_data": {"path": "somewhere"}}
    scenario = scenario_from_dict(data)
    broken = NanDistribution()
    client = attrs.evolve(
        scenario_from_dict(tiny_scenario()).workload.clients[0], id="m-large/7", input_distribution=broken
    )
    source = ClientSource(client, 1.0, RandomStreams(0), 0)
    err = sampling_scenario_error(SamplingError("drew NaN", broken), scenario, [source])
    assert err.paths == ["workload.servegen_data"]
    assert "'m-large/7' (input_distribution)" in err.problems[0][1]


def test_sampling_error_survives_simpys_copy() -> None:
    """SimPy re-raises a failed process's exception as type(e)(*e.args); the copy keeps the distribution and message."""
    dist = Constant(value=1)
    exc = SamplingError("drew NaN", dist)
    copy_ = type(exc)(*exc.args)
    assert copy_.distribution is dist
    assert str(copy_) == "drew NaN"


@pytest.mark.parametrize(
    "dist",
    [
        {"type": "lognormal", "params": {"mu": 3, "sigma": -0.0}},
        {"type": "normal", "params": {"mean": 30, "std_dev": -0.0}},
        {"type": "gaussian", "params": {"mean": 30, "std_dev": -0.0}},
        {"type": "pareto_lognormal", "params": {"alpha": 2, "xm": 5, "mu": 3, "sigma": -0.0, "mix_weight": 0.5}},
    ],
    ids=lambda d: d["type"],
)
def test_negative_zero_spread_loads_and_runs(dist: dict[str, Any]) -> None:
    """A spread of -0.0 (which numpy's samplers refuse) is taken as 0: the scenario loads and runs."""
    data = _set(tiny_scenario(), f"{CLIENT}.input_distribution", dist)
    results = Simulation(scenario_from_dict(data)).run()
    assert results.summary()["requests"]["completed"] == data["workload"]["num_requests"]


@pytest.mark.parametrize("key", ["simulation.timeseries_interval_s", "serving.view_refresh_s"])
def test_periods_below_a_microsecond_are_rejected(key: str) -> None:
    """A periodic process with a period of 5e-324 s would never let the clock advance: rejected with its range."""
    err = _error(_set(tiny_scenario(), key, 5e-324))
    assert err.paths == [key]
    assert "must be in [1e-06, 1000000000.0]" in err.problems[0][1]
