"""Policy protocols and their registries.

A policy is a small object that makes one decision and never touches the
SimPy environment, so it can be unit-tested without running a simulation.
Built-ins and user policies register the same way, and a scenario then names
them (from the command line, import the module that registers them with
``--plugin``, or list it under the scenario's ``plugins:``):

>>> from simpy_llm import Simulation, load_scenario
>>> from simpy_llm.policies import routing_policies
>>> @routing_policies.register("fewest_waiting")
... class FewestWaiting:
...     def choose(self, request, view):
...         return min(range(len(view)), key=lambda i: view[i].waiting_requests)
>>> scenario = load_scenario("scenarios/quickstart.yaml", {
...     "workload.num_requests": 200, "serving.replicas": 2, "serving.router.kind": "fewest_waiting"})
>>> Simulation(scenario).run().summary()["requests"]["completed"]
200

A plain class like this one is called with its ``params:`` as keyword
arguments (checked against its signature); an attrs class has them structured
strictly into its fields. A routing or admission policy that declares an
``rng`` parameter (or field) is given the simulation's random stream in it.

Routing policies choose a replica (:data:`routing_policies`, with the scorers
of ``weighted_score`` in :data:`routing_scorers`); admission policies admit or
reject a request before routing (:data:`admission_policies`); an
:class:`OutputPredictor` tells policies what they may believe about a
request's output length; gamma policies choose how many tokens a speculative drafter
proposes next (:data:`gamma_policies`) and mode selectors whether a request's
speculative decoding runs distributed or fused (:data:`mode_selectors`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simpy_llm.lazy import lazy_exports

if TYPE_CHECKING:
    from simpy_llm.policies.admission import (
        AdmissionPolicy,
        AlwaysAdmit,
        MaxQueue,
        SloShed,
        TokenBucket,
        admission_policies,
        predicted_ttft_s,
    )
    from simpy_llm.policies.gamma import GammaPolicy, GammaState, gamma_policies
    from simpy_llm.policies.latency_head import LatencyHead
    from simpy_llm.policies.mode import ModeSelector, ModeState, mode_selectors
    from simpy_llm.policies.predictors import OutputPredictor
    from simpy_llm.policies.routing import (
        JoinIdleQueue,
        JoinShortestQueue,
        LeastKV,
        LeastLoaded,
        LeastOutstandingTokens,
        PowerOfD,
        PrefixAffinity,
        RandomRouting,
        ReplicaView,
        RoundRobin,
        RoutingPolicy,
        Scorer,
        SemiClairvoyant,
        WeightedPowerOfD,
        WeightedScore,
        prefix_key,
        routing_policies,
        routing_scorers,
    )

_HOME = {
    "AdmissionPolicy": "admission", "AlwaysAdmit": "admission", "MaxQueue": "admission", "SloShed": "admission",
    "TokenBucket": "admission", "admission_policies": "admission", "predicted_ttft_s": "admission",
    "GammaPolicy": "gamma", "GammaState": "gamma", "gamma_policies": "gamma", "LatencyHead": "latency_head",
    "ModeSelector": "mode", "ModeState": "mode", "mode_selectors": "mode", "OutputPredictor": "predictors",
    "JoinIdleQueue": "routing", "JoinShortestQueue": "routing", "LeastKV": "routing", "LeastLoaded": "routing",
    "LeastOutstandingTokens": "routing", "PowerOfD": "routing", "PrefixAffinity": "routing",
    "RandomRouting": "routing", "ReplicaView": "routing", "RoundRobin": "routing", "RoutingPolicy": "routing",
    "Scorer": "routing", "SemiClairvoyant": "routing", "WeightedPowerOfD": "routing", "WeightedScore": "routing",
    "prefix_key": "routing", "routing_policies": "routing", "routing_scorers": "routing",
}
"""Each public name's module. They are imported on first use (PEP 562): a module that needs
one policy module (the loader, the simulation) does not load the others (γ policies, mode
selectors and the latency head belong to speculative decoding only)."""


__getattr__, __dir__ = lazy_exports(globals(), _HOME)


__all__ = [
    "AdmissionPolicy",
    "AlwaysAdmit",
    "GammaPolicy",
    "GammaState",
    "JoinIdleQueue",
    "JoinShortestQueue",
    "LatencyHead",
    "LeastKV",
    "LeastLoaded",
    "LeastOutstandingTokens",
    "MaxQueue",
    "ModeSelector",
    "ModeState",
    "OutputPredictor",
    "PowerOfD",
    "PrefixAffinity",
    "RandomRouting",
    "ReplicaView",
    "RoundRobin",
    "RoutingPolicy",
    "Scorer",
    "SemiClairvoyant",
    "SloShed",
    "TokenBucket",
    "WeightedPowerOfD",
    "WeightedScore",
    "admission_policies",
    "gamma_policies",
    "mode_selectors",
    "predicted_ttft_s",
    "prefix_key",
    "routing_policies",
    "routing_scorers",
]
