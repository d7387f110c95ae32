"""Gateway dispatch policies: which waiting sub-queue the gateway serves next (``docs/gateway.md``).

A dispatch policy implements ``choose(queues) -> key``: *queues* maps each sub-queue's key (a
tenant, client, SLO class or priority, as ``serving.gateway.queue_by`` says) to its requests,
oldest first; only non-empty sub-queues are passed. It returns the key of the sub-queue whose
oldest request goes next; it may keep state (a fair policy counts what it served). It never
yields and never touches the environment. Register one with
``@gateway_dispatch.register("name")``.

Built-in: ``fifo`` (:class:`Fifo`), ``priority`` (:class:`StrictPriority`) and ``fair``
(:class:`WeightedFair`).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Protocol

import attrs

from simpy_llm.config.errors import FieldValueError
from simpy_llm.entities import Request
from simpy_llm.registry import Registry

__all__ = ["DispatchPolicy", "Fifo", "StrictPriority", "WeightedFair", "gateway_dispatch"]

gateway_dispatch: Registry = Registry("gateway dispatch policy")
"""Registered gateway dispatch policies."""


class DispatchPolicy(Protocol):
    """Chooses the sub-queue the gateway serves next."""

    def choose(self, queues: Mapping[Hashable, Sequence[Request]]) -> Hashable:
        """The key of the sub-queue whose oldest request is dispatched next."""


def _head(item: tuple[Hashable, Sequence[Request]]) -> tuple[float, int]:
    req = item[1][0]
    return (req.arrival_s, req.id)


def _req(i: int, at: float, priority: int = 0) -> Request:
    return Request(id=i, client_id="c", prompt_tokens=1, output_tokens=1, arrival_s=at, priority=priority)


@gateway_dispatch.register("fifo")
@attrs.define
class Fifo:
    """The sub-queue whose oldest request arrived first (ties: the lower request id).

    >>> Fifo().choose({"a": [_req(3, 1.0)], "b": [_req(2, 0.5)]})
    'b'
    """

    def choose(self, queues: Mapping[Hashable, Sequence[Request]]) -> Hashable:
        return min(queues.items(), key=_head)[0]


@gateway_dispatch.register("priority")
@attrs.define
class StrictPriority:
    """The sub-queue whose oldest request has the highest priority (ties: first arrived).

    >>> StrictPriority().choose({"a": [_req(1, 0.0, priority=0)], "b": [_req(2, 1.0, priority=2)]})
    'b'
    """

    def choose(self, queues: Mapping[Hashable, Sequence[Request]]) -> Hashable:
        def key(item: tuple[Hashable, Sequence[Request]]) -> tuple[int, float, int]:
            req = item[1][0]
            return (-req.priority, req.arrival_s, req.id)

        return min(queues.items(), key=key)[0]


@gateway_dispatch.register("fair")
@attrs.define
class WeightedFair:
    """Weighted round robin over the sub-queues: the one that has been served least for its
    weight (requests dispatched so far over its weight) goes next; ties go to the sub-queue
    whose oldest request arrived first. Over a stretch where sub-queues stay backlogged, each
    gets dispatches in proportion to its weight.

    >>> p = WeightedFair(weights={"gold": 3})
    >>> queues = {"gold": [_req(1, 0.0)], "free": [_req(2, 0.0)]}
    >>> [p.choose(queues) for _ in range(8)]
    ['gold', 'free', 'gold', 'gold', 'gold', 'free', 'gold', 'gold']
    """

    weights: dict[str, float] = attrs.field(factory=dict)
    """Weight per sub-queue key (written as a string: ``"2"`` for priority 2); others weigh 1."""
    served: dict[Hashable, int] = attrs.field(factory=dict, init=False)
    """Requests dispatched from each sub-queue so far."""

    def __attrs_post_init__(self) -> None:
        for key, weight in self.weights.items():
            if not isinstance(weight, (int, float)) or isinstance(weight, bool) or not weight > 0:
                raise FieldValueError(f"weights.{key}", f"must be a number > 0, got {weight!r}")

    def choose(self, queues: Mapping[Hashable, Sequence[Request]]) -> Hashable:
        weights, served = self.weights, self.served

        def key(item: tuple[Hashable, Sequence[Request]]) -> tuple[float, float, int]:
            name = item[0]
            return (served.get(name, 0) / weights.get(str(name), 1.0), *_head(item))

        chosen = min(queues.items(), key=key)[0]
        served[chosen] = served.get(chosen, 0) + 1
        return chosen
