"""Requests started without a task (``OpenAIClient.start``, the lean transport's ``LeanPool.start``):
what an open-loop load generator sends most of its requests by. Their records mean what the
task path's (and aiohttp's) mean, for answers of every kind; they time out, are cancelled and are
written as the others are; and the client's cap on connections hands its slots on in order."""

from __future__ import annotations

import asyncio
import itertools
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm.observe import lean
from simpy_llm.observe.client import ObservedRequest, OpenAIClient, RequestSpec, _Slots
from simpy_llm.observe.loadgen import OBSERVER_COLUMNS, LoadGenerator
from simpy_llm.workload.traces import TraceV2Writer, read_trace_v2
from tests.observe.fake_server import MODES, serve
from tests.observe.test_lean_transport import _ANSWER, _stream_fields, _Transport

pytest.importorskip("httptools")

_TIMING = ["send_time_us", "first_chunk_time_us", "last_chunk_time_us", "first_byte_time_us",
           "first_token_time_us", "done_time_us", "itl_us"]


def _mode(name: str) -> int:
    return next(k for k, v in MODES.items() if v == name)


class _Counting(OpenAIClient):
    """A client that keeps the ids of the requests it started without a task."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started: list[int] = []

    def start(self, spec: RequestSpec, *args: Any, **kwargs: Any) -> Any:
        handle = super().start(spec, *args, **kwargs)
        if handle is not None:
            self.started.append(spec.request_id)
        return handle


async def _run(transport: str, requests: list[dict[str, Any]], out: Path, **client_kw: Any) -> tuple[LoadGenerator, list[int]]:
    async with serve(slow_s=5.0) as fake, _Counting(fake.url, transport=transport, keep_alive=True, **client_kw) as client:
        with TraceV2Writer(out, extra_columns=OBSERVER_COLUMNS) as writer:
            gen = LoadGenerator(client, requests, writer, lag_threshold_s=math.inf)
            await gen.run()
    return gen, client.started


def test_started_requests_write_the_trace_aiohttp_writes(tmp_path: Path) -> None:
    """A run mixing every kind of answer (ok, reasoning, truncated, invalid JSON, error events,
    429, 503) sends most of its requests without a task through the lean transport, and its trace
    is aiohttp's but for the client's clock: the same statuses, errors, token counts and sources."""
    kinds = ["ok_short", "ok", "reasoning", "truncated", "bad_json", "error_event", "429", "503"]
    requests = [{"arrival_time_s": 0.02 + i * 0.004, "input_tokens": 10 + i, "output_tokens": _mode(kinds[i % len(kinds)]),
                 "streaming": i % 5 != 4} for i in range(40)]
    frames = {}
    for transport in ("aiohttp", "lean"):
        gen, started = asyncio.run(_run(transport, requests, tmp_path / transport))
        frames[transport] = read_trace_v2(tmp_path / transport).frame.sort_values("request_id").reset_index(drop=True)
        if transport == "lean":
            assert len(started) >= 30  # all but those that found no idle connection
            assert {r.status for r in gen.records.values()} == {"ok", "error"}
    assert frames["lean"].drop(columns=_TIMING).equals(frames["aiohttp"].drop(columns=_TIMING))


def test_a_started_request_keeps_its_times_in_order(tmp_path: Path) -> None:
    """The times of a request started without a task come in the order they happen: target, send,
    headers, first byte, first chunk, first token, last chunk, end; its TTFT and ITLs are those times'."""
    requests = [{"arrival_time_s": 0.02 + i * 0.005, "input_tokens": 8, "output_tokens": _mode("ok")} for i in range(12)]
    gen, started = asyncio.run(_run("lean", requests, tmp_path / "t"))
    assert len(started) >= 8
    for rec in gen.records.values():
        times = [rec.scheduled_s, rec.sent_s, rec.headers_s, rec.first_byte_s, rec.first_chunk_s, rec.first_content_s,
                 rec.last_chunk_s, rec.done_s]
        assert None not in times and times == sorted(times), rec  # type: ignore[type-var]
        assert rec.ttft_s == rec.first_content_s - rec.sent_s  # type: ignore[operator]
        assert len(rec.itl_s) == len(rec.content_times_s) - 1 == rec.completion_tokens - 1  # type: ignore[operator]


def test_a_started_request_times_out_as_a_sent_one_does(tmp_path: Path) -> None:
    """A slow answer to a request started without a task ends, after the client's timeout, with
    the record a request sent by ``send`` gets: status, message, attempts, HTTP statuses; the
    connection is closed, and the next request ends ok."""
    requests = [{"arrival_time_s": 0.02 + i * 0.05, "input_tokens": 8, "output_tokens": n}
                for i, n in enumerate([_mode("ok"), _mode("slow"), _mode("ok")])]

    async def by_send() -> ObservedRequest:
        async with serve(slow_s=5.0) as fake, OpenAIClient(fake.url, transport="lean", keep_alive=True, timeout_s=0.3) as client:
            return await client.send(RequestSpec("x", _mode("slow")))

    gen, started = asyncio.run(_run("lean", requests, tmp_path / "t", timeout_s=0.3))
    sent = asyncio.run(by_send())
    slow = gen.records[1]
    assert 1 in started
    assert [gen.records[i].status for i in (0, 2)] == ["ok", "ok"]
    fields = ("status", "error_message", "attempts", "attempt_statuses", "http_status")
    assert {f: getattr(slow, f) for f in fields} == {f: getattr(sent, f) for f in fields}
    assert slow.status == "timeout" and slow.done_s - slow.sent_s >= 0.3  # type: ignore[operator]


def test_stopping_a_run_cancels_its_started_requests_and_writes_them(tmp_path: Path) -> None:
    """stop() while requests started without a task wait for slow answers: each is written as
    cancelled, with the message of a cancelled send, and the run returns its summary."""
    requests = [{"arrival_time_s": 0.02 + i * 0.01, "input_tokens": 8, "output_tokens": _mode("ok" if i == 0 else "slow")}
                for i in range(6)]

    async def run() -> list[int]:
        async with serve(slow_s=5.0) as fake, _Counting(fake.url, transport="lean", keep_alive=True) as client:
            with TraceV2Writer(tmp_path / "t", extra_columns=OBSERVER_COLUMNS) as writer:
                gen = LoadGenerator(client, requests, writer, lag_threshold_s=math.inf)
                asyncio.get_running_loop().call_later(0.4, gen.stop)
                summary = await gen.run()
            assert summary.stopped
        return client.started

    started = asyncio.run(run())
    rows = read_trace_v2(tmp_path / "t").frame.set_index("request_id")
    assert 1 in started
    assert rows.loc[0, "status"] == "ok"
    assert list(rows.loc[1:, "status"]) == ["cancelled"] * 5
    assert set(rows.loc[1:, "error_message"]) == {"cancelled before completion"}


# --------------------------------------------------------------- an answer fed to a started request
def _feed_started(pieces: list[bytes]) -> tuple[ObservedRequest, int, list[Any]]:
    """*pieces* of an answer fed to a request started on a lean connection; its record, how many
    times its callback was called, and the pool's idle connections after."""

    async def run() -> tuple[ObservedRequest, int, list[Any]]:
        pool = lean.LeanPool("http://127.0.0.1:1", {"Content-Type": "application/json"}, keep_alive=True, now=lambda: 0.0)
        conn = lean._Connection(pool)
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        rec = ObservedRequest(output_text="")
        calls: list[int] = []
        pool.start(conn, "/v1/chat/completions", b"{}", rec, True, lambda: calls.append(1))
        for piece in pieces:
            conn.data_received(piece)
        return rec, len(calls), list(pool._idle)

    return asyncio.run(run())


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(1, len(_ANSWER) - 1), unique=True, max_size=12))
def test_a_started_request_reads_an_answer_split_anywhere_as_a_sent_one(cuts: list[int]) -> None:
    """An answer split at any bytes (inside the status line, headers, chunk sizes, SSE lines, a
    CRLF, a UTF-8 character) fills a started request's record as the answer fed whole fills a
    sent one's, its callback is called once, and the connection goes back to the pool."""
    bounds = [0, *sorted(cuts), len(_ANSWER)]
    rec, calls, idle = _feed_started([_ANSWER[a:b] for a, b in itertools.pairwise(bounds)])
    assert _stream_fields(rec) == ("ok", "", 4, 2, " hé b", 2, "length", 200)
    assert calls == 1 and len(idle) == 1


@pytest.mark.parametrize(
    ("pieces", "words"),
    [
        ([_ANSWER[:200]], "stream broken"),  # the server closes mid-answer
        ([], "before answering"),  # the server closes before answering
        ([b"SPDY/9 nonsense\r\n\r\n"], "invalid HTTP response"),  # not HTTP
    ],
)
def test_a_started_request_broken_by_the_server_is_an_error_ended_once(pieces: list[bytes], words: str) -> None:
    """A connection closed mid-answer or before it, or an answer that is not HTTP, ends a started
    request once, as an error saying so; the connection leaves the pool."""

    async def run() -> tuple[ObservedRequest, int, int]:
        pool = lean.LeanPool("http://127.0.0.1:1", {"Content-Type": "application/json"}, keep_alive=True, now=lambda: 0.0)
        conn = lean._Connection(pool)
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        pool._all.add(conn)
        rec = ObservedRequest()
        calls: list[int] = []
        pool.start(conn, "/v1/chat/completions", b"{}", rec, True, lambda: calls.append(1))
        for piece in pieces:
            conn.data_received(piece)
        conn.connection_lost(None)
        return rec, len(calls), len(pool._all)

    rec, calls, held = asyncio.run(run())
    assert rec.status == "error" and words in rec.error_message
    assert calls == 1 and held == 0


# --------------------------------------------------------------- the cap on connections
def test_the_slots_go_to_their_waiters_in_order_and_none_is_lost() -> None:
    """Two slots held and five waiters: each release hands a slot to the first still waiting (one
    cancelled while waiting is passed over), and once every holder released, both slots are free."""

    async def run() -> tuple[list[int], int]:
        slots = _Slots(2)
        assert slots.try_acquire() and slots.try_acquire() and slots.locked()
        got: list[int] = []

        async def waiter(i: int) -> None:
            await slots.acquire()
            got.append(i)

        tasks = [asyncio.create_task(waiter(i)) for i in range(5)]
        await asyncio.sleep(0)
        tasks[1].cancel()
        for _ in range(6):  # the two first holders', then each waiter's in turn as it got a slot
            slots.release()
            await asyncio.sleep(0)
        await asyncio.gather(*tasks, return_exceptions=True)
        return got, slots.free

    got, free = asyncio.run(run())
    assert got == [0, 2, 3, 4]
    assert free == 2


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.sampled_from(["wait", "release", "cancel", "step"]), max_size=40), cap=st.integers(1, 3))
def test_the_slots_never_hold_more_than_their_number_nor_lose_one(ops: list[str], cap: int) -> None:
    """Any mix of waits, releases (by a holder) and cancellations of waiters: at no time do more
    than *cap* hold a slot, and when every holder has released, all *cap* slots are free."""

    async def run() -> None:
        slots = _Slots(cap)
        holding: list[int] = []
        waiting: list[asyncio.Task[None]] = []
        top = [0]

        async def waiter() -> None:
            await slots.acquire()
            holding.append(1)
            top[0] = max(top[0], len(holding))

        for op in ops:
            if op == "wait":
                waiting.append(asyncio.create_task(waiter()))
            elif op == "release" and holding:
                holding.pop()
                slots.release()
            elif op == "cancel" and waiting:
                waiting.pop(0).cancel()
            await asyncio.sleep(0)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        while holding:
            holding.pop()
            slots.release()
        assert top[0] <= cap
        assert slots.free == cap and not slots.locked()

    asyncio.run(run())
