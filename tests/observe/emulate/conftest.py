"""Shared set-up of the emulated-server tests: a scenario slow enough that queueing,
chunked prefill and preemption shape every request's latency."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from simpy_llm import Scenario, scenario_from_dict

SLOW: dict[str, Any] = {
    "name": "emulate-slow",
    "seed": 3,
    "workload": {
        "aggregate_rate": 10.0,
        "num_requests": 10,
        "clients": [
            {
                "id": "c0",
                "rate_fraction": 1.0,
                "arrival": {"process": "poisson"},
                "input_distribution": {"type": "constant", "params": {"value": 50}},
                "output_distribution": {"type": "constant", "params": {"value": 7}},
            }
        ],
    },
    "serving": {
        "replicas": 2,
        "router": {"kind": "least_loaded"},
        # 4 sequences per replica (requests queue), 128-token steps (a 300-word prompt takes
        # 3 steps), 768 tokens of KV cache (a full batch of long prompts is preempted).
        "engine": {"max_num_seqs": 4, "max_num_batched_tokens": 128, "kv_block_size": 16, "kv_num_blocks": 48},
        # Steps of 15-30 ms: first tokens after 20-600 ms, answers after up to a second.
        "latency_model": {
            "kind": "blis_linear",
            "params": {
                "beta0_us": 15000.0,
                "beta1_us": 100.0,
                "beta2_us": 400.0,
                "alpha0_us": 3000.0,
                "alpha1_us": 5.0,
                "alpha2_us": 500.0,
            },
        },
    },
}
"""The test scenario as plain data (its workload only gives the drawn output length: 7)."""


@pytest.fixture
def slow_data() -> dict[str, Any]:
    """A fresh copy of :data:`SLOW`."""
    return copy.deepcopy(SLOW)


@pytest.fixture
def slow_scenario() -> Scenario:
    """:data:`SLOW` as a Scenario."""
    return scenario_from_dict(copy.deepcopy(SLOW))
