"""A load generator that runs out of open files records the failures and says it saturated."""

from __future__ import annotations

import asyncio
import os
import resource
from pathlib import Path
from typing import Any

import pytest

from simpy_llm.observe.client import OpenAIClient
from simpy_llm.observe.loadgen import OBSERVER_COLUMNS, LoadGenerator
from simpy_llm.observe.saturation import client_limited
from simpy_llm.workload.traces import TraceV2Writer, read_trace_v2
from tests.observe.fake_server import serve

N = 60
SLOW = 10  # max_tokens of the fake server's mode that holds its answer back (see fake_server.MODES)


def _open_files() -> int:
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts this process's open files in /proc")
@pytest.mark.parametrize("transport", ["aiohttp", "lean"])
def test_requests_beyond_the_open_files_limit_are_rows_and_the_run_is_saturated(tmp_path: Path, transport: str) -> None:
    """Answers held back keep each request's connection open; with the soft limit lowered to a
    few files more than are open when the run starts (after the generator raised it), the later
    requests cannot open a connection. Each is an ``error`` row naming the cause, every request
    has its row, the run returns its summary, and the summary says the generator saturated, and why."""
    if transport == "lean":
        pytest.importorskip("httptools")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    summary: Any = None

    async def go() -> None:
        nonlocal summary
        async with serve(slow_s=1.0) as fake, OpenAIClient(fake.url, transport=transport, timeout_s=0.5) as client:
            reqs = [{"arrival_time_s": 0.001 * i, "input_tokens": 8, "output_tokens": SLOW} for i in range(N)]
            with TraceV2Writer(tmp_path / "trace", extra_columns=OBSERVER_COLUMNS) as writer:
                gen = LoadGenerator(client, reqs, writer, lag_threshold_s=1e9, model="m")
                # Lowered after the generator raised it: room for about 10 connections (each
                # takes two files here: the client's socket and the server's, in this process).
                resource.setrlimit(resource.RLIMIT_NOFILE, (_open_files() + 20, hard))
                try:
                    summary = await gen.run()
                finally:
                    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    asyncio.run(go())
    frame = read_trace_v2(tmp_path / "trace").frame
    assert len(frame) == N and frame["request_id"].is_unique
    failed = frame[frame["error_message"].map(client_limited)]
    assert len(failed) > 0 and set(failed["status"]) == {"error"}
    assert summary.saturated
    assert f"{len(failed)} request" in summary.saturation_reason
    assert "for want of the client's own resources" in summary.saturation_reason
