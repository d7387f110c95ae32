"""simpy_llm: discrete-event simulation of LLM inference serving with SimPy.

The public API::

    from simpy_llm import Simulation, load_scenario
    results = Simulation(load_scenario("scenarios/quickstart.yaml")).run()
    results.summary(); results.to_dataframe(); results.save("out/")

``simpy_llm.observe`` and ``simpy_llm.calibrate`` (aiohttp, pandas) sit beside
the core and are never imported from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simpy_llm.lazy import lazy_exports

if TYPE_CHECKING:
    from simpy_llm.config import Scenario, ScenarioError
    from simpy_llm.entities import Request
    from simpy_llm.loading import load_scenario, scenario_from_dict
    from simpy_llm.metrics.record import RequestRecord
    from simpy_llm.metrics.recorder import Recorder
    from simpy_llm.metrics.results import Results
    from simpy_llm.registry import Registry
    from simpy_llm.rng import RandomStreams
    from simpy_llm.simulation import Simulation

_HOME = {
    "Scenario": "config", "ScenarioError": "config", "Request": "entities", "load_scenario": "loading",
    "scenario_from_dict": "loading", "RequestRecord": "metrics.record", "Recorder": "metrics.recorder",
    "Results": "metrics.results", "Registry": "registry", "RandomStreams": "rng", "Simulation": "simulation",
}
"""Each public name's module. They are imported on first use (PEP 562): the command line
(``simpy_llm.cli``) imports this package first, and a command imports only what it runs."""


__getattr__, __dir__ = lazy_exports(globals(), _HOME)


__all__ = [
    "RandomStreams",
    "Recorder",
    "Registry",
    "Request",
    "RequestRecord",
    "Results",
    "Scenario",
    "ScenarioError",
    "Simulation",
    "load_scenario",
    "scenario_from_dict",
]

__version__ = "0.1.0"
