"""Request bodies built ahead of their targets (``LoadGenerator(prepare_bytes=...)``,
:mod:`simpy_llm.observe.ahead`): the same bytes on the wire and the same trace rows as bodies
built at the send, a window that holds at most its budget, and what is never built ahead."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from simpy_llm.observe.ahead import Lookahead, held_bytes
from simpy_llm.observe.client import OpenAIClient, RequestSpec
from simpy_llm.observe.loadgen import OBSERVER_COLUMNS, PREPARE_BYTES, LoadGenerator
from simpy_llm.observe.prompts import SyntheticPrompts
from simpy_llm.observe.workers import ProcessLoadGenerator
from simpy_llm.workload.traces import TraceV2Writer, read_trace_v2
from tests.observe.fake_server import serve

TIMING = [
    "send_time_us", "first_chunk_time_us", "last_chunk_time_us", "first_byte_time_us",
    "first_token_time_us", "done_time_us", "itl_us",
]
"""The trace columns measured on the client's clock: the only ones two runs may differ in."""

QUIET = 1e9  # a lag threshold that never warns (timing is not asserted)


def _requests(n: int = 40) -> list[dict[str, Any]]:
    """Requests of several lengths, streamed and not, some in a prefix group, some the fake
    server fails (max_tokens 8: HTTP 429)."""
    return [
        {"arrival_time_s": i * 0.003, "input_tokens": 5 + 37 * i % 300, "output_tokens": (4, 5, 8, 5)[i % 4],
         "streaming": i % 5 != 4, "request_id": 1000 + i, "client_id": f"c{i % 3}",
         **({"prefix_group": "sys"} if i % 3 == 0 else {})}
        for i in range(n)
    ]


def _run(tmp_path: Path, name: str, transport: str = "aiohttp", **kw: Any) -> tuple[pd.DataFrame, list[bytes], LoadGenerator]:
    """The requests sent by a load generator to the fake server: its trace, the bodies the server
    received (sorted: requests in flight at once arrive in any order), the generator."""

    async def go() -> tuple[list[bytes], LoadGenerator]:
        async with serve() as fake, OpenAIClient(fake.url, transport=transport, keep_alive=True, timeout_s=5.0) as client:
            with TraceV2Writer(tmp_path / name, extra_columns=OBSERVER_COLUMNS) as writer:
                gen = LoadGenerator(client, _requests(), writer, lag_threshold_s=QUIET, prefixes={"sys": 12},
                                    prompts=SyntheticPrompts(seed=7), **kw)
                await gen.run()
            return sorted(fake.raw_bodies), gen

    bodies, gen = asyncio.run(go())
    frame = read_trace_v2(tmp_path / name).frame.sort_values("request_id").reset_index(drop=True)
    return frame, bodies, gen


@pytest.mark.parametrize("transport", ["aiohttp", "lean"])
@pytest.mark.parametrize("budget", [PREPARE_BYTES, 3_000])
def test_bodies_built_ahead_send_the_same_bytes_and_write_the_same_rows(tmp_path: Path, transport: str, budget: int) -> None:
    """The same workload sent with bodies built ahead (all of them before the clock, or a window
    of a few refilled during the run) and with each body built at its send (prepare_bytes=0)
    delivers byte-identical request bodies and writes the same trace rows but for timings."""
    if transport == "lean":
        pytest.importorskip("httptools")
    base, base_bodies, _ = _run(tmp_path, "at_send", transport, prepare_bytes=0)
    ahead, ahead_bodies, _ = _run(tmp_path, "ahead", transport, prepare_bytes=budget)
    assert len(base_bodies) == len(ahead_bodies) == 40
    assert ahead_bodies == base_bodies
    assert set(base["status"]) == {"ok", "error"}
    pd.testing.assert_frame_equal(ahead.drop(columns=TIMING), base.drop(columns=TIMING))


def test_a_body_that_cannot_be_encoded_is_recorded_as_before(tmp_path: Path) -> None:
    """A body JSON cannot encode (an object in extra_body) is not built ahead: each request's row
    is the same error, naming the cause, as when built at its send."""
    rows = {}
    for budget in (0, PREPARE_BYTES):
        frame, bodies, _ = _run(tmp_path, f"bad{budget}", prepare_bytes=budget, extra_body={"x": object()})
        assert bodies == []
        rows[budget] = frame.drop(columns=TIMING)
    assert (rows[0]["status"] == "error").all()
    assert rows[0]["error_message"].str.contains("TypeError").all()
    pd.testing.assert_frame_equal(rows[PREPARE_BYTES], rows[0])


def test_prepare_builds_every_body_that_fits_before_the_run() -> None:
    """prepare() with the model known builds every request's body when they fit the budget, a
    window of them when they do not, and none with prepare_bytes=0 or the model unknown."""
    client = OpenAIClient("http://127.0.0.1:1", model="m")
    reqs = _requests(30)
    assert LoadGenerator(client, reqs, model="m").prepare() == 30
    small = LoadGenerator(client, reqs, model="m", prepare_bytes=2_000)
    n = small.prepare()
    assert 0 < n < 30
    assert LoadGenerator(client, reqs, model="m", prepare_bytes=0).prepare() == 0
    assert LoadGenerator(client, reqs).prepare() == 0  # the body names the model, not yet known


def test_the_window_holds_at_most_its_budget_and_one_body() -> None:
    """A window fills in order until its bytes reach the budget (one body may cross it); taking
    a body frees its bytes, and the next fill builds on from where it stopped. A body built is held
    without its prompt text (the spec it is taken with has an empty prompt): its bytes alone count."""
    order = [f"w{i} " * (i + 1) for i in range(20)]
    specs = {}

    def make(text: str) -> tuple[RequestSpec, int]:
        specs[text] = RequestSpec(text, 1)
        return specs[text], len(text.split())

    ahead = Lookahead(order, 100, make, lambda s: str(s.prompt).encode())
    n = ahead.fill()
    sizes = [len(t.encode()) for t in order[:n]]
    assert sizes[0] < held_bytes(specs[order[0]], order[0].encode())  # the text is not held
    assert ahead.held == sum(sizes) and sum(sizes[:-1]) < 100 <= sum(sizes)
    first = ahead.take(0)
    assert first is not None and first[1] == order[0].encode() and first[2] == 1
    assert first[0].prompt == "" and first[0].max_tokens == specs[order[0]].max_tokens
    assert ahead.held == sum(sizes[1:])
    m = ahead.fill()
    assert m >= n - 1  # the n - 1 left, and more if the freed bytes let
    taken = [ahead.take(i) for i in range(1, m + 1)]
    assert [t[1] if t is not None else None for t in taken] == [t.encode() for t in order[1 : m + 1]]


def test_a_request_not_built_ahead_is_skipped_by_the_window() -> None:
    """Taking a position the window has not reached gives None, and building goes on after it
    (that request is built at its send, not twice)."""
    built: list[str] = []

    def make(text: str) -> tuple[RequestSpec, int]:
        built.append(text)
        return RequestSpec(text, 1), 1

    ahead = Lookahead(["a", "b", "c", "d"], 0, make, lambda s: b"{}")
    assert ahead.fill() == 0 and ahead.take(0) is None and ahead.take(1) is None
    ahead.budget_bytes = 100
    ahead.fill()
    assert built == ["c", "d"]
    assert ahead.take(2) is not None and ahead.take(3) is not None


def test_encode_needs_a_model() -> None:
    """encode() without a model in the spec or the client is a ValueError saying so."""
    with pytest.raises(ValueError, match="no model"):
        OpenAIClient("http://127.0.0.1:1").encode(RequestSpec("x", 1))


@pytest.mark.parametrize("make", [
    lambda: LoadGenerator(OpenAIClient("http://127.0.0.1:1"), [], prepare_bytes=-1),
    lambda: ProcessLoadGenerator(OpenAIClient("http://127.0.0.1:1"), [], workers=2, prepare_bytes=-1),
])
def test_a_negative_budget_is_refused(make: Any) -> None:
    """prepare_bytes below 0 is a ValueError naming it, for one process and for workers."""
    with pytest.raises(ValueError, match="prepare_bytes"):
        make()


@pytest.mark.parametrize(("given", "budget"), [(None, PREPARE_BYTES), ("600M", 600 * 2**20), ("0", 0), ("64k", 65_536)])
def test_the_observe_command_takes_a_body_budget(given: str | None, budget: int) -> None:
    """``simpy-llm observe --prepare-bytes N[K|M|G]``: bytes, with an optional binary unit; by
    default the load generator's own budget."""
    from simpy_llm.cli import _parser

    argv = ["observe", "spec.yaml", "--url", "http://127.0.0.1:1"] + ([] if given is None else ["--prepare-bytes", given])
    assert _parser("observe").parse_args(argv).prepare_bytes == budget


@pytest.mark.parametrize("given", ["-1", "1.5M", "lots", "M"])
def test_the_observe_command_refuses_a_bad_body_budget(given: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A budget that is not a whole number of bytes is a usage error naming the option and what it takes."""
    from simpy_llm.cli import _parser

    with pytest.raises(SystemExit) as exit_info:
        _parser("observe").parse_args(["observe", "spec.yaml", "--url", "http://127.0.0.1:1", "--prepare-bytes", given])
    assert exit_info.value.code == 2
    assert "--prepare-bytes: must be a whole number of bytes >= 0" in capsys.readouterr().err
