"""A benchmark run's metrics as users of ``vllm bench serve`` read them, from its trace v2.

:func:`bench_metrics` takes the rows of an observed trace (``simpy-llm observe`` or
``simpy-llm bench`` wrote them) and gives the figures of vLLM's serving benchmark
(``benchmark_serving.py`` / ``vllm bench serve``, its ``calculate_metrics``) under the same
names and definitions:

- ``completed`` (answered requests), ``failed`` (``error`` or ``timeout``), ``cancelled``
  (stopped by a stop criterion or Ctrl-C; vLLM has no such requests);
- ``duration`` (seconds from the run's start to the end of its last request),
  ``total_input_tokens``, ``total_output_tokens``;
- ``request_throughput`` = completed / duration, ``request_goodput`` = requests meeting every
  SLO / duration, ``output_throughput`` = output tokens / duration,
  ``total_token_throughput`` = (input + output tokens) / duration;
- for TTFT, TPOT, ITL and E2EL: ``mean_<m>_ms``, ``median_<m>_ms``, ``std_<m>_ms`` and
  ``p<P>_<m>_ms`` per asked percentile (``p99_ttft_ms``; ``p99.9_ttft_ms``), in milliseconds.

Definitions (vLLM's): TTFT = first content chunk − send; E2EL = end of the response − send;
TPOT = (E2EL − TTFT) / (output tokens − 1), over requests with more than one output token;
ITL = every gap between consecutive content chunks, pooled over requests. For goodput a
request with one output token has TPOT 0. A statistic over no value is 0, as in vLLM.

Token counts are the server's ``usage`` (the trace's ``*_tokens_source`` says so); a request
the server gave no completion count for counts its content chunks (vLLM re-tokenizes the
generated text instead), and one without a prompt count its requested length.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "DEFAULT_PERCENTILES",
    "GOODPUT_METRICS",
    "LATENCY_METRICS",
    "bench_metrics",
    "error_kind",
    "parse_goodput",
    "parse_percentiles",
    "percentile_key",
    "read_rows",
]

DEFAULT_PERCENTILES: tuple[float, ...] = (99.0,)
"""vLLM's default ``--metric-percentiles``."""

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
"""The latency metrics, by vLLM's names (``e2el``: end-to-end latency)."""

GOODPUT_METRICS = ("ttft", "tpot", "e2el")
"""The metrics an SLO may bound (vLLM's ``--goodput`` keys; ``e2e`` is read as ``e2el``)."""


def percentile_key(p: float, metric: str) -> str:
    """The JSON key of percentile *p* of *metric*, vLLM's way (a whole *p* without decimals).

    >>> percentile_key(99, "ttft"), percentile_key(99.9, "itl")
    ('p99_ttft_ms', 'p99.9_itl_ms')
    """
    word = str(int(p)) if float(p).is_integer() else str(p)
    return f"p{word}_{metric}_ms"


def parse_percentiles(text: str) -> tuple[float, ...]:
    """Percentiles from ``"50,90,99"`` (each in (0, 100]).

    >>> parse_percentiles("50, 90,99.9")
    (50.0, 90.0, 99.9)
    >>> parse_percentiles("0")
    Traceback (most recent call last):
    ...
    ValueError: --percentiles: '0' is not a percentile in (0, 100]
    """
    out = []
    for part in text.split(","):
        try:
            p = float(part)
        except ValueError:
            raise ValueError(f"--percentiles: {part.strip()!r} is not a number (give e.g. 50,90,99)") from None
        if not 0 < p <= 100:
            raise ValueError(f"--percentiles: {part.strip()!r} is not a percentile in (0, 100]")
        out.append(p)
    return tuple(out)


def parse_goodput(items: Iterable[str]) -> dict[str, float]:
    """SLOs from vLLM's ``--goodput`` syntax: ``KEY:MILLISECONDS`` items, keys ``ttft``, ``tpot``
    and ``e2el`` (``e2e`` is the same as ``e2el``).

    >>> parse_goodput(["ttft:500", "tpot:50", "e2e:3000"])
    {'ttft': 500.0, 'tpot': 50.0, 'e2el': 3000.0}
    >>> parse_goodput(["itl:5"])
    Traceback (most recent call last):
    ...
    ValueError: --goodput: 'itl:5': the key must be one of ttft, tpot, e2el (e2e)
    """
    slos: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition(":")
        key = "e2el" if key.strip() == "e2e" else key.strip()
        if not sep:
            raise ValueError(f"--goodput: {item!r}: give KEY:MILLISECONDS, e.g. ttft:500")
        if key not in GOODPUT_METRICS:
            raise ValueError(f"--goodput: {item!r}: the key must be one of {', '.join(GOODPUT_METRICS)} (e2e)")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"--goodput: {item!r}: {value.strip()!r} is not a number of milliseconds") from None
        if not ms > 0 or math.isinf(ms):
            raise ValueError(f"--goodput: {item!r}: the bound must be a finite number of milliseconds > 0")
        slos[key] = ms
    return slos


def read_rows(trace: Path | str) -> pd.DataFrame:
    """The rows of the observed trace at *trace* (its directory, stem or CSV), as written."""
    from simpy_llm.workload.traces import trace_v2_paths

    _, csv_path = trace_v2_paths(trace)
    return pd.read_csv(csv_path, keep_default_na=False, na_values=[""], dtype={"itl_us": str, "error_message": str})


def error_kind(status: str, http_status: Any) -> str:
    """How a failed request failed: ``timeout``, ``http_<code>`` for an HTTP error answer, else
    ``error`` (connection refused or broken, a stream that broke off or reported an error).

    >>> error_kind("error", 503), error_kind("timeout", None), error_kind("error", float("nan"))
    ('http_503', 'timeout', 'error')
    """
    if status == "timeout":
        return "timeout"
    if http_status is not None and not (isinstance(http_status, float) and math.isnan(http_status)) and int(http_status) != 200:
        return f"http_{int(http_status)}"
    return "error"


def _stats(values: Sequence[float], metric: str, percentiles: Sequence[float]) -> dict[str, float]:
    # vLLM takes np.mean(values or 0): a metric over no value reads 0.
    arr = np.asarray(values if len(values) else [0.0], dtype=float) * 1e3
    out = {
        f"mean_{metric}_ms": float(np.mean(arr)),
        f"median_{metric}_ms": float(np.median(arr)),
        f"std_{metric}_ms": float(np.std(arr)),
    }
    for p in percentiles:
        out[percentile_key(p, metric)] = float(np.percentile(arr, p))
    return out


def _us(value: Any) -> float | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value) / 1e6


def bench_metrics(
    rows: pd.DataFrame | Iterable[Mapping[str, Any]],
    *,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    goodput: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """vLLM's serving-benchmark metrics of the observed trace rows *rows* (see the module docstring).

    Parameters
    ----------
    rows
        The trace's rows (a DataFrame as :func:`read_rows` gives, or mappings): ``status``,
        ``send_time_us``, ``first_token_time_us``, ``done_time_us``, ``itl_us``,
        ``input_tokens``, ``output_tokens``, ``requested_input_tokens``,
        ``prompt_tokens_source``, ``completion_tokens_source``, ``http_status``.
    percentiles
        The percentiles to report of each latency metric.
    goodput
        SLOs in milliseconds by metric (:func:`parse_goodput`); ``None``: no goodput
        (``request_goodput`` is ``None``).

    Examples
    --------
    Two answered requests sent at 0, one failed:

    >>> rows = [
    ...     {"status": "ok", "send_time_us": 0, "first_token_time_us": 100_000, "done_time_us": 400_000,
    ...      "itl_us": "100000 200000", "input_tokens": 10, "output_tokens": 3,
    ...      "prompt_tokens_source": "usage", "completion_tokens_source": "usage"},
    ...     {"status": "ok", "send_time_us": 0, "first_token_time_us": 300_000, "done_time_us": 500_000,
    ...      "itl_us": "", "input_tokens": 20, "output_tokens": 1,
    ...      "prompt_tokens_source": "usage", "completion_tokens_source": "usage"},
    ...     {"status": "error", "send_time_us": 0, "done_time_us": 10_000, "http_status": 503},
    ... ]
    >>> m = bench_metrics(rows, percentiles=(50,), goodput={"ttft": 200})
    >>> m["completed"], m["failed"], m["duration"], m["total_output_tokens"], m["errors"]
    (2, 1, 0.5, 4, {'http_503': 1})
    >>> round(m["mean_tpot_ms"], 6), m["mean_itl_ms"], m["request_goodput"], m["output_throughput"]
    (150.0, 150.0, 2.0, 8.0)
    """
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    records = frame.to_dict("records")
    ttfts: list[float] = []
    tpots: list[float] = []
    slo_values: list[dict[str, float]] = []
    itls: list[float] = []
    e2els: list[float] = []
    total_input = total_output = 0
    completed = failed = cancelled = 0
    errors: dict[str, int] = {}
    ends: list[float] = []
    for row in records:
        status = str(row.get("status", ""))
        done = _us(row.get("done_time_us"))
        if done is not None:
            ends.append(done)
        if status == "cancelled":
            cancelled += 1
            continue
        if status != "ok":
            failed += 1
            kind = error_kind(status, row.get("http_status"))
            errors[kind] = errors.get(kind, 0) + 1
            continue
        sent, first = _us(row.get("send_time_us")), _us(row.get("first_token_time_us"))
        if sent is None or done is None:
            continue
        itl_text = row.get("itl_us")
        gaps = [int(g) / 1e6 for g in str(itl_text).split()] if isinstance(itl_text, str) else []
        if row.get("completion_tokens_source") == "usage":
            output_len = int(row["output_tokens"])
        else:
            output_len = len(gaps) + 1 if first is not None else 0
        if row.get("prompt_tokens_source") == "usage" or "requested_input_tokens" not in row:
            input_len = int(row.get("input_tokens") or 0)
        else:
            input_len = int(row["requested_input_tokens"])
        completed += 1
        total_input += input_len
        total_output += output_len
        latency = done - sent
        e2els.append(latency)
        itls.extend(gaps)
        # A response that is not streamed arrives whole: its first token is its end.
        ttft = latency if first is None else first - sent
        tpot = 0.0
        if first is not None:
            ttfts.append(ttft)
            if output_len > 1:
                tpot = (latency - ttft) / (output_len - 1)
                tpots.append(tpot)
        slo_values.append({"ttft": ttft, "tpot": tpot, "e2el": latency})
    duration = max(ends) if ends else 0.0
    good = None
    if goodput:
        good = sum(all(values[k] <= bound / 1e3 for k, bound in goodput.items()) for values in slo_values)

    def per_s(n: float) -> float:
        return n / duration if duration > 0 else 0.0

    out: dict[str, Any] = {
        "duration": duration,
        "completed": completed,
        "failed": failed,
        "cancelled": cancelled,
        "errors": dict(sorted(errors.items())),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": per_s(completed),
        "request_goodput": None if good is None else per_s(good),
        "output_throughput": per_s(total_output),
        "total_token_throughput": per_s(total_input + total_output),
    }
    for metric, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        out.update(_stats(values, metric, percentiles))
    return out
