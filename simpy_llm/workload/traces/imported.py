"""Importers of public traces, each returning a :class:`~simpy_llm.workload.traces.Trace` in
the trace v2 layout: the Azure LLM inference trace 2023 (:func:`read_azure`), Mooncake JSONL
(:func:`read_mooncake`), BurstGPT (:func:`read_burstgpt`) and any CSV with a mapping of trace
fields to its columns (:func:`read_csv_mapped`), with the columns and keys each format needs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from simpy_llm.config.errors import ScenarioError
from simpy_llm.workload.prefix import MAX_TRACE_BLOCK_ID
from simpy_llm.workload.traces.columns import (
    EXTENSION_COLUMNS,
    TIME_UNIT,
    TRACE_VERSION,
    V2_COLUMNS,
    Trace,
    _is_int,
    _parse_columns,
    _parse_datetime_us,
    _parse_float,
    _parse_int,
    _Problems,
    _read_csv_strings,
    _require_columns,
    _strings,
)

__all__ = [
    "CSV_FIELDS",
    "MOONCAKE_BLOCK_TOKENS",
    "read_azure",
    "read_burstgpt",
    "read_csv_mapped",
    "read_mooncake",
]


MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per Mooncake ``hash_ids`` entry."""

CSV_FIELDS: tuple[str, ...] = (
    *(c for c in V2_COLUMNS if c != "arrival_time_us"),
    *EXTENSION_COLUMNS,
    "arrival_time_s",
    "arrival_time_ms",
    "arrival_time_us",
    "arrival_datetime",
)
"""Trace fields :func:`read_csv_mapped` can map a column to (exactly one ``arrival_*``)."""
_ARRIVAL_FIELDS = ("arrival_time_s", "arrival_time_ms", "arrival_time_us", "arrival_datetime")
_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
"""The columns :func:`read_azure` needs."""
_BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
"""The columns :func:`read_burstgpt` needs."""
_MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
"""The keys every object of a Mooncake JSONL trace has."""


# --------------------------------------------------------------------------- importers


def _imported_header(path: Path | str, fmt: str, **extra: Any) -> dict[str, Any]:
    return {
        "trace_version": TRACE_VERSION,
        "time_unit": TIME_UNIT,
        "mode": "real",
        "source_format": fmt,
        "source_file": Path(path).name,
        **extra,
    }


def read_azure(path: Path | str) -> Trace:
    """The Azure LLM inference trace 2023 CSV at *path* (``TIMESTAMP``, ``ContextTokens``,
    ``GeneratedTokens``; e.g. ``data/azure_llm_2023/AzureLLMInferenceTrace_conv.csv``).

    ``arrival_time_us`` is the time since the earliest ``TIMESTAMP`` (the first
    row: the files are in time order), in microseconds; the files' 100-ns
    ticks are rounded to the nearest microsecond (in the shipped files the
    seventh digit is always 0, so nothing is lost). ``input_tokens`` =
    ``ContextTokens``, ``output_tokens`` = ``GeneratedTokens``; other columns
    take their defaults. The header's ``start_time`` is the earliest
    ``TIMESTAMP`` as written in the file.

    >>> t = read_azure("data/azure_llm_2023/AzureLLMInferenceTrace_code.csv")
    >>> len(t), t.frame.arrival_time_us.iloc[:2].tolist(), t.header["start_time"]
    (8819, [0, 52000], '2023-11-16 18:17:03.9799600')
    """
    df, lines = _read_csv_strings(path)
    problems = _Problems(path)
    _require_columns(df, _AZURE_COLUMNS, problems)
    inputs = _parse_int(df["ContextTokens"], lines, "ContextTokens", problems, non_negative=True)
    outputs = _parse_int(df["GeneratedTokens"], lines, "GeneratedTokens", problems, non_negative=True)
    problems.raise_if_any()
    arrivals, start = _parse_datetime_us(df["TIMESTAMP"], lines, "TIMESTAMP", problems)
    frame = {"arrival_time_us": arrivals, "input_tokens": inputs, "output_tokens": outputs}
    return Trace(_imported_header(path, "azure", start_time=start), frame)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def read_mooncake(path: Path | str) -> Trace:
    """The Mooncake JSONL trace at *path* (one object a line: ``timestamp`` in ms,
    ``input_length``, ``output_length``, ``hash_ids``).

    ``arrival_time_us`` = ``timestamp`` x 1000 (already relative to the trace
    start; fractional milliseconds are rounded to the microsecond).
    ``hash_ids`` (optional; whole numbers in [0, 2**63)) become the column ``prefix_blocks``:
    the ids as decimal text separated by single spaces (``"0 1 2"``); each covers
    :data:`MOONCAKE_BLOCK_TOKENS` prompt tokens (``header["prefix_block_tokens"]``),
    equal ids = the same prompt prefix within this trace (a replay keeps each trace's ids
    apart: :func:`~simpy_llm.workload.traces.trace_rows`). ``prefix_group`` is the first id
    (requests in one group share at least their first block; ``""`` without
    ids). Blank lines are skipped; other keys are ignored.
    """
    source = str(path)
    problems = _Problems(source)
    times: list[int] = []
    inputs: list[int] = []
    outputs: list[int] = []
    blocks: list[str] = []
    groups: list[str] = []
    try:
        f = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        raise ScenarioError(source, [("", "file not found")]) from None
    except IsADirectoryError:
        raise ScenarioError(source, [("", "is a directory, expected a JSONL file")]) from None
    with f:
        try:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"line {lineno}"
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    problems.add(where, f"not valid JSON: {exc.msg} (column {exc.colno})")
                    continue
                if not isinstance(obj, dict):
                    problems.add(where, f"must be a JSON object, got {type(obj).__name__}")
                    continue
                missing = [k for k in ("timestamp", "input_length", "output_length") if k not in obj]
                if missing:
                    problems.add(where, f"missing key(s) {', '.join(missing)}")
                    continue
                ts, n_in, n_out, ids = obj["timestamp"], obj["input_length"], obj["output_length"], obj.get("hash_ids", [])
                bad = False
                if not _is_number(ts) or ts < 0:
                    problems.add(f"{where}, key timestamp", f"must be a number of ms >= 0, got {ts!r}")
                    bad = True
                for key, v in (("input_length", n_in), ("output_length", n_out)):
                    if not _is_int(v) or v < 0:
                        problems.add(f"{where}, key {key}", f"must be a whole number >= 0, got {v!r}")
                        bad = True
                if not isinstance(ids, list) or not all(_is_int(h) and 0 <= h <= MAX_TRACE_BLOCK_ID for h in ids):
                    problems.add(
                        f"{where}, key hash_ids",
                        f"must be a list of whole numbers in [0, 2**63) (block ids), got {str(ids)[:60]}",
                    )
                    bad = True
                if bad:
                    continue
                times.append(ts * 1000 if _is_int(ts) else round(ts * 1000.0))
                inputs.append(n_in)
                outputs.append(n_out)
                blocks.append(" ".join(map(str, ids)))
                groups.append(str(ids[0]) if ids else "")
        except UnicodeDecodeError as exc:
            problems.add("", f"not UTF-8 text: {exc}")
    problems.raise_if_any()
    frame = {
        "prefix_group": groups,
        "arrival_time_us": np.array(times, dtype=np.int64),
        "input_tokens": np.array(inputs, dtype=np.int64),
        "output_tokens": np.array(outputs, dtype=np.int64),
        "prefix_blocks": blocks,
    }
    return Trace(_imported_header(path, "mooncake", prefix_block_tokens=MOONCAKE_BLOCK_TOKENS), frame)


def read_burstgpt(path: Path | str) -> Trace:
    """A BurstGPT CSV at *path* (``Timestamp`` in s, ``Model``, ``Request tokens``,
    ``Response tokens``, ``Total tokens``, ``Log Type``).

    ``arrival_time_us`` = ``Timestamp`` x 1e6 rounded (already relative to the
    trace start); ``input_tokens`` = ``Request tokens``, ``output_tokens`` =
    ``Response tokens``. BurstGPT marks failed requests by 0 response tokens:
    they are **kept**, with ``status`` ``"error"`` and an ``error_message``
    saying so (the request still reached the service; calibration excludes
    failures by their status). ``Model`` and ``Log Type`` become the extra
    string columns ``model`` and ``log_type`` when present; ``Total tokens`` is
    not used. Only ``Timestamp``, ``Request tokens`` and ``Response tokens``
    are required.
    """
    df, lines = _read_csv_strings(path)
    problems = _Problems(path)
    _require_columns(df, _BURSTGPT_COLUMNS, problems)
    seconds = _parse_float(df["Timestamp"], lines, "Timestamp", problems, low=0.0)
    inputs = _parse_int(df["Request tokens"], lines, "Request tokens", problems, non_negative=True)
    outputs = _parse_int(df["Response tokens"], lines, "Response tokens", problems, non_negative=True)
    problems.raise_if_any()
    failed = outputs == 0
    frame: dict[str, Any] = {
        "arrival_time_us": np.rint(seconds * 1e6).astype(np.int64),
        "input_tokens": inputs,
        "output_tokens": outputs,
        "status": np.where(failed, "error", "ok"),
        "error_message": np.where(failed, "failed request (0 response tokens in BurstGPT)", ""),
    }
    for column, name in (("Model", "model"), ("Log Type", "log_type")):
        if column in df.columns:
            frame[name] = _strings(df[column])
    return Trace(_imported_header(path, "burstgpt"), frame)


def _column_mapping(names: list[str], columns: Mapping[str, str] | None, problems: _Problems) -> dict[str, str]:
    """The field -> column mapping :func:`read_csv_mapped` uses for a CSV whose header has the
    column *names*: *columns*, or every field that is a column name; fails (through
    *problems*) unless it maps known fields, exactly one arrival time and both lengths to
    columns the header has."""
    mapping = dict(columns or {})
    if not mapping:
        mapping = {f: f for f in CSV_FIELDS if f in names}
    for field in mapping:
        if field not in CSV_FIELDS:
            problems.add(f"columns.{field}", f"unknown trace field; allowed: {', '.join(CSV_FIELDS)}")
    arrival = [f for f in _ARRIVAL_FIELDS if f in mapping]
    if len(arrival) != 1:
        problems.add("columns", f"map exactly one of {', '.join(_ARRIVAL_FIELDS)}, got {len(arrival)}")
    for field in ("input_tokens", "output_tokens"):
        if field not in mapping:
            problems.add("columns", f"map {field} to a column")
    problems.raise_if_any()
    _require_columns(names, list(dict.fromkeys(mapping.values())), problems, " (named in the column mapping)")
    return mapping


def read_csv_mapped(path: Path | str, columns: Mapping[str, str] | None = None) -> Trace:
    """Any CSV at *path*, with *columns* mapping trace fields to the file's column names.

    Fields (:data:`CSV_FIELDS`): the trace v2 columns, ``priority``,
    ``prefix_blocks``, and exactly one arrival time: ``arrival_time_s`` or
    ``arrival_time_ms`` (numbers, rounded to the microsecond),
    ``arrival_time_us`` (whole numbers), or ``arrival_datetime`` (ISO 8601
    date-times, made relative to the earliest). ``input_tokens`` and
    ``output_tokens`` are required. Token counts may be written ``12`` or
    ``12.0``. Unmapped fields take their defaults; unmapped file columns are
    not read. Without *columns* (or with an empty mapping) every field whose
    name is a column of the file is mapped to it.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = Path(d) / "log.csv"
    ...     _ = p.write_text("t,prompt,completion,user\\n0.5,100,20,alice\\n1.25,80,10.0,bob\\n")
    ...     t = read_csv_mapped(p, {"arrival_time_s": "t", "input_tokens": "prompt",
    ...                             "output_tokens": "completion", "client_id": "user"})
    >>> t.frame.arrival_time_us.tolist(), t.frame.output_tokens.tolist(), t.frame.client_id.tolist()
    ([500000, 1250000], [20, 10], ['alice', 'bob'])
    """
    source = str(path)
    df, lines = _read_csv_strings(path)
    problems = _Problems(source)
    mapping = _column_mapping(list(df.columns), columns, problems)
    arrival = [f for f in _ARRIVAL_FIELDS if f in mapping]
    field_map = {f: c for f, c in mapping.items() if f not in _ARRIVAL_FIELDS}
    data = _parse_columns(df, lines, field_map, problems)
    (afield,) = arrival
    s = df[mapping[afield]]
    extra_header: dict[str, Any] = {}
    if afield == "arrival_time_us":
        data["arrival_time_us"] = _parse_int(s, lines, mapping[afield], problems, non_negative=True)
    elif afield == "arrival_datetime":
        problems.raise_if_any()
        data["arrival_time_us"], extra_header["start_time"] = _parse_datetime_us(s, lines, mapping[afield], problems)
    else:
        scale = 1e6 if afield == "arrival_time_s" else 1e3
        values = _parse_float(s, lines, mapping[afield], problems, low=0.0)
        data["arrival_time_us"] = np.rint(values * scale).astype(np.int64)
    problems.raise_if_any()
    return Trace(_imported_header(path, "csv", **extra_header), data)
