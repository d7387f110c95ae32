"""Benchmarks of real servers as ``vllm bench serve`` and guidellm make them (``simpy-llm bench``).

:func:`~simpy_llm.observe.bench.run.bench` runs a profile
(:mod:`~simpy_llm.observe.bench.profiles`) of a dataset's requests
(:mod:`~simpy_llm.observe.bench.datasets`, counted by
:mod:`~simpy_llm.observe.bench.tokens`) through the observer, one trace per run, and reports
vLLM's metrics (:mod:`~simpy_llm.observe.bench.metrics`). See docs/observe.md, "Benchmarks".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simpy_llm.lazy import lazy_exports

if TYPE_CHECKING:
    from simpy_llm.observe.bench.metrics import bench_metrics, parse_goodput, parse_percentiles
    from simpy_llm.observe.bench.profiles import PROFILES, RunPlan, arrival_times, sweep_rates
    from simpy_llm.observe.bench.run import bench

_HOME = {
    "bench_metrics": ("metrics", "bench_metrics"), "parse_goodput": ("metrics", "parse_goodput"),
    "parse_percentiles": ("metrics", "parse_percentiles"), "PROFILES": ("profiles", "PROFILES"),
    "RunPlan": ("profiles", "RunPlan"), "arrival_times": ("profiles", "arrival_times"),
    "sweep_rates": ("profiles", "sweep_rates"), "bench": ("run", "bench"),
}
"""Each public name's module and its name there. They are imported on first use (PEP 562):
the command line builds the ``bench`` verbs' parsers (:mod:`simpy_llm.observe.bench.cli`) for
every command, and a ``simpy-llm run`` should not pay for the observer."""


__getattr__, __dir__ = lazy_exports(globals(), _HOME)


__all__ = ["PROFILES", "RunPlan", "arrival_times", "bench", "bench_metrics", "parse_goodput", "parse_percentiles", "sweep_rates"]
