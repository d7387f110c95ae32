"""Policy protocols and their registries.

A policy is a small object that makes one decision and never touches the
SimPy environment, so it can be unit-tested without running a simulation.
Built-ins and user policies register the same way::

    from simpy_llm.policies import routing_policies

    @routing_policies.register("fewest_waiting")
    class FewestWaiting:
        def choose(self, request, view):
            return min(range(len(view)), key=lambda i: view[i].waiting_requests)
"""

from simpy_llm.policies.routing import (
    LeastLoaded,
    RandomRouting,
    ReplicaView,
    RoundRobin,
    RoutingPolicy,
    routing_policies,
)

__all__ = [
    "LeastLoaded",
    "RandomRouting",
    "ReplicaView",
    "RoundRobin",
    "RoutingPolicy",
    "routing_policies",
]
