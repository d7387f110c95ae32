"""Request traces: the trace v2 format, importers of public traces, and replay.

A :class:`Trace` is a header (a dict) and a :class:`pandas.DataFrame` with one
row per request and the trace v2 columns (:data:`V2_COLUMNS`, seed 000 §7).
Times in the frame stay in the trace v2 unit, integer **microseconds**:
``arrival_time_us`` is ``int64`` and always present; ``send_time_us``,
``first_chunk_time_us``, ``last_chunk_time_us`` and ``num_chunks`` are nullable
``Int64`` (``<NA>`` when not measured). :meth:`Trace.arrival_s` gives the
arrival times in seconds.

Files
-----
A trace v2 is two files sharing a stem: ``<stem>.yaml`` (the header) beside
``<stem>.csv`` (the requests). Every function that takes a trace v2 path
accepts the CSV, the YAML, the stem, or a directory (then the stem is
``<directory>/trace``); see :func:`trace_v2_paths`. :func:`write_trace_v2`
writes a whole trace at once, :class:`TraceV2Writer` one row at a time (each
row flushed, so a run cut short leaves a readable file).

Importers (:func:`read_azure`, :func:`read_mooncake`, :func:`read_burstgpt`,
:func:`read_csv_mapped`) return a :class:`Trace` in the same layout.
:func:`load_trace` reads the file a scenario's ``TraceSource`` names and applies
its defaults, ``max_requests`` and time scaling; :func:`trace_requests` and
:func:`trace_rows` turn a trace into requests in arrival order.

Every malformed file raises :class:`~simpy_llm.config.ScenarioError` whose
``source`` is the file and whose problems name the line (``"line 7, column
input_tokens"``); a file is either loaded whole or not at all.

Modules
-------
The names above are defined in the submodules and imported here:
:mod:`~simpy_llm.workload.traces.columns` (the columns, :class:`Trace` and the parsing of
cells), :mod:`~simpy_llm.workload.traces.v2` (trace v2 files),
:mod:`~simpy_llm.workload.traces.imported` (the public trace formats),
:mod:`~simpy_llm.workload.traces.loading` (checking and loading a ``TraceSource``, the
``server`` block) and :mod:`~simpy_llm.workload.traces.replay` (requests in arrival order).
A setting such as ``LOADED_TRACES_KEPT`` is read in its submodule: set it there
(``simpy_llm.workload.traces.loading.LOADED_TRACES_KEPT = 0``).

Examples
--------
>>> trace = read_mooncake("data/mooncake/synthetic_trace.jsonl")
>>> len(trace), trace.header["prefix_block_tokens"]
(3993, 512)
>>> first = next(trace_requests(trace))
>>> first.arrival_s, first.input_tokens, first.output_tokens, first.prefix_blocks[:3]
(0.0, 40160, 6, (0, 1, 2))
"""

from __future__ import annotations

from simpy_llm.workload.traces.columns import (
    EXTENSION_COLUMNS,
    OBSERVED_COLUMNS,
    TIME_UNIT,
    TRACE_VERSION,
    V2_COLUMNS,
    Trace,
    normalize_frame,
    us_from_s,
)
from simpy_llm.workload.traces.imported import (
    CSV_FIELDS,
    MOONCAKE_BLOCK_TOKENS,
    read_azure,
    read_burstgpt,
    read_csv_mapped,
    read_mooncake,
)
from simpy_llm.workload.traces.loading import CHECKED_TRACES_KEPT as CHECKED_TRACES_KEPT
from simpy_llm.workload.traces.loading import LLAMACPP_BLOCK_KEYS as LLAMACPP_BLOCK_KEYS
from simpy_llm.workload.traces.loading import LOADED_TRACES_KEPT as LOADED_TRACES_KEPT
from simpy_llm.workload.traces.loading import SERVER_BLOCK_KEYS as SERVER_BLOCK_KEYS
from simpy_llm.workload.traces.loading import (
    TraceFileInfo,
    check_trace_files,
    load_trace,
)
from simpy_llm.workload.traces.loading import emulated_server_block as emulated_server_block
from simpy_llm.workload.traces.loading import server_block_mismatches as server_block_mismatches
from simpy_llm.workload.traces.replay import _RECORD_COLUMNS as _RECORD_COLUMNS
from simpy_llm.workload.traces.replay import (
    TraceRequest,
    trace_requests,
    trace_rows,
)
from simpy_llm.workload.traces.v2 import (
    TraceV2Writer,
    read_trace_v2,
    trace_v2_paths,
    write_generated_trace,
    write_trace_v2,
)

__all__ = [
    "CSV_FIELDS",
    "EXTENSION_COLUMNS",
    "MOONCAKE_BLOCK_TOKENS",
    "OBSERVED_COLUMNS",
    "TIME_UNIT",
    "TRACE_VERSION",
    "V2_COLUMNS",
    "Trace",
    "TraceFileInfo",
    "TraceRequest",
    "TraceV2Writer",
    "check_trace_files",
    "load_trace",
    "normalize_frame",
    "read_azure",
    "read_burstgpt",
    "read_csv_mapped",
    "read_mooncake",
    "read_trace_v2",
    "trace_requests",
    "trace_rows",
    "trace_v2_paths",
    "us_from_s",
    "write_generated_trace",
    "write_trace_v2",
]
