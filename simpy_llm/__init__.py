"""simpy_llm: discrete-event simulation of LLM inference serving with SimPy.

The public API::

    from simpy_llm import Simulation, load_scenario
    results = Simulation(load_scenario("scenarios/quickstart.yaml")).run()
    results.summary(); results.to_dataframe(); results.save("out/")

``simpy_llm.observe`` and ``simpy_llm.calibrate`` (aiohttp, pandas) sit beside
the core and are never imported from here.
"""

from simpy_llm.config import Scenario, ScenarioError
from simpy_llm.entities import Request
from simpy_llm.loading import load_scenario, scenario_from_dict
from simpy_llm.metrics.record import RequestRecord
from simpy_llm.metrics.recorder import Recorder
from simpy_llm.metrics.results import Results
from simpy_llm.registry import Registry
from simpy_llm.rng import RandomStreams
from simpy_llm.simulation import Simulation

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
