"""A load generator that fell behind catches up on the connections it has (the lean transport's
line of requests waiting for a connection), its collector walks what the run made only once
(young collections on a clock), and its summary says how many requests were late and when."""

from __future__ import annotations

import asyncio
import gc
import math
import socket
import weakref
from pathlib import Path
from typing import Any

import pytest

from simpy_llm.observe import lean
from simpy_llm.observe.client import ObservedRequest, OpenAIClient, RequestSpec
from simpy_llm.observe.collector import NO_FULL_COLLECTIONS, young_collections_only
from simpy_llm.observe.loadgen import OBSERVER_COLUMNS, LoadGenerator, LoadRequest, run_statistics, summarize_run
from simpy_llm.observe.saturation import behind, saturation
from simpy_llm.workload.traces import TraceV2Writer, read_trace_v2
from tests.observe.fake_server import OK_TOKENS, PROMPT_TOKENS, serve
from tests.observe.test_started_requests import _Counting

pytest.importorskip("httptools")


# --------------------------------------------------------------- requests waiting for a connection
def test_a_burst_of_late_requests_waits_in_line_and_each_ends_as_an_on_time_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """60 requests due at one instant (a client that fell behind) and 4 on time after them: every
    one is started without a task, at most MAX_OPENING connections are opened at once (4 here), and
    every record is an on-time request's: ok, the server's token counts, its times in order."""
    monkeypatch.setattr(lean, "MAX_OPENING", 4)
    opening = [0, 0]  # now, most at once
    real_open = lean.LeanPool._open

    async def counted(self: lean.LeanPool) -> None:
        opening[0] += 1
        opening[1] = max(opening)
        try:
            await real_open(self)
        finally:
            opening[0] -= 1

    monkeypatch.setattr(lean.LeanPool, "_open", counted)
    requests = [{"arrival_time_s": 0.02, "input_tokens": 8, "output_tokens": OK_TOKENS} for _ in range(60)]
    requests += [{"arrival_time_s": 0.3 + i * 0.01, "input_tokens": 8, "output_tokens": OK_TOKENS} for i in range(4)]

    async def run() -> tuple[LoadGenerator, list[int], int]:
        async with serve() as fake, _Counting(fake.url, transport="lean", keep_alive=True) as client:
            with TraceV2Writer(tmp_path / "t", extra_columns=OBSERVER_COLUMNS) as writer:
                gen = LoadGenerator(client, requests, writer, lag_threshold_s=math.inf)
                await gen.run()
            assert client._lean is not None
            return gen, client.started, len(client._lean._all)

    gen, started, held = asyncio.run(run())
    assert sorted(started) == list(range(64))
    assert 1 <= opening[1] <= 4 and held <= 60
    for rec in gen.records.values():
        assert rec.status == "ok" and rec.attempts == 1
        assert (rec.prompt_tokens, rec.completion_tokens) == (PROMPT_TOKENS, OK_TOKENS)
        times = [rec.scheduled_s, rec.sent_s, rec.headers_s, rec.first_content_s, rec.done_s]
        assert None not in times and times == sorted(times), rec  # type: ignore[type-var]
    assert len(read_trace_v2(tmp_path / "t").frame) == 64


def _closed_port() -> int:
    """A port of 127.0.0.1 that nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_request_whose_connection_cannot_be_opened_fails_as_a_sent_one_does() -> None:
    """With nothing listening, each of 5 requests started at once ends once, as ``error`` with the
    record ``send`` gives (status, message, attempts); none is left waiting."""
    port = _closed_port()

    async def run() -> tuple[list[ObservedRequest], list[int], ObservedRequest, int]:
        async with OpenAIClient(f"http://127.0.0.1:{port}", transport="lean", keep_alive=True, model="m") as client:
            recs = [ObservedRequest() for _ in range(5)]
            ended: list[int] = []
            done = asyncio.get_running_loop().create_future()

            def end(i: int) -> None:
                ended.append(i)
                if len(ended) == 5:
                    done.set_result(None)

            for i, rec in enumerate(recs):
                spec = RequestSpec("x", 4, request_id=i)
                assert client.start(spec, rec, client.encode(spec), lambda i=i: end(i)) is not None
            await asyncio.wait_for(done, 10.0)
            sent = await client.send(RequestSpec("x", 4, request_id=9))
            assert client._lean is not None
            return recs, ended, sent, client._lean.waiting

    recs, ended, sent, waiting = asyncio.run(run())
    assert sorted(ended) == list(range(5)) and waiting == 0
    fields = ("status", "error_message", "attempts", "attempt_statuses", "http_status")
    for rec in recs:
        assert {f: getattr(rec, f) for f in fields} == {f: getattr(sent, f) for f in fields}
        assert rec.status == "error" and "Connect" in rec.error_message


def test_a_request_aborted_while_it_waits_is_never_written() -> None:
    """A request waiting for a connection that is cancelled ends once as ``cancelled``; the
    connection opened for it stays idle and the server never sees a request."""

    async def run() -> tuple[ObservedRequest, int, int, dict[str, int]]:
        async with serve() as fake:
            pool = lean.LeanPool(fake.url, {"Content-Type": "application/json"}, keep_alive=True, now=lambda: 0.0)
            rec = ObservedRequest()
            calls: list[int] = []
            ex = pool.start(None, "/v1/chat/completions", b"{}", rec, True, lambda: calls.append(1))
            pool.abort(ex)
            for _ in range(100):  # until the connection opened for it is made
                if pool._all:
                    break
                await asyncio.sleep(0.01)
            idle = len(pool._idle)
            await pool.close()
            return rec, len(calls), idle, dict(fake.hits)

    rec, calls, idle, hits = asyncio.run(run())
    assert rec.status == "cancelled" and rec.sent_s is None and calls == 1
    assert idle == 1 and hits == {}


# --------------------------------------------------------------- the collector on a clock
def test_while_a_run_sends_the_collector_runs_young_collections_on_its_clock_only() -> None:
    """Inside a run the collector starts no collection by its own count: young ones only, from the
    run's clock; afterwards it is on again, with its thresholds and nothing frozen."""
    seen: list[tuple[int, bool, int]] = []  # (generation, collector on, oldest threshold)

    def note(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append((info["generation"], gc.isenabled(), gc.get_threshold()[2]))

    async def go() -> None:
        async with serve() as fake, OpenAIClient(fake.url, timeout_s=5.0, transport="lean", keep_alive=True) as client:
            reqs = [{"arrival_time_s": i * 0.01, "input_tokens": 8, "output_tokens": 4} for i in range(40)]
            await LoadGenerator(client, reqs, lag_threshold_s=math.inf).run()

    before = gc.get_threshold()
    gc.collect()
    gc.callbacks.append(note)
    try:
        asyncio.run(go())
    finally:
        gc.callbacks.remove(note)
    during = [s for s in seen if s[2] == NO_FULL_COLLECTIONS]
    assert len(during) >= 4  # 0.4 s of sending, a young collection every 0.05 s
    assert {(g, on) for g, on, _ in during} == {(0, False)}
    assert gc.isenabled() and gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_the_clock_frees_the_cycles_a_run_drops_and_freezes_what_it_keeps() -> None:
    """In the block on a running loop, a cycle dropped before a tick is freed by it, and what is
    kept is frozen (never walked again); after the block nothing is frozen and the collector is on."""

    class Node:
        other: Any = None

    async def go() -> tuple[bool, int, int]:
        with young_collections_only(every_s=0.01) as held:
            assert held and not gc.isenabled()
            frozen0 = gc.get_freeze_count()
            a, b = Node(), Node()
            a.other, b.other = b, a
            gone = weakref.ref(a)
            del a, b
            kept = [[i] for i in range(1000)]
            await asyncio.sleep(0.05)
            frozen1 = gc.get_freeze_count()
            freed = gone() is None
            del kept
        return freed, frozen0, frozen1

    freed, frozen0, frozen1 = asyncio.run(go())
    assert freed and frozen1 >= frozen0 + 1000
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_clock_of_no_length_is_refused() -> None:
    """A clock period of 0 s is refused, naming what is allowed."""
    with pytest.raises(ValueError, match="every_s must be > 0"), young_collections_only(every_s=0.0):
        pass


# --------------------------------------------------------------- when the generator fell behind
def _recs(delays: list[tuple[float, float]]) -> dict[int, ObservedRequest]:
    return {i: ObservedRequest(request_id=i, scheduled_s=t, dispatched_s=t + d, sent_s=t + d, status="ok")
            for i, (t, d) in enumerate(delays)}


def test_late_requests_are_counted_in_spans_of_their_targets() -> None:
    """Late requests less than 0.1 s apart make one span; on-time ones are not counted; under a
    concurrency limit the dispatch is judged, not the send."""
    recs = _recs([(0.0, 0.001), (1.0, 0.05), (1.05, 0.03), (1.12, 0.02), (2.0, 0.001), (3.0, 0.5)])
    assert behind(recs.values(), 0.010) == (4, ((1.0, 1.12), (3.0, 3.0)))
    recs[5].dispatched_s = 3.0  # it waited for a slot: the server's doing, not the client's
    assert behind(recs.values(), 0.010, limited=True) == (3, ((1.0, 1.12),))


def test_a_run_that_fell_behind_says_when_and_a_good_one_stays_silent() -> None:
    """A run whose p99 schedule delay is over the threshold is saturated, and its reason and
    statistics say how many requests were late and when; a run with a few late requests but its
    p99 under the threshold is not saturated, and counts them all the same."""
    n = 1000
    targets = [i * 0.01 for i in range(n)]
    requests = [LoadRequest(i, t, 8, 2) for i, t in enumerate(targets)]
    bad = _recs([(t, 0.05 if 3.0 <= t < 3.5 else 0.001) for t in targets])
    good = _recs([(t, 0.05 if i in (100, 700) else 0.001) for i, t in enumerate(targets)])
    s_bad = summarize_run(requests, bad, lag_threshold_s=0.010, stopped=False)
    s_good = summarize_run(requests, good, lag_threshold_s=0.010, stopped=False)
    assert s_bad.saturated and s_bad.late == 50 and s_bad.late_spans_s == ((3.0, 3.49),)
    assert s_bad.saturation_reason is not None and "50 requests over it" in s_bad.saturation_reason
    assert "3.00-3.49 s" in s_bad.saturation_reason
    assert run_statistics(s_bad, concurrency=None)["late_spans_s"] == [[3.0, 3.49]]
    assert not s_good.saturated and s_good.saturation_reason is None
    assert s_good.late == 2 and s_good.late_spans_s == ((1.0, 1.0), (7.0, 7.0))


def test_a_reason_names_the_longest_spans_only() -> None:
    """With more spans than a reason shows, it names the three longest, in time order."""
    spans = [(0.0, 0.0), (1.0, 1.5), (2.0, 2.1), (3.0, 3.9), (5.0, 5.2)]
    reason = saturation(delay_p99_s=0.05, lag_p99_s=0.05, requested_rate=10.0, achieved_rate=10.0, threshold_s=0.010,
                        limited=False, late=40, late_spans_s=spans)
    assert reason is not None
    assert reason.endswith("(40 requests over it, targets in 5 spans; the 3 longest: 1.00-1.50 s, 3.00-3.90 s, 5.00-5.20 s)")


def test_connections_opened_ahead_carry_the_first_requests() -> None:
    """The client opens connections ahead, up to what it was asked and its max_connections, and
    the next request goes on one of them (no connection opened for it); without keep_alive it
    opens none."""

    async def run() -> tuple[int, int, int, int, str, int]:
        async with serve() as fake:
            async with OpenAIClient(fake.url, transport="lean", keep_alive=True, max_connections=3) as client:
                opened = await client.open_connections(8)
                again = await client.open_connections(3)  # already held
                assert client._lean is not None
                rec = await client.send(RequestSpec("x", OK_TOKENS))
                held = len(client._lean._all)
            async with OpenAIClient(fake.url, transport="lean", keep_alive=False) as closing:
                none = await closing.open_connections(8)
        return opened, again, held, none, rec.status, sum(fake.hits.values())

    opened, again, held, none, status, hits = asyncio.run(run())
    assert (opened, again, held, none) == (3, 0, 3, 0)
    assert status == "ok" and hits == 1
