"""Progress bars for long runs, shared by :meth:`Simulation.run` and the command line.

Whether a bar shows is decided by :func:`progress_wanted`, a pure function of the
caller's setting and what the environment looks like:

* ``True`` / ``False``: always / never;
* ``None`` (automatic): only when someone is watching (standard error is a terminal,
  or the code runs in a Jupyter kernel that can show widgets) and the run is
  expected to simulate at least :data:`AUTO_MIN_REQUESTS` requests; so never in
  tests, pipes or batch jobs, and never for runs over in a blink.

The bar itself is ``rich``'s (a dependency), drawn on standard error and removed
when the run ends. ``rich`` is imported only when a bar is shown.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["AUTO_MIN_REQUESTS", "ProgressCallback", "in_jupyter_kernel", "progress_wanted", "rich_progress", "watched"]

AUTO_MIN_REQUESTS = 50_000
"""Automatic progress bars show for runs expected to simulate at least this many requests."""

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
