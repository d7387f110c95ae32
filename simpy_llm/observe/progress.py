"""A live progress line for ``simpy-llm observe``: requests sent, answered, failed, recent latencies.

:class:`LiveStats` is kept up to date by the load generator as requests start and
end (a few counters and two bounded windows, nothing per refresh);
:func:`progress_text` formats it; :func:`live_progress` redraws a ``rich``
progress bar and that text from the event loop twice a second (no refresh
thread competing with the sends) until cancelled, and clears them then.
:func:`show_progress` decides whether to show it at all: ``on``, ``off``, or
``auto``, which shows it only on an interactive terminal (not when the output
is redirected, on a ``TERM=dumb`` terminal, or under pytest).
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from simpy_llm.progress import progress_wanted

if TYPE_CHECKING:
    from simpy_llm.observe.client import ObservedRequest

__all__ = ["MODES", "RECENT", "LiveStats", "live_progress", "progress_text", "show_progress"]

MODES = ("auto", "on", "off")
RECENT = 1000
"""The live latency percentiles are over the last this many answered requests."""


def show_progress(mode: str, *, is_terminal: bool, environ: Mapping[str, str]) -> bool:
    """Whether to show the live progress line: *mode* ``on`` / ``off`` decide; ``auto``
    shows it when the output *is_terminal*, the terminal is not ``TERM=dumb`` and
    *environ* is not a pytest run's (``PYTEST_CURRENT_TEST``).

    >>> show_progress("auto", is_terminal=True, environ={}), show_progress("auto", is_terminal=False, environ={})
    (True, False)
    >>> show_progress("on", is_terminal=False, environ={"PYTEST_CURRENT_TEST": "t"})
    True
    """
    if mode not in MODES:
        raise ValueError(f"progress must be one of {', '.join(MODES)}, got {mode!r}")
    terminal = is_terminal and environ.get("TERM") != "dumb" and "PYTEST_CURRENT_TEST" not in environ
    setting = None if mode == "auto" else mode == "on"
    return progress_wanted(setting, terminal=terminal, jupyter=False, expected_requests=math.inf)


@attrs.define(eq=False)
class LiveStats:
    """Counts of a run in progress, and the TTFT (streamed answers with content) and E2E of
    the last :data:`RECENT` answered requests, in seconds."""

    sent: int = 0
    """Requests handed to the client (it sends them at once)."""
    ok: int = 0
    failed: int = 0
    """Requests that ended ``error`` or ``timeout``."""
    cancelled: int = 0
    ttft_s: deque[float] = attrs.field(factory=lambda: deque(maxlen=RECENT))
    e2e_s: deque[float] = attrs.field(factory=lambda: deque(maxlen=RECENT))

    @property
    def ended(self) -> int:
        """Requests ended, whatever their status."""
        return self.ok + self.failed + self.cancelled

    def end(self, rec: ObservedRequest) -> None:
        """Count *rec*, which just ended."""
        self.end_values(rec.status, rec.streaming, rec.sent_s, rec.first_content_s, rec.done_s)

    def end_values(
        self, status: str, streaming: bool, sent_s: float | None, first_content_s: float | None, done_s: float | None
    ) -> None:
        """Count a request that just ended, given the fields of its record that :meth:`end` reads
        (for a record not made into an :class:`~simpy_llm.observe.client.ObservedRequest` yet)."""
        if status == "ok":
            self.ok += 1
            if streaming and first_content_s is not None and sent_s is not None:
                self.ttft_s.append(first_content_s - sent_s)
            if done_s is not None and sent_s is not None:
                self.e2e_s.append(done_s - sent_s)
        elif status == "cancelled":
            self.cancelled += 1
        else:
            self.failed += 1


def _p50_p99(values: Sequence[float], scale: float, unit: str) -> str:
    if not values:
        return "-"
    p50, p99 = np.percentile(np.asarray(values, dtype=np.float64), [50.0, 99.0])
    digits = 0 if scale > 1 else 2
    return f"p50/p99 {p50 * scale:.{digits}f}/{p99 * scale:.{digits}f} {unit}"


def progress_text(stats: LiveStats) -> str:
    """The progress line's text.

    >>> s = LiveStats(sent=3, ok=2, failed=1)
    >>> s.ttft_s.extend([0.1, 0.3]); s.e2e_s.extend([1.0, 2.0])
    >>> progress_text(s)
    'sent 3, ok 2, failed 1 | TTFT p50/p99 200/298 ms | E2E p50/p99 1.50/1.99 s'
    """
    text = f"sent {stats.sent}, ok {stats.ok}, failed {stats.failed}"
    if stats.cancelled:
        text += f", cancelled {stats.cancelled}"
    return f"{text} | TTFT {_p50_p99(stats.ttft_s, 1e3, 'ms')} | E2E {_p50_p99(stats.e2e_s, 1.0, 's')}"


async def live_progress(stats: LiveStats, total: Callable[[], int], console: Any, interval_s: float = 0.5) -> None:
    """Show a progress bar (requests ended of ``total()``, which grows as session rounds are
    planned) over a line of :func:`progress_text` on the ``rich`` *console*, redrawn every
    *interval_s* seconds until the task is cancelled; both lines are then removed."""
    from rich.console import Group
    from rich.live import Live
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.text import Text

    bar = Progress(TextColumn("observing"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console)
    task = bar.add_task("observe", total=total())
    with Live(console=console, transient=True, auto_refresh=False) as live:
        while True:
            bar.update(task, completed=stats.ended, total=total())
            line = Text(progress_text(stats), no_wrap=True, overflow="ellipsis")
            live.update(Group(bar.get_renderable(), line), refresh=True)
            await asyncio.sleep(interval_s)
