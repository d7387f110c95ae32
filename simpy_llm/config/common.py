"""The config tree's shared pieces: a registered implementation by name (:class:`PolicySpec`),
the field types the loader structures specially, time windows and a network path's faults.

Every section of the config (:mod:`simpy_llm.config.schema`, :mod:`simpy_llm.config.speculation`)
builds on these; this module imports no other section.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal, NewType, Protocol, TypeAlias

import attrs
import numpy as np

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.validators import MAX_BANDWIDTH_MBPS, MAX_TIME_S, all_of, at_least, at_most, greater_than, one_of, optional

__all__ = [
    "AdmissionSpec",
    "ArrivalField",
    "ArrivalProcess",
    "BatchServiceSpec",
    "BinSelectorSpec",
    "KvBlocks",
    "LatencySpec",
    "LengthDistribution",
    "LengthField",
    "LinkFaults",
    "NetworkConfig",
    "OutageWindow",
    "PolicySpec",
    "PriorityField",
    "Probability",
    "RouterSpec",
    "SchedulerSpec",
    "TimeWindow",
]


@attrs.frozen(kw_only=True)
class PolicySpec:
    """A registered implementation by name plus its parameters (``{kind: ..., params: {...}}``)."""

    kind: str
    """Registered name."""
    params: dict[str, Any] = attrs.field(factory=dict)
    """Keyword parameters for the implementation."""


class LengthDistribution(Protocol):
    """What every registered length distribution provides (:mod:`simpy_llm.workload.distributions`)."""

    @property
    def mean(self) -> float: ...

    @property
    def variance(self) -> float: ...

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Draw *n* values (floats; see :func:`~simpy_llm.workload.distributions.to_tokens`)."""
        ...


class ArrivalProcess(Protocol):
    """What every registered arrival process provides (:mod:`simpy_llm.workload.arrivals`)."""

    def times(self, rng: np.random.Generator, rate: float, chunk: int) -> Iterator[np.ndarray]:
        """Endless chunks of *chunk* increasing absolute arrival times (s) at mean rate *rate*."""
        ...


# Field markers. At run time each is a distinct NewType, so that the loader can give each its
# own structuring hook (look a process up by ``process``, a distribution by ``type``, a policy
# in its registry...); to a type checker each is the type of the value the loader makes.
if TYPE_CHECKING:
    ArrivalField: TypeAlias = ArrivalProcess
    LengthField: TypeAlias = LengthDistribution
    PriorityField: TypeAlias = int | LengthDistribution
    RouterSpec: TypeAlias = PolicySpec
    LatencySpec: TypeAlias = PolicySpec
    SchedulerSpec: TypeAlias = PolicySpec
    AdmissionSpec: TypeAlias = PolicySpec
    BatchServiceSpec: TypeAlias = PolicySpec
    BinSelectorSpec: TypeAlias = PolicySpec
    KvBlocks: TypeAlias = int | Literal["auto"]
    Probability: TypeAlias = float
else:
    ArrivalField = NewType("ArrivalField", object)
    """A registered arrival process, written ``{process: NAME, ...its fields}``."""
    LengthField = NewType("LengthField", object)
    """A registered length distribution, written ``{type: NAME, params: {...}}``."""
    PriorityField = NewType("PriorityField", object)
    """A request priority: an integer, or a registered length distribution drawn per request."""
    RouterSpec = NewType("RouterSpec", PolicySpec)
    """A :class:`PolicySpec` naming a routing policy."""
    LatencySpec = NewType("LatencySpec", PolicySpec)
    """A :class:`PolicySpec` naming a latency model."""
    SchedulerSpec = NewType("SchedulerSpec", PolicySpec)
    """A :class:`PolicySpec` naming a scheduler policy."""
    AdmissionSpec = NewType("AdmissionSpec", PolicySpec)
    """A :class:`PolicySpec` naming an admission policy."""
    BatchServiceSpec = NewType("BatchServiceSpec", PolicySpec)
    """A :class:`PolicySpec` naming a batch service model (:mod:`simpy_llm.serving.batching`)."""
    BinSelectorSpec = NewType("BinSelectorSpec", PolicySpec)
    """A :class:`PolicySpec` naming a bin selector (:mod:`simpy_llm.policies.batching`)."""
    KvBlocks = NewType("KvBlocks", object)
    """A block count (int >= 1) or ``"auto"``."""
    Probability = NewType("Probability", float)
    """A probability in [0, 1]; YAML ``true``/``false`` mean 1 and 0."""


@attrs.frozen(kw_only=True)
class TimeWindow:
    """A period of simulated time, ``[start_s, end_s)``."""

    start_s: float = attrs.field(validator=all_of(at_least(0), at_most(MAX_TIME_S)))
    """Start, seconds from the simulation start."""
    end_s: float = attrs.field(validator=all_of(greater_than(0), at_most(MAX_TIME_S)))
    """End, seconds (exclusive)."""

    def __attrs_post_init__(self) -> None:
        if self.end_s <= self.start_s:
            raise FieldValueError("end_s", f"must be > start_s ({self.start_s}), got {self.end_s}")


@attrs.frozen(kw_only=True)
class OutageWindow(TimeWindow):
    """A period during which a link moves no bytes."""


@attrs.frozen(kw_only=True)
class LinkFaults:
    """What can go wrong on a link (:class:`~simpy_llm.network.link.Link`, ``docs/network.md``):
    jitter, loss with retransmission after a timeout, and outages. All off by default."""

    rtt_jitter_ms: float = attrs.field(default=0.0, validator=all_of(at_least(0), at_most(MAX_TIME_S * 1e3)))
    """Standard deviation of each message's round-trip sample, milliseconds."""
    bandwidth_jitter: float = attrs.field(default=0.0, validator=all_of(at_least(0), at_most(10.0)))
    """Relative standard deviation of each message's bandwidth factor."""
    loss_probability: float = attrs.field(default=0.0, validator=all_of(at_least(0), at_most(1)))
    """Probability that a transmission is lost (and retransmitted after the timeout)."""
    retransmit_timeout_ms: float | None = attrs.field(default=None, validator=optional(all_of(at_least(0), at_most(MAX_TIME_S * 1e3))))
    """From a lost transmission's end to its retransmission, milliseconds (required with loss)."""
    max_retransmissions: int | None = attrs.field(default=None, validator=optional(all_of(at_least(0), at_most(1_000_000))))
    """Retransmissions before a further loss drops the message, and its request (None: no limit)."""
    outages: tuple[OutageWindow, ...] = attrs.field(default=(), converter=tuple)
    """Windows during which the link moves nothing (sorted, not overlapping)."""
    outage_mode: str = attrs.field(default="wait", validator=one_of(("wait", "drop")))
    """``wait``: messages pause until the outage ends; ``drop``: they, and their requests, are dropped."""

    def __attrs_post_init__(self) -> None:
        if self.loss_probability > 0 and self.retransmit_timeout_ms is None:
            raise FieldValueError("retransmit_timeout_ms", "required when loss_probability > 0")
        if self.retransmit_timeout_ms is not None and self.loss_probability == 0:
            raise FieldValueError("retransmit_timeout_ms", "applies only with loss_probability > 0")
        if self.max_retransmissions is not None and self.loss_probability == 0:
            raise FieldValueError("max_retransmissions", "applies only with loss_probability > 0")
        if self.loss_probability == 1 and self.max_retransmissions is None:
            raise FieldValueError("max_retransmissions", "required when every transmission is lost (loss_probability 1)")
        for i in range(1, len(self.outages)):
            if self.outages[i].start_s < self.outages[i - 1].end_s:
                raise FieldValueError(f"outages[{i}]", "outages must be sorted and must not overlap")

    @property
    def random(self) -> bool:
        """Whether the link draws random numbers (jitter or loss)."""
        return self.rtt_jitter_ms > 0 or self.bandwidth_jitter > 0 or self.loss_probability > 0

    def link_faults(self) -> dict[str, Any]:
        """The :class:`~simpy_llm.network.link.Link` keyword arguments of these faults (no rng)."""
        return {
            "rtt_jitter_s": self.rtt_jitter_ms / 1e3,
            "bandwidth_jitter": self.bandwidth_jitter,
            "loss_probability": self.loss_probability,
            "retransmit_timeout_s": None if self.retransmit_timeout_ms is None else self.retransmit_timeout_ms / 1e3,
            "max_retransmissions": self.max_retransmissions,
            "outages": tuple((w.start_s, w.end_s) for w in self.outages),
            "outage_mode": self.outage_mode,
        }


@attrs.frozen(kw_only=True)
class NetworkConfig(LinkFaults):
    """A client's network path to the serving system (``docs/network.md``).

    Its prompt crosses the client's uplink before the request reaches the router (half
    the round trip, plus its bytes over the bandwidth, shared fairly among the client's
    uploads in flight), and each output token reaches the client half a round trip plus
    its bytes' transmission after the server emits it. Records keep the server-side
    times and add ``upload_s`` and ``download_s``; ``client_ttft_s`` and ``client_e2e_s``
    are what the client sees."""

    rtt_ms: float = attrs.field(default=0.0, validator=all_of(at_least(0), at_most(MAX_TIME_S * 1e3)))
    """Round-trip time, milliseconds."""
    bandwidth_mbps: float | None = attrs.field(
        default=None, validator=optional(all_of(greater_than(0), at_most(MAX_BANDWIDTH_MBPS)))
    )
    """Client bandwidth each way, megabits per second (None: unlimited)."""
    bytes_per_token: float = attrs.field(default=4.0, validator=all_of(greater_than(0), at_most(1e6)))
    """Bytes on the wire per token, up and down (4: a 32-bit token id, BLIS's estimate;
    text and streamed JSON chunks are larger)."""

    @property
    def one_way_s(self) -> float:
        """Half the round trip, s."""
        return self.rtt_ms * 5e-4

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Bandwidth each way, bytes per second (inf: unlimited)."""
        return math.inf if self.bandwidth_mbps is None else self.bandwidth_mbps * 1e6 / 8

    @property
    def download_s(self) -> float:
        """Delay from the server emitting a token to the client having it, s."""
        return self.one_way_s + self.bytes_per_token / self.bandwidth_bytes_per_s
