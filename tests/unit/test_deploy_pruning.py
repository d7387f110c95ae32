"""The deployment search's pruning skips at least half the simulations of the exhaustive
search on a space built so that it honestly can, and names the same answer.

Why this space prunes: at 6 requests/s of 500-token prompts with 50-token answers, one H100
at TP 1 with ``max_num_seqs`` 4 carries the load within the SLO, for 3.9492 USD/h. Every
configuration at TP 2 or 4 costs more than that at a single replica (A100-80 TP2 4.9968,
H100 TP2 7.8984, A100-80 TP4 9.9936, H100 TP4 15.7968 USD/h): eight of the twelve
configurations cannot win whatever their count. Branch and bound visits configurations
cheapest lower bound first (their cost at one replica), so the four TP1 configurations are
searched first; once one H100 replica is found to suffice, the eight dearer ones are decided
without a simulation (the exhaustive search runs 13 on them), and H100 TP1 with
``max_num_seqs`` 2 is searched at one replica only (it fails there): when its turn comes the
cheapest found is three A100-80 TP1 replicas (7.4952 USD/h), which two H100s (7.8984) would
not beat; the exhaustive search runs it at two as well.

The exhaustive search has no bound and searches every configuration to ``max_replicas``.
"""

from __future__ import annotations

from typing import Any

import pytest

from simpy_llm.explore.capacity import _doctest_scenario
from simpy_llm.explore.deploy import DeployResult, deploy


def _scenario() -> dict[str, Any]:
    """Poisson arrivals of 500-token prompts with 50-token answers (the scenario of test_deploy)."""
    s = _doctest_scenario()
    client = s["workload"]["clients"][0]
    client["input_distribution"]["params"]["value"] = 500
    client["output_distribution"] = {"type": "constant", "params": {"value": 50}}
    return s


SPACE: dict[str, Any] = {
    "load": 6.0, "slo": {"ttft_p99": 0.3}, "gpus": ["A100-80", "H100"], "tp": [1, 2, 4], "max_num_seqs": [2, 4],
    "model": "llama-3.1-8b-instruct", "warmup_requests": 30, "measure_requests": 150, "max_replicas": 8,
}
"""Six catalogue rows x two max_num_seqs values: twelve configurations."""


@pytest.fixture(scope="module")
def exhaustive() -> DeployResult:
    return deploy(_scenario(), exhaustive=True, **SPACE)


@pytest.fixture(scope="module")
def pruned() -> DeployResult:
    return deploy(_scenario(), **SPACE)


def _answer(result: DeployResult) -> tuple[Any, ...]:
    best = result.best
    assert best is not None
    return (best.configuration, best.min_replicas, best.cost_per_hour, best.ttft_p99_s, best.tpot_p99_s)


def test_pruning_gives_the_exhaustive_answer(pruned: DeployResult, exhaustive: DeployResult) -> None:
    """Both searches name the same configuration, replica count, cost and tail latencies:
    one H100 at TP 1 with max_num_seqs 4."""
    assert _answer(pruned) == _answer(exhaustive)
    best = pruned.best
    assert best is not None
    c = best.configuration
    assert (c.gpu, c.tp, c.max_num_seqs, best.min_replicas, best.cost_per_hour) == ("H100", 1, 4, 1, 3.9492)


def test_pruning_skips_at_least_half_the_simulations(pruned: DeployResult, exhaustive: DeployResult) -> None:
    """The pruned search runs 12 simulations where the exhaustive one runs 26: 54 % skipped."""
    assert (pruned.simulations, exhaustive.simulations) == (12, 26)
    assert pruned.simulations <= exhaustive.simulations / 2


def test_configurations_dearer_at_one_replica_are_skipped(pruned: DeployResult) -> None:
    """Exactly the configurations whose one replica costs more than the answer are decided
    without a simulation: the eight at TP 2 and TP 4."""
    best = pruned.best
    assert best is not None
    dearer = {o.configuration.index for o in pruned.outcomes if o.configuration.cost(1) > best.cost_per_hour}
    unsimulated = {o.configuration.index for o in pruned.outcomes if o.simulations == 0}
    assert unsimulated == dearer
    assert {(o.configuration.gpu, o.configuration.tp) for o in pruned.outcomes if o.configuration.index in dearer} == {
        ("A100-80", 2), ("H100", 2), ("A100-80", 4), ("H100", 4)}
    assert (len(dearer), pruned.skipped) == (8, 8)


def test_counts_found_by_both_searches_agree(pruned: DeployResult, exhaustive: DeployResult) -> None:
    """Where the pruned search found a configuration's fewest replicas, the exhaustive search
    found the same count, cost and tail latencies (the bound cuts searches, never changes them)."""
    found = [(p, e) for p, e in zip(pruned.outcomes, exhaustive.outcomes, strict=True) if p.min_replicas is not None]
    assert [p.configuration.label() for p, _e in found] == [
        "A100-80 tp1 fcfs seqs=2 tokens=8192 whole-prefill", "A100-80 tp1 fcfs seqs=4 tokens=8192 whole-prefill",
        "H100 tp1 fcfs seqs=4 tokens=8192 whole-prefill"]
    for p, e in found:
        assert (p.min_replicas, p.cost_per_hour, p.ttft_p99_s, p.tpot_p99_s) == (
            e.min_replicas, e.cost_per_hour, e.ttft_p99_s, e.tpot_p99_s)
