"""The event-loop helper: ``run`` runs a coroutine on uvloop or on asyncio's loop, as asked."""

from __future__ import annotations

import asyncio
import sys

import pytest

from simpy_llm.observe import run_loop
from simpy_llm.observe.runner import resolve_loop, run


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_uvloop_when_asked() -> None:
    """loop="uvloop" runs the coroutine on a uvloop event loop."""
    uvloop = pytest.importorskip("uvloop")
    assert issubclass(run(_loop_type(), loop="uvloop"), uvloop.Loop)


def test_asyncio_when_asked() -> None:
    """loop="asyncio" runs the coroutine on the standard library's loop, even with uvloop installed."""
    loop_type = run(_loop_type(), loop="asyncio")
    assert issubclass(loop_type, asyncio.BaseEventLoop)
    assert loop_type.__module__.startswith("asyncio.")


def test_auto_picks_uvloop_when_installed() -> None:
    """loop="auto" (the default) runs on uvloop when uvloop can be imported."""
    uvloop = pytest.importorskip("uvloop")
    assert resolve_loop("auto") == "uvloop"
    assert issubclass(run(_loop_type()), uvloop.Loop)


def test_auto_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """loop="auto" runs on asyncio's loop when uvloop cannot be imported."""
    monkeypatch.setitem(sys.modules, "uvloop", None)  # makes `import uvloop` raise ImportError
    assert resolve_loop("auto") == "asyncio"
    assert run(_loop_type()).__module__.startswith("asyncio.")


def test_uvloop_asked_but_missing_raises_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """loop="uvloop" without uvloop raises ImportError naming the package, and closes the coroutine
    (no "never awaited" warning, which this suite turns into an error)."""
    monkeypatch.setitem(sys.modules, "uvloop", None)
    coro = _loop_type()
    with pytest.raises(ImportError, match="uvloop"):
        run(coro, loop="uvloop")
    assert coro.cr_frame is None  # closed


def test_unknown_loop_name_is_rejected() -> None:
    """An unknown loop name raises ValueError listing the accepted ones."""
    with pytest.raises(ValueError, match="'auto', 'uvloop', 'asyncio'"):
        run(_loop_type(), loop="trio")


def test_returns_the_coroutine_result() -> None:
    """run returns what the coroutine returns."""

    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    assert run(answer(), loop="asyncio") == 42


def test_package_exports_it_as_run_loop() -> None:
    """simpy_llm.observe.run_loop is runner.run (the name run belongs to the observe command's module)."""
    assert run_loop is run
