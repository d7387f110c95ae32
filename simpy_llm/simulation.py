"""Simulation: builds the components from a scenario, wires their Stores, runs.

Wiring happens here and only here::

    WorkloadGenerator --Wire--> Router --Wire per replica--> Replica (ingress + engine)

Examples
--------
>>> from simpy_llm import Simulation, load_scenario
>>> sim = Simulation(load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=200"]))
>>> results = sim.run()
>>> results.summary()["requests"]["completed"]
200
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import simpy

from simpy_llm.config.loader import build_policy
from simpy_llm.metrics.recorder import Recorder
from simpy_llm.metrics.results import Results
from simpy_llm.policies.routing import routing_policies
from simpy_llm.rng import RandomStreams
from simpy_llm.serving.engine import Replica
from simpy_llm.serving.latency import latency_models
from simpy_llm.serving.router import Router
from simpy_llm.wire import Wire
from simpy_llm.workload.generator import WorkloadGenerator

if TYPE_CHECKING:
    from simpy_llm.config.schema import Scenario

__all__ = ["Simulation"]

ProgressCallback = Callable[[int, int | None, float], None]
"""Called as ``progress(finished_requests, total_requests_or_None, sim_time_s)``."""


class Simulation:
    """One simulation of a :class:`~simpy_llm.config.schema.Scenario`.

    Parameters
    ----------
    scenario
        What to simulate.
    latency_model
        Use this latency model instead of the scenario's (e.g. one fitted in Python).
    routing_policy
        Use this routing policy object instead of the scenario's.
    """

    def __init__(self, scenario: Scenario, *, latency_model: object = None, routing_policy: object = None) -> None:
        self.scenario = scenario
        self.env = simpy.Environment()
        self.streams = RandomStreams(scenario.seed)
        serving = scenario.serving
        self.recorder = Recorder(num_replicas=serving.replicas)
        self.latency_model = latency_model or build_policy(serving.latency_model, latency_models)
        self.routing_policy = routing_policy or build_policy(
            serving.router, routing_policies, rng=self.streams.stream("router")
        )
        env = self.env
        fast = scenario.simulation.mode == "event_per_change"
        arrivals = Wire(env)
        replica_inboxes = [Wire(env) for _ in range(serving.replicas)]
        self.replicas = [
            Replica(env, i, inbox, serving.engine, self.latency_model, self.recorder, fast=fast)
            for i, inbox in enumerate(replica_inboxes)
        ]
        self.router = Router(env, arrivals, replica_inboxes, self.replicas, self.routing_policy, self.recorder)
        self.generator = WorkloadGenerator(env, scenario.workload, self.streams, arrivals, self.recorder)
        self._ran = False

    def _finished(self) -> bool:
        return self.generator.done and not self.recorder.live

    def run(self, progress: ProgressCallback | None = None, progress_every_s: float | None = None) -> Results:
        """Run to the end (every request finished, or ``simulation.until_s``) and return the Results.

        Parameters
        ----------
        progress
            Called periodically with ``(finished, total, sim_time_s)``.
        progress_every_s
            Simulated seconds between progress calls (default: 1/200 of the expected duration).
        """
        if self._ran:
            raise RuntimeError("a Simulation runs once; build a new one to run again")
        self._ran = True
        env = self.env
        wl = self.scenario.workload
        until = self.scenario.simulation.until_s
        wall0 = time.perf_counter()
        if progress is None:
            env.run(until=until)
        else:
            total = wl.num_requests
            expected = wl.horizon_s if wl.horizon_s is not None else (wl.num_requests or 1) / wl.aggregate_rate
            every = progress_every_s or max(expected / 200.0, 1e-6)
            t = 0.0
            while not self._finished() and (until is None or t < until):
                t = t + every if until is None else min(t + every, until)
                env.run(until=t)
                progress(self.recorder.arrived - len(self.recorder.live), total, env.now)
                if env.peek() == float("inf"):
                    break  # nothing left to happen
            progress(self.recorder.arrived - len(self.recorder.live), total, env.now)
        wall = time.perf_counter() - wall0
        end_s = until if until is not None else self._last_activity_s()
        for req in sorted(self.recorder.live.values(), key=lambda r: r.id):
            self.recorder.on_in_flight(req)
        return Results.from_recorder(
            self.recorder,
            scenario=self.scenario,
            end_s=end_s,
            wall_s=wall,
            events=self._events_processed(),
            steps=sum(r.step for r in self.replicas),
            kv_blocks=[r.kv.num_blocks for r in self.replicas],
        )

    def _last_activity_s(self) -> float:
        """When the last request finished (or arrived): the end of a run to completion.

        Not ``env.now``: superseded step-end events of the fast mode may lie later
        than the last real activity, and the two modes must report the same end.
        """
        cols = self.recorder.columns
        completions = np.frombuffer(cols["completion_s"], dtype=np.float64)
        arrivals = np.frombuffer(cols["arrival_s"], dtype=np.float64)
        last = float(np.nanmax(completions, initial=0.0)) if completions.size else 0.0
        return max(last, float(arrivals.max(initial=0.0)))

    def _events_processed(self) -> int:
        # SimPy numbers every scheduled event from one counter; its next value is the count.
        return next(self.env._eid)  # noqa: SLF001 - read-only use of SimPy's event counter
