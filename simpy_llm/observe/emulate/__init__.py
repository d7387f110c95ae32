"""The emulated server: an OpenAI-compatible HTTP server whose token timing is the simulator's.

Beside the core, like :mod:`simpy_llm.observe` (it needs ``aiohttp``); the
simulator core never imports it. ``simpy-llm serve SCENARIO`` runs it; see
docs/emulate.md.

- :mod:`simpy_llm.observe.emulate.clock`: :class:`RealtimeDriver` (a SimPy environment in wall-clock time on asyncio).
- :mod:`simpy_llm.observe.emulate.protocol`: request checking, token counting, response bodies (pure).
- :mod:`simpy_llm.observe.emulate.server`: :class:`EmulatedServer`, :class:`ServedRequest`, :func:`replay_scenario`.
"""

from __future__ import annotations

from simpy_llm.observe.emulate.clock import RealtimeDriver
from simpy_llm.observe.emulate.protocol import ParsedRequest, RequestError, count_tokens, parse_request
from simpy_llm.observe.emulate.server import (
    TRACE_COLUMNS,
    EmulatedServer,
    ServedRequest,
    default_model_name,
    replay_scenario,
    serve_until_signalled,
)

__all__ = [
    "TRACE_COLUMNS",
    "EmulatedServer",
    "ParsedRequest",
    "RealtimeDriver",
    "RequestError",
    "ServedRequest",
    "count_tokens",
    "default_model_name",
    "parse_request",
    "replay_scenario",
    "serve_until_signalled",
]
