"""Scenario builders shared by the tests."""

from __future__ import annotations

import copy
import math
from typing import Any

import attrs
import numpy as np

from simpy_llm import Results, Simulation, scenario_from_dict


def tiny_scenario(**overrides: Any) -> dict[str, Any]:
    """A small one-replica scenario as plain data; top-level keys in *overrides* replace parts."""
    data: dict[str, Any] = {
        "seed": 1,
        "workload": {
            "aggregate_rate": 50.0,
            "num_requests": 50,
            "clients": [
                {
                    "id": "c0",
                    "rate_fraction": 1.0,
                    "arrival": {"process": "poisson"},
                    "input_distribution": {"type": "exponential", "params": {"mean": 60}},
                    "output_distribution": {"type": "exponential", "params": {"mean": 20}},
                }
            ],
        },
        "serving": {
            "replicas": 1,
            "engine": {
                "max_num_seqs": 8,
                "max_num_batched_tokens": 64,
                "kv_block_size": 4,
                "kv_num_blocks": 64,
            },
            "latency_model": {
                "kind": "blis_linear",
                "params": {"beta0_us": 2000.0, "beta1_us": 20.0, "beta2_us": 100.0},
            },
        },
    }
    for key, value in overrides.items():
        data[key] = value
    return copy.deepcopy(data)


def run(data: dict[str, Any], mode: str | None = None) -> Results:
    """Run the scenario *data* (optionally forcing the engine mode)."""
    data = copy.deepcopy(data)
    if mode is not None:
        data.setdefault("simulation", {})["mode"] = mode
    return Simulation(scenario_from_dict(data)).run()


def columns_equal(a: Results, b: Results) -> list[str]:
    """Names of record columns that differ between *a* and *b* (NaN equals NaN)."""
    diff = []
    for name, x in a.columns.items():
        y = b.columns[name]
        if x.dtype == object:
            same = x.shape == y.shape and bool((x == y).all())
        else:
            same = np.array_equal(x, y, equal_nan=True)
        if not same:
            diff.append(name)
    return diff


def assert_moments(x: np.ndarray, mean: float, variance: float, excess_kurtosis: float) -> None:
    """Sample mean and variance agree with *mean* and *variance* to 5 standard errors."""
    n = len(x)
    assert abs(x.mean() - mean) < 5 * math.sqrt(variance / n), (x.mean(), mean)
    rel = 5 * math.sqrt((excess_kurtosis + 2) / n)
    assert abs(x.var(ddof=1) / variance - 1) < rel, (x.var(ddof=1), variance)


@attrs.frozen
class NanDistribution:
    """A registered-style length distribution whose draws are all NaN (no check of its own)."""

    mean: float = 1.0
    variance: float = 0.0

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, math.nan)


def tiny_groups(*groups: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """:func:`tiny_scenario` with its fleet as ``replica_groups``: each of *groups* is a group's
    own keys (``name``, ``count``, ``role``...) over the tiny engine and latency model (deep
    copies; a group's ``engine`` or ``latency_model`` replaces them)."""
    data = tiny_scenario(**overrides)
    serving = data["serving"]
    engine, latency = serving.pop("engine"), serving.pop("latency_model")
    serving.pop("replicas")
    serving["replica_groups"] = [
        {"engine": copy.deepcopy(engine), "latency_model": copy.deepcopy(latency), **group} for group in groups
    ]
    return data


def delivery_log(env: Any) -> tuple[Any, dict[Any, float]]:
    """A Wire on *env* that records when each message's payload arrives, and that record
    (a payload delivered twice fails the test)."""
    from simpy_llm.wire import Wire

    out = Wire(env)
    got: dict[Any, float] = {}

    def record(message: Any) -> None:
        assert message.payload not in got  # delivered once
        got[message.payload] = env.now

    out.connect(record)
    return out, got
