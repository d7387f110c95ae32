"""The HTML report's fixtures: its three pages, written once per session, and a headless Chromium.

The browser is Debian's ``chromium`` (``.ci/run`` installs it with ``apt-get``), driven by the
``playwright`` package (the test extra) through ``executable_path``; ``playwright install`` is
never run (it downloads a browser build). Without the browser or the package the browser tests
skip, naming what to install, unless ``SIMPY_LLM_REQUIRE_EXTRAS`` names ``browser`` (CI): then
they fail. The report's tests need plotly (the report extra) likewise: they skip without it unless
``SIMPY_LLM_REQUIRE_EXTRAS`` names ``report``.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

ROOT = Path(__file__).resolve().parents[2]
OBSERVED = ROOT / "tests" / "data" / "calibration" / "llamacpp_short_prompts"
PROFILE = ROOT / "tests" / "data" / "calibration" / "llamacpp_open_loop_profile.yaml"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
)
"""Chromium without a display, sandbox (root in a container) or any traffic of its own (updates, sync)."""


def _importable(name: str) -> bool:
    """Whether the top-level module *name* can be imported (found, not imported)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a finder that refuses the name (tests/unit/test_extras.py hides packages so)
        return False


def _required(name: str) -> bool:
    return name in {e.strip() for e in os.environ.get("SIMPY_LLM_REQUIRE_EXTRAS", "").split(",")}


def _missing(name: str, reason: str) -> None:
    """Skip with *reason*; fail instead when the run requires *name*."""
    if _required(name):
        pytest.fail(f"SIMPY_LLM_REQUIRE_EXTRAS requires {name}: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def _plotly() -> None:
    """Every test here makes plotly figures: plotly is the report extra."""
    if not _importable("plotly"):
        _missing("report", "needs the report extra (plotly not installed): pip install -e '.[report]'")


@pytest.fixture(scope="session")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The three kinds of page, written by the command line: a sampled quickstart run (``run``),
    the llama.cpp trace of ``tests/data/calibration`` (``observe``, via ``report DIR``) and its
    comparison with the open-loop profile (``compare``)."""
    if not _importable("plotly"):
        pytest.skip("needs the report extra")
    from simpy_llm.cli import main

    out = tmp_path_factory.mktemp("pages")
    paths = {kind: out / f"{kind}.html" for kind in ("run", "observe", "compare")}
    assert main(["run", str(ROOT / "scenarios" / "quickstart.yaml"), "--set", "workload.num_requests=40",
                 "--set", "simulation.timeseries_interval_s=0.5", "--progress", "off", "--html", str(paths["run"])]) == 0
    assert main(["report", str(OBSERVED), "--html", str(paths["observe"])]) == 0
    assert main(["calibrate", "compare", str(OBSERVED), "--profile", str(PROFILE), "--resamples", "50",
                 "--html", str(paths["compare"])]) == 0
    return paths


EXPECTED_PLOTS = {
    "run": ("run-cdf-ttft", "run-cdf-tpot", "run-cdf-e2e", "run-over-time"),
    "observe": ("observe-cdf-ttft", "observe-cdf-tpot", "observe-cdf-e2e", "observe-latency-over-time", "observe-schedule",
                "observe-prometheus"),
    "compare": (
        *(f"compare-{kind}-{m}" for m in ("ttft", "itl", "tpot", "e2e") for kind in ("cdf", "scatter")),
        "compare-timeseries-queue_depth", "compare-timeseries-running_batch",
    ),
}
"""The figures each page of :func:`pages` has, by their div ids."""


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """Debian's Chromium, headless, launched by playwright (skips, or fails when required, without either).

    One per module: playwright's synchronous API keeps an event loop running in this thread while
    it is open, and the tests that run ``asyncio.run`` (observe, the emulated server) must not meet it."""
    if not CHROMIUM.exists():
        _missing("browser", f"needs Chromium at {CHROMIUM}: apt-get install -y chromium")
    if not _importable("playwright"):
        _missing("browser", "needs playwright (the test extra): pip install -e '.[test]'")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=list(CHROMIUM_ARGS))
        try:
            yield browser
        finally:
            browser.close()


@attrs.define
class Opened:
    """A page opened in the browser, with what it said and asked for while loading."""

    page: Any
    console_errors: list[str] = attrs.field(factory=list)
    requests: list[str] = attrs.field(factory=list)
    failed: list[str] = attrs.field(factory=list)


def open_page(browser: Any, path: Path) -> Opened:
    """Open *path* via ``file://``, wait until plotly has drawn every figure, and return it with
    the console errors, the URLs requested and the requests that failed."""
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    opened = Opened(page)
    page.on("console", lambda m: opened.console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: opened.console_errors.append(str(e)))
    page.on("request", lambda r: opened.requests.append(r.url))
    page.on("requestfailed", lambda r: opened.failed.append(r.url))
    page.goto(path.as_uri(), wait_until="load")
    drawn = "d => d.classList.contains('js-plotly-plot') && d.querySelector('svg.main-svg')"
    page.wait_for_function(f"[...document.querySelectorAll('.plotly-graph-div')].every({drawn})", timeout=120_000)
    return opened
