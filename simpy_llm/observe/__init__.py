"""The observer: measure a real OpenAI-compatible server and write what happened as a trace v2.

Optional: it needs ``aiohttp``, and nothing in the simulator core imports it.
See docs/observe.md for the metric definitions.

- :mod:`simpy_llm.observe.sse`: incremental SSE parser (pure).
- :mod:`simpy_llm.observe.client`: :class:`OpenAIClient`, :class:`RequestRecord`.
- :mod:`simpy_llm.observe.loadgen`: :class:`LoadGenerator` (open loop or concurrency limit).
"""

from __future__ import annotations

from simpy_llm.observe.client import OpenAIClient, RequestRecord, RequestSpec, RetryPolicy
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
from simpy_llm.observe.sse import SSEEvent, SSEParser, StreamChunk, interpret, parse_events

__all__ = [
    "OBSERVER_COLUMNS",
    "LoadGenerator",
    "LoadRequest",
    "OpenAIClient",
    "RequestRecord",
    "RequestSpec",
    "RetryPolicy",
    "RunSummary",
    "SSEEvent",
    "SSEParser",
    "ScheduleLagWarning",
    "StreamChunk",
    "interpret",
    "load_requests",
    "parse_events",
    "record_row",
    "synthetic_prompt",
]
