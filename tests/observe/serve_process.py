"""Start ``simpy-llm serve`` as a separate process for a test, and stop it by its PID."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp

STARTUP_S = 60.0


def cli() -> list[str]:
    """The installed ``simpy-llm`` command (beside this Python), else the module."""
    script = Path(sys.executable).with_name("simpy-llm")
    return [str(script)] if script.exists() else [sys.executable, "-m", "simpy_llm.cli"]


def _wait_for_url(out: Path, proc: subprocess.Popen[bytes], deadline: float) -> str:
    while time.monotonic() < deadline:
        for word in out.read_text().split():
            if word.startswith("http://127.0.0.1:"):
                return word
        if proc.poll() is not None:
            raise AssertionError(f"the server exited early: {out.read_text()}")
        time.sleep(0.05)
    raise AssertionError("the server did not print its URL")


async def _wait_healthy(url: str, deadline: float) -> None:
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(url + "/health") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError("the server never became healthy")


class ServeProcess:
    """A running ``simpy-llm serve``: its ``url``, ``proc``, the ``output`` file, and ``returncode`` once stopped."""

    def __init__(self, url: str, proc: subprocess.Popen[bytes], output: Path) -> None:
        self.url = url
        self.proc = proc
        self.output = output
        self.returncode: int | None = None


@contextmanager
def serve_process(scenario_file: Path, workdir: Path, *args: str) -> Iterator[ServeProcess]:
    """Run ``simpy-llm serve SCENARIO --port 0 ARGS`` on 127.0.0.1 until the block ends,
    then send SIGTERM to its PID and wait for it (``returncode`` is set)."""
    out = workdir / "serve-stdout.txt"
    cmd = [*cli(), "serve", str(scenario_file), "--port", "0", *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with out.open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env)
    handle = ServeProcess("", proc, out)
    try:
        deadline = time.monotonic() + STARTUP_S
        handle.url = _wait_for_url(out, proc, deadline)
        asyncio.run(_wait_healthy(handle.url, deadline))
        yield handle
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        handle.returncode = proc.wait(timeout=30)
