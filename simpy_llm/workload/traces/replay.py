"""Replaying a trace: its requests in arrival order (:class:`TraceRequest`,
:func:`trace_requests`) and the rows the workload generator reads (:func:`trace_rows`), with
each row's fields for the simulated record, its prefix blocks kept apart from other traces', and
the shared prefixes of the prefix groups the header names.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from simpy_llm.config.errors import ScenarioError
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
_passed_on = attrgetter(*(TRACE_COLUMNS[name] for name in _PASSED_ON))


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
    1-token response. *fields* carries the request's identity, session,
    prefix group, modality and reasoning fields, and, when the trace has
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
    for r in trace_requests(trace):
        client = r.client_id or default_client
        fields: dict[str, Any] = {
            "client_id": client,
            "tenant_id": r.tenant_id or client,
            "slo_class": r.slo_class or default_slo,
            "priority": r.priority,
        }
        fields.update(zip(_PASSED_ON, _passed_on(r), strict=True))
        if r.prefix_blocks:
            fields["prefix_blocks"] = namespaced_blocks(r.prefix_blocks, namespace)
            fields["prefix_block_tokens"] = block_tokens
        elif r.prefix_group in groups:
            fields.update(groups[r.prefix_group])
        if r.request_id in warm_ids:
            fields["warm_up"] = True
        yield r.arrival_s, max(r.input_tokens, 1), max(r.output_tokens, 1), fields
