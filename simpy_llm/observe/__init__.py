"""The observer: measure a real OpenAI-compatible server and write what happened as a trace v2.

Optional: it needs ``aiohttp``, and nothing in the simulator core imports it.
See docs/observe.md for the metric definitions.

- :mod:`simpy_llm.observe.sse`: incremental SSE parser (pure).
- :mod:`simpy_llm.observe.client`: :class:`OpenAIClient`, :class:`ObservedRequest`.
- :mod:`simpy_llm.observe.loadgen`: :class:`LoadGenerator` (open loop or concurrency limit).
- :mod:`simpy_llm.observe.sessions`: :class:`Conversations` (closed-loop sessions: multi-turn, conversational and agentic workflows).
- :mod:`simpy_llm.observe.prompts`: prompt text (synthetic words, or a user's dataset: :func:`load_prompts`,
  :class:`DatasetPrompts`).
- :mod:`simpy_llm.observe.report`: :func:`latency_report` (TTFT, TPOT, ITL, E2E of a run, per client).
- :mod:`simpy_llm.observe.progress`: the live progress line of ``simpy-llm observe``.
- :mod:`simpy_llm.observe.scrape`: :class:`MetricsScraper` (Prometheus ``/metrics`` over time).
- :mod:`simpy_llm.observe.run`: :func:`observe`, the ``simpy-llm observe`` command's engine.
- :mod:`simpy_llm.observe.emulate`: the emulated OpenAI-compatible server (``simpy-llm serve``).
- :mod:`simpy_llm.observe.llamacpp`: a real llama.cpp server on the CPU, for tests and calibration.
- :mod:`simpy_llm.observe.runner`: :func:`~simpy_llm.observe.runner.run` (here ``run_loop``), :func:`asyncio.run`
  on uvloop when installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simpy_llm.lazy import lazy_exports

if TYPE_CHECKING:
    from simpy_llm.observe.client import ObservedRequest, OpenAIClient, RequestSpec, RetryPolicy
    from simpy_llm.observe.loadgen import (
        OBSERVER_COLUMNS,
        LoadGenerator,
        LoadRequest,
        RunSummary,
        ScheduleLagWarning,
        load_requests,
        record_row,
        synthetic_prompt,
    )
    from simpy_llm.observe.prompts import DatasetPrompts, PromptDatasetError, SyntheticPrompts, load_prompts
    from simpy_llm.observe.report import latency_report
    from simpy_llm.observe.run import observe

    # Exported as run_loop: simpy_llm.observe.run is the module of the observe command.
    from simpy_llm.observe.runner import loop_factory, resolve_loop
    from simpy_llm.observe.runner import run as run_loop
    from simpy_llm.observe.scrape import MetricsScraper, read_metrics
    from simpy_llm.observe.sessions import Conversations
    from simpy_llm.observe.sse import SSEEvent, SSEParser, StreamChunk, interpret, parse_events

_HOME = {
    "ObservedRequest": ("client", "ObservedRequest"), "OpenAIClient": ("client", "OpenAIClient"),
    "RequestSpec": ("client", "RequestSpec"), "RetryPolicy": ("client", "RetryPolicy"),
    "OBSERVER_COLUMNS": ("loadgen", "OBSERVER_COLUMNS"), "LoadGenerator": ("loadgen", "LoadGenerator"),
    "LoadRequest": ("loadgen", "LoadRequest"), "RunSummary": ("loadgen", "RunSummary"),
    "ScheduleLagWarning": ("loadgen", "ScheduleLagWarning"), "load_requests": ("loadgen", "load_requests"),
    "record_row": ("loadgen", "record_row"), "synthetic_prompt": ("loadgen", "synthetic_prompt"),
    "DatasetPrompts": ("prompts", "DatasetPrompts"), "PromptDatasetError": ("prompts", "PromptDatasetError"),
    "SyntheticPrompts": ("prompts", "SyntheticPrompts"), "load_prompts": ("prompts", "load_prompts"),
    "latency_report": ("report", "latency_report"), "observe": ("run", "observe"),
    "loop_factory": ("runner", "loop_factory"), "resolve_loop": ("runner", "resolve_loop"),
    "run_loop": ("runner", "run"), "MetricsScraper": ("scrape", "MetricsScraper"),
    "read_metrics": ("scrape", "read_metrics"), "Conversations": ("sessions", "Conversations"),
    "SSEEvent": ("sse", "SSEEvent"), "SSEParser": ("sse", "SSEParser"), "StreamChunk": ("sse", "StreamChunk"),
    "interpret": ("sse", "interpret"), "parse_events": ("sse", "parse_events"),
}
"""Each public name's module and its name there. They are imported on first use (PEP 562):
the command line builds the ``bench`` verbs' parsers (:mod:`simpy_llm.observe.bench.cli`) for
every command, and a ``simpy-llm run`` should not pay for aiohttp, pandas and the Prometheus
client."""


__getattr__, __dir__ = lazy_exports(globals(), _HOME)


__all__ = [
    "OBSERVER_COLUMNS",
    "Conversations",
    "DatasetPrompts",
    "LoadGenerator",
    "LoadRequest",
    "MetricsScraper",
    "ObservedRequest",
    "OpenAIClient",
    "PromptDatasetError",
    "RequestSpec",
    "RetryPolicy",
    "RunSummary",
    "SSEEvent",
    "SSEParser",
    "ScheduleLagWarning",
    "StreamChunk",
    "SyntheticPrompts",
    "interpret",
    "latency_report",
    "load_prompts",
    "load_requests",
    "loop_factory",
    "observe",
    "parse_events",
    "read_metrics",
    "record_row",
    "resolve_loop",
    "run_loop",
    "synthetic_prompt",
]
