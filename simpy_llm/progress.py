"""Progress of long runs, shared by :meth:`Simulation.run` and the command line.

Whether progress shows is decided by :func:`progress_wanted`, a pure function of the
caller's setting and what the environment looks like:

* ``True`` / ``False``: always / never;
* ``None`` (automatic): only when someone is watching (standard error is a terminal,
  or the code runs in a Jupyter kernel that can show widgets) and the run is
  expected to simulate at least :data:`AUTO_MIN_REQUESTS` requests; so never in
  tests, pipes or batch jobs, and never for runs over in a blink.

How it shows: on a terminal or in Jupyter, ``rich``'s bar (a dependency), drawn on
standard error and removed when the run ends (:func:`rich_progress`); anywhere else
(``--progress on`` into a log file or a pipe), one plain line every
:data:`PLAIN_LINE_EVERY_S` wall seconds, with the simulated time, the requests done out of
the total, the rate and the time left, and a last line when the run ends
(:class:`PlainProgress`). ``rich`` is imported only when a bar is shown.

**The projection.** After :data:`WARM_UP_S` wall seconds a run projects its whole wall
time and memory from what it did so far (:class:`RunEstimator`: wall seconds per share
of the run done, and the growth of the process's resident memory per share), and says
so on standard error in one line; when the projected memory exceeds the machine's
(:func:`machine_memory_bytes`), a second line warns that the run would fail or swap. It
prints whenever progress shows; with progress left automatic and nothing shown (a pipe,
a test), only for runs expected to simulate at least :data:`AUTO_MIN_REQUESTS` requests
and then only when the projection says at least :data:`AUTO_PROJECTION_MIN_S` wall
seconds or more memory than the machine has; never with ``progress=False``. The share
of the run done is the largest of the requests generated out of ``num_requests`` (or
out of a trace replay's rows), and the simulated time out of ``horizon_s`` and out of
``simulation.until_s``: the one that ends the run first.

The wall clock and the memory readings are the module's :func:`wall_clock`,
:func:`resident_memory_bytes` and :func:`machine_memory_bytes`, looked up when used,
so tests replace them.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs

__all__ = [
    "AUTO_MIN_REQUESTS",
    "AUTO_PROJECTION_MIN_S",
    "PLAIN_LINE_EVERY_S",
    "WARM_UP_S",
    "PlainProgress",
    "ProgressCallback",
    "RunEstimator",
    "RunProjection",
    "format_bytes",
    "format_duration",
    "in_jupyter_kernel",
    "machine_memory_bytes",
    "plain_progress",
    "progress_wanted",
    "resident_memory_bytes",
    "rich_progress",
    "wall_clock",
    "watched",
]

AUTO_MIN_REQUESTS = 50_000
"""Automatic progress bars show for runs expected to simulate at least this many requests."""
PLAIN_LINE_EVERY_S = 10.0
"""Wall seconds between two plain progress lines (progress shown without a terminal); set
it to change the default of :func:`plain_progress`."""
WARM_UP_S = 2.0
"""Wall seconds a run runs before it projects its whole wall time and memory."""
AUTO_PROJECTION_MIN_S = 60.0
"""With progress left automatic and nothing shown, the projection prints only for runs
projected to last at least this many wall seconds (or to need more memory than the machine)."""


def wall_clock() -> float:
    """Seconds on a monotonic wall clock (:func:`time.monotonic`)."""
    return time.monotonic()


def resident_memory_bytes() -> int | None:
    """The process's resident memory now, bytes: ``/proc/self/statm`` where there is one
    (Linux), else the peak resident memory from :func:`resource.getrusage`; None when
    neither can be read."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:  # not on this platform (Windows)
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # macOS counts bytes, Linux KiB


def machine_memory_bytes() -> int | None:
    """The machine's physical memory, bytes (``SC_PHYS_PAGES`` x ``SC_PAGE_SIZE``); None when
    the system does not say."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def format_duration(seconds: float) -> str:
    """A wall duration for people.

    >>> format_duration(0.04), format_duration(42.4), format_duration(125), format_duration(3 * 3600 + 61), format_duration(9e6)
    ('0.0 s', '42 s', '2 min 5 s', '3 h 1 min', '104 days')
    """
    if not math.isfinite(seconds):
        return "forever"
    if seconds < 9.95:
        return f"{max(seconds, 0.0):.1f} s"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400 * 2:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400:,} days"


def format_bytes(n: float) -> str:
    """A memory size for people, in powers of 1000.

    >>> format_bytes(512), format_bytes(3.2e6), format_bytes(1.94e12)
    ('512 B', '3.2 MB', '1.9 TB')
    """
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")

ProgressCallback = Callable[[int, int | None, float], None]
"""Called as ``progress(finished_requests, total_requests_or_None, sim_time_s)``."""


def progress_wanted(
    setting: bool | None,
    *,
    terminal: bool,
    jupyter: bool,
    expected_requests: float,
    min_requests: float = AUTO_MIN_REQUESTS,
) -> bool:
    """Whether to show a progress bar.

    Parameters
    ----------
    setting
        ``True`` or ``False`` force it; ``None`` decides from the rest.
    terminal
        Standard error is an interactive terminal.
    jupyter
        The code runs in a Jupyter (IPython) kernel able to show the bar.
    expected_requests
        How many requests the run is expected to simulate (0 when unknown).
    min_requests
        The fewest expected requests for which an automatic bar shows.

    Examples
    --------
    >>> progress_wanted(None, terminal=True, jupyter=False, expected_requests=1e6)
    True
    >>> progress_wanted(None, terminal=False, jupyter=False, expected_requests=1e6)  # a pipe, a test
    False
    >>> progress_wanted(None, terminal=True, jupyter=False, expected_requests=100)  # over in a blink
    False
    >>> progress_wanted(True, terminal=False, jupyter=False, expected_requests=0)
    True
    """
    if setting is not None:
        return bool(setting)
    return (terminal or jupyter) and expected_requests >= min_requests


def in_jupyter_kernel() -> bool:
    """Whether this code runs in a Jupyter (IPython) kernel that can draw a live bar.

    Looks only at modules already imported (an IPython kernel has imported IPython), so
    it costs nothing elsewhere. A kernel without ``ipywidgets`` counts as not able to:
    ``rich`` needs the widgets to redraw a bar in a notebook.
    """
    ipython = sys.modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    shell = get_ipython() if get_ipython is not None else None
    if shell is None or getattr(shell, "kernel", None) is None:
        return False  # plain Python, or IPython in a terminal (a terminal is detected as such)
    return importlib.util.find_spec("ipywidgets") is not None


def watched(stream: Any = None) -> tuple[bool, bool]:
    """``(terminal, jupyter)`` for :func:`progress_wanted`: whether *stream* (default
    standard error) is an interactive terminal, and whether this is a Jupyter kernel."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    try:
        terminal = bool(isatty()) if isatty is not None else False
    except ValueError:  # a closed stream
        terminal = False
    return terminal, in_jupyter_kernel()


@contextmanager
def rich_progress(total: int | None, console: Any = None) -> Iterator[ProgressCallback]:
    """A ``rich`` progress bar on *console* (default: standard error), removed on exit.

    Yields the :data:`ProgressCallback` that advances it: finished requests out of
    *total* (``None``: unknown, the bar pulses) and the simulated time.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [
        TextColumn("simulating"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("t={task.fields[t]:.0f}s"),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=console if console is not None else Console(stderr=True), transient=True) as bar:
        task = bar.add_task("run", total=total, t=0.0)

        def update(finished: int, _total: int | None, now_s: float) -> None:
            bar.update(task, completed=finished, t=now_s)

        yield update


class PlainProgress:
    """Plain progress lines on *stream* (default standard error), one every *every_s* wall
    seconds at most: a log file or a pipe gets a steady trace of a long run.

    Called as a :data:`ProgressCallback`; a line is written at the first call at least
    *every_s* seconds after the previous line (or the start): the simulated time, the
    requests done (out of *total* when known, with the share), the rate in requests per
    wall second since the start and, with a total, the time left at that rate.
    :meth:`close` writes the last line.

    Examples
    --------
    >>> import io
    >>> ticks = iter([0.0, 4.0, 10.5, 12.0, 18.0, 30.0])
    >>> out = io.StringIO()
    >>> p = PlainProgress(1000, stream=out, every_s=10.0, clock=lambda: next(ticks))
    >>> p(100, 1000, 50.0); p(210, 1000, 105.0); p(250, 1000, 125.0); p(1000, 1000, 500.0)
    >>> p.close()
    >>> print(out.getvalue(), end="")
    simulating: t=105 s, 210/1,000 requests (21.0%), 20.0 requests/s, 40 s left
    simulated: t=500 s, 1,000 requests in 30 s (33.3 requests/s)
    """

    def __init__(
        self,
        total: int | None,
        *,
        stream: Any = None,
        every_s: float | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.total = total
        self.stream = stream
        self.every_s = float(PLAIN_LINE_EVERY_S if every_s is None else every_s)
        if not (math.isfinite(self.every_s) and self.every_s > 0):
            raise ValueError(f"every_s must be a number of seconds > 0, got {every_s!r}")
        self.clock = clock if clock is not None else wall_clock
        self.start = self.clock()
        self.last_line = self.start
        self.finished = 0
        self.now_s = 0.0
        self.lines = 0
        """Progress lines written so far (the last line not counted)."""

    def _write(self, text: str) -> None:
        stream = self.stream if self.stream is not None else sys.stderr
        print(text, file=stream, flush=True)

    def __call__(self, finished: int, total: int | None, now_s: float) -> None:
        self.finished, self.now_s = finished, now_s
        t = self.clock()
        if t - self.last_line < self.every_s:
            return
        self.last_line = t
        elapsed = t - self.start
        rate = finished / elapsed if elapsed > 0 else 0.0
        total = self.total if self.total is not None else total
        parts = [f"t={now_s:,.0f} s"]
        if total:
            share = 100.0 * finished / total
            parts.append(f"{finished:,}/{total:,} requests ({share:.1f}%)" if share >= 0.1 or not finished
                         else f"{finished:,}/{total:,} requests ({share:.2g}%)")
        else:
            parts.append(f"{finished:,} requests done")
        parts.append(f"{rate:,.1f} requests/s")
        if total and rate > 0:
            parts.append(f"{format_duration((total - finished) / rate)} left")
        self._write("simulating: " + ", ".join(parts))
        self.lines += 1

    def close(self) -> None:
        """Write the last line: the requests done, the wall time and the rate."""
        elapsed = self.clock() - self.start
        rate = f" ({self.finished / elapsed:,.1f} requests/s)" if elapsed > 0 else ""
        self._write(f"simulated: t={self.now_s:,.0f} s, {self.finished:,} requests in {format_duration(elapsed)}{rate}")


@contextmanager
def plain_progress(total: int | None, *, stream: Any = None, every_s: float | None = None) -> Iterator[ProgressCallback]:
    """:class:`PlainProgress` lines on *stream* (default standard error) every *every_s* wall
    seconds (default :data:`PLAIN_LINE_EVERY_S`, read when called); the last line on exit."""
    lines = PlainProgress(total, stream=stream, every_s=every_s)
    yield lines
    lines.close()


@attrs.frozen(kw_only=True)
class RunProjection:
    """What a run will take, projected from its first seconds."""

    measured_s: float
    """Wall seconds the projection was measured over."""
    share_done: float
    """Share of the run done when it was made, in (0, 1]."""
    wall_s: float
    """Projected wall time of the whole run, seconds."""
    memory_bytes: float | None
    """Projected resident memory at the end of the run, bytes (None: not measured)."""
    machine_bytes: int | None
    """The machine's physical memory, bytes (None: not known)."""

    @property
    def exceeds_memory(self) -> bool:
        """The projected memory is more than the machine has."""
        return self.memory_bytes is not None and self.machine_bytes is not None and self.memory_bytes > self.machine_bytes

    def lines(self) -> list[str]:
        """The projection, and the warning when it needs more memory than the machine has.

        >>> p = RunProjection(measured_s=2.0, share_done=1e-5, wall_s=2e5, memory_bytes=2e12, machine_bytes=16 * 10**9)
        >>> for line in p.lines(): print(line)
        projection: the whole run would take about 2 days of wall time and 2.0 TB of memory (measured over its first 2.0 s, 0.001% of it)
        warning: 2.0 TB is more memory than this machine has (16.0 GB): the run would fail or swap long before it ends
        """
        memory = f" and {format_bytes(self.memory_bytes)} of memory" if self.memory_bytes is not None else ""
        share = f"{100.0 * self.share_done:.3g}%"
        out = [
            f"projection: the whole run would take about {format_duration(self.wall_s)} of wall time{memory} "
            + f"(measured over its first {format_duration(self.measured_s)}, {share} of it)"
        ]
        if self.exceeds_memory:
            assert self.memory_bytes is not None and self.machine_bytes is not None
            out.append(
                f"warning: {format_bytes(self.memory_bytes)} is more memory than this machine has "
                f"({format_bytes(self.machine_bytes)}): the run would fail or swap long before it ends"
            )
        return out


class RunEstimator:
    """Projects a run's wall time and memory once it has run :data:`WARM_UP_S` wall seconds.

    Call :meth:`update` with the share of the run done after each slice of the run; the
    first call on or after the warm-up with some of the run done returns the
    :class:`RunProjection` (later calls return None). Wall time: the seconds so far divided
    by the share done. Memory: the resident memory at that point plus its growth per share
    since the first call (so what the run allocated once at its start is not projected) times
    the share left; with no growth measured since the first call, the growth since the start.

    Parameters
    ----------
    warm_up_s
        Wall seconds before the projection (default :data:`WARM_UP_S`).
    clock, memory, machine_memory
        The wall clock, the resident-memory reading and the machine's memory (default:
        :func:`wall_clock`, :func:`resident_memory_bytes`, :func:`machine_memory_bytes`).

    Examples
    --------
    >>> ticks, rss = iter([0.0, 0.5, 2.5]), iter([100e6, 110e6, 130e6])
    >>> est = RunEstimator(clock=lambda: next(ticks), memory=lambda: next(rss), machine_memory=lambda: 8 * 10**9)
    >>> est.update(0.001) is None    # 0.5 s: still warming up
    True
    >>> p = est.update(0.005)        # 2.5 s for 0.5% of the run; 20 MB more for 0.4% more of it
    >>> round(p.wall_s), round(p.memory_bytes / 1e9, 3), p.exceeds_memory
    (500, 5.105, False)
    """

    def __init__(
        self,
        *,
        warm_up_s: float | None = None,
        clock: Callable[[], float] | None = None,
        memory: Callable[[], float | None] | None = None,
        machine_memory: Callable[[], int | None] | None = None,
    ) -> None:
        self.warm_up_s = WARM_UP_S if warm_up_s is None else warm_up_s
        self.clock = clock if clock is not None else wall_clock
        self.memory = memory if memory is not None else resident_memory_bytes
        self.machine_memory = machine_memory if machine_memory is not None else machine_memory_bytes
        self.start = self.clock()
        self.start_memory = self.memory()
        self.first: tuple[float, float | None] | None = None
        """(share done, memory) at the first update."""
        self.projection: RunProjection | None = None

    def update(self, share_done: float | None) -> RunProjection | None:
        """The projection if this call makes it, else None (see the class docstring)."""
        if self.projection is not None or share_done is None or not share_done > 0:
            return None
        elapsed = self.clock() - self.start
        if self.first is None:
            self.first = (share_done, self.memory())
            if elapsed < self.warm_up_s:
                return None
        elif elapsed < self.warm_up_s:
            return None
        share = min(share_done, 1.0)
        now_memory = self.memory() if self.first[1] is not None else None
        projected_memory = None
        if now_memory is not None:
            first_share, first_memory = self.first
            assert first_memory is not None
            if share > first_share and now_memory > first_memory:
                growth = (now_memory - first_memory) / (share - first_share)
            elif self.start_memory is not None:
                growth = max(now_memory - self.start_memory, 0.0) / share
            else:
                growth = 0.0
            projected_memory = now_memory + growth * (1.0 - share)
        self.projection = RunProjection(
            measured_s=elapsed,
            share_done=share,
            wall_s=elapsed / share,
            memory_bytes=projected_memory,
            machine_bytes=self.machine_memory(),
        )
        return self.projection
