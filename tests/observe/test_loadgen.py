"""The load generator: open loop and concurrency limit, one trace row per request whatever its fate."""

from __future__ import annotations

import asyncio
import itertools
import warnings
from pathlib import Path

import pytest

from simpy_llm import load_scenario
from simpy_llm.observe.client import OpenAIClient, RetryPolicy
from simpy_llm.observe.loadgen import OBSERVER_COLUMNS, LoadGenerator, RunSummary, ScheduleLagWarning, prefix_text
from simpy_llm.workload.export import generate_requests
from simpy_llm.workload.traces import TraceV2Writer, read_trace_v2
from tests.observe.fake_server import PROMPT_TOKENS, serve

QUIET = 1e9  # lag threshold that never warns (timing is not asserted in these tests)
TIMEOUT_S = 2.0
"""Client timeout: the fake server's slow mode only ends when the client gives up, and a
well-behaved fake request (milliseconds) stays far inside it on a busy machine."""


def _run(requests: list[dict], path: Path, **kw: object) -> tuple[RunSummary, LoadGenerator]:
    async def go() -> tuple[RunSummary, LoadGenerator]:
        async with serve() as fake, OpenAIClient(fake.url, timeout_s=TIMEOUT_S) as client:
            with TraceV2Writer(path, extra_columns=OBSERVER_COLUMNS) as writer:
                gen = LoadGenerator(client, requests, writer, lag_threshold_s=QUIET, **kw)  # type: ignore[arg-type]
                return await gen.run(), gen

    return asyncio.run(go())


def test_generated_workload_runs_open_loop(tmp_path: Path) -> None:
    """A scenario's generated requests (times compressed) all end ok; the trace has one row each
    with the server's usage counts, the requested lengths, ignore_eos/max_tokens sent, targets as
    arrival times, send >= target, ordered chunk times, and a summary with rates."""
    frame = generate_requests(load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=12"]))
    frame["arrival_time_s"] = frame["arrival_time_s"] / max(frame["arrival_time_s"].max(), 1e-9) * 0.3
    frame["output_tokens"] = frame["output_tokens"].clip(upper=30).clip(lower=15)
    summary, _gen = _run(frame, tmp_path / "trace")
    trace = read_trace_v2(tmp_path / "trace")
    f = trace.frame.sort_values("request_id").reset_index(drop=True)
    assert sorted(f.request_id) == sorted(frame.request_id)
    assert (f.status == "ok").all()
    assert (f.input_tokens == PROMPT_TOKENS).all()
    assert f.output_tokens.tolist() == frame.sort_values("request_id").output_tokens.tolist()
    assert f.requested_input_tokens.tolist() == frame.sort_values("request_id").input_tokens.tolist()
    assert (f.send_time_us >= f.arrival_time_us).all()
    assert (f.first_chunk_time_us >= f.send_time_us).all() and (f.last_chunk_time_us >= f.first_chunk_time_us).all()
    assert (f.client_id != "").all()
    assert summary.n_requests == summary.n_sent == 12 and summary.status_counts == {"ok": 12}
    assert summary.requested_rate is not None and summary.achieved_rate is not None
    assert summary.schedule_delay_p50_s is not None and summary.schedule_delay_p50_s >= 0
    assert not summary.stopped and not summary.lagging


def test_misbehaving_server_one_row_each_right_status(tmp_path: Path) -> None:
    """Against a server that kills streams, truncates them, answers 429 and 503, is slower than
    the timeout, sends invalid JSON, resets connections and sends error events, the run completes
    and the trace has exactly one row per request with the right status (HTTP status kept),
    while the well-behaved requests' rows are intact."""
    modes = [5, 6, 7, 8, 9, 10, 11, 12, 13, 5, 4]
    expected = {5: "ok", 4: "ok", 10: "timeout"}
    requests = [{"request_id": i, "arrival_time_s": i * 0.01, "input_tokens": 20, "output_tokens": n} for i, n in enumerate(modes)]
    summary, _ = _run(requests, tmp_path / "trace")
    f = read_trace_v2(tmp_path / "trace").frame.set_index("request_id")
    assert sorted(f.index) == list(range(len(modes)))
    for i, n in enumerate(modes):
        assert f.loc[i, "status"] == expected.get(n, "error"), (n, f.loc[i, "error_message"])
    assert f.loc[3, "http_status"] == 429 and f.loc[4, "http_status"] == 503
    ok = f[f.status == "ok"]
    assert (ok.completion_tokens_source == "usage").all() and (ok.output_tokens == ok.requested_output_tokens).all()
    assert (ok.num_chunks > 0).all() and (f[f.status != "ok"].error_message != "").all()
    assert summary.status_counts == {"ok": 3, "error": 7, "timeout": 1}


def test_concurrency_limit_and_retries(tmp_path: Path) -> None:
    """With concurrency=1 requests are sent one after another in FIFO order (each sent after the
    previous one finished); a 429 storm with retries records every attempt."""

    async def go() -> LoadGenerator:
        policy = RetryPolicy(max_retries=1, base_delay_s=0.01)
        async with serve() as fake, OpenAIClient(fake.url, retry=policy) as client:
            with TraceV2Writer(tmp_path / "t", extra_columns=OBSERVER_COLUMNS) as writer:
                reqs = [{"arrival_time_s": 0.0, "input_tokens": 5, "output_tokens": n} for n in (5, 8, 5, 5)]
                gen = LoadGenerator(client, reqs, writer, concurrency=1, lag_threshold_s=QUIET)
                await gen.run()
                return gen

    gen = asyncio.run(go())
    recs = [gen.records[i] for i in range(4)]
    for prev, nxt in itertools.pairwise(recs):
        assert prev.done_s is not None and nxt.sent_s is not None and prev.done_s <= nxt.sent_s
    assert recs[1].attempts == 2 and recs[1].status == "error"
    f = read_trace_v2(tmp_path / "t").frame
    assert f.request_id.tolist() == [0, 1, 2, 3] and f.attempts.tolist() == [1, 2, 1, 1]


def test_stop_writes_unfinished_requests_as_cancelled(tmp_path: Path) -> None:
    """stop() ends the run cleanly: finished rows are intact, the in-flight request and the
    never-sent ones are written as cancelled, exactly one row each; the trace is readable
    before the writer is closed."""

    async def go() -> tuple[RunSummary, LoadGenerator, int]:
        async with serve(token_delay_s=0.05) as fake, OpenAIClient(fake.url) as client:
            writer = TraceV2Writer(tmp_path / "t", extra_columns=OBSERVER_COLUMNS)
            reqs = [{"arrival_time_s": t, "input_tokens": 5, "output_tokens": n} for t, n in ((0.0, 2), (0.0, 40), (30.0, 5), (40.0, 5))]
            gen = LoadGenerator(client, reqs, writer, lag_threshold_s=QUIET)
            task = asyncio.create_task(gen.run())
            while gen.records.get(0) is None or gen.records[0].status != "ok" or gen.records[1].first_content_s is None:
                await asyncio.sleep(0.01)
            gen.stop()
            summary = await task
            rows = len(read_trace_v2(tmp_path / "t"))  # not closed yet: still readable
            writer.close()
            return summary, gen, rows

    summary, _gen, rows = asyncio.run(go())
    assert rows == 4
    f = read_trace_v2(tmp_path / "t").frame.set_index("request_id")
    assert f.status.to_dict() == {0: "ok", 1: "cancelled", 2: "cancelled", 3: "cancelled"}
    assert f.loc[0, "output_tokens"] == 2 and f.loc[0, "completion_tokens_source"] == "usage"
    assert not f.loc[[2, 3], "send_time_us"].notna().any() and f.loc[1, "send_time_us"] is not None
    assert summary.stopped and summary.status_counts == {"ok": 1, "cancelled": 3}


def test_task_cancellation_writes_rows_then_reraises(tmp_path: Path) -> None:
    """Cancelling the task running the generator (what a SIGINT handler does) re-raises
    CancelledError after every request has its row (cancelled for the unfinished)."""

    async def go() -> LoadGenerator:
        async with serve(token_delay_s=0.05) as fake, OpenAIClient(fake.url) as client:
            with TraceV2Writer(tmp_path / "t") as writer:
                reqs = [{"arrival_time_s": t, "input_tokens": 5, "output_tokens": 30} for t in (0.0, 0.0, 20.0)]
                gen = LoadGenerator(client, reqs, writer, lag_threshold_s=QUIET)
                task = asyncio.create_task(gen.run())
                while gen.records.get(1) is None or gen.records[1].sent_s is None:
                    await asyncio.sleep(0.01)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                return gen

    gen = asyncio.run(go())
    f = read_trace_v2(tmp_path / "t").frame
    assert sorted(f.request_id) == [0, 1, 2] and (f.status == "cancelled").all()
    assert gen.summary is not None and gen.summary.status_counts == {"cancelled": 3}


def test_lag_warning_and_flag(tmp_path: Path) -> None:
    """When the median lag exceeds the threshold the summary is flagged and a ScheduleLagWarning
    is issued (a negative threshold forces it, so no timing is asserted)."""
    reqs = [{"arrival_time_s": 0.0, "input_tokens": 5, "output_tokens": 4}]
    with pytest.warns(ScheduleLagWarning):
        summary, _ = _run_lag(reqs, tmp_path / "t")
    assert summary.lagging and summary.lag_p50_s is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        summary, _ = _run(reqs, tmp_path / "u")
    assert not summary.lagging


def _run_lag(requests: list[dict], path: Path) -> tuple[RunSummary, LoadGenerator]:
    async def go() -> tuple[RunSummary, LoadGenerator]:
        async with serve() as fake, OpenAIClient(fake.url) as client:
            with TraceV2Writer(path) as writer:
                gen = LoadGenerator(client, requests, writer, lag_threshold_s=-1.0)
                return await gen.run(), gen

    return asyncio.run(go())


def test_prefix_groups_share_their_prompt_start() -> None:
    """Requests of a listed prefix group open with the group's same system text and then their own
    words (prompt length kept); other requests are plain prompts."""
    rows = [
        {"request_id": i, "arrival_time_s": 0.0, "input_tokens": 12 + i, "output_tokens": 5, "prefix_group": g}
        for i, g in enumerate(["sys", "sys", "", "other"])
    ]

    async def go() -> list[dict]:
        async with serve() as fake, OpenAIClient(fake.url) as client:
            await LoadGenerator(client, rows, prefixes={"sys": 8}, lag_threshold_s=QUIET).run()
        return sorted(fake.bodies, key=lambda b: len(b["messages"][-1]["content"].split()))

    bodies = asyncio.run(go())
    with_prefix = [b["messages"] for b in bodies if len(b["messages"]) == 2]
    assert len(with_prefix) == 2
    for i, messages in enumerate(with_prefix):
        assert messages[0] == {"role": "system", "content": prefix_text("sys", 8)}
        assert len(messages[1]["content"].split()) == 12 + i - 8
    assert sum(len(b["messages"]) == 1 for b in bodies) == 2


def test_statistics_need_a_finished_run(tmp_path: Path) -> None:
    """LoadGenerator.statistics() before run() is an error that says so; after it, the block
    holds the summary's figures and the concurrency limit."""

    async def go() -> tuple[LoadGenerator, str]:
        async with serve() as fake, OpenAIClient(fake.url, timeout_s=TIMEOUT_S) as client:
            rows = [{"request_id": i, "arrival_time_s": i * 0.01, "input_tokens": 5, "output_tokens": 5} for i in range(3)]
            gen = LoadGenerator(client, rows, None, concurrency=2, lag_threshold_s=QUIET)
            with pytest.raises(RuntimeError) as info:
                gen.statistics()
            await gen.run()
            return gen, str(info.value)

    gen, message = asyncio.run(go())
    assert "has not run" in message
    stats, s = gen.statistics(), gen.summary
    assert s is not None
    assert (stats["requests"], stats["sent"], stats["concurrency"], stats["stopped"]) == (3, 3, 2, False)
    assert (stats["achieved_rate"], stats["schedule_delay_max_s"], stats["lagging"]) == (s.achieved_rate, s.schedule_delay_max_s, s.lagging)


def test_observe_writes_the_load_statistics_into_the_trace_header(tmp_path: Path) -> None:
    """observe() rewrites the trace header at the end with a load_generator block whose rates and
    schedule delays are the ones the trace's own rows give (targets in arrival_time_us, sends in
    send_time_us, whole microseconds), with the concurrency limit and the measured round trip."""
    import numpy as np
    import yaml

    from simpy_llm.observe.run import observe
    from tests.helpers import tiny_scenario
    from tests.observe.fake_thread import fake_server_thread

    data = tiny_scenario(seed=3)
    data["workload"]["num_requests"] = 12
    data["workload"]["clients"][0]["output_distribution"] = {"type": "constant", "params": {"value": 5}}
    spec = tmp_path / "w.yaml"
    spec.write_text(yaml.safe_dump(data))
    with fake_server_thread() as fake:
        observe(spec, fake.url, tmp_path / "run", concurrency=3, timeout_s=5.0)
    trace = read_trace_v2(tmp_path / "run" / "trace")
    stats, f = trace.header["load_generator"], trace.frame
    target = f.arrival_time_us.to_numpy(dtype=float) / 1e6
    sent = f.send_time_us.to_numpy(dtype=float) / 1e6
    delay = sent - target
    assert (stats["requests"], stats["sent"], stats["concurrency"], stats["stopped"]) == (12, 12, 3, False)
    assert stats["requested_rate"] == pytest.approx(11 / (target.max() - target.min()), rel=1e-4)
    assert stats["achieved_rate"] == pytest.approx(11 / (sent.max() - sent.min()), rel=1e-4)
    assert stats["schedule_delay_max_s"] == pytest.approx(delay.max(), abs=2e-6)
    assert stats["schedule_delay_p50_s"] == pytest.approx(float(np.median(delay)), abs=2e-6)
    assert stats["lag_threshold_s"] == 0.010 and isinstance(stats["lagging"], bool)
    assert stats["measured_rtt_ms"] == trace.header["network"]["measured_rtt_ms"] is not None


def test_observe_sends_under_the_workloads_own_cap(tmp_path: Path) -> None:
    """A workload's max_concurrency is the observer's concurrency limit (header and statistics say
    2); a different --concurrency beside it, or more workers than it, is refused before anything
    is sent."""
    import yaml

    from simpy_llm.observe.run import observe
    from tests.helpers import tiny_scenario
    from tests.observe.fake_thread import fake_server_thread

    data = tiny_scenario(seed=3)
    data["workload"].update(num_requests=6, max_concurrency=2)
    spec = tmp_path / "w.yaml"
    spec.write_text(yaml.safe_dump(data))
    with fake_server_thread() as fake:
        with pytest.raises(ValueError, match="differs from the workload's max_concurrency 2"):
            observe(spec, fake.url, tmp_path / "refused", concurrency=3, timeout_s=5.0)
        with pytest.raises(ValueError, match=r"workers \(3\) must not exceed the workload's max_concurrency \(2\)"):
            observe(spec, fake.url, tmp_path / "refused", workers=3, timeout_s=5.0)
        assert not (tmp_path / "refused").exists()
        observe(spec, fake.url, tmp_path / "run", timeout_s=5.0)
    header = read_trace_v2(tmp_path / "run" / "trace").header
    assert header["load"]["concurrency"] == 2 and header["load_generator"]["concurrency"] == 2


def test_a_subclass_shapes_every_request_through_spec(tmp_path: Path) -> None:
    """spec() is the seam a subclass shapes request bodies with: every body sent carries what
    the override adds (here each request's id as ``user``), and its prompt is counted as sent."""
    import attrs

    class Tagged(LoadGenerator):
        def spec(self, req):  # type: ignore[no-untyped-def]
            base = super().spec(req)
            return attrs.evolve(base, extra_body={**base.extra_body, "user": f"r{req.request_id}"})

    async def go() -> tuple[list[dict], Tagged]:
        async with serve() as fake, OpenAIClient(fake.url, timeout_s=TIMEOUT_S) as client:
            rows = [{"request_id": i, "arrival_time_s": 0.0, "input_tokens": 5, "output_tokens": 2} for i in range(4)]
            gen = Tagged(client, rows, None, lag_threshold_s=QUIET)
            await gen.run()
            return fake.bodies, gen

    bodies, gen = asyncio.run(go())
    assert sorted(b["user"] for b in bodies) == ["r0", "r1", "r2", "r3"]
    assert all(rec.approx_prompt_tokens == 5 for rec in gen.records.values())
