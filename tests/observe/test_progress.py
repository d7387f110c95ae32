"""The live progress line of `simpy-llm observe`: when it shows, what it counts, what it says."""

from __future__ import annotations

import asyncio
import io

import pytest
from rich.console import Console

from simpy_llm.observe.client import ObservedRequest, OpenAIClient
from simpy_llm.observe.loadgen import LoadGenerator
from simpy_llm.observe.progress import RECENT, LiveStats, live_progress, progress_text, show_progress
from tests.observe.fake_server import OK_TOKENS, serve


@pytest.mark.parametrize(
    ("mode", "is_terminal", "environ", "shown"),
    [
        ("auto", True, {}, True),
        ("auto", False, {}, False),
        ("auto", True, {"PYTEST_CURRENT_TEST": "test_x (call)"}, False),
        ("auto", True, {"TERM": "dumb"}, False),
        ("auto", True, {"TERM": "xterm-256color"}, True),
        ("on", False, {"PYTEST_CURRENT_TEST": "test_x (call)"}, True),
        ("off", True, {}, False),
    ],
)
def test_progress_shows_on_an_interactive_terminal_only(mode: str, is_terminal: bool, environ: dict[str, str], shown: bool) -> None:
    """`auto` shows the line on a terminal that is not dumb, outside pytest; `on` and `off` decide alone."""
    assert show_progress(mode, is_terminal=is_terminal, environ=environ) is shown


def test_unknown_progress_mode_is_an_error() -> None:
    """A mode other than auto, on, off is rejected, naming the allowed values."""
    with pytest.raises(ValueError, match="auto, on, off"):
        show_progress("yes", is_terminal=True, environ={})


def _ended(status: str, streaming: bool = True, ttft: float | None = 0.5, e2e: float = 2.0) -> ObservedRequest:
    return ObservedRequest(
        status=status, streaming=streaming, sent_s=1.0, first_content_s=None if ttft is None else 1.0 + ttft, done_s=1.0 + e2e
    )


def test_live_stats_count_each_ending() -> None:
    """Answers count as ok with their E2E (and TTFT when streamed with content), errors and
    timeouts as failed, cancellations apart; `ended` is their sum."""
    stats = LiveStats(sent=6)
    for rec in (_ended("ok"), _ended("ok", streaming=False, e2e=3.0), _ended("ok", ttft=None, e2e=0.25)):
        stats.end(rec)
    for status in ("error", "timeout", "cancelled"):
        stats.end(_ended(status))
    assert (stats.ok, stats.failed, stats.cancelled, stats.ended) == (3, 2, 1, 6)
    assert list(stats.ttft_s) == [0.5] and list(stats.e2e_s) == [2.0, 3.0, 0.25]


def test_live_latencies_are_over_the_recent_answers() -> None:
    """The windows keep the last RECENT answers only."""
    stats = LiveStats()
    for i in range(RECENT + 5):
        stats.end(_ended("ok", e2e=float(i)))
    assert len(stats.e2e_s) == RECENT and stats.e2e_s[0] == 5.0 and stats.e2e_s[-1] == RECENT + 4.0


def test_progress_text_reports_counts_and_percentiles() -> None:
    """The line gives sent, ok, failed (cancelled when any) and TTFT / E2E p50 and p99."""
    stats = LiveStats(sent=5, ok=2, failed=1, cancelled=2)
    stats.ttft_s.extend([0.1, 0.3])
    stats.e2e_s.extend([1.0, 2.0])
    assert progress_text(stats) == "sent 5, ok 2, failed 1, cancelled 2 | TTFT p50/p99 200/298 ms | E2E p50/p99 1.50/1.99 s"
    assert progress_text(LiveStats()) == "sent 0, ok 0, failed 0 | TTFT - | E2E -"


def test_load_generator_keeps_the_live_counts() -> None:
    """After a run against the fake server the live counts match the outcomes: every request
    sent, the well-behaved ones ok (their TTFT and E2E in the windows), the 429 failed."""
    rows = [{"request_id": i, "arrival_time_s": 0.0, "input_tokens": 5, "output_tokens": n} for i, n in enumerate([OK_TOKENS, OK_TOKENS, 8])]

    async def go() -> LoadGenerator:
        async with serve() as fake, OpenAIClient(fake.url, timeout_s=2.0) as client:
            gen = LoadGenerator(client, rows, lag_threshold_s=1e9)
            await gen.run()
            return gen

    live = asyncio.run(go()).live
    assert (live.sent, live.ok, live.failed, live.cancelled) == (3, 2, 1, 0)
    assert len(live.ttft_s) == len(live.e2e_s) == 2


def test_live_progress_draws_the_line_and_clears_it() -> None:
    """The display draws the bar with the progress text at once and removes it when cancelled."""
    stats = LiveStats(sent=3, ok=2, failed=1)
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160, color_system=None)

    async def go() -> None:
        task = asyncio.create_task(live_progress(stats, lambda: 7, console, interval_s=60.0))
        await asyncio.sleep(0)  # the task draws once, then sleeps
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    text = out.getvalue()
    assert "observing" in text and "3/7" in text and "sent 3, ok 2, failed 1" in text
    assert text.endswith("\x1b[2K")  # the last thing written erases the line
