"""The latency head's memory per target (``history_scope: target``) against per request (the default)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest

from simpy_llm import scenario_from_dict
from simpy_llm.config.errors import ScenarioError
from simpy_llm.policies.gamma import GammaState
from simpy_llm.policies.latency_head import LatencyHead
from simpy_llm.simulation import Simulation
from tests.spec_helpers import flat_curve, spec_scenario


@attrs.define
class _Request:
    """What a bound head reads of its request: the target's fleet index."""

    replica: int


class _Fleet:
    """Stands for one simulation's draft fleet: the scope memories are shared within."""


def _head(**params: Any) -> LatencyHead:
    """γ = round(5 - 10 x mean rtt_s) once two rounds are in the buffer; 2 before (the cold start)."""
    return LatencyHead(weights=(0, 0, -10, 0, 0, 0, 0, 0), bias=5.0, history=2, min_samples=2, default_gamma=2,
                       smoothing=1.0, fused_below=-1e9, **params)


def _state(rtt_s: float) -> GammaState:
    return GammaState(gamma=4, k_min=1, k_max=8, rtt_s=rtt_s)


def test_two_requests_on_one_target_share_the_buffer() -> None:
    """Request b's first decision on the target of request a already sees a's sample: its buffer
    holds two rounds (a's rtt 0.1, its own 0.3), so the head runs: round(5 - 10 x 0.2) = 3."""
    fleet = _Fleet()
    a, b = _head(history_scope="target"), _head(history_scope="target")
    a.bind_request(_Request(replica=0), fleet)
    b.bind_request(_Request(replica=0), fleet)
    assert a.next_gamma(_state(0.1)) == 2  # the target's first sample: cold start
    assert b.next_gamma(_state(0.3)) == 3
    assert a.smoothed_output == b.smoothed_output == pytest.approx(3.0)


def test_two_requests_on_different_targets_do_not_share() -> None:
    """On targets 0 and 1, request b's first decision has only its own sample: the cold-start γ."""
    fleet = _Fleet()
    a, b = _head(history_scope="target"), _head(history_scope="target")
    a.bind_request(_Request(replica=0), fleet)
    b.bind_request(_Request(replica=1), fleet)
    assert a.next_gamma(_state(0.1)) == 2
    assert b.next_gamma(_state(0.3)) == 2
    assert b.smoothed_output is None


def test_memories_do_not_cross_simulations() -> None:
    """Heads bound to different scopes (two simulations' fleets) keep separate memories of target 0."""
    a, b = _head(history_scope="target"), _head(history_scope="target")
    a.bind_request(_Request(replica=0), _Fleet())
    b.bind_request(_Request(replica=0), _Fleet())
    assert a.next_gamma(_state(0.1)) == 2
    assert b.next_gamma(_state(0.3)) == 2


def test_request_scope_ignores_the_binding() -> None:
    """``history_scope: request`` (the default) keeps each head's own memory, bound or not."""
    fleet = _Fleet()
    a, b = _head(), _head()
    a.bind_request(_Request(replica=0), fleet)
    b.bind_request(_Request(replica=0), fleet)
    assert a.next_gamma(_state(0.1)) == 2
    assert b.next_gamma(_state(0.3)) == 2


def test_an_unbound_target_head_says_what_it_needs() -> None:
    """A ``target`` head asked before being bound to a request raises, naming the hook."""
    with pytest.raises(RuntimeError, match="bind_request"):
        _head(history_scope="target").next_gamma(_state(0.1))


def test_a_bad_history_scope_is_refused_at_its_key(tmp_path: Path) -> None:
    """``history_scope`` other than request or target is refused at its key path."""
    data = spec_scenario(flat_curve(tmp_path, [1.0] * 6), requests=2)
    data["speculation"]["gamma_policy"] = {"kind": "latency_head", "params": {"weights": [0.0] * 8, "history_scope": "pool"}}
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(data)
    problems = dict(err.value.problems)
    assert "request, target" in problems["speculation.gamma_policy.params.history_scope"]


@pytest.mark.parametrize(("scope", "replicas"), [("request", 1), ("target", 1), ("target", 2)])
def test_cold_start_rounds_count_once_per_target_or_per_request(tmp_path: Path, scope: str, replicas: int) -> None:
    """In a run, the head answers its cold-start γ exactly ``min_samples - 1`` times per memory: per
    request under ``history_scope: request``, per target used under ``target`` (counted from the
    round records, each request's last round left out: only it can be cut to the tokens left)."""
    min_samples = 6
    data = spec_scenario(flat_curve(tmp_path, [1.0] * 6), requests=12, rate=50.0, output=60, replicas=replicas,
                         speculation={"k_max": 6, "acceptance_sampling": "expected"})
    data["speculation"]["gamma_policy"] = {"kind": "latency_head", "params": {
        "weights": [0.0] * 8, "bias": 5.0, "history": 8, "min_samples": min_samples, "default_gamma": 3,
        "fused_rounds": 1, "history_scope": scope}}
    rounds = Simulation(scenario_from_dict(data)).run(progress=False).spec_rounds()
    last = rounds.groupby("request_id").tail(1).index
    kept = rounds.drop(index=last)
    assert set(kept["gamma"]) == {3, 5}
    memories = kept["request_id"].nunique() if scope == "request" else rounds["replica"].nunique()
    assert scope == "request" or memories == replicas
    assert (kept["gamma"] == 3).sum() == (min_samples - 1) * memories
