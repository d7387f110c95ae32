"""The simulated request record: the one definition of its fields.

:class:`RequestRecord` is one request's fate as a run records it: a row of
:meth:`~simpy_llm.metrics.results.Results.to_dataframe` (before the derived
columns), an object of :meth:`~simpy_llm.metrics.results.Results.records`. Each
field is declared once, here, with its type, its docstring and, in its
``metadata``, where it comes from and where it goes; every other list of the
record's fields derives from :func:`attrs.fields` of the class:

* :data:`RECORD_COLUMNS`: one :class:`RecordColumn` per field, in order;
* :data:`RECORD_FIELDS`: ``(name, kind)`` per field, the recorder's columns (kind
  ``"i"``, ``"f"`` or ``"s"``, from the field's type);
* :data:`FRAME_DTYPES`: the dtype of each record column of ``to_dataframe()``;
* :data:`TRACE_COLUMNS`: the trace v2 column that carries a field, for the fields a
  trace v2 row has (:mod:`simpy_llm.workload.traces` replays them,
  :mod:`simpy_llm.calibrate.synthetic` writes them).

Adding a field here adds it everywhere; ``tests/unit/test_record_schema.py`` checks
that the recorder, the DataFrame and the trace columns agree with the class.

This module imports nothing of the package, so the lowest layer that needs the
record (the recorder) can.

Examples
--------
>>> RECORD_FIELDS[:3]
(('request_id', 'i'), ('client_id', 's'), ('tenant_id', 's'))
>>> RECORD_COLUMNS[0].attr, FRAME_DTYPES["arrival_s"], TRACE_COLUMNS["prompt_tokens"]
('id', 'float64', 'input_tokens')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import attrs

__all__ = ["FRAME_DTYPES", "RECORD_COLUMNS", "RECORD_FIELDS", "TRACE_COLUMNS", "RecordColumn", "RequestRecord"]

_SAME = "="
"""``attr`` of a field read from the request attribute of its own name."""
_FROM_TYPE = "from type"
"""``dtype`` of a field whose frame dtype follows from its type."""


def _column(
    *,
    attr: str | None = _SAME,
    read: Callable[[Any], Any] | None = None,
    trace: str | None = None,
    dtype: str | None = _FROM_TYPE,
) -> Any:
    """A record field, with where its values come from and go to in its ``metadata``.

    Parameters
    ----------
    attr
        The :class:`~simpy_llm.entities.Request` attribute the recorder reads (default: the
        field's own name); ``None``: the recorder supplies the value itself.
    read
        Applied to each attribute value before it is stored (default: stored as it is).
    trace
        The trace v2 column holding the same value, a field of the workload: a trace's
        replay gives it to the request, a simulated observation writes it (``None``:
        neither, the field is not a trace v2 column).
    dtype
        The column's dtype in ``to_dataframe()`` (default: from the field's type); ``None``:
        the dtype pandas infers from the values, not cast.
    """
    return attrs.field(metadata={"attr": attr, "read": read, "trace": trace, "dtype": dtype})


def _count(times: list[float] | None) -> int:
    """How many preemption times a request holds (``None``: never preempted)."""
    return 0 if times is None else len(times)


@attrs.frozen(kw_only=True)
class RequestRecord:
    """One request's fate (a row of :meth:`~simpy_llm.metrics.results.Results.to_dataframe`).

    Times are simulated seconds, NaN when the request never got there; string fields are
    empty when they do not apply.
    """

    request_id: int = _column(attr="id", trace="request_id")
    """Request number, unique within the run, in arrival order."""
    client_id: str = _column(trace="client_id")
    """The client that sent it."""
    tenant_id: str = _column(trace="tenant_id")
    """Its tenant, for per-tenant metrics (the client id unless given)."""
    slo_class: str = _column(trace="slo_class")
    """The SLO class whose targets decide whether it counts towards goodput."""
    status: str = _column(attr=None)
    """completed | dropped | in_flight (still in the system when the run stopped); the
    recorder writes it when the request leaves or the run ends."""
    replica: int = _column()
    """The replica it was routed to (its decode replica when disaggregated; -1: never routed)."""
    priority: int = _column()
    """User priority (higher is more important)."""
    streaming: int = _column(read=int, trace="streaming")
    """1 when the response streams, 0 when it reaches its client in one piece."""
    session_id: str = _column(trace="session_id")
    """The session it belongs to (empty for single requests)."""
    round_index: int = _column(trace="round_index")
    """Its round within its session, from 0 (the loop iteration of a workflow's step)."""
    step_id: str = _column()
    """The workflow step it runs (agentic sessions; empty otherwise)."""
    loop_iteration: int = _column()
    """The iteration of its workflow's loop it belongs to (0 outside a loop)."""
    prefix_group: str = _column(trace="prefix_group")
    """Its prefix-sharing group (empty: none)."""
    prefix_tokens: int = _column()
    """Leading prompt tokens shared with its group."""
    text_tokens: int = _column(trace="text_tokens")
    """Text part of the prompt (multimodal requests; 0 otherwise)."""
    image_tokens: int = _column(trace="image_tokens")
    """Image tokens in the prompt."""
    audio_tokens: int = _column(trace="audio_tokens")
    """Audio tokens in the prompt."""
    video_tokens: int = _column(trace="video_tokens")
    """Video tokens in the prompt."""
    reason_ratio: float = _column(trace="reason_ratio")
    """Share of the output that is reasoning tokens (reasoning models; 0 otherwise)."""
    prompt_tokens: int = _column(trace="input_tokens")
    """Input length, tokens."""
    output_tokens: int = _column(trace="output_tokens")
    """Output length it was to generate, tokens."""
    generated_tokens: int = _column()
    """Output tokens it produced (fewer than ``output_tokens`` when it did not complete)."""
    num_preemptions: int = _column(attr="preemption_times_s", read=_count)
    """How often it was preempted."""
    cached_tokens: int = _column()
    """Prompt tokens found in the prefix cache at its first admission."""
    arrival_s: float = _column()
    """It reached the serving system (the router), s; its client sent it ``upload_s``
    (and ``draft_wait_s``) before."""
    enqueue_s: float = _column()
    """It entered its replica's waiting queue, s."""
    first_scheduled_s: float = _column()
    """Start of the first engine step that computed any of its tokens, s."""
    first_token_s: float = _column()
    """The server sent its first output token, s (its client sees it ``download_s`` later)."""
    completion_s: float = _column()
    """The server sent its last output token, s."""
    dropped_reason: str = _column()
    """Why it was dropped (a short code: ``max_model_len`` or the admission policy's
    reason; empty unless dropped)."""
    warm_up: int = _column(read=int)
    """1 for a warm-up request of a replayed trace (simulated, left out of the summary)."""
    bin: int = _column()
    """Bin of the request-level batch server that queued it (-1: none)."""
    upload_s: float = _column()
    """Time its prompt spent crossing its client's network, s (0 without one)."""
    download_s: float = _column()
    """Time each output token took from the server to its client, s (0 without a network)."""
    prefill_replica: int = _column()
    """The replica that computed its prompt when prefill and decode are disaggregated
    (``replica`` is then its decode replica); -1 otherwise."""
    kv_transfer_s: float = _column()
    """Time its KV took from the prefill replica to the decode replica, s (0 unless
    disaggregated; NaN: a link lost it, and the request was dropped)."""
    # The speculative decoding text fields were added without a cast to "string": their
    # frame dtype is what pandas infers ("str" in pandas 3, object before it and for an
    # empty frame); kept so that frames and saved files stay as they were.
    draft_group: str = _column(dtype=None)
    """The draft group whose device drafted for it (speculative decoding; empty otherwise)."""
    draft_device: int = _column()
    """Its draft device's number within the group (-1: none)."""
    spec_mode: str = _column(dtype=None)
    """How its speculative decoding ran: ``distributed`` or ``fused`` (empty: none)."""
    drafter: str = _column(dtype=None)
    """The drafter of its last draft round (distributed; empty otherwise)."""
    spec_rounds: int = _column()
    """Verify rounds after its prefill."""
    drafted_tokens: int = _column()
    """Draft tokens proposed over its rounds."""
    accepted_tokens: int = _column()
    """Draft tokens the target accepted over its rounds."""
    tvt_s: float = _column()
    """Time to verified tokens: its longest round, from the start of drafting to the
    verdict reaching whoever drafted, s (NaN: no round)."""
    rollbacks: int = _column()
    """Rounds whose rejection fell on a position partial verification skipped."""
    draft_wait_s: float = _column()
    """Time it waited for its draft device to finish the device's previous request (and
    think), s; its client sent it at ``arrival_s - upload_s - draft_wait_s``."""


attrs.resolve_types(RequestRecord)  # field types as classes (this module's annotations are strings)


class RecordColumn(NamedTuple):
    """A record field as the code that stores and shows it needs it (from its declaration)."""

    name: str
    kind: str
    """``"i"`` (int), ``"f"`` (float) or ``"s"`` (string): how the recorder stores it."""
    attr: str | None
    """The request attribute it is read from (``None``: the recorder supplies it)."""
    read: Callable[[Any], Any] | None
    """Applied to each attribute value before it is stored (``None``: stored as it is)."""
    trace: str | None
    """Its trace v2 column (``None``: none)."""
    dtype: str | None
    """Its dtype in ``to_dataframe()`` (``None``: what pandas infers from its values)."""


_KINDS: dict[type, tuple[str, str]] = {int: ("i", "int64"), float: ("f", "float64"), str: ("s", "string")}
"""Recorder kind and frame dtype by field type (text as pandas' ``string``, with ``pd.NA``)."""


def _record_column(field: attrs.Attribute[Any]) -> RecordColumn:
    if field.type is None:  # every field is annotated, and resolve_types made the annotations classes
        raise TypeError(f"record field {field.name!r} has no type")
    kind, dtype = _KINDS[field.type]
    meta = field.metadata
    attr = field.name if meta["attr"] == _SAME else meta["attr"]
    if meta["dtype"] != _FROM_TYPE:
        dtype = meta["dtype"]
    return RecordColumn(field.name, kind, attr, meta["read"], meta["trace"], dtype)


RECORD_COLUMNS: tuple[RecordColumn, ...] = tuple(_record_column(field) for field in attrs.fields(RequestRecord))
"""Every record field, in order, with where it comes from and goes to."""

RECORD_FIELDS: tuple[tuple[str, str], ...] = tuple((c.name, c.kind) for c in RECORD_COLUMNS)
"""Record columns in order: ``(name, kind)`` where kind is ``"i"`` (int), ``"f"`` (float) or ``"s"`` (string)."""

FRAME_DTYPES: dict[str, str | None] = {c.name: c.dtype for c in RECORD_COLUMNS}
"""The dtype of each record column of ``Results.to_dataframe()``, in order (``None``: not
cast, what pandas infers from the values)."""

TRACE_COLUMNS: dict[str, str] = {c.name: c.trace for c in RECORD_COLUMNS if c.trace is not None}
"""The trace v2 column of each record field a trace v2 row carries, in record order."""
