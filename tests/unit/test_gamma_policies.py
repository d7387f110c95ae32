"""γ (speculation depth) policies: scripted trajectories, bounds, registry, Spec++ freshness, the latency head."""

from __future__ import annotations

import math

import attrs
import cattrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm.config import PolicySpec
from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.structure import build_policy
from simpy_llm.policies.gamma import (
    AcceptanceBackoff,
    Backpressure,
    GammaState,
    PidGamma,
    SpecPlusPlus,
    StaticGamma,
    UcbBandit,
    gamma_policies,
)
from simpy_llm.policies.latency_head import LatencyHead


def state(**fields) -> GammaState:
    """A GammaState with k in [1, 6] and γ 4 unless given."""
    return GammaState(**({"gamma": 4, "k_min": 1, "k_max": 6} | fields))


def closed_loop(policy, rounds: list[dict], gamma: int = 4, k_min: int = 1, k_max: int = 6) -> list[int]:
    """Feed *policy* one state per round, each carrying the γ it chose the round before."""
    chosen = []
    for telemetry in rounds:
        gamma = policy.next_gamma(GammaState(gamma=gamma, k_min=k_min, k_max=k_max, **telemetry))
        chosen.append(gamma)
    return chosen


def rtt_head(**params) -> LatencyHead:
    """A latency head that reads only the round trip: ``y = 6 - 8 * mean(rtt_s)``."""
    return LatencyHead(weights=(0, 0, -8, 0, 0, 0, 0, 0), bias=6.0, **params)


# --- scripted trajectories -------------------------------------------------------------------


def test_static_trajectory() -> None:
    """static returns its γ, clamped to each state's [k_min, k_max]."""
    policy = StaticGamma(gamma=5)
    states = [state(), state(k_max=4), state(k_min=6, k_max=8)]
    assert [policy.next_gamma(s) for s in states] == [5, 4, 6]


def test_backpressure_trajectory() -> None:
    """backpressure grows when both signals are low, shrinks when either is high, keeps inside the band."""
    rounds = [
        {"verify_queue_wait_s": 0.0, "kv_utilization": 0.5},  # light: 4 -> 5
        {"verify_queue_wait_s": 0.0, "kv_utilization": 0.5},  # -> 6
        {"verify_queue_wait_s": 0.0, "kv_utilization": 0.5},  # capped at k_max
        {"verify_queue_wait_s": 0.03, "kv_utilization": 0.5},  # wait inside the band: keep
        {"verify_queue_wait_s": 0.1, "kv_utilization": 0.5},  # wait high: -> 5
        {"verify_queue_wait_s": 0.0, "kv_utilization": 0.95},  # KV high: -> 4
        {"verify_queue_wait_s": 0.02, "kv_utilization": 0.8},  # both in band: keep
        {"verify_queue_wait_s": 0.005, "kv_utilization": 0.75},  # KV in band: keep
        {"verify_queue_wait_s": 0.2, "kv_utilization": 0.95},  # both high: one step only
    ]
    assert closed_loop(Backpressure(), rounds) == [5, 6, 6, 6, 5, 4, 4, 4, 3]


def test_backpressure_step_size() -> None:
    """backpressure moves by ``step`` and never leaves [k_min, k_max]."""
    rounds = [{"verify_queue_wait_s": 1.0}] * 3 + [{}] * 4
    assert closed_loop(Backpressure(step=2), rounds, gamma=5) == [3, 1, 1, 3, 5, 6, 6]


def test_acceptance_backoff_trajectory() -> None:
    """acceptance_backoff halves after a poor round, adds one after a good one, keeps otherwise."""
    accepted = [None, 4, 5, 6, 2, 1, 0, 1, 1]  # None: no round yet
    gamma, chosen, policy = 4, [], AcceptanceBackoff(low=0.5, high=0.9)
    for a in accepted:
        last = {} if a is None else {"accepted_last": a, "proposed_last": gamma}
        gamma = policy.next_gamma(state(gamma=gamma, **last))
        chosen.append(gamma)
    # 4 kept; 4/4 -> 5; 5/5 -> 6; 6/6 capped; 2/6 halves 6 -> 3; 1/3 halves -> 1;
    # 0/1 halves to 0, floored at k_min 1; 1/1 -> 2; 1/2 = low: kept
    assert chosen == [4, 5, 6, 6, 3, 1, 1, 2, 2]


def test_specpp_trajectory() -> None:
    """specpp takes the longest prefix of positions whose rejection 1 - p_i is at most the threshold."""
    policy = SpecPlusPlus(threshold=0.3)
    probabilities = [
        (0.9, 0.9, 0.9, 0.9, 0.9),  # all fine: capped at k_max 4
        (0.9, 0.8, 0.6, 0.95),  # position 3 rejects with 0.4: stop before it
        (0.5, 0.99, 0.99),  # the first position already fails: k_min
        (0.75, 0.75),  # positions beyond the model's answer count as rejected
        (),  # no prediction: k_min
    ]
    chosen = [policy.next_gamma(state(k_max=4, position_probabilities=p)) for p in probabilities]
    assert chosen == [4, 2, 1, 2, 1]


def test_latency_head_trajectory() -> None:
    """latency_head: warm-up default, averaged ring buffer, smoothing, half-up rounding, fused hysteresis."""
    head = rtt_head(history=3, min_samples=2, default_gamma=4, smoothing=0.5, fused_below=1.5, fused_rounds=2)
    rtts = [0.0, 0.0, 0.75, 0.75, 0.75, 0.75, 0.75, 0.0, 0.0]
    chosen = [head.next_gamma(state(rtt_s=r)) for r in rtts]
    # round: buffer mean rtt -> y = 6 - 8 * mean -> s = y/2 + s_prev/2 -> γ
    # 1: one sample < min_samples -> default 4
    # 2: 0     -> 6 -> 6 (first output, unsmoothed) -> 6
    # 3: 0.25  -> 4 -> 5                           -> 5
    # 4: 0.5   -> 2 -> 3.5                         -> 4 (half up)
    # 5: 0.75  -> 0 -> 1.75                        -> 2
    # 6: 0.75  -> 0 -> 0.875  (below 1.5, 1 round) -> 2 (1 is only for fused)
    # 7: 0.75  -> 0 -> 0.4375 (below, 2 rounds)    -> 1 fused
    # 8: 0.5   -> 2 -> 1.21875 (below, 3 rounds)   -> 1 fused
    # 9: 0.25  -> 4 -> 2.609375 (above: reset)     -> 3
    assert chosen == [4, 6, 5, 4, 2, 2, 1, 1, 3]


# --- bounds ----------------------------------------------------------------------------------

probability = st.floats(0.0, 1.0)
nonnegative = st.floats(0.0, 10.0)


@st.composite
def gamma_states(draw) -> GammaState:
    k_min = draw(st.integers(1, 8))
    proposed = draw(st.integers(0, 20))
    return GammaState(
        gamma=draw(st.integers(0, 20)),
        k_min=k_min,
        k_max=draw(st.integers(k_min, k_min + 10)),
        rtt_s=draw(nonnegative),
        verify_queue_wait_s=draw(nonnegative),
        kv_utilization=draw(probability),
        accepted_last=draw(st.integers(0, proposed)),
        proposed_last=proposed,
        acceptance_ewma=draw(probability),
        position_probabilities=draw(st.lists(probability, max_size=12)),
        draft_step_s=draw(nonnegative),
        verify_step_s=draw(nonnegative),
        slo_tpot_s=draw(st.none() | nonnegative),
    )


@st.composite
def policies(draw):
    kind = draw(st.sampled_from(gamma_policies.names()))
    if kind == "static":
        return StaticGamma(gamma=draw(st.integers(1, 30)))
    if kind == "backpressure":
        wait_low, wait_high = sorted(draw(st.lists(nonnegative, min_size=2, max_size=2)))
        kv_low, kv_high = sorted(draw(st.lists(probability, min_size=2, max_size=2)))
        return Backpressure(
            wait_high_s=wait_high, wait_low_s=wait_low, kv_high=kv_high, kv_low=kv_low, step=draw(st.integers(1, 5))
        )
    if kind == "acceptance_backoff":
        low, high = sorted(draw(st.lists(probability, min_size=2, max_size=2)))
        return AcceptanceBackoff(low=low, high=high)
    if kind == "specpp":
        return SpecPlusPlus(threshold=draw(probability))
    history = draw(st.integers(1, 5))
    return LatencyHead(
        weights=draw(st.lists(st.floats(-100, 100), min_size=8, max_size=8)),
        bias=draw(st.floats(-100, 100)),
        history=history,
        min_samples=draw(st.integers(1, history)),
        default_gamma=draw(st.integers(1, 30)),
        smoothing=draw(st.floats(0.01, 1.0)),
        fused_below=draw(st.floats(-10, 10)),
        fused_rounds=draw(st.integers(1, 4)),
    )


@settings(max_examples=200, deadline=None)
@given(policy=policies(), states=st.lists(gamma_states(), min_size=1, max_size=8))
def test_gamma_always_within_bounds(policy, states) -> None:
    """Every built-in, with any valid params, returns an int in [k_min, k_max] for any sequence of states."""
    for s in states:
        gamma = policy.next_gamma(s)
        assert type(gamma) is int
        assert s.k_min <= gamma <= s.k_max


# --- registry --------------------------------------------------------------------------------

BUILT_INS = {
    "static": ({"gamma": 3}, StaticGamma),
    "backpressure": ({"wait_high_s": 0.1, "wait_low_s": 0.02, "kv_high": 0.8, "kv_low": 0.6, "step": 2}, Backpressure),
    "acceptance_backoff": ({"low": 0.4, "high": 0.8}, AcceptanceBackoff),
    "specpp": ({"threshold": 0.2}, SpecPlusPlus),
    "latency_head": ({"weights": [0, 0, -8, 0, 0, 0, 0, 0], "bias": 6, "history": 2, "smoothing": 1.0}, LatencyHead),
    "pid": ({"setpoint": 0.6, "kp": 1.5, "ki": 0.25}, PidGamma),
    "bandit": ({"exploration": 0.3}, UcbBandit),
}


def test_registry_lists_the_built_ins() -> None:
    """The registry holds exactly the seven built-in γ policies."""
    assert gamma_policies.names() == sorted(BUILT_INS)


@pytest.mark.parametrize("kind", sorted(BUILT_INS))
def test_registry_builds_each_policy_from_kind_and_params(kind) -> None:
    """build_policy turns ``{kind, params}`` into the registered class with those params."""
    params, cls = BUILT_INS[kind]
    policy = build_policy(PolicySpec(kind=kind, params=params), gamma_policies)
    assert type(policy) is cls
    for name, value in params.items():
        expected = tuple(float(v) for v in value) if isinstance(value, list) else value
        assert getattr(policy, name) == expected
    assert 1 <= policy.next_gamma(state()) <= 6


@pytest.mark.parametrize("kind", sorted(BUILT_INS))
def test_registry_rejects_an_unknown_param_by_name(kind) -> None:
    """An unknown key under ``params`` is an error naming that key."""
    params = dict(BUILT_INS[kind][0], gama=4)
    with pytest.raises(cattrs.ClassValidationError) as info:
        build_policy(PolicySpec(kind=kind, params=params), gamma_policies)
    assert any("gama" in message for message in cattrs.transform_error(info.value))


def test_invalid_params_name_the_field() -> None:
    """Out-of-range or inconsistent params raise FieldValueError at the offending field."""
    with pytest.raises(FieldValueError) as info:
        LatencyHead(weights=(1.0, 2.0))
    assert info.value.field == "weights"
    with pytest.raises(FieldValueError) as info:
        Backpressure(wait_high_s=0.01, wait_low_s=0.02)
    assert info.value.field == "wait_low_s"
    with pytest.raises(FieldValueError) as info:
        AcceptanceBackoff(low=0.8, high=0.5)
    assert info.value.field == "high"
    with pytest.raises(FieldValueError) as info:
        LatencyHead(weights=(0,) * 8, history=2, min_samples=3)
    assert info.value.field == "min_samples"


def test_custom_policy_registers_and_is_found_by_name() -> None:
    """A user policy registered with the decorator is found by name and built from params."""

    @gamma_policies.register("queue_cap")
    @attrs.define
    class QueueCap:
        cap: int = 2

        def next_gamma(self, state: GammaState) -> int:
            return max(state.k_min, min(self.cap, state.k_max))

    try:
        assert gamma_policies.get("queue_cap") is QueueCap
        policy = build_policy(PolicySpec(kind="queue_cap", params={"cap": 3}), gamma_policies)
        assert policy.next_gamma(state()) == 3
    finally:
        gamma_policies._items.pop("queue_cap")  # noqa: SLF001 - the test registers an example
    assert "queue_cap" not in gamma_policies


# --- Spec++ (seed 003 Appendix B) ------------------------------------------------------------


def test_specpp_uses_this_rounds_probabilities() -> None:
    """Appendix B regression: γ follows the probabilities of the current state in the same step, never an old estimate."""
    policy = SpecPlusPlus(threshold=0.3)
    confident = (0.95,) * 6
    doubtful = (0.95, 0.5, 0.95, 0.95, 0.95, 0.95)
    sequence = [confident, doubtful, confident, confident, doubtful]
    chosen = [policy.next_gamma(state(position_probabilities=p)) for p in sequence]
    assert chosen == [6, 1, 6, 6, 1]
    # the same state always gives the same γ, whatever the policy saw before
    assert policy.next_gamma(state(position_probabilities=doubtful)) == SpecPlusPlus(threshold=0.3).next_gamma(
        state(position_probabilities=doubtful)
    )


def test_specpp_does_not_take_the_rejecting_position() -> None:
    """Appendix B off-by-one: the first position whose rejection exceeds the threshold is not drafted."""
    policy = SpecPlusPlus(threshold=0.3)
    assert policy.next_gamma(state(position_probabilities=(0.9, 0.9, 0.6, 0.9))) == 2
    assert policy.next_gamma(state(k_min=3, position_probabilities=(0.9, 0.6))) == 3  # k_min still holds


# --- latency head ----------------------------------------------------------------------------


def test_latency_head_ring_buffer_averages_the_last_history_rounds() -> None:
    """The head sees the mean features of the last ``history`` rounds only; older rounds drop out."""
    head = rtt_head(history=2, min_samples=1, smoothing=1.0, fused_below=0.0)
    chosen = [head.next_gamma(state(rtt_s=r)) for r in (0.5, 0.25, 0.0)]
    # means 0.5, 0.375, 0.125 (0.5 dropped) -> y = 2, 3, 5; a 3-round buffer would give 4 last
    assert chosen == [2, 3, 5]
    assert head.smoothed_output == 5.0


def test_latency_head_uses_default_gamma_until_min_samples() -> None:
    """Until ``min_samples`` rounds are buffered the head returns ``default_gamma`` (clamped)."""
    head = rtt_head(history=3, min_samples=3, default_gamma=8, smoothing=1.0)
    chosen = [head.next_gamma(state(rtt_s=0.0)) for _ in range(3)]
    assert chosen == [6, 6, 6]  # default 8 clamped to k_max 6, twice; then y = 6
    assert head.smoothed_output == 6.0


def test_latency_head_fused_needs_consecutive_rounds_below() -> None:
    """γ = 1 only after ``fused_rounds`` consecutive outputs below ``fused_below``; one round above resets."""
    head = rtt_head(history=1, min_samples=1, smoothing=1.0, fused_below=1.5, fused_rounds=2)
    rtts = [0.625, 0.5, 0.625, 0.625, 0.625, 0.5]  # y = 1, 2, 1, 1, 1, 2
    assert [head.next_gamma(state(rtt_s=r)) for r in rtts] == [2, 2, 2, 1, 1, 2]


def test_latency_head_fused_respects_k_min() -> None:
    """With k_min > 1 the fused choice is clamped to k_min (γ stays in bounds)."""
    head = rtt_head(history=1, min_samples=1, smoothing=1.0, fused_rounds=1)
    assert head.next_gamma(state(k_min=2, rtt_s=0.75)) == 2


def test_latency_head_features_follow_the_documented_order() -> None:
    """``features`` packs the state in the order of LATENCY_HEAD_FEATURES (no SLO counts as 0)."""
    from simpy_llm.policies.latency_head import LATENCY_HEAD_FEATURES

    s = state(verify_queue_wait_s=0.1, kv_utilization=0.2, rtt_s=0.3, acceptance_ewma=0.4,
              draft_step_s=0.5, verify_step_s=0.6, gamma=3)
    assert LatencyHead.features(s) == (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.0, 3.0)
    assert len(LATENCY_HEAD_FEATURES) == len(LatencyHead.features(s))
    assert math.isclose(LatencyHead.features(attrs.evolve(s, slo_tpot_s=0.05))[6], 0.05)
