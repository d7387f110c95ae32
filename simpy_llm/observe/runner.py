"""Run the observer's coroutines on the fastest event loop available.

The load generator's timing depends on how quickly the event loop turns: on
a 2-core machine the default asyncio loop falls behind a few hundred
requests per second before uvloop does (see ``benchmarks/RESULTS.md``).
:func:`run` is :func:`asyncio.run` with a choice of loop:

- ``"auto"`` (default): uvloop when it can be imported, else asyncio's loop;
- ``"uvloop"``: uvloop, or :class:`ImportError` if it is not installed;
- ``"asyncio"``: the standard library's loop, even when uvloop is installed.

uvloop is a dependency of this package except on Windows, where it does not
exist and ``"auto"`` therefore means asyncio.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["LOOPS", "loop_factory", "resolve_loop", "run"]

T = TypeVar("T")

LOOPS = ("auto", "uvloop", "asyncio")
"""The accepted values of the ``loop`` argument."""


def _uvloop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _asyncio_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    # Named explicitly rather than through the event-loop policy, so that "asyncio"
    # still means the standard loop when a program installed uvloop's policy. A statement,
    # not a conditional expression: mypy reads platform checks in statements alone, and
    # ProactorEventLoop exists on Windows alone.
    if sys.platform == "win32":
        return asyncio.ProactorEventLoop
    return asyncio.SelectorEventLoop


def _check_loop_name(loop: str) -> None:
    if loop not in LOOPS:
        raise ValueError(f"loop must be one of {', '.join(map(repr, LOOPS))}, got {loop!r}")


def resolve_loop(loop: str = "auto") -> str:
    """The loop that *loop* stands for here: ``"uvloop"`` or ``"asyncio"``.

    ``"auto"`` resolves to ``"uvloop"`` when uvloop can be imported. Raises
    :class:`ImportError` for ``"uvloop"`` when it cannot, :class:`ValueError`
    for an unknown name.

    >>> resolve_loop("asyncio")
    'asyncio'
    """
    _check_loop_name(loop)
    if loop == "asyncio":
        return "asyncio"
    if _uvloop_factory() is not None:
        return "uvloop"
    if loop == "uvloop":
        raise ImportError("loop='uvloop' needs the uvloop package (pip install uvloop; not available on Windows)")
    return "asyncio"


def loop_factory(loop: str = "auto") -> Callable[[], asyncio.AbstractEventLoop]:
    """A function creating a new event loop of the kind *loop* names (for :class:`asyncio.Runner`).

    >>> import asyncio
    >>> with asyncio.Runner(loop_factory=loop_factory("asyncio")) as runner:
    ...     runner.run(asyncio.sleep(0, "ran"))
    'ran'
    """
    if resolve_loop(loop) == "uvloop":
        factory = _uvloop_factory()
        assert factory is not None  # resolve_loop checked the import
        return factory
    return _asyncio_factory()


def run(main: Coroutine[Any, Any, T], *, loop: str = "auto", debug: bool | None = None) -> T:
    """Run the coroutine *main* to completion on a new event loop of kind *loop*; return its result.

    Like :func:`asyncio.run` (a new loop, closed afterwards with its async
    generators and executor), with the loop chosen by *loop*: ``"auto"``
    (uvloop when installed), ``"uvloop"`` or ``"asyncio"``.

    Parameters
    ----------
    main
        The coroutine to run, e.g. ``main()`` of the example in docs/observe.md.
    loop
        ``"auto"``, ``"uvloop"`` or ``"asyncio"`` (see the module docstring).
    debug
        Passed to :class:`asyncio.Runner` (asyncio's debug mode).

    Examples
    --------
    >>> import asyncio
    >>> run(asyncio.sleep(0, "done"), loop="asyncio")
    'done'
    """
    try:
        factory = loop_factory(loop)
    except (ValueError, ImportError):
        main.close()  # the coroutine will never run: close it so it is not reported as never awaited
        raise
    with asyncio.Runner(debug=debug, loop_factory=factory) as runner:
        return runner.run(main)
