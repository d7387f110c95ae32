"""The fake server (:mod:`tests.observe.fake_server`) on its own event loop in a thread, for code
that runs its own loop (``observe()``, the ``simpy-llm observe`` command)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Any

from tests.observe.fake_server import FakeServer, serve

START_S = 30.0


@contextmanager
def fake_server_thread(**kwargs: Any) -> Iterator[FakeServer]:
    """Run a :class:`FakeServer` (*kwargs* as :func:`serve`) in a thread until the block ends;
    read its ``bodies`` after the client is done with it."""
    with in_thread(lambda: serve(**kwargs)) as fake:
        yield fake


@contextmanager
def in_thread(factory: Callable[[], AbstractAsyncContextManager[Any]]) -> Iterator[Any]:
    """Run the async context manager *factory()* on an event loop of its own in a thread until
    the block ends (for a server that code running its own loop talks to); yields what it yields."""
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def main() -> None:
        async with factory() as obj:
            state["obj"], state["loop"], state["stop"] = obj, asyncio.get_running_loop(), asyncio.Event()
            ready.set()
            await state["stop"].wait()

    def run() -> None:
        try:
            asyncio.run(main())
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="test-server", daemon=True)
    thread.start()
    assert ready.wait(START_S) and "obj" in state, "the server did not start"
    try:
        yield state["obj"]
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(START_S)
