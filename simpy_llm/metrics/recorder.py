"""The Recorder: what components report, kept as compact columns.

Components call the ``on_*`` methods; nothing is patched in. Per-request
records are appended column by column (``array`` of machine numbers, string
fields as small integer codes), so a million records cost at most 8 bytes per
column each (~370 MB for the 46 columns), not the gigabytes a million Python
objects would. A column that has held one value so far (most of a run's: the
speculative columns without speculation, the network's without a network, the
modality counts of a text workload...) is kept as that value and a count, not
an array: the quickstart's million records hold 12 arrays, ~100 MB. The
record's columns, their kinds and the request attribute each is read from come
from :class:`~simpy_llm.metrics.record.RequestRecord`.
"""

from __future__ import annotations

import struct
from array import array
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from simpy_llm.entities import RequestStatus
from simpy_llm.metrics.monitors import LevelMonitor, WeightedTally
from simpy_llm.metrics.record import RECORD_COLUMNS, RECORD_FIELDS

if TYPE_CHECKING:
    from simpy_llm.entities import Batch, Request
    from simpy_llm.serving.prefix_cache import CpuTier

__all__ = ["RECORD_FIELDS", "SPEC_ROUND_FIELDS", "ColumnLog", "RecordSink", "Recorder"]

_FROM_REQUEST = tuple(c for c in RECORD_COLUMNS if c.attr is not None)
"""Record columns read from the request (the rest, its status, the recorder supplies)."""
_REQUEST_ATTRS = tuple(c.attr for c in _FROM_REQUEST if c.attr is not None)  # each has one; the test narrows the type
_FLUSH_EVERY = 4096


def _reader(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """A function returning the tuple of an object's attributes *names*, in order: what
    ``operator.attrgetter(*names)`` returns, compiled as the expression
    ``(r.a, r.b, ...)``, whose attribute reads the interpreter specialises to the class's
    slots (about a third less time a record than ``attrgetter``'s lookups by name).

    >>> _reader(("real", "imag"))(3 + 4j)
    (3.0, 4.0)
    """
    if not all(name.isidentifier() for name in names):
        raise ValueError(f"not attribute names: {names!r}")
    source = "lambda r: (" + "".join(f"r.{name}, " for name in names) + ")"
    reader: Callable[[Any], tuple[Any, ...]] = eval(compile(source, "<record reader>", "eval"), {})  # the names are checked above
    return reader


def _packed(typecode: str, numbers: list[Any]) -> bytes:
    """*numbers* as the machine values an ``array`` of *typecode* (``"d"`` or ``"q"``) holds,
    converted and checked as the array would (a float refused as an integer, an integer out of
    range refused), a few times faster than ``fromlist``, which parses each number as a call's
    argument.

    >>> array("d", [0.5, -0.0]).tobytes() == _packed("d", [0.5, -0.0])
    True
    """
    return struct.pack(f"{len(numbers)}{typecode}", *numbers)


class _Codes:
    """Interns strings as small integers, in first-seen order."""

    __slots__ = ("codes", "names")

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        self.names: list[str] = []

    def __call__(self, name: str) -> int:
        code = self.codes.get(name)
        if code is None:
            code = self.codes[name] = len(self.names)
            self.names.append(name)
        return code


SPEC_ROUND_FIELDS: tuple[tuple[str, str], ...] = (
    ("time_s", "f"), ("request_id", "i"), ("replica", "i"), ("draft_group", "s"), ("draft_device", "i"),
    ("mode", "s"), ("drafter", "s"), ("gamma", "i"), ("accepted", "f"), ("tokens", "i"),
    ("context_tokens", "i"), ("tvt_s", "f"), ("rollback", "i"),
)
"""Fields of a speculative round's record, in order (see :meth:`Recorder.on_spec_round`)."""
TREE_ROUND_FIELDS: tuple[tuple[str, str], ...] = (("round", "i"), ("tree_depth", "i"), ("tree_width", "i"))
"""Fields of a tree round's record (see :meth:`Recorder.on_tree_round`)."""
CHAIN_ROUND_FIELDS: tuple[tuple[str, str], ...] = (("round", "i"), ("mid_accepted", "f"), ("mid_steps", "f"))
"""Fields of a chained round's record (see :meth:`Recorder.on_chain_round`)."""


class ColumnLog:
    """Rows of fixed fields kept as columns: an ``array`` per number field, interned codes per
    string field, filled from a buffer of row tuples every :data:`_FLUSH_EVERY` rows. A
    million rows cost ~100 MB, not the gigabyte a million tuples would (and no garbage
    collector time).

    >>> log = ColumnLog((("t", "f"), ("who", "s")))
    >>> log.append((0.5, "a")); log.append((1.0, "b")); len(log)
    2
    >>> {k: v.tolist() for k, v in log.columns().items()}
    {'t': [0.5, 1.0], 'who': ['a', 'b']}
    """

    __slots__ = ("_buffer", "_codes", "_columns", "fields")

    def __init__(self, fields: tuple[tuple[str, str], ...]) -> None:
        self.fields = fields
        self._columns = {name: array("d" if kind == "f" else "q") for name, kind in fields}
        self._codes = {name: _Codes() for name, kind in fields if kind == "s"}
        self._buffer: list[tuple] = []

    def append(self, row: tuple) -> None:
        """Add one row (a tuple in field order)."""
        self._buffer.append(row)
        if len(self._buffer) >= _FLUSH_EVERY:
            self._flush()

    def __len__(self) -> int:
        return len(self._columns[self.fields[0][0]]) + len(self._buffer)

    def _flush(self) -> None:
        if not self._buffer:
            return
        for (name, kind), values in zip(self.fields, zip(*self._buffer, strict=True), strict=True):
            if kind == "s":
                codes = self._codes[name]
                for value in dict.fromkeys(values):
                    codes(value)
                self._columns[name].fromlist(list(map(codes.codes.__getitem__, values)))
            else:
                self._columns[name].fromlist(list(values))  # fromlist: about twice extend's speed
        self._buffer = []

    def columns(self) -> dict[str, np.ndarray]:
        """The columns as numpy arrays (strings decoded, as objects)."""
        self._flush()
        out: dict[str, np.ndarray] = {}
        for name, kind in self.fields:
            arr = np.frombuffer(self._columns[name], dtype=np.float64 if kind == "f" else np.int64).copy()
            if kind == "s":
                names = np.array(self._codes[name].names, dtype=object)
                arr = names[arr] if arr.size else np.array([], dtype=object)
            out[name] = arr
        return out


class _HeldColumns(Mapping[str, array]):
    """A recorder's columns by name; looking one up gives it as an array (a column kept as
    one value becomes an array then, and stays one)."""

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder

    def __getitem__(self, name: str) -> array:
        return self._recorder.column_array(name)

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in RECORD_FIELDS)

    def __len__(self) -> int:
        return len(RECORD_FIELDS)


class RecordSink(Protocol):
    """Where a recorder hands its records over as the run goes (streamed records,
    :class:`~simpy_llm.metrics.stream.RecordStream`)."""

    chunk_size: int
    """Records per :meth:`write`."""

    def write(self, columns: dict[str, np.ndarray]) -> None:
        """Take *chunk_size* records (the last chunk: the rest), as columns with strings decoded."""


class Recorder:
    """Collects per-request records, preemptions, step statistics and levels.

    With a :attr:`sink`, the records leave the recorder in chunks of the sink's
    ``chunk_size`` as they come (checked when the buffered rows are moved into the columns,
    every :data:`_FLUSH_EVERY` records, so recording a request costs the same), and
    :meth:`finish_stream` hands over the rest: the columns then hold at most a chunk and
    a buffer.
    """

    def __init__(self, num_replicas: int = 1) -> None:
        self._columns: dict[str, array] = {
            name: array("d" if kind == "f" else "q") for name, kind in RECORD_FIELDS
        }
        self._single: dict[str, bytes] = dict.fromkeys(self._columns, b"")
        """Columns that have held one value so far: its 8 bytes (``b""`` before any record);
        such a column's array stays empty, and :attr:`_rows` says how many records it holds."""
        self._rows = 0
        """Records in the columns (the buffer not counted)."""
        self._buffer: list[Any] = []
        """The buffered records' fields read from the request, record after record (one per
        :data:`_FROM_REQUEST` column each); their statuses are in :attr:`_status`."""
        self._status: list[str] = []
        self._fields_of = _reader(_REQUEST_ATTRS)
        self.codes: dict[str, _Codes] = {name: _Codes() for name, kind in RECORD_FIELDS if kind == "s"}
        self.sessions: list[tuple[str, str, int, str]] = []
        """(session_id, client_id, rounds, end_reason) per ended session."""
        self.tool_calls: list[tuple] = []
        """Per returned tool call: see :meth:`on_tool_call`."""
        self.cold_starts: list[tuple[int, float, float]] = []
        """(replica, start_s, end_s) per model load of a replica with a cold start."""
        self.kv_transfers = array("d")
        """(request_id, prefill replica, decode replica, bytes, start_s, end_s) per KV transfer, flat:
        six doubles a transfer (ids below 2**53 are exact), so that a run of a million hand-offs
        leaves no object behind for the garbage collector to walk."""
        self.kv_tiers: dict[int, CpuTier] = {}
        """The CPU tier of each replica's prefix cache that has one (``EngineConfig.kv_offload_blocks``),
        by replica index: its counters, updated as the run goes."""
        self.workflow_sessions: list[tuple] = []
        """Per agentic session: see :func:`~simpy_llm.workload.sessions.session_record`."""
        self.preemptions: list[tuple[int, int, float, str]] = []
        """(request_id, replica, time_s, mode) per preemption (mode: recompute or swap)."""
        self.samples: list[tuple[float, int, int, int, int, int]] = []
        """(time_s, replica, waiting, running, kv_used_blocks, busy) per time-series sample."""
        self.batches: list[tuple[int, int, int, int, float, float, float, int, int, int, int]] = []
        """(replica, batch id, bin, size, formed_s, start_s, end_s, b_target, b_mem, b_sla,
        memory_tokens) per batch a request-level batch server finished."""
        self.spec_rounds = ColumnLog(SPEC_ROUND_FIELDS)
        """Per speculative round: see :meth:`on_spec_round`."""
        self.tree_rounds = ColumnLog(TREE_ROUND_FIELDS)
        """Per tree-drafted round: see :meth:`on_tree_round`."""
        self.chain_rounds = ColumnLog(CHAIN_ROUND_FIELDS)
        """Per chained round: see :meth:`on_chain_round`."""
        self.drafter_switches: list[tuple] = []
        """Per drafter escalation: see :meth:`on_drafter_switch`."""
        self.itl = WeightedTally()
        """Inter-token latencies, s (weighted: one weight per token)."""
        # The tally's own add, bound: the engines call it a few times per request, and a
        # method forwarding to it would be one Python call more each time.
        self.on_token_gaps: Callable[[float, int], None] = self.itl.add
        """``on_token_gaps(gap_s, count)``: *count* output tokens each followed their
        predecessor by *gap_s*."""
        self.batch_steps: Counter[int] = Counter()
        """Engine steps per batch size (requests in the step)."""
        self._in_system = LevelMonitor()
        self._level_inline = True
        """Whether :attr:`in_system` is a plain :class:`LevelMonitor`, whose change the arrivals
        and departures make inline (a subclass's own change is called)."""
        self.num_replicas = num_replicas
        self.steps = [0] * num_replicas
        self.busy_s = [0.0] * num_replicas
        self.energy_j: list[float | None] = [None] * num_replicas
        """Energy of each replica's steps from its latency model's table, J (None: the model has none)."""
        self.kv_block_seconds = [0.0] * num_replicas
        self.prefill_tokens = [0] * num_replicas
        self.decode_tokens = [0] * num_replicas
        self.arrived = 0
        self.live: dict[int, Request] = {}
        """Requests that arrived and have not completed or been dropped."""
        self.arrival_log: list[Request] | None = None
        """Every arriving request, in arrival order, when someone asked for them (the
        planner's telemetry, which trims it); None: not kept."""
        self.sink: RecordSink | None = None
        """Where the records go in chunks as they come (None: they stay here to the end)."""
        self.spilled_extremes: list[tuple[float, float]] = []
        """Per chunk handed to the sink: its latest completion (NaN ignored, at least 0) and its
        latest arrival (NaN if one is), so that the run's end is known without its records."""

    @property
    def in_system(self) -> LevelMonitor:
        """Requests between arrival and their last token being computed."""
        return self._in_system

    @in_system.setter
    def in_system(self, monitor: LevelMonitor) -> None:
        self._in_system = monitor
        self._level_inline = type(monitor) is LevelMonitor

    # --- lifecycle -------------------------------------------------------
    def on_arrival(self, req: Request, now_s: float) -> None:
        """A request entered the serving system."""
        self.arrived += 1
        self.live[req.id] = req
        level = self._in_system
        if self._level_inline:
            # level.change(now_s, +1), inline (once per request: a call fewer).
            last = level._last_s  # noqa: SLF001 - the monitor's change, inline
            count = level.level
            if now_s > last:
                level._area += count * (now_s - last)  # noqa: SLF001
                level._last_s = now_s  # noqa: SLF001
            level.level = count = count + 1
            if count > level.peak:
                level.peak = count
        else:
            level.change(now_s, +1)
        if self.arrival_log is not None:
            self.arrival_log.append(req)

    def on_departure(self, now_s: float) -> None:
        """A request left the serving system (its last token computed, or dropped)."""
        level = self._in_system
        if self._level_inline:
            # level.change(now_s, -1), inline (once per request: a call fewer); a decrease
            # never raises the peak.
            last = level._last_s  # noqa: SLF001 - the monitor's change, inline
            if now_s > last:
                level._area += level.level * (now_s - last)  # noqa: SLF001
                level._last_s = now_s  # noqa: SLF001
            level.level -= 1
        else:
            level.change(now_s, -1)

    def on_departures(self, now_s: float, count: int) -> None:
        """*count* requests left the serving system at once (a batch ended)."""
        self.in_system.change(now_s, -count)

    def on_complete(self, req: Request) -> None:
        """A request produced its last token."""
        del self.live[req.id]
        # _append(req, COMPLETED), inline: once per request.
        self._buffer += self._fields_of(req)
        status_list = self._status
        status_list.append(RequestStatus.COMPLETED)
        if len(status_list) >= _FLUSH_EVERY:
            self._flush()

    def on_drop(self, req: Request) -> None:
        """A request was rejected (e.g. longer than the model allows)."""
        del self.live[req.id]
        self._append(req, RequestStatus.DROPPED)

    def on_in_flight(self, req: Request) -> None:
        """A request still in the system when the simulation stopped."""
        self._append(req, RequestStatus.IN_FLIGHT)

    def on_preemption(self, req: Request, replica: int, now_s: float, mode: str = "recompute") -> None:
        """A running request lost its KV blocks (recomputed later, or swapped out to CPU
        memory) and went back to the waiting queue."""
        self.preemptions.append((req.id, replica, now_s, mode))

    def on_sample(self, now_s: float, replica: int, waiting: int, running: int, kv_used_blocks: int, busy: bool) -> None:
        """A time-series sample of one replica's state."""
        self.samples.append((now_s, replica, waiting, running, kv_used_blocks, int(busy)))

    def on_session_end(self, session_id: str, client_id: str, rounds: int, reason: str) -> None:
        """A session ended after *rounds* rounds, for *reason* (see ``workload.sessions``)."""
        self.sessions.append((session_id, client_id, rounds, reason))

    def on_tool_call(self, record: tuple) -> None:
        """A tool call of an agentic session returned: (session_id, client_id, step_id, tool,
        loop_iteration, instance, start_s, wait_s, end_s, latency_s, output_tokens)."""
        self.tool_calls.append(record)

    def on_kv_transfer(self, request_id: int, prefill: int, decode: int, size_bytes: float, start_s: float, end_s: float) -> None:
        """A request's KV crossed from replica *prefill* to replica *decode* (disaggregation)."""
        self.kv_transfers.extend((request_id, prefill, decode, size_bytes, start_s, end_s))

    def on_cold_start(self, replica: int, start_s: float, end_s: float) -> None:
        """*replica* loaded its model from *start_s* to *end_s* (busy, before serving)."""
        self.cold_starts.append((replica, start_s, end_s))
        self.busy_s[replica] += end_s - start_s

    def on_spec_round(self, record: tuple) -> None:
        """A speculative round's verify pass ended: (time_s, request_id, replica, draft_group,
        draft_device, mode, drafter, gamma, accepted, tokens, context_tokens, tvt_s, rollback)."""
        self.spec_rounds.append(record)

    def on_tree_round(self, record: tuple) -> None:
        """The speculative round just recorded drafted a tree: (its row in :attr:`spec_rounds`,
        tree_depth, tree_width)."""
        self.tree_rounds.append(record)

    def on_chain_round(self, record: tuple) -> None:
        """The speculative round just recorded was chained: (its row in :attr:`spec_rounds`,
        mid_accepted, mid_steps)."""
        self.chain_rounds.append(record)

    def on_drafter_switch(self, record: tuple) -> None:
        """A request escalated to a larger drafter: (time_s, request_id, draft_group,
        draft_device, from_drafter, to_drafter)."""
        self.drafter_switches.append(record)

    def on_workflow_session(self, record: tuple) -> None:
        """An agentic session's figures (see :func:`~simpy_llm.workload.sessions.session_record`)."""
        self.workflow_sessions.append(record)

    # --- engine steps ----------------------------------------------------
    def on_steps(
        self,
        replica: int,
        step_s: float,
        steps: int,
        batch_size: int,
        prefill_tokens: int,
        decode_tokens: int,
        kv_block_seconds: float,
    ) -> None:
        """*steps* identical engine steps of *step_s* each ran on *replica*.

        *prefill_tokens* and *decode_tokens* are per step; *kv_block_seconds*
        is the integral of used KV blocks over the steps.
        """
        self.steps[replica] += steps
        self.busy_s[replica] += step_s * steps
        self.kv_block_seconds[replica] += kv_block_seconds
        if prefill_tokens:  # (none in a stretch of decode steps, the usual call)
            self.prefill_tokens[replica] += prefill_tokens * steps
        self.decode_tokens[replica] += decode_tokens * steps
        self.batch_steps[batch_size] += steps

    def on_energy(self, replica: int, joules: float) -> None:
        """*replica*'s steps took *joules* by its latency model's table of step energies."""
        self.energy_j[replica] = (self.energy_j[replica] or 0.0) + joules

    def on_busy(self, replica: int, seconds: float) -> None:
        """*replica* was busy *seconds* more than its reported steps say (a batch cut by the end of the run)."""
        self.busy_s[replica] += seconds

    def on_batch(self, replica: int, batch: Batch) -> None:
        """A request-level batch server finished *batch*."""
        self.batches.append(
            (replica, batch.id, batch.bin, batch.size, batch.formed_s, batch.start_s, batch.end_s,
             batch.b_target, batch.b_mem, batch.b_sla, batch.memory_tokens)
        )

    def on_token_burst(self, gap_s: float, count: int) -> None:
        """*count* output tokens reached the client together, the first *gap_s* after its
        predecessor (a speculative round's accepted prefix and the target's token)."""
        itl = self.itl
        itl.add(gap_s, 1)
        if count > 1:
            itl.add(0.0, count - 1)

    # --- internals ------------------------------------------------------
    def _append(self, req: Request, status: str) -> None:
        # The record's fields in one call (reads of the request's slots), laid end to end in
        # one flat list (no tuple kept per record); the columns are filled in batches.
        self._buffer += self._fields_of(req)
        status_list = self._status
        status_list.append(status)
        if len(status_list) >= _FLUSH_EVERY:
            self._flush()

    def _flush(self) -> None:
        status = self._status
        if not status:
            return
        buffer = self._buffer
        width = len(_FROM_REQUEST)
        single = self._single
        n = len(status)
        i = 0
        for column in RECORD_COLUMNS:
            name = column.name
            values: list[Any]
            if column.attr is None:
                values = status  # the one column the record leaves to the recorder
            else:
                values = buffer[i::width]  # this column's values, record by record (a C-level slice)
                i += 1
            kind = column.kind
            target = self._columns[name]
            held = single.get(name)  # None: the column is an array already
            first = values[0]
            # One value throughout (a C-level count: equal objects, or the same one)? Then one
            # number to the bit, except a float zero, whose sign equality does not see; a
            # column read through a function (int, a count: equal values read equal) is read
            # once.
            if held is not None and values.count(first) == n:
                one = first if column.read is None else column.read(first)
                if not (kind == "f" and one == 0.0):
                    value = _packed(target.typecode, [self.codes[name](one) if kind == "s" else one])
                    if not held or held == value:
                        single[name] = value
                        continue
                    del single[name]
                    target.frombytes(held * self._rows)
                    target.frombytes(value * n)
                    continue
            numbers: list[Any]
            if kind == "s":
                codes = self.codes[name]
                for value in dict.fromkeys(values):  # new names in first-seen order, then one C-level pass
                    if value not in codes.codes:
                        codes(value)
                numbers = list(map(codes.codes.__getitem__, values))
            elif column.read is not None:
                numbers = list(map(column.read, values))
            else:
                numbers = values
            raw = _packed(target.typecode, numbers)
            if held is not None:
                # Compared as bytes: the same value to the bit (-0.0 is not 0.0, NaNs keep their payload).
                value = held or raw[:8]
                if raw == value * n:
                    single[name] = value
                    continue
                del single[name]
                target.frombytes(value * self._rows)
            target.frombytes(raw)
        self._rows += len(status)
        self._buffer = []
        self._status = []
        if self.sink is not None:
            self._spill(self.sink, self.sink.chunk_size)

    def _spill(self, sink: RecordSink, size: int) -> None:
        """Hand the oldest whole chunks of *size* records to *sink* and forget them."""
        held = self._rows
        whole = held - held % size
        for start in range(0, whole, size):
            chunk = self._decoded(start, start + size)
            self.spilled_extremes.append(
                (float(np.nanmax(chunk["completion_s"], initial=0.0)), float(chunk["arrival_s"].max(initial=0.0)))
            )
            sink.write(chunk)
        if whole:
            for name, target in self._columns.items():
                if name not in self._single:
                    del target[:whole]
            self._rows -= whole

    def _decoded(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Records *start* to *stop* of the columns, in the order recorded, strings decoded."""
        out: dict[str, np.ndarray] = {}
        for name, kind in RECORD_FIELDS:
            dtype = np.float64 if kind == "f" else np.int64
            if name in self._single:
                arr = np.frombuffer(self._single[name] * (stop - start), dtype=dtype)
            else:
                arr = np.frombuffer(self._columns[name], dtype=dtype)[start:stop].copy()
            if kind == "s":
                names = np.array(self.codes[name].names, dtype=object)
                arr = names[arr] if arr.size else np.array([], dtype=object)
            out[name] = arr
        return out

    def finish_stream(self) -> None:
        """Hand every record still held to the sink (the last chunk holds the rest); no-op without one."""
        sink = self.sink
        if sink is None:
            return
        self._flush()
        held = self._rows
        if held:
            self._spill(sink, held)

    @property
    def rows(self) -> int:
        """Records held (those handed to a sink not counted)."""
        self._flush()
        return self._rows

    @property
    def columns(self) -> Mapping[str, array]:
        """Record columns so far (string fields as codes into ``codes[name].names``), each an
        array when looked up (:meth:`column_array`)."""
        self._flush()
        return _HeldColumns(self)

    def column_array(self, name: str) -> array:
        """Column *name* as an array (a column kept as one value is written out, and kept so)."""
        self._flush()
        value = self._single.pop(name, None)
        if value is not None:
            self._columns[name].frombytes(value * self._rows)
        return self._columns[name]

    def single_value(self, name: str) -> bytes | None:
        """The 8 bytes of the one value column *name* has held in every record so far (a
        float64 or an int64; a string's code), or None: it holds several, or no record."""
        self._flush()
        return self._single.get(name) or None

    def take_column(self, name: str) -> array:
        """Hand column *name* over as an array, leaving it empty here: a run's Results take the
        records one column at a time, so the records are never held twice."""
        taken = self.column_array(name)
        self._columns[name] = array(taken.typecode)
        self._single.pop(name, None)
        return taken
