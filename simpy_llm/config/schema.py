"""The scenario config tree: frozen attrs classes, one default per setting.

A scenario YAML file maps onto :class:`Scenario`::

    seed: 42
    workload:        # WorkloadConfig
      aggregate_rate: 10.0
      num_requests: 2000
      clients: [...]  # ClientConfig
    serving:         # ServingConfig
      replicas: 1
      router: {kind: round_robin}
      engine: {...}  # EngineConfig
      latency_model: {kind: blis_linear, params: {model: llama-3.1-8b-instruct, gpu: H100, tp: 2}}
    slo:             # per-class targets used for goodput
      interactive: {ttft_s: 0.5, tpot_s: 0.05}
    simulation:      # SimulationConfig
      mode: event_per_change

Units are in the names (``_s`` seconds, ``_tokens`` tokens). Distributions
and arrival processes are the registered classes themselves
(:mod:`simpy_llm.workload.distributions`, :mod:`simpy_llm.workload.arrivals`);
routers and latency models are :class:`PolicySpec` entries resolved against
their registries when the simulation is built.
"""

from __future__ import annotations

from typing import Any, NewType

import attrs

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.validators import at_least, greater_than, non_empty, one_of, optional

__all__ = [
    "ArrivalField",
    "ClientConfig",
    "LatencySpec",
    "LengthField",
    "RouterSpec",
    "EngineConfig",
    "PolicySpec",
    "SLOTarget",
    "Scenario",
    "ServingConfig",
    "SimulationConfig",
    "WorkloadConfig",
]


@attrs.frozen(kw_only=True)
class PolicySpec:
    """A registered implementation by name plus its parameters (``{kind: ..., params: {...}}``)."""

    kind: str
    """Registered name."""
    params: dict[str, Any] = attrs.field(factory=dict)
    """Keyword parameters for the implementation."""


ArrivalField = NewType("ArrivalField", object)
"""A registered arrival process, written ``{process: NAME, ...its fields}``."""
LengthField = NewType("LengthField", object)
"""A registered length distribution, written ``{type: NAME, params: {...}}``."""
RouterSpec = NewType("RouterSpec", PolicySpec)
"""A :class:`PolicySpec` naming a routing policy."""
LatencySpec = NewType("LatencySpec", PolicySpec)
"""A :class:`PolicySpec` naming a latency model."""


@attrs.frozen(kw_only=True)
class ClientConfig:
    """One client (ServeGen's unit of workload decomposition)."""

    id: str = attrs.field(validator=non_empty)
    """Client name, unique within the workload."""
    rate_fraction: float = attrs.field(validator=at_least(0))
    """Relative share of the aggregate rate (fractions are normalised to sum to 1)."""
    arrival: ArrivalField
    """Arrival process (``{process: poisson}`` or ``{process: gamma, cv: 2.0}``)."""
    input_distribution: LengthField
    """Prompt length distribution, tokens (``{type: ..., params: {...}}``)."""
    output_distribution: LengthField
    """Output length distribution, tokens."""
    tenant_id: str = ""
    """Tenant the client belongs to (defaults to the client id)."""
    slo_class: str = "default"
    """SLO class used for goodput (a key of ``Scenario.slo``)."""


@attrs.frozen(kw_only=True)
class WorkloadConfig:
    """Open-loop workload: clients splitting an aggregate rate.

    Give exactly one of ``num_requests`` (generate that many, then stop) or
    ``horizon_s`` (generate arrivals until that time).
    """

    aggregate_rate: float = attrs.field(validator=greater_than(0))
    """Total request rate over all clients, requests/s."""
    clients: tuple[ClientConfig, ...] = attrs.field(validator=non_empty)
    """The clients (at least one)."""
    num_requests: int | None = attrs.field(default=None, validator=optional(at_least(1)))
    """Total number of requests to generate."""
    horizon_s: float | None = attrs.field(default=None, validator=optional(greater_than(0)))
    """Stop generating arrivals at this simulated time, seconds."""

    def __attrs_post_init__(self) -> None:
        if (self.num_requests is None) == (self.horizon_s is None):
            raise FieldValueError("num_requests", "give exactly one of num_requests or horizon_s")
        if sum(c.rate_fraction for c in self.clients) <= 0:
            raise FieldValueError("clients", "at least one client needs rate_fraction > 0")
        ids = [c.id for c in self.clients]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise FieldValueError("clients", f"client ids must be unique; repeated: {', '.join(sorted(dup))}")


@attrs.frozen(kw_only=True)
class EngineConfig:
    """A replica's vLLM-style continuous-batching engine."""

    max_num_seqs: int = attrs.field(default=256, validator=at_least(1))
    """Most requests in the running batch."""
    max_num_batched_tokens: int = attrs.field(default=8192, validator=at_least(1))
    """Token budget of one step (prefill chunk tokens + one per decoding request)."""
    chunked_prefill: bool = True
    """Split prompts across steps to fit the token budget. Without it a prompt
    is prefilled whole in one step and must fit the budget alone."""
    kv_block_size: int = attrs.field(default=16, validator=at_least(1))
    """Tokens per KV-cache block."""
    kv_num_blocks: int = attrs.field(default=8192, validator=at_least(1))
    """KV-cache blocks on the replica."""
    max_model_len: int | None = attrs.field(default=None, validator=optional(at_least(2)))
    """Longest prompt + output a request may have; longer ones are dropped on arrival.
    Default: what the KV cache can hold."""

    def __attrs_post_init__(self) -> None:
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise FieldValueError(
                "max_num_batched_tokens",
                f"must be >= max_num_seqs ({self.max_num_seqs}) so every running request "
                f"can decode each step; got {self.max_num_batched_tokens}",
            )
        if self.kv_num_blocks * self.kv_block_size < self.max_num_batched_tokens:
            raise FieldValueError(
                "kv_num_blocks",
                f"the KV cache ({self.kv_num_blocks} blocks x {self.kv_block_size} tokens) must hold "
                f"at least max_num_batched_tokens ({self.max_num_batched_tokens}) tokens",
            )


@attrs.frozen(kw_only=True)
class ServingConfig:
    """Replicas behind a router."""

    latency_model: LatencySpec
    """Step-time model (``{kind: blis_linear, params: {...}}``)."""
    replicas: int = attrs.field(default=1, validator=at_least(1))
    """Number of identical replicas."""
    router: RouterSpec = attrs.field(factory=lambda: PolicySpec(kind="round_robin"))
    """Routing policy."""
    engine: EngineConfig = attrs.field(factory=EngineConfig)
    """Engine settings shared by all replicas."""


@attrs.frozen(kw_only=True)
class SLOTarget:
    """Latency targets of one SLO class; a request meets its SLO when every given target holds."""

    ttft_s: float | None = attrs.field(default=None, validator=optional(greater_than(0)))
    """Time to first token, seconds."""
    tpot_s: float | None = attrs.field(default=None, validator=optional(greater_than(0)))
    """Mean time per output token after the first, seconds."""
    e2e_s: float | None = attrs.field(default=None, validator=optional(greater_than(0)))
    """End-to-end latency, seconds."""


@attrs.frozen(kw_only=True)
class SimulationConfig:
    """How the simulation itself runs."""

    mode: str = attrs.field(default="event_per_change", validator=one_of(("event_per_change", "event_per_step")))
    """``event_per_change``: one SimPy event per batch-composition change (fast);
    ``event_per_step``: one per engine step (the reference; same records)."""
    until_s: float | None = attrs.field(default=None, validator=optional(greater_than(0)))
    """Stop the simulation at this time (requests still in flight are reported as such).
    Default: run until every generated request has finished."""


@attrs.frozen(kw_only=True)
class Scenario:
    """A whole scenario: workload, serving system, SLOs and run settings."""

    workload: WorkloadConfig
    serving: ServingConfig
    seed: int = attrs.field(default=0, validator=at_least(0))
    """Root seed of every random stream."""
    name: str = ""
    """Free-form label."""
    slo: dict[str, SLOTarget] = attrs.field(factory=dict)
    """SLO targets per class name."""
    simulation: SimulationConfig = attrs.field(factory=SimulationConfig)
