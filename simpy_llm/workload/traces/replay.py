"""Replaying a trace: its requests in arrival order (:class:`TraceRequest`,
:func:`trace_requests`) and the rows the workload generator reads (:func:`trace_rows`), with
each row's fields for the simulated record, its prefix blocks kept apart from other traces', and
the shared prefixes of the prefix groups the header names.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from itertools import repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import attrs
import numpy as np

from simpy_llm.config.errors import ScenarioError
from simpy_llm.entities import Request
from simpy_llm.metrics.record import TRACE_COLUMNS
from simpy_llm.workload.prefix import PREFIX_BLOCK_TOKENS, namespaced_blocks, prefix_blocks
from simpy_llm.workload.traces.columns import Trace
from simpy_llm.workload.traces.loading import _stem

if TYPE_CHECKING:
    from simpy_llm.config.schema import TraceSource

__all__ = [
    "TraceRequest",
    "trace_requests",
    "trace_rows",
]


class TraceRequest(NamedTuple):
    """One request of a trace, as the workload generator needs it."""

    arrival_s: float
    """Seconds from the trace's time zero (``arrival_time_us / 1e6``)."""
    input_tokens: int
    output_tokens: int
    client_id: str
    tenant_id: str
    slo_class: str
    session_id: str
    round_index: int
    prefix_group: str
    streaming: bool
    text_tokens: int
    image_tokens: int
    audio_tokens: int
    video_tokens: int
    reason_ratio: float
    prefix_blocks: tuple[int, ...]
    """Prefix-block hashes (``header["prefix_block_tokens"]`` tokens each); ``()`` if none."""
    priority: int
    status: str
    request_id: int


_RECORD_COLUMNS = tuple(TRACE_COLUMNS.values())
"""The trace v2 columns a :class:`TraceRequest` takes as they are: those that carry a field of
the simulated record (:data:`~simpy_llm.metrics.record.TRACE_COLUMNS`)."""
_SET_APART = ("request_id", "client_id", "tenant_id", "slo_class", "prompt_tokens", "output_tokens")
"""Record fields a replayed request does not take from its row as they are: the id (the
simulation numbers requests), the client, tenant and SLO class (blank ones take defaults)
and the lengths (at least 1 token)."""
_PASSED_ON = tuple(name for name in TRACE_COLUMNS if name not in _SET_APART)
"""The record fields a replayed request takes from its row as they are."""


def _blocks(text: str) -> tuple[int, ...]:
    return tuple(map(int, text.split())) if text else ()


def trace_requests(trace: Trace, chunk: int = 65536) -> Iterator[TraceRequest]:
    """The trace's requests in arrival order (stable: ties keep frame order).

    Columns are converted to Python values *chunk* rows at a time, so memory
    stays bounded on long traces.
    """
    frame = trace.frame
    n = len(frame)
    t = frame["arrival_time_us"].to_numpy()
    order = None if n < 2 or bool(np.all(t[1:] >= t[:-1])) else np.argsort(t, kind="stable")
    has_blocks = "prefix_blocks" in frame.columns
    has_priority = "priority" in frame.columns
    arrays = {name: frame[name].to_numpy() for name in (*_RECORD_COLUMNS, "status")}
    blocks = frame["prefix_blocks"].to_numpy() if has_blocks else None
    priority = frame["priority"].to_numpy() if has_priority else None
    for start in range(0, n, chunk):
        idx: Any = slice(start, min(start + chunk, n)) if order is None else order[start : start + chunk]
        m = len(t[idx])
        cols: dict[str, list[Any]] = {name: values[idx].tolist() for name, values in arrays.items()}
        cols["arrival_s"] = (t[idx] / 1e6).tolist()
        cols["prefix_blocks"] = [_blocks(b) for b in blocks[idx]] if blocks is not None else [()] * m
        cols["priority"] = priority[idx].tolist() if priority is not None else [0] * m
        yield from map(TraceRequest._make, zip(*(cols[name] for name in TraceRequest._fields), strict=True))


def _prefix_groups(header: Mapping[str, Any], source: TraceSource | None) -> dict[str, dict[str, Any]]:
    """The request fields that give each prefix group of the header's ``prefix_groups``
    (``{group: prefix tokens}``, written by the observer) its shared prefix: the same
    synthetic stream a client of that group has in a simulation with the header's ``seed``."""

    groups = header.get("prefix_groups") or {}
    where = str(source.path) if source is not None else "<trace>"
    if not isinstance(groups, Mapping):
        raise ScenarioError(where, [("prefix_groups", f"must be a mapping of group names to prefix tokens, got {groups!r}")])
    seed = header.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ScenarioError(where, [("seed", f"must be a whole number >= 0, got {seed!r}")])
    out = {}
    for group, tokens in groups.items():
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ScenarioError(where, [(f"prefix_groups.{group}", f"must be a whole number of tokens >= 0, got {tokens!r}")])
        if tokens:
            out[str(group)] = {
                "prefix_tokens": tokens,
                "prefix_blocks": prefix_blocks(seed, str(group), tokens),
                "prefix_block_tokens": PREFIX_BLOCK_TOKENS,
            }
    return out


def trace_rows(
    trace: Trace, source: TraceSource | None = None, namespace: int = 0
) -> Iterator[tuple[float, int, int, dict[str, Any]]]:
    """The trace as a workload-generator source: rows ``(arrival_s, prompt_tokens,
    output_tokens, fields)`` in arrival order (see :mod:`simpy_llm.workload.generator`).

    Every row is replayed, failed ones too (they loaded the real service);
    lengths are at least 1 token (the engine's prefill produces the first
    output token), so a BurstGPT failure (0 response tokens) is replayed as a
    1-token response. *fields* carries the request's client, tenant and SLO class, its
    session, prefix group, modality, reasoning and priority fields (each only when some row
    of the trace sets it to other than the :class:`~simpy_llm.entities.Request` default, which
    the request then takes), and, when the trace has
    prefix blocks, ``prefix_blocks`` with ``prefix_block_tokens`` from the
    header (default 16), moved to the range of the trace's *namespace* (its index in the
    workload's ``traces``: :func:`~simpy_llm.workload.prefix.namespaced_blocks`), so the
    blocks of two traces replayed together never match each other. The header's ``warm_up_requests`` requests with the smallest ids (the
    first the observer generated) are marked ``warm_up``: simulated, left out of the summary. Blank client ids take ``source.client_id`` (or the
    file's stem), blank tenants the client id, blank SLO classes
    ``source.slo_class`` (``"default"`` without a source). A row of a prefix group that the
    header's ``prefix_groups`` names gets that group's shared prefix (as its client had).
    """
    block_tokens = int(trace.header.get("prefix_block_tokens", PREFIX_BLOCK_TOKENS))
    groups = _prefix_groups(trace.header, source)
    warm_up = trace.header.get("warm_up_requests", 0) or 0
    if isinstance(warm_up, bool) or not isinstance(warm_up, int) or warm_up < 0:
        where = str(source.path) if source is not None else "<trace>"
        raise ScenarioError(where, [("warm_up_requests", f"must be a whole number >= 0, got {warm_up!r}")])
    if source is not None:
        default_client = source.client_id or _stem(source.path)
        default_slo = source.slo_class or "default"
    else:
        default_client = Path(str(trace.header.get("source_file", "trace"))).stem or "trace"
        default_slo = "default"
    # The header's warm-up is the first requests by id (as the observer numbered them), which
    # a replay at send times or with sessions need not reach first.
    warm_ids = set(np.sort(trace.frame["request_id"].to_numpy())[:warm_up].tolist()) if warm_up else set()
    frame = trace.frame
    n = len(frame)
    t = frame["arrival_time_us"].to_numpy()
    order = None if n < 2 or bool(np.all(t[1:] >= t[:-1])) else np.argsort(t, kind="stable")
    # A field whose every row holds the request's own default is left to that default: the
    # request is the same, and a row's dict the smaller (one dict and one Request per row).
    passed = [(name, frame[TRACE_COLUMNS[name]].to_numpy()) for name in _PASSED_ON]
    if "priority" in frame.columns:
        passed.append(("priority", frame["priority"].to_numpy()))
    passed = [(name, values) for name, values in passed if not _all_default(name, values)]
    names = [name for name, _ in passed]
    blocks = frame["prefix_blocks"].to_numpy() if "prefix_blocks" in frame.columns else None
    group_column = frame["prefix_group"].to_numpy() if groups else None
    ids = frame["request_id"].to_numpy() if warm_ids else None
    columns = {
        name: frame[column].to_numpy()
        for name, column in (
            ("input", "input_tokens"),
            ("output", "output_tokens"),
            ("client", "client_id"),
            ("tenant", "tenant_id"),
            ("slo", "slo_class"),
        )
    }
    for start in range(0, n, _CHUNK):
        idx: Any = slice(start, min(start + _CHUNK, n)) if order is None else order[start : start + _CHUNK]
        cols = {name: values[idx].tolist() for name, values in columns.items()}
        rows = zip((t[idx] / 1e6).tolist(), cols["input"], cols["output"], cols["client"], cols["tenant"], cols["slo"], strict=True)
        m = len(cols["input"])
        passed_rows = zip(*(values[idx].tolist() for _, values in passed), strict=True) if passed else repeat((), m)
        block_texts = blocks[idx].tolist() if blocks is not None else repeat("", m)
        group_names = group_column[idx].tolist() if group_column is not None else repeat("", m)
        row_ids = ids[idx].tolist() if ids is not None else repeat(-1, m)
        for (arrival_s, prompt, output, client_id, tenant_id, slo_class), values, text, group, request_id in zip(
            rows, passed_rows, block_texts, group_names, row_ids, strict=True
        ):
            client = client_id or default_client
            fields: dict[str, Any] = {"client_id": client, "tenant_id": tenant_id or client, "slo_class": slo_class or default_slo}
            if values:
                fields.update(zip(names, values, strict=True))
            if text:
                fields["prefix_blocks"] = namespaced_blocks(_blocks(text), namespace)
                fields["prefix_block_tokens"] = block_tokens
            elif group in groups:
                fields.update(groups[group])
            if request_id in warm_ids:
                fields["warm_up"] = True
            yield arrival_s, max(prompt, 1), max(output, 1), fields


_CHUNK = 65536
"""Rows :func:`trace_rows` converts to Python values at a time (memory bounded on long traces)."""
_REQUEST_DEFAULTS = {f.name: f.default for f in attrs.fields(Request) if f.default is not attrs.NOTHING}


def _all_default(name: str, values: np.ndarray) -> bool:
    """Whether every one of *values* (a trace column, as its rows give it to the request's
    field *name*) is that field's default, of the default's type (a float also by its sign,
    so that -0.0 is kept)."""
    default = _REQUEST_DEFAULTS[name]
    if not len(values):
        return True
    kind = values.dtype.kind
    if isinstance(default, bool):
        ok = kind == "b"
    elif isinstance(default, int):
        ok = kind in "iu"
    elif isinstance(default, float):
        ok = kind == "f" and not bool(np.signbit(values).any())
    else:
        ok = isinstance(default, str) and kind in "OU"
    return ok and bool((values == default).all())
