"""Scrape a Prometheus ``/metrics`` endpoint at an interval into a time-series CSV.

Servers such as vLLM and llama.cpp export their queue lengths, running
requests, KV-cache use and token counters in the Prometheus text format. The
:class:`MetricsScraper` reads them every ``interval_s`` seconds while a load
generator runs, on the load generator's clock, so each sample lines up with
the trace. Parsing is done by ``prometheus_client``'s text parser.

The file is long-format CSV, one line per sample, flushed after every
scrape (a run cut short leaves every scrape so far)::

    time_s,metric,labels,value,error
    0.0012,llamacpp:requests_processing,,0.0,
    0.0012,llamacpp:prompt_tokens_total,,0.0,
    1.0009,,,,ClientConnectorError: Cannot connect to host 127.0.0.1:8080

``labels`` is ``name="value"`` pairs joined with ``,`` (sorted by name; the
CSV quotes them), empty when the sample has none. A failed scrape (refused, HTTP error, timeout,
unparsable text) is one line with an empty ``metric`` and the reason in
``error``; scraping goes on. :func:`read_metrics` loads the file as a
DataFrame.
"""

from __future__ import annotations

import asyncio
import csv
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["METRICS_COLUMNS", "MetricsScraper", "parse_samples", "read_metrics"]

METRICS_COLUMNS = ("time_s", "metric", "labels", "value", "error")
"""Columns of the scraped time-series file."""


def parse_samples(text: str) -> list[tuple[str, str, float]]:
    """``(metric, labels, value)`` of every sample in Prometheus text *text*.

    >>> parse_samples('# TYPE q gauge\\nq{b="2",a="1"} 3\\nup 1\\n')
    [('q', 'a="1",b="2"', 3.0), ('up', '', 1.0)]
    """
    out = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out.append((sample.name, labels, float(sample.value)))
    return out


class MetricsScraper:
    """Scrapes *url* every *interval_s* seconds and appends the samples to *path*.

    Parameters
    ----------
    url
        The metrics endpoint (e.g. ``http://127.0.0.1:8080/metrics``).
    path
        CSV file to write (replaced).
    interval_s
        Seconds between scrape starts (fixed rate: a slow scrape does not shift later ones).
    clock
        Seconds on the run's clock (default: since the scraper was created); pass the
        load generator's ``client.now`` so samples share the trace's time axis.
    timeout_s
        Limit per scrape.
    headers
        Sent with each scrape (e.g. ``Authorization``).

    Run it as a task beside the load generator and :meth:`stop` it at the end;
    the last scrape happens on stop, so the file ends with the final counters.
    """

    def __init__(
        self,
        url: str,
        path: Path | str,
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] | None = None,
        timeout_s: float = 5.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        if not interval_s > 0 or math.isinf(interval_s):
            raise ValueError(f"interval_s must be a positive number of seconds, got {interval_s}")
        self.url = url
        self.path = Path(path)
        self.interval_s = float(interval_s)
        start = time.perf_counter()
        self.clock = clock or (lambda: time.perf_counter() - start)
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self.scrapes = 0
        self.failures = 0
        self._stop = asyncio.Event()

    def stop(self) -> None:
        """End :meth:`run` after one last scrape."""
        self._stop.set()

    async def run(self) -> None:
        """Scrape until :meth:`stop` (or cancellation), writing as it goes."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        connector = aiohttp.TCPConnector(force_close=True)
        with self.path.open("w", encoding="utf-8", newline="") as f:
            out = csv.writer(f, lineterminator="\n")
            out.writerow(METRICS_COLUMNS)
            f.flush()
            async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=self.headers) as session:
                next_tick = self.clock()
                while True:
                    await self._scrape(session, out)
                    f.flush()
                    if self._stop.is_set():
                        return
                    next_tick += self.interval_s
                    try:
                        await asyncio.wait_for(self._stop.wait(), max(next_tick - self.clock(), 0.0))
                    except TimeoutError:
                        pass

    async def _scrape(self, session: aiohttp.ClientSession, out: Any) -> None:
        t = self.clock()
        self.scrapes += 1
        try:
            async with session.get(self.url) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}: {' '.join(text.split())[:200]}")
            samples = parse_samples(text)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            self.failures += 1
            out.writerow((repr(t), "", "", "", f"{type(exc).__name__}: {exc}"[:300]))
            return
        out.writerows((repr(t), name, labels, repr(value), "") for name, labels, value in samples)


def read_metrics(path: Path | str) -> Any:
    """The scraped file as a DataFrame (``labels`` and ``error`` as strings, ``value`` float).

    Pivot to one column per series with
    ``df[df.metric != ""].pivot_table(index="time_s", columns=["metric", "labels"], values="value")``.
    """
    import pandas as pd

    return pd.read_csv(path, dtype={"metric": str, "labels": str, "error": str}, keep_default_na=False, na_values={"value": [""]})
