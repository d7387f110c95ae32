"""The latency report of an observed run: TTFT, TPOT, ITL and E2E from the client's timestamps.

:func:`latency_report` turns the :class:`~simpy_llm.observe.client.ObservedRequest`
of every request into plain data (JSON-ready), over the whole run and per
client; :func:`latency_table` lays it out for the terminal. The metrics are
the record's own (docs/observe.md, "Metrics"), over answered requests
(``status == "ok"``):

* ``ttft`` = ``first_content_s - sent_s`` and ``tpot`` = ``(last content chunk -
  first content chunk) / (completion_tokens - 1)``, over *streamed* answers with
  at least one content chunk (TPOT: and at least two completion tokens). A
  response that is not streamed arrives in one piece: its first token says
  nothing the E2E does not.
* ``itl``: every gap between consecutive content chunks of those streamed
  answers, one value per gap.
* ``e2e`` = ``done_s - sent_s``, over every answered request.

Each statistic is ``{count, mean, p50, p90, p95, p99}`` in seconds, ``count``
being the values it is taken over (requests; gaps for ``itl``, which also gives
``requests``: the requests with at least one gap). Percentiles interpolate
linearly between order statistics (numpy's default, as ``simpy-llm run``);
with no value every statistic is ``None`` and ``count`` is 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from simpy_llm.observe.client import ObservedRequest

__all__ = ["METRICS", "QUANTILES", "latency_report", "latency_stats", "latency_table"]

QUANTILES = (("p50", 50.0), ("p90", 90.0), ("p95", 95.0), ("p99", 99.0))
METRICS = ("ttft", "tpot", "itl", "e2e")
_COLUMNS = ("mean", *(k for k, _ in QUANTILES))


def latency_stats(values: Sequence[float]) -> dict[str, Any]:
    """``count``, ``mean`` and the percentiles of *values* (``None`` when there is none).

    >>> latency_stats([0.1, 0.3, 0.2])["p50"], latency_stats([])["mean"]
    (0.2, None)
    """
    if not len(values):
        return {"count": 0, **dict.fromkeys(_COLUMNS)}
    a = np.asarray(values, dtype=np.float64)
    qs = np.percentile(a, [q for _, q in QUANTILES])
    return {"count": int(a.size), "mean": float(a.mean()), **{k: float(v) for (k, _), v in zip(QUANTILES, qs, strict=True)}}


def _group(records: Sequence[ObservedRequest]) -> dict[str, Any]:
    ok = [r for r in records if r.status == "ok"]
    streamed = [r for r in ok if r.streaming and r.content_times_s]
    ttft = [t for r in streamed if (t := r.ttft_s) is not None]
    tpot = [t for r in streamed if (t := r.tpot_s) is not None]
    gaps = [r.itl_s for r in streamed]
    e2e = [t for r in ok if (t := r.e2e_s) is not None]
    return {
        "requests": len(records),
        "ok": len(ok),
        "ttft": latency_stats(ttft),
        "tpot": latency_stats(tpot),
        "itl": {**latency_stats([g for gs in gaps for g in gs]), "requests": sum(1 for gs in gaps if gs)},
        "e2e": latency_stats(e2e),
    }


def latency_report(records: Iterable[ObservedRequest], client_ids: Mapping[int, str] | None = None) -> dict[str, Any]:
    """The latency statistics of *records*: ``latency_s`` (every record) and
    ``latency_s_by_client`` (``{client_id: ...}``, sorted; a record's client is
    ``client_ids[record.request_id]``, records without one count in ``latency_s`` only).

    Each part is ``{requests, ok, ttft, tpot, itl, e2e}``: how many records, how many
    answered, and the statistics described in the module docstring.

    >>> from simpy_llm.observe.client import ObservedRequest
    >>> r = ObservedRequest(request_id=0, status="ok", sent_s=0.0, first_content_s=0.25, content_times_s=[0.25, 0.5],
    ...                   completion_tokens=2, done_s=0.75)
    >>> rep = latency_report([r], {0: "chat"})
    >>> rep["latency_s"]["ttft"]["p50"], rep["latency_s"]["tpot"]["mean"], rep["latency_s_by_client"]["chat"]["e2e"]["count"]
    (0.25, 0.25, 1)
    """
    records = list(records)
    clients = client_ids or {}
    by_client: dict[str, list[ObservedRequest]] = {}
    for r in records:
        cid = clients.get(r.request_id)
        if cid is not None:
            by_client.setdefault(cid, []).append(r)
    return {
        "latency_s": _group(records),
        "latency_s_by_client": {cid: _group(rs) for cid, rs in sorted(by_client.items())},
    }


def _ms(v: float | None, scale: float) -> str:
    return "-" if v is None else f"{v * scale:.{1 if scale > 1 else 3}f}"


def latency_table(latency_s: Mapping[str, Any], by_client: Mapping[str, Mapping[str, Any]], title: str = "latency") -> Any:
    """A :class:`rich.table.Table` of :func:`latency_report`'s two parts: the whole run, then
    each client when there are several (TTFT, TPOT and ITL in ms, E2E in s). Under each
    group's name, how many of its requests were answered; ``over``, how many values each
    row covers (requests; ITL: gaps, and the requests they come from)."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, header_style="bold", box=box.SIMPLE_HEAD)
    table.add_column("client")
    table.add_column("metric")
    table.add_column("over", justify="right")
    for col in _COLUMNS:
        table.add_column(col, justify="right")
    groups = [("all", latency_s)]
    if len(by_client) > 1:
        groups += list(by_client.items())
    for i, (name, group) in enumerate(groups):
        if i:
            table.add_section()
        labels = [name, f"{group['ok']}/{group['requests']} ok"]
        for metric, label, scale in (("ttft", "TTFT ms", 1e3), ("tpot", "TPOT ms", 1e3), ("itl", "ITL ms", 1e3), ("e2e", "E2E s", 1.0)):
            st = group[metric]
            over = f"{st['count']} gaps/{st['requests']} req" if metric == "itl" else f"{st['count']} req"
            table.add_row(labels.pop(0) if labels else "", label, over, *(_ms(st[k], scale) for k in _COLUMNS))
    return table
