"""The HTML report in a real browser (headless Chromium): every figure drawn, nothing asked of a network."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from tests.report.conftest import EXPECTED_PLOTS, open_page


@pytest.mark.parametrize("kind", sorted(EXPECTED_PLOTS))
def test_page_draws_every_figure_offline_without_errors(kind: str, pages: dict[str, Path], chromium: Any) -> None:
    """Opened from a file, each page draws each of its figures (a plotly div with its svg), logs no
    console error and requests nothing but the file itself (so no request fails)."""
    opened = open_page(chromium, pages[kind])
    drawn = opened.page.evaluate(
        "[...document.querySelectorAll('.js-plotly-plot')].filter(d => d.querySelector('svg.main-svg')).map(d => d.id)"
    )
    assert opened.console_errors == []
    assert opened.requests == [pages[kind].as_uri()]
    assert opened.failed == []
    assert sorted(drawn) == sorted(EXPECTED_PLOTS[kind])
    opened.page.close()


@pytest.mark.parametrize("kind", sorted(EXPECTED_PLOTS))
def test_page_screenshot_is_not_blank(kind: str, pages: dict[str, Path], chromium: Any) -> None:
    """A screenshot of the page's first screen holds many colours (text, axes, curves), not one."""
    from PIL import Image

    opened = open_page(chromium, pages[kind])
    png = opened.page.screenshot(full_page=False)
    opened.page.close()
    colours = Image.open(io.BytesIO(png)).convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50


def test_figures_are_drawn_with_their_words(pages: dict[str, Path], chromium: Any) -> None:
    """plotly.js in the page drew the run's TTFT CDF from its data: the legend names the curve of
    the 40 simulated requests and the axes say TTFT in seconds and the share of requests."""
    opened = open_page(chromium, pages["run"])
    texts = opened.page.evaluate(
        "['.legendtext', '.xtitle', '.ytitle'].map(s => document.querySelector('#run-cdf-ttft ' + s).textContent)"
    )
    opened.page.close()
    assert texts == ["simulated (40)", "TTFT (s)", "share of values at or below x"]
