"""Agentic scenarios as plain data, and latency models for the agentic truth tests.

Nothing here imports from ``simpy_llm.workload.workflows``: the references the agentic
tests compare against are written from seed 004 and ``docs/agentic.md`` alone.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from simpy_llm.serving.latency import LatencyModelBase

# The serving section of scenarios/agentic_react.yaml, with a smaller KV cache.
REACT_SERVING: dict[str, Any] = {
    "replicas": 1,
    "engine": {"max_num_seqs": 128, "max_num_batched_tokens": 4096, "kv_num_blocks": 2048},
    "latency_model": {"kind": "blis_linear", "params": {"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": 2}},
}


def const(value: float) -> dict[str, Any]:
    """A constant length distribution."""
    return {"type": "constant", "params": {"value": value}}


def expo(mean: float) -> dict[str, Any]:
    """An exponential distribution."""
    return {"type": "exponential", "params": {"mean": mean}}


def llm(step_id: str, *deps: str, prompt: Any = None, output: Any = None, **extra: Any) -> dict[str, Any]:
    """An ``llm_call`` step (constant 8-token prompt and 4-token output unless given)."""
    step: dict[str, Any] = {
        "id": step_id,
        "type": "llm_call",
        "input_distribution": prompt if prompt is not None else const(8),
        "output_distribution": output if output is not None else const(4),
    }
    if deps:
        step["depends_on"] = list(deps)
    step.update(extra)
    return step


def tool(step_id: str, tool_name: str, *deps: str, **extra: Any) -> dict[str, Any]:
    """A ``tool_call`` step."""
    step: dict[str, Any] = {"id": step_id, "type": "tool_call", "tool": tool_name}
    if deps:
        step["depends_on"] = list(deps)
    step.update(extra)
    return step


def tool_spec(latency_s: Any, output_tokens: Any = None, capacity: int | None = None) -> dict[str, Any]:
    """A ``tools`` entry."""
    spec: dict[str, Any] = {"latency_s": latency_s, "output_tokens": output_tokens or const(5)}
    if capacity is not None:
        spec["capacity"] = capacity
    return spec


def agentic_scenario(
    agentic: Mapping[str, Any],
    *,
    sessions: int = 10,
    rate: float = 5.0,
    seed: int = 7,
    serving: Mapping[str, Any] | None = None,
    horizon_s: float | None = None,
    until_s: float | None = None,
) -> dict[str, Any]:
    """A one-client agentic scenario as plain data (serving: :data:`REACT_SERVING` unless given)."""
    workload: dict[str, Any] = {
        "category": "agentic",
        "aggregate_rate": rate,
        "clients": [{"id": "agent", "arrival": {"process": "poisson"}, "agentic": copy.deepcopy(dict(agentic))}],
    }
    if horizon_s is None:
        workload["num_requests"] = sessions
    else:
        workload["horizon_s"] = horizon_s
    data: dict[str, Any] = {
        "seed": seed,
        "workload": workload,
        "serving": copy.deepcopy(dict(serving if serving is not None else REACT_SERVING)),
    }
    if until_s is not None:
        data["simulation"] = {"until_s": until_s}
    return data


def zero_time_serving(engine: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A one-replica fleet for :class:`ZeroTimeLatency`: a replica group with an explicit
    ``capacity`` (the default capacity divides by the step time of a full batch, which is 0
    here); the scenario's own latency model is replaced when the simulation is built."""
    return {
        "replica_groups": [
            {
                "name": "instant",
                "count": 1,
                "capacity": 1.0,
                "engine": dict(engine or {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "kv_num_blocks": 8192}),
                "latency_model": {"kind": "blis_linear", "params": {"beta0_us": 1.0}},
            }
        ]
    }


class ZeroTimeLatency(LatencyModelBase):
    """An infinitely fast server: every step takes 0 s, no queueing time, no per-token overhead."""

    output_token_overhead_s = 0.0

    def step_time_s(self, prefill_tokens: int, decode_tokens: int) -> float:
        return 0.0

    def queueing_time_s(self, prompt_tokens: int) -> float:
        return 0.0


class PrefillDecodeLatency(LatencyModelBase):
    """A step computing prompt tokens takes ``a + b * prefill_tokens``; a step of decodes only
    takes ``c``. No queueing time, no per-token overhead."""

    output_token_overhead_s = 0.0

    def __init__(self, a: float, b: float, c: float) -> None:
        self.a, self.b, self.c = a, b, c

    def step_time_s(self, prefill_tokens: int, decode_tokens: int) -> float:
        if prefill_tokens > 0:
            return self.a + self.b * prefill_tokens
        return self.c

    def queueing_time_s(self, prompt_tokens: int) -> float:
        return 0.0

