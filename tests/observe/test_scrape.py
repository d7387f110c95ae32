"""The Prometheus scraper: samples on the run's clock, failures recorded, a readable file."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from simpy_llm.observe.scrape import MetricsScraper, parse_samples, read_metrics


def _app(state: dict[str, int]) -> web.Application:
    async def metrics(_request: web.Request) -> web.Response:
        state["hits"] += 1
        if state["hits"] == 2:
            return web.Response(status=500, text="boom")
        if state["hits"] == 3:
            return web.Response(text="this is { not prometheus")
        body = (
            "# HELP tokens_total Tokens.\n# TYPE tokens_total counter\n"
            f"tokens_total {state['hits'] * 10}\n"
            "# TYPE running gauge\n"
            f'running{{model="m",replica="0"}} {state["hits"] % 3}\n'
        )
        return web.Response(text=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


async def _scrape(path: Path, scrapes: int) -> tuple[MetricsScraper, dict[str, int]]:
    state = {"hits": 0}
    async with TestServer(_app(state), host="127.0.0.1") as server:
        scraper = MetricsScraper(str(server.make_url("/metrics")), path, interval_s=0.02)
        task = asyncio.create_task(scraper.run())
        while scraper.scrapes < scrapes:
            await asyncio.sleep(0.005)
        scraper.stop()
        await task
    return scraper, state


def test_every_scrape_is_written_and_failures_are_rows(tmp_path: Path) -> None:
    """Each scrape adds its samples (or one error row) to the file; scraping goes on after a failure."""
    path = tmp_path / "metrics.csv"
    scraper, state = asyncio.run(_scrape(path, 6))
    df = read_metrics(path)
    assert scraper.scrapes == state["hits"] >= 6
    assert scraper.failures == 2
    errors = df[df.metric == ""]
    assert len(errors) == 2 and errors.error.str.contains("HTTP 500").iloc[0]
    tokens = df[df.metric == "tokens_total"]
    assert len(tokens) == scraper.scrapes - 2
    assert tokens.value.is_monotonic_increasing and bool(tokens.time_s.is_monotonic_increasing)
    assert set(df[df.metric == "running"].labels) == {'model="m",replica="0"'}


def test_parse_samples_keeps_suffixed_names_and_labels() -> None:
    """Histogram samples keep their _bucket/_sum/_count names and labels, sorted."""
    text = (
        "# TYPE lat histogram\n"
        'lat_bucket{le="0.1"} 2\nlat_bucket{le="+Inf"} 3\nlat_sum 0.4\nlat_count 3\n'
    )
    names = [(m, lab) for m, lab, _ in parse_samples(text)]
    assert names == [("lat_bucket", 'le="0.1"'), ("lat_bucket", 'le="+Inf"'), ("lat_sum", ""), ("lat_count", "")]


def test_interval_must_be_positive(tmp_path: Path) -> None:
    """A zero or negative interval is refused with the value in the message."""
    with pytest.raises(ValueError, match="interval_s"):
        MetricsScraper("http://127.0.0.1:1/metrics", tmp_path / "m.csv", interval_s=0)
