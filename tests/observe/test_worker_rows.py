"""Where the rows of a run spread over worker processes are written: the parent holds the
workers' records while they send and writes them once every request was sent (or in slices when
it holds too many), and nothing it holds is lost when the run is stopped or a worker fails."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from simpy_llm.observe import workers
from simpy_llm.observe.client import OpenAIClient
from simpy_llm.observe.loadgen import OBSERVER_COLUMNS
from simpy_llm.observe.workers import ProcessLoadGenerator
from simpy_llm.workload.traces import TraceV2Writer, read_trace_v2
from tests.observe.failing_prompts import FailingPrompts
from tests.observe.fake_server import serve

QUIET = 1e9  # lag threshold that never warns (timing is not asserted in these tests)


class _SentAtWrite:
    """A writer that keeps each row with how many requests the generator had sent when it was written."""

    def __init__(self) -> None:
        self.gen: ProcessLoadGenerator | None = None
        self.rows: list[tuple[int, int]] = []

    def write_row(self, row: dict[str, Any]) -> None:
        assert self.gen is not None
        self.rows.append((row["request_id"], self.gen.live.sent))


def _spread(n: int, every_s: float) -> list[dict[str, Any]]:
    return [{"arrival_time_s": i * every_s, "input_tokens": 4, "output_tokens": 2} for i in range(n)]


def _run_counting(n: int, every_s: float) -> tuple[list[tuple[int, int]], dict[str, int]]:
    async def run() -> tuple[list[tuple[int, int]], dict[str, int]]:
        writer = _SentAtWrite()
        async with serve() as fake, OpenAIClient(fake.url, model="m") as client:
            gen = writer.gen = ProcessLoadGenerator(client, _spread(n, every_s), writer, workers=2, lag_threshold_s=QUIET)
            summary = await gen.run()
        return writer.rows, summary.status_counts

    return asyncio.run(run())


def test_no_row_is_written_while_the_workers_send() -> None:
    """40 requests over 0.4 s: every row is written once, after the last request was sent (its
    records, which came back meanwhile, were held)."""
    rows, counts = _run_counting(40, 0.01)
    assert counts == {"ok": 40}
    assert sorted(r for r, _ in rows) == list(range(40))
    assert {sent for _, sent in rows} == {40}


def test_beyond_the_rows_held_the_parent_writes_in_slices_while_they_send(monkeypatch: pytest.MonkeyPatch) -> None:
    """With at most 4 rows held, the records that come back while the workers send (40 requests
    over 1 s) are written then, before the last request was sent; each once."""
    monkeypatch.setattr(workers, "HOLD_ROWS", 4)
    rows, counts = _run_counting(40, 0.025)
    assert counts == {"ok": 40}
    assert sorted(r for r, _ in rows) == list(range(40))
    assert min(sent for _, sent in rows) < 40


def test_rows_held_when_the_run_is_stopped_are_written(tmp_path: Path) -> None:
    """stop() after six requests were answered (their records held, four requests not yet due):
    the trace has one row per request, the six ``ok`` and the four never sent ``cancelled``."""

    async def run() -> None:
        reqs = _spread(6, 0.0) + [{"arrival_time_s": 30.0, "input_tokens": 4, "output_tokens": 2}] * 4
        async with serve() as fake, OpenAIClient(fake.url, model="m") as client:
            with TraceV2Writer(tmp_path / "trace", extra_columns=OBSERVER_COLUMNS) as writer:
                gen = ProcessLoadGenerator(client, reqs, writer, workers=2, lag_threshold_s=QUIET)
                task = asyncio.create_task(gen.run())
                while gen.live.ok < 6 and not task.done():
                    await asyncio.sleep(0.01)
                gen.stop()
                await task

    asyncio.run(run())
    frame = read_trace_v2(tmp_path / "trace").frame
    assert sorted(frame.request_id) == list(range(10))
    status = frame.set_index("request_id").status.to_dict()
    assert [status[i] for i in range(10)] == ["ok"] * 6 + ["cancelled"] * 4


def test_rows_held_when_a_worker_fails_are_written(tmp_path: Path) -> None:
    """A worker fails building request 5's prompt, which it does once request 4 (due 0.5 s after
    the first four) is sent: the run raises naming the failure, and the trace still holds the
    four ``ok`` rows the parent held, with the requests never sent written ``cancelled``; one
    row per request."""

    async def run() -> None:
        reqs = _spread(4, 0.0) + [{"arrival_time_s": 0.5 + i, "input_tokens": 4, "output_tokens": 2} for i in range(3)]
        async with serve() as fake, OpenAIClient(fake.url, model="m") as client:
            with TraceV2Writer(tmp_path / "trace", extra_columns=OBSERVER_COLUMNS) as writer:
                gen = ProcessLoadGenerator(
                    client, reqs, writer, workers=1, lag_threshold_s=QUIET, prompts=FailingPrompts(fail_id=5), prepare_bytes=0
                )
                with pytest.raises(RuntimeError, match="no prompt for request 5"):
                    await gen.run()

    asyncio.run(run())
    frame = read_trace_v2(tmp_path / "trace").frame
    assert sorted(frame.request_id) == list(range(7))
    status = frame.set_index("request_id").status.to_dict()
    assert [status[i] for i in (0, 1, 2, 3, 5, 6)] == ["ok"] * 4 + ["cancelled"] * 2
