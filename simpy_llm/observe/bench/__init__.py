"""Benchmarks of real servers as ``vllm bench serve`` and guidellm make them (``simpy-llm bench``).

:func:`~simpy_llm.observe.bench.run.bench` runs a profile
(:mod:`~simpy_llm.observe.bench.profiles`) of a dataset's requests
(:mod:`~simpy_llm.observe.bench.datasets`, counted by
:mod:`~simpy_llm.observe.bench.tokens`) through the observer, one trace per run, and reports
vLLM's metrics (:mod:`~simpy_llm.observe.bench.metrics`). See docs/observe.md, "Benchmarks".
"""

from simpy_llm.observe.bench.metrics import bench_metrics, parse_goodput, parse_percentiles
from simpy_llm.observe.bench.profiles import PROFILES, RunPlan, arrival_times, sweep_rates
from simpy_llm.observe.bench.run import bench

__all__ = ["PROFILES", "RunPlan", "arrival_times", "bench", "bench_metrics", "parse_goodput", "parse_percentiles", "sweep_rates"]
