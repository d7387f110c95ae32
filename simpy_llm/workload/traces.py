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

import copy
import csv
import hashlib
import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, date, datetime
from operator import attrgetter
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NamedTuple

import attrs
import numpy as np
import pandas as pd
import yaml

from simpy_llm.config.errors import ScenarioError
from simpy_llm.metrics.record import TRACE_COLUMNS
from simpy_llm.workload.prefix import (
    MAX_TRACE_BLOCK_ID,
    PREFIX_BLOCK_TOKENS,
    namespaced_blocks,
)

if TYPE_CHECKING:
    from simpy_llm.config.schema import TraceSource

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

TRACE_VERSION = 2
"""The ``trace_version`` this module reads and writes."""
TIME_UNIT = "microseconds"
"""The ``time_unit`` of every trace v2 time column."""
MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per Mooncake ``hash_ids`` entry."""

V2_COLUMNS: tuple[str, ...] = (
    "request_id",
    "client_id",
    "tenant_id",
    "slo_class",
    "session_id",
    "round_index",
    "prefix_group",
    "streaming",
    "input_tokens",
    "output_tokens",
    "text_tokens",
    "image_tokens",
    "audio_tokens",
    "video_tokens",
    "reason_ratio",
    "arrival_time_us",
    "send_time_us",
    "first_chunk_time_us",
    "last_chunk_time_us",
    "num_chunks",
    "status",
    "error_message",
)
"""The trace v2 request columns, in file order (seed 000 §7, with the failure columns)."""

EXTENSION_COLUMNS: dict[str, str] = {"priority": "int", "prefix_blocks": "str"}
"""Optional columns this project adds after the v2 ones, with their kinds: ``priority``
(the request's user priority) and ``prefix_blocks`` (space-separated prefix-block
hashes, ``header["prefix_block_tokens"]`` tokens each). Any other extra column is
kept as strings."""

OBSERVED_COLUMNS: dict[str, str] = {
    "requested_input_tokens": "int",
    "requested_output_tokens": "int",
    "prompt_tokens_source": "str",
    "completion_tokens_source": "str",
    "http_status": "nint",
    "attempts": "int",
    "first_byte_time_us": "nint",
    "first_token_time_us": "nint",
    "done_time_us": "nint",
    "approx_input_tokens": "nint",
    "cached_tokens": "nint",
    "itl_us": "str",
}
"""Columns a trace recorded from a real server adds (see docs/observe.md), with their kinds:
the lengths asked for, where the counts in ``input_tokens``/``output_tokens`` came from
(``usage``, ``chunks`` or ``none``), the last HTTP status, the number of attempts, the
first-byte, first-token and end times, the prompt length by the prompt source's own
token rule, the prompt tokens the server reported as served from its prefix cache
(``usage.prompt_tokens_details.cached_tokens``; empty when it did not say), and the gaps
between consecutive content chunks as the client received them (space-separated whole
microseconds, one fewer than the content chunks; empty without two). Columns added later
than a trace was written are empty in it."""

_KINDS: dict[str, str] = {
    "request_id": "int",
    "client_id": "str",
    "tenant_id": "str",
    "slo_class": "str",
    "session_id": "str",
    "round_index": "int",
    "prefix_group": "str",
    "streaming": "bool",
    "input_tokens": "int",
    "output_tokens": "int",
    "text_tokens": "int",
    "image_tokens": "int",
    "audio_tokens": "int",
    "video_tokens": "int",
    "reason_ratio": "float",
    "arrival_time_us": "int",
    "send_time_us": "nint",
    "first_chunk_time_us": "nint",
    "last_chunk_time_us": "nint",
    "num_chunks": "nint",
    "status": "str",
    "error_message": "str",
    **EXTENSION_COLUMNS,
    **OBSERVED_COLUMNS,
}
_DEFAULTS: dict[str, Any] = {"streaming": True, "status": "ok", "reason_ratio": 0.0}
_REQUIRED = ("arrival_time_us", "input_tokens", "output_tokens")
_NON_NEGATIVE = frozenset(
    ("round_index", "input_tokens", "output_tokens", "text_tokens", "image_tokens", "audio_tokens", "video_tokens", "num_chunks")
)
_MODES = ("real", "generated", "simulated")
"""``real``: measured on a server; ``generated``: a workload, no measurements; ``simulated``:
measurements made by the simulator in the observer's layout (:mod:`simpy_llm.calibrate.synthetic`)."""
_STR_DTYPE = pd.Series([""]).astype(str).dtype
_MAX_PROBLEMS = 20
_INT_RE = r"\s*[+-]?\d{1,18}(?:\.0*)?\s*"
_TRUE = frozenset(("true", "1", "t", "yes", "y"))
_FALSE = frozenset(("false", "0", "f", "no", "n"))

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


def us_from_s(seconds: float) -> int:
    """Seconds to whole trace v2 microseconds (rounded to nearest).

    >>> us_from_s(1.5), us_from_s(0.0000014)
    (1500000, 1)
    """
    return round(seconds * 1e6)


# --------------------------------------------------------------------------- the Trace


def _complete_header(header: Mapping[str, Any] | None) -> dict[str, Any]:
    out = dict(header or {})
    version = out.setdefault("trace_version", TRACE_VERSION)
    unit = out.setdefault("time_unit", TIME_UNIT)
    if version != TRACE_VERSION:
        raise ValueError(f"trace_version must be {TRACE_VERSION}, got {version!r}")
    if unit != TIME_UNIT:
        raise ValueError(f"time_unit must be {TIME_UNIT!r}, got {unit!r}")
    return out


def _kind(name: str) -> str:
    return _KINDS.get(name, "str")


def _default(name: str, n: int) -> Any:
    kind = _kind(name)
    if name == "request_id":
        return np.arange(n, dtype=np.int64)
    if kind == "int":
        return np.zeros(n, dtype=np.int64)
    if kind == "nint":
        return pd.array([pd.NA] * n, dtype="Int64")
    if kind == "float":
        return np.full(n, float(_DEFAULTS.get(name, 0.0)))
    if kind == "bool":
        return np.full(n, bool(_DEFAULTS.get(name, True)))
    return pd.Series([_DEFAULTS.get(name, "")] * n, dtype=object).astype(str)


def _coerce(series: pd.Series, name: str) -> Any:
    """*series* in the canonical dtype of column *name* (ValueError if it cannot be)."""
    kind = _kind(name)
    s = series.reset_index(drop=True)
    if kind == "str":
        if not (s.dtype == _STR_DTYPE and not s.isna().any()):
            s = s.astype(object).where(s.notna(), "").astype(str)
        if name == "status":  # blank status means ok, as on read
            s = s.where(s != "", "ok")
        return s
    if kind == "bool":
        if pd.api.types.is_bool_dtype(s.dtype) and not s.isna().any():
            return s.astype(bool)
        return pd.Series([_bool_value(v, name) for v in s.tolist()], dtype=bool)
    if kind == "float":
        try:
            return s.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"column {name}: not numeric ({exc})") from None
    if kind == "nint":
        if s.dtype == "Int64":
            return s
        try:
            return s.astype("Int64")
        except (TypeError, ValueError) as exc:
            raise ValueError(f"column {name}: not whole numbers or missing ({exc})") from None
    if s.dtype == np.int64:
        return s
    if pd.api.types.is_bool_dtype(s.dtype):
        raise ValueError(f"column {name}: must be integers, got booleans")
    try:
        num = pd.to_numeric(s)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"column {name}: not numeric ({exc})") from None
    if num.isna().any():
        raise ValueError(f"column {name}: missing values")
    values = num.to_numpy(dtype=np.float64) if num.dtype.kind == "f" else None
    if values is not None and not np.array_equal(values, np.floor(values)):
        raise ValueError(f"column {name}: not whole numbers")
    return num.astype(np.int64)


def _bool_value(value: Any, name: str) -> bool:
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"column {name}: not a boolean: {value!r}")


def normalize_frame(frame: pd.DataFrame | Mapping[str, Any]) -> pd.DataFrame:
    """*frame* with every trace v2 column, in order and in its canonical dtype.

    Missing columns get defaults: ``request_id`` the row number, strings ``""``
    (``status``: ``"ok"``), counts 0, ``streaming`` true, ``reason_ratio`` 0.0,
    measured times and ``num_chunks`` ``<NA>``. ``arrival_time_us``,
    ``input_tokens`` and ``output_tokens`` are required. Columns beyond the v2
    ones follow in their order: :data:`EXTENSION_COLUMNS` in their kind, any
    other as strings.

    Raises
    ------
    ValueError
        A required column is missing or a column cannot take its dtype.

    >>> f = normalize_frame({"arrival_time_us": [0, 5], "input_tokens": [3, 4], "output_tokens": [1, 2]})
    >>> f.shape, f.status.tolist(), bool(f.send_time_us.isna().all())
    ((2, 22), ['ok', 'ok'], True)
    """
    if not isinstance(frame, pd.DataFrame):
        frame = pd.DataFrame(frame)
    if not all(isinstance(c, str) for c in frame.columns):
        frame = frame.rename(columns=str)
    missing = [c for c in _REQUIRED if c not in frame.columns]
    if missing:
        raise ValueError(f"trace frame lacks required column(s): {', '.join(missing)}")
    n = len(frame)
    names = list(V2_COLUMNS) + [str(c) for c in frame.columns if c not in V2_COLUMNS]
    data = {name: (_coerce(frame[name], name) if name in frame.columns else _default(name, n)) for name in names}
    return pd.DataFrame(data, index=pd.RangeIndex(n))


@attrs.frozen(eq=False, repr=False)
class Trace:
    """A request trace: the header and one frame row per request (see the module docstring).

    The header always has ``trace_version: 2`` and ``time_unit: microseconds``;
    the frame is normalised by :func:`normalize_frame`. Rows stay in file
    order; :func:`trace_requests` gives them in arrival order.
    """

    header: dict[str, Any] = attrs.field(converter=_complete_header)
    """Trace metadata (the YAML header of a trace v2)."""
    frame: pd.DataFrame = attrs.field(converter=normalize_frame)
    """One row per request, the :data:`V2_COLUMNS` then any extra columns."""

    def __len__(self) -> int:
        return len(self.frame)

    def __repr__(self) -> str:
        return f"Trace({len(self.frame)} requests, header keys {sorted(self.header)})"

    def arrival_s(self) -> np.ndarray:
        """Arrival times in seconds (``arrival_time_us / 1e6``), in frame order."""
        return self.frame["arrival_time_us"].to_numpy(dtype=np.int64) / 1e6

    def equals(self, other: Trace) -> bool:
        """Same header and an equal frame (values, dtypes and column order)."""
        return self.header == other.header and self.frame.equals(other.frame) and list(self.frame) == list(other.frame)


# --------------------------------------------------------------------------- problems


class _Problems:
    """Problems found in one file, reported together as one ScenarioError."""

    def __init__(self, source: Path | str) -> None:
        self.source = str(source)
        self.items: list[tuple[str, str]] = []
        self.more = 0

    def add(self, where: str, message: str) -> None:
        if len(self.items) < _MAX_PROBLEMS:
            self.items.append((where, message))
        else:
            self.more += 1

    def cells(self, bad: np.ndarray, lines: np.ndarray, column: str, values: Any, message: Callable[[Any], str]) -> None:
        """One problem per row where *bad*, naming its line and *column*."""
        idx = np.flatnonzero(bad)
        room = max(_MAX_PROBLEMS - len(self.items), 0)
        for i in idx[:room]:
            self.items.append((f"line {int(lines[i])}, column {column}", message(values[i])))
        self.more += max(len(idx) - room, 0)

    def raise_if_any(self) -> None:
        if self.items:
            items = list(self.items)
            if self.more:
                items.append(("", f"and {self.more} more problem(s) not listed"))
            raise ScenarioError(self.source, items)

    def fail(self, where: str, message: str) -> None:
        self.add(where, message)
        self.raise_if_any()


# --------------------------------------------------------------------------- parsing columns


def _read_csv_strings(path: Path | str) -> tuple[pd.DataFrame, np.ndarray]:
    """Every cell of the CSV at *path* as a string, and each row's line number.

    Whitespace around header names is stripped. Lines with no value at all
    (blank lines) are skipped; line numbers assume no line break inside a field.
    """
    source = str(path)
    try:  # header=None: the header line fixes the field count, so no row can have more
        df = pd.read_csv(path, header=None, dtype=str, keep_default_na=False, skip_blank_lines=False, encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(source, [("", "file not found")]) from None
    except IsADirectoryError:
        raise ScenarioError(source, [("", "is a directory, expected a CSV file")]) from None
    except pd.errors.EmptyDataError:
        raise ScenarioError(source, [("line 1", "empty file: expected a header line")]) from None
    except pd.errors.ParserError as exc:
        m = re.search(r"line (\d+)", str(exc))
        where = f"line {m.group(1)}" if m else ""
        raise ScenarioError(source, [(where, f"malformed CSV: {str(exc).strip()}")]) from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(source, [("", f"not UTF-8 text: {exc}")]) from None
    names = [str(c).strip() for c in df.iloc[0].tolist()]
    duplicated = sorted({c for c in names if names.count(c) > 1})
    if duplicated:
        raise ScenarioError(source, [("line 1", f"duplicate column name(s): {', '.join(duplicated)}")])
    df = df.iloc[1:].reset_index(drop=True)
    df.columns = names
    lines = np.arange(len(df), dtype=np.int64) + 2
    if len(df):
        blank = df.iloc[:, 0].to_numpy(dtype=object) == ""  # candidates, then every cell
        if blank.any():
            blank[blank] = (df.loc[blank] == "").all(axis=1).to_numpy()
        if blank.any():
            df = df.loc[~blank].reset_index(drop=True)
            lines = lines[~blank]
    return df, lines


def _require_columns(
    df: pd.DataFrame | list[str], columns: tuple[str, ...] | list[str], problems: _Problems, what: str = ""
) -> None:
    """Fail with the columns of *columns* that *df* (a frame, or the header's column names) lacks."""
    names = list(df.columns) if isinstance(df, pd.DataFrame) else list(df)
    missing = [c for c in columns if c not in names]
    if missing:
        have = ", ".join(names) or "(none)"
        problems.fail("line 1", f"missing column(s) {', '.join(missing)}{what}; the header has: {have}")


def _parse_int(
    s: pd.Series,
    lines: np.ndarray,
    column: str,
    problems: _Problems,
    *,
    non_negative: bool,
    default: int | None = None,
    nullable: bool = False,
) -> Any:
    """Whole numbers (``12`` or ``12.0``) of a string column; blank cells take *default*
    (or ``<NA>`` if *nullable*, else are a problem)."""
    values = s.to_numpy(dtype=object)
    empty = values == ""
    any_empty = bool(empty.any())
    try:  # fast path: plain integers (numpy calls int() per cell)
        ints = np.zeros(len(values), dtype=np.int64)
        ints[~empty] = values[~empty].astype(np.int64) if any_empty else values.astype(np.int64)
    except (ValueError, OverflowError, TypeError):
        stripped = s.str.strip()
        empty = (stripped == "").to_numpy()
        any_empty = bool(empty.any())
        ok = s.str.fullmatch(_INT_RE).to_numpy(dtype=bool)
        problems.cells(~ok & ~empty, lines, column, values, lambda v: f"not a whole number: {v!r}")
        ints = stripped.where(ok, "0").str.replace(r"\.0*$", "", regex=True).astype(np.int64).to_numpy()
    if any_empty and default is None and not nullable:
        problems.cells(empty, lines, column, values, lambda v: "missing value")
    if non_negative:
        problems.cells(~empty & (ints < 0), lines, column, values, lambda v: f"must be >= 0, got {v.strip()}")
    if nullable:
        out = pd.array(ints, dtype="Int64")
        if any_empty:
            out[empty] = pd.NA
        return out
    if any_empty and default is not None:
        ints[empty] = default
    return ints


def _parse_float(
    s: pd.Series,
    lines: np.ndarray,
    column: str,
    problems: _Problems,
    *,
    default: float | None = None,
    low: float | None = None,
    high: float | None = None,
) -> np.ndarray:
    """Finite floats of a string column (blank cells take *default* or are a problem)."""
    values = s.to_numpy(dtype=object)
    empty = values == ""
    try:  # fast path (numpy calls float() per cell: exact)
        num = np.zeros(len(values), dtype=np.float64)
        num[~empty] = values[~empty].astype(np.float64)
    except (ValueError, TypeError):
        stripped = s.str.strip()
        empty = (stripped == "").to_numpy()
        num = pd.to_numeric(stripped.where(~empty, "0"), errors="coerce").to_numpy(dtype=np.float64)
    finite = np.isfinite(num)
    problems.cells(~finite & ~empty, lines, column, values, lambda v: f"not a finite number: {v!r}")
    if empty.any() and default is None:
        problems.cells(empty, lines, column, values, lambda v: "missing value")
    if low is not None:
        problems.cells(finite & ~empty & (num < low), lines, column, values, lambda v: f"must be >= {low}, got {v.strip()}")
    if high is not None:
        problems.cells(finite & ~empty & (num > high), lines, column, values, lambda v: f"must be <= {high}, got {v.strip()}")
    if empty.any() and default is not None:
        num[empty] = default
    return np.where(finite, num, 0.0)


def _parse_bool(s: pd.Series, lines: np.ndarray, column: str, problems: _Problems) -> np.ndarray:
    values = s.to_numpy(dtype=object)
    true = values == "true"
    if bool((true | (values == "false")).all()):  # fast path: as written here
        return true
    low = s.str.strip().str.lower()
    true = low.isin(_TRUE).to_numpy()
    false = low.isin(_FALSE).to_numpy()
    empty = (low == "").to_numpy()
    problems.cells(~true & ~false & ~empty, lines, column, values, lambda v: f"not a boolean (true/false): {v!r}")
    return true | empty  # blank: the default, streaming


def _parse_datetime_us(s: pd.Series, lines: np.ndarray, column: str, problems: _Problems) -> tuple[np.ndarray, str]:
    """Date-times of a string column as microseconds after the earliest (100-ns ticks and
    finer are rounded to the nearest microsecond), and the earliest one's text."""
    values = s.to_numpy(dtype=object)
    stripped = s.str.strip()
    try:
        parsed = pd.to_datetime(stripped, format="ISO8601", errors="coerce")
    except (TypeError, ValueError) as exc:  # e.g. mixed time zones
        problems.fail(f"column {column}", f"date-times cannot be parsed together: {exc}")
    if getattr(parsed.dtype, "tz", None) is not None:
        parsed = parsed.dt.tz_convert("UTC").dt.tz_localize(None)
    bad = parsed.isna().to_numpy()
    problems.cells(bad, lines, column, values, lambda v: f"not a date-time: {v!r}" if str(v).strip() else "missing value")
    problems.raise_if_any()
    if not len(parsed):
        return np.zeros(0, dtype=np.int64), ""
    ns = parsed.astype("datetime64[ns]").to_numpy().astype(np.int64)
    first = int(np.argmin(ns))
    rel = ns - ns[first]
    return (rel + 500) // 1000, str(values[first]).strip()


def _strings(s: pd.Series) -> pd.Series:
    return s.reset_index(drop=True).astype(str)


def _parse_columns(
    df: pd.DataFrame, lines: np.ndarray, mapping: Mapping[str, str], problems: _Problems
) -> dict[str, Any]:
    """Trace fields parsed from the file columns *mapping* names (field -> column)."""
    out: dict[str, Any] = {}
    for field, column in mapping.items():
        s = df[column]
        kind = _kind(field)
        if kind == "int":
            out[field] = _parse_int(
                s, lines, column, problems, non_negative=field in _NON_NEGATIVE, default=None if field in _REQUIRED else 0
            )
        elif kind == "nint":
            out[field] = _parse_int(s, lines, column, problems, non_negative=field in _NON_NEGATIVE, nullable=True)
        elif kind == "float":
            out[field] = _parse_float(s, lines, column, problems, default=0.0, low=0.0, high=1.0)
        elif kind == "bool":
            out[field] = _parse_bool(s, lines, column, problems)
        else:
            out[field] = _strings(s)
    if "status" in out:
        out["status"] = out["status"].where(out["status"] != "", "ok")
    return out


# --------------------------------------------------------------------------- trace v2 files


def trace_v2_paths(path: Path | str) -> tuple[Path, Path]:
    """``(header_path, csv_path)`` of the trace v2 at *path*.

    *path* may be the CSV, the header (``.yaml`` or ``.yml``), a stem, or an
    existing directory (stem ``<directory>/trace``).

    >>> [str(p) for p in trace_v2_paths("out/run1.csv")]
    ['out/run1.yaml', 'out/run1.csv']
    >>> [str(p) for p in trace_v2_paths("out/run1")]
    ['out/run1.yaml', 'out/run1.csv']
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix in (".yaml", ".yml"):
        return p, p.with_suffix(".csv")
    if suffix == ".csv":
        stem = p.with_suffix("")
    elif p.is_dir():
        stem = p / "trace"
    else:
        stem = p
    header = stem.parent / f"{stem.name}.yaml"
    if not header.exists() and (stem.parent / f"{stem.name}.yml").exists():
        header = stem.parent / f"{stem.name}.yml"
    return header, stem.parent / f"{stem.name}.csv"


def _yaml_key_line(text: str, key: str) -> int | None:
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    if isinstance(node, yaml.MappingNode):
        for k, _v in node.value:
            if getattr(k, "value", None) == key:
                return k.start_mark.line + 1
    return None


def _read_header(path: Path) -> dict[str, Any]:
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(source, [("", "trace v2 header not found (<stem>.yaml beside <stem>.csv)")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(source, [("", f"cannot read: {exc}")]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ScenarioError(source, [(where, f"not valid YAML: {exc.problem or exc}")]) from None
    except yaml.YAMLError as exc:
        raise ScenarioError(source, [("", f"not valid YAML: {exc}")]) from None
    if not isinstance(data, dict):
        raise ScenarioError(source, [("line 1", f"must be a mapping (trace_version, time_unit, ...), got {type(data).__name__}")])
    problems = _Problems(source)

    def where(key: str) -> str:
        line = _yaml_key_line(text, key)
        return f"line {line}, key {key}" if line else f"key {key}"

    if data.get("trace_version") != TRACE_VERSION:
        problems.add(where("trace_version"), f"must be {TRACE_VERSION}, got {data.get('trace_version')!r}")
    if data.get("time_unit", TIME_UNIT) != TIME_UNIT:
        problems.add(where("time_unit"), f"must be {TIME_UNIT!r}, got {data.get('time_unit')!r}")
    if "mode" in data and data["mode"] not in _MODES:
        problems.add(where("mode"), f"must be one of {', '.join(_MODES)}, got {data['mode']!r}")
    problems.raise_if_any()
    if isinstance(data.get("created_at"), datetime | date):  # an unquoted timestamp
        created = data["created_at"]
        data["created_at"] = created.isoformat().replace("+00:00", "Z")
    data.setdefault("time_unit", TIME_UNIT)
    return data


def read_trace_v2(path: Path | str, header_path: Path | str | None = None) -> Trace:
    """The trace v2 at *path* (CSV, header, stem or directory; see :func:`trace_v2_paths`).

    The header is ``<stem>.yaml`` unless *header_path* is given. Only
    ``arrival_time_us``, ``input_tokens`` and ``output_tokens`` are required
    columns; missing ones take the defaults of :func:`normalize_frame`.

    Raises
    ------
    ScenarioError
        The header or the CSV is missing or malformed (naming the file and line).
    """
    default_header, csv_path = trace_v2_paths(path)
    header = _read_header(Path(header_path) if header_path is not None else default_header)
    df, lines = _read_csv_strings(csv_path)
    problems = _Problems(csv_path)
    _require_columns(df, _REQUIRED, problems)
    known = {c: c for c in df.columns if c in _KINDS}
    data = _parse_columns(df, lines, known, problems)
    for c in df.columns:
        if c not in _KINDS:
            data[c] = _strings(df[c])
    problems.raise_if_any()
    return Trace(header, pd.DataFrame({c: data[c] for c in df.columns}))


def _format_column(s: pd.Series, name: str) -> list[str]:
    """*s* (canonical dtype) as the strings the CSV holds, one per row."""
    kind = _kind(name)
    n = len(s)
    if n and kind != "str":
        values = s.to_numpy(dtype=object, na_value=None) if kind == "nint" else s.to_numpy()
        first = values[0]
        same = all(v is None for v in values) if first is None else bool((values == first).all())
        if same:  # constant column (often all zero or all missing): format once
            return [_format_cell(first.item() if hasattr(first, "item") else first, name, kind)] * n
    if kind == "int":
        return list(map(str, s.tolist()))
    if kind == "nint":
        return ["" if v is None else str(v) for v in s.to_numpy(dtype=object, na_value=None)]
    if kind == "float":
        return list(map(repr, s.tolist()))
    if kind == "bool":
        return np.where(s.to_numpy(dtype=bool), "true", "false").tolist()
    return s.tolist()


def _format_cell(value: Any, name: str, kind: str) -> str:
    missing = value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))
    if kind == "str":
        return "" if missing else str(value)
    if kind == "nint" and missing:
        return ""
    if kind in ("int", "nint"):
        if isinstance(value, bool | np.bool_):
            raise ValueError(f"{name}: must be an integer, got {value!r}")
        number = float(value) if not isinstance(value, int | np.integer) else None
        if number is not None and number != math.floor(number):
            raise ValueError(f"{name}: must be a whole number, got {value!r}")
        return str(int(value))
    if kind == "float":
        return repr(float(value))
    if kind == "bool":
        return "true" if _bool_value(value, name) else "false"
    raise AssertionError(kind)


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _header_for_writing(header: Mapping[str, Any] | None, mode: str) -> dict[str, Any]:
    out = _complete_header(header)
    out.setdefault("created_at", _now_iso())
    out.setdefault("mode", mode)
    if out["mode"] not in _MODES:
        raise ValueError(f"mode must be one of {', '.join(_MODES)}, got {out['mode']!r}")
    ordered = {k: out[k] for k in ("trace_version", "time_unit", "created_at", "mode")}
    ordered.update({k: v for k, v in out.items() if k not in ordered})
    return ordered


def _write_header(path: Path, header: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(header, sort_keys=False, allow_unicode=True), encoding="utf-8")


def write_trace_v2(
    trace_or_frame: Trace | pd.DataFrame, path: Path | str, header: Mapping[str, Any] | None = None
) -> tuple[Path, Path]:
    """Write a trace v2: ``<stem>.yaml`` (header) and ``<stem>.csv``; returns both paths.

    *path* is the CSV, the header, the stem or a directory (:func:`trace_v2_paths`).
    *header* entries are added to (and override) the trace's own header;
    ``created_at`` (now, UTC) and ``mode`` (``generated``) are filled in when
    absent. Integers are written in decimal, floats as their shortest exact
    text (``repr``), booleans ``true``/``false``, missing times as empty cells,
    so :func:`read_trace_v2` gives back an equal frame.

    >>> import tempfile, os
    >>> t = Trace({"created_at": "2026-01-01T00:00:00Z"},
    ...           {"arrival_time_us": [0, 250], "input_tokens": [10, 20], "output_tokens": [5, 6]})
    >>> with tempfile.TemporaryDirectory() as d:
    ...     paths = write_trace_v2(t, os.path.join(d, "run"))
    ...     back = read_trace_v2(paths[1])
    ...     [p.name for p in paths], back.equals(Trace({**t.header, "mode": "generated"}, t.frame))
    (['run.yaml', 'run.csv'], True)
    """
    if isinstance(trace_or_frame, Trace):
        trace = Trace({**trace_or_frame.header, **(header or {})}, trace_or_frame.frame)
    else:
        trace = Trace(dict(header or {}), trace_or_frame)
    full_header = _header_for_writing(trace.header, "generated")
    header_path, csv_path = trace_v2_paths(path)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    frame = trace.frame
    columns = [_format_column(frame[name], name) for name in frame.columns]
    with csv_path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(frame.columns)
        writer.writerows(zip(*columns, strict=True))
    _write_header(header_path, full_header)
    return header_path, csv_path


def write_generated_trace(
    frame: pd.DataFrame, path: Path | str, *, source: Any = None, seed: int | None = None
) -> tuple[Path, Path]:
    """Write a generated workload (a frame with ``arrival_time_s`` in seconds, as
    :func:`simpy_llm.workload.export.generate_requests` makes) as a trace v2 with
    ``mode: generated``; returns ``(header_path, csv_path)``.

    Arrival times are rounded to whole microseconds. The header records the
    spec file (``workload_spec``) and ``seed`` when given.
    """
    data = frame.copy()
    if "arrival_time_s" in data.columns:
        data["arrival_time_us"] = np.rint(data["arrival_time_s"].to_numpy(dtype=np.float64) * 1e6).astype(np.int64)
        data = data.drop(columns=["arrival_time_s"])
    header: dict[str, Any] = {"mode": "generated"}
    if source is not None:
        header["workload_spec"] = str(source)
    if seed is not None:
        header["seed"] = int(seed)
    return write_trace_v2(data, path, header)


class TraceV2Writer:
    """Writes a trace v2 one request at a time, flushing each row to the OS.

    The header is written when the writer opens, then the CSV header line;
    every :meth:`write_row` appends one complete line and flushes, so a run cut
    short (never closed) still leaves a file :func:`read_trace_v2` reads, with
    every row written so far. Use as a context manager or call :meth:`open` /
    :meth:`close` (``write_row`` opens on first use).

    Parameters
    ----------
    path
        CSV, header, stem or directory (:func:`trace_v2_paths`); existing files are replaced.
    header
        Header entries (``created_at`` defaults to now, ``mode`` to ``real``).
    extra_columns
        Columns after the v2 ones (e.g. ``priority``, ``prefix_blocks``).
    flush_every
        Flush after this many rows (1: every row).

    Rows are mappings from column to value: missing columns take the defaults
    of :func:`normalize_frame` (``request_id``: the row's number), unknown
    columns raise ``ValueError``; ``arrival_time_us`` is required. Missing
    measured times are ``None``.

    >>> import tempfile, os
    >>> with tempfile.TemporaryDirectory() as d:
    ...     with TraceV2Writer(os.path.join(d, "trace")) as w:
    ...         w.write_row({"arrival_time_us": 0, "input_tokens": 5, "output_tokens": 2, "client_id": "a"})
    ...     len(read_trace_v2(d))
    1
    """

    def __init__(
        self,
        path: Path | str,
        header: Mapping[str, Any] | None = None,
        *,
        extra_columns: tuple[str, ...] | list[str] = (),
        flush_every: int = 1,
    ) -> None:
        self.header_path, self.path = trace_v2_paths(path)
        self.header = _header_for_writing(header, "real")
        extra = tuple(c for c in extra_columns if c not in V2_COLUMNS)
        self.columns: tuple[str, ...] = V2_COLUMNS + extra
        self._kinds = [(name, _kind(name)) for name in self.columns]
        self._known = frozenset(self.columns)
        self.flush_every = max(int(flush_every), 1)
        self.rows_written = 0
        self._file: IO[str] | None = None
        self._writer: Any = None
        self._closed = False

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def open(self) -> TraceV2Writer:
        """Write the header file and the CSV's header line (idempotent)."""
        if self._closed:
            raise ValueError("the writer is closed")
        if self._file is None:
            _write_header(self.header_path, self.header)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("w", encoding="utf-8", newline="")
            self._writer = csv.writer(self._file, lineterminator="\n")
            self._writer.writerow(self.columns)
            self._file.flush()
        return self

    def write_row(self, row: Mapping[str, Any]) -> None:
        """Append one request (see the class docstring) and flush."""
        if self._file is None:
            self.open()
        unknown = [k for k in row if k not in self._known]
        if unknown:
            raise ValueError(f"unknown trace column(s) {', '.join(map(str, unknown))}; declare extra_columns")
        if "arrival_time_us" not in row:
            raise ValueError("a trace row needs arrival_time_us")
        cells = []
        for name, kind in self._kinds:
            if name in row:
                cells.append(_format_cell(row[name], name, kind))
            elif name == "request_id":
                cells.append(str(self.rows_written))
            else:
                default = _DEFAULTS.get(name, 0 if kind == "int" else None)
                cells.append(_format_cell(default, name, kind) if default is not None else "")
        self._writer.writerow(cells)
        self.rows_written += 1
        if self.rows_written % self.flush_every == 0:
            self._file.flush()

    def flush(self) -> None:
        """Flush written rows to the OS."""
        if self._file is not None:
            self._file.flush()

    def update_header(self, entries: Mapping[str, Any]) -> None:
        """Add *entries* to the header (replacing keys it has) and, once the writer is open,
        rewrite the header file: what is known only at the end of a run (e.g. the load
        generator's statistics). The file is replaced in one step (written beside it, then
        renamed), so a reader never sees half a header; the rows are not touched.

        >>> import tempfile, os
        >>> with tempfile.TemporaryDirectory() as d:
        ...     with TraceV2Writer(os.path.join(d, "trace"), header={"seed": 1}) as w:
        ...         w.update_header({"sent": 0})
        ...     read_trace_v2(d).header["sent"]
        0
        """
        self.header = _header_for_writing({**self.header, **entries}, "real")
        if self._file is not None:
            partial = self.header_path.with_name(self.header_path.name + ".partial")
            _write_header(partial, self.header)
            partial.replace(self.header_path)

    def close(self) -> None:
        """Flush and close (idempotent; opens first, so an empty trace is still written)."""
        if self._closed:
            return
        if self._file is None:
            self.open()
        assert self._file is not None
        self._file.close()
        self._closed = True

    def __enter__(self) -> TraceV2Writer:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
    apart: :func:`trace_rows`). ``prefix_group`` is the first id
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


# --------------------------------------------------------------------------- header and column checks


class TraceFileInfo(NamedTuple):
    """What :func:`check_trace_files` learnt from a trace's header, without reading its rows."""

    header: dict[str, Any]
    """A trace v2's YAML header (empty for the other formats, whose header is made on reading)."""
    fields: frozenset[str]
    """The trace fields the file gives each row (``slo_class`` among them when rows carry a class)."""


def _csv_header(path: Path | str) -> list[str]:
    """The column names on the first line of the CSV at *path* (whitespace stripped), read as
    :func:`_read_csv_strings` reads them but without reading any other line."""
    source = str(path)
    try:
        with open(path, encoding="utf-8", newline="") as f:
            first = next(csv.reader(f), None)
    except FileNotFoundError:
        raise ScenarioError(source, [("", "file not found")]) from None
    except IsADirectoryError:
        raise ScenarioError(source, [("", "is a directory, expected a CSV file")]) from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(source, [("line 1", f"not UTF-8 text: {exc}")]) from None
    except csv.Error as exc:
        raise ScenarioError(source, [("line 1", f"malformed CSV: {exc}")]) from None
    except OSError as exc:
        raise ScenarioError(source, [("", f"cannot read: {exc.strerror or exc}")]) from None
    if first is None:
        raise ScenarioError(source, [("line 1", "empty file: expected a header line")])
    names = [c.strip() for c in first]
    if not any(names):
        raise ScenarioError(source, [("line 1", "blank header line: expected the column names")])
    duplicated = sorted({c for c in names if names.count(c) > 1})
    if duplicated:
        raise ScenarioError(source, [("line 1", f"duplicate column name(s): {', '.join(duplicated)}")])
    return names


def _first_jsonl_object(path: Path | str) -> dict[str, Any]:
    """The first object of the JSONL file at *path* (blank lines skipped), reading no further."""
    source = str(path)
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):  # noqa: B007 - lineno is read after the loop
                if line.strip():
                    break
            else:
                raise ScenarioError(source, [("", "empty file: expected one JSON object a line")])
    except FileNotFoundError:
        raise ScenarioError(source, [("", "file not found")]) from None
    except IsADirectoryError:
        raise ScenarioError(source, [("", "is a directory, expected a JSONL file")]) from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(source, [("", f"not UTF-8 text: {exc}")]) from None
    except OSError as exc:
        raise ScenarioError(source, [("", f"cannot read: {exc.strerror or exc}")]) from None
    where = f"line {lineno}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ScenarioError(source, [(where, f"not valid JSON: {exc.msg} (column {exc.colno})")]) from None
    if not isinstance(obj, dict):
        raise ScenarioError(source, [(where, f"must be a JSON object, got {type(obj).__name__}")])
    missing = [k for k in _MOONCAKE_KEYS if k not in obj]
    if missing:
        raise ScenarioError(source, [(where, f"missing key(s) {', '.join(missing)}; the first object has: {', '.join(map(str, obj)) or '(none)'}")])
    return obj


def _whole(value: Any, low: int) -> bool:
    return _is_int(value) and value >= low


def _replay_header_problems(header: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Problems with the keys of a trace v2 header that the replay reads (``prefix_block_tokens``,
    ``prefix_groups``, ``seed``, ``warm_up_requests``), as :func:`trace_rows` would find them."""
    out = []
    if "prefix_block_tokens" in header and not _whole(header["prefix_block_tokens"], 1):
        out.append(("prefix_block_tokens", f"must be a whole number of tokens >= 1, got {header['prefix_block_tokens']!r}"))
    groups = header.get("prefix_groups") or {}
    if not isinstance(groups, Mapping):
        out.append(("prefix_groups", f"must be a mapping of group names to prefix tokens, got {groups!r}"))
    else:
        out += [
            (f"prefix_groups.{group}", f"must be a whole number of tokens >= 0, got {tokens!r}")
            for group, tokens in groups.items()
            if not _whole(tokens, 0)
        ]
    if not _whole(header.get("seed", 0), 0):
        out.append(("seed", f"must be a whole number >= 0, got {header['seed']!r}"))
    if not _whole(header.get("warm_up_requests", 0) or 0, 0):
        out.append(("warm_up_requests", f"must be a whole number >= 0, got {header['warm_up_requests']!r}"))
    return out


def check_trace_files(source: TraceSource) -> TraceFileInfo:
    """Check the file(s) a scenario's :class:`~simpy_llm.config.schema.TraceSource` names
    without reading their rows: each exists and can be read, a CSV's header line has the
    columns its format needs (without duplicates), a Mooncake file's first object has the
    keys every row needs, and a trace v2's YAML header is valid (``trace_version``,
    ``time_unit``, ``mode``, and the keys the replay reads: ``prefix_block_tokens``,
    ``prefix_groups``, ``seed``, ``warm_up_requests``). Replaying at ``send_time_us`` needs
    that column.

    The rows are read, and checked, when the trace is loaded (:func:`load_trace`).

    Returns
    -------
    TraceFileInfo
        The trace v2 header (empty for the other formats) and the fields rows carry.

    Raises
    ------
    ScenarioError
        Naming the file and the line (or header key) of the first problem.

    The last :data:`CHECKED_TRACES_KEPT` results are kept, keyed by the source and its files'
    modification times and sizes: a fit or a sweep builds many simulations of one trace, and
    each checks it.

    Examples
    --------
    >>> from simpy_llm.config.schema import TraceSource
    >>> info = check_trace_files(TraceSource(path="data/azure_llm_2023/AzureLLMInferenceTrace_code.csv", format="azure"))
    >>> sorted(info.fields)
    ['arrival_time_us', 'input_tokens', 'output_tokens']
    >>> check_trace_files(TraceSource(path="data/azure_llm_2023/AzureLLMInferenceTrace_code.csv", format="burstgpt"))
    Traceback (most recent call last):
    ...
    simpy_llm.config.errors.ScenarioError: data/azure_llm_2023/AzureLLMInferenceTrace_code.csv: 1 problem(s) in trace
      line 1: missing column(s) Timestamp, Request tokens, Response tokens; the header has: TIMESTAMP, ContextTokens, GeneratedTokens
    """
    key = (repr(source), _file_stats(source))
    with _checked_lock:
        kept = _checked.get(key)
        if kept is not None:
            _checked.move_to_end(key)
    if kept is None:
        try:
            kept = _check_trace_files(source)
        except ScenarioError as exc:
            raise ScenarioError(exc.source, exc.problems, "trace") from None
        with _checked_lock:
            _checked[key] = kept
            while len(_checked) > CHECKED_TRACES_KEPT:
                _checked.popitem(last=False)
    return TraceFileInfo(copy.deepcopy(kept.header), kept.fields)


CHECKED_TRACES_KEPT = 64
"""How many results of :func:`check_trace_files` are kept for the next check of the same
source and unchanged files."""

_checked: OrderedDict[tuple[str, tuple[tuple[str, int, int] | None, ...]], TraceFileInfo] = OrderedDict()
_checked_lock = threading.Lock()  # sweeps may build simulations from threads


def _file_stats(source: TraceSource) -> tuple[tuple[str, int, int] | None, ...]:
    """``(path, modification time in ns, size)`` of each file *source* reads (None for one not there)."""
    paths = trace_v2_paths(source.path) if source.format == "trace_v2" else (Path(source.path),)
    out: list[tuple[str, int, int] | None] = []
    for path in paths:
        try:
            stat = path.stat()
        except OSError:
            out.append(None)
        else:
            out.append((str(path), stat.st_mtime_ns, stat.st_size))
    return tuple(out)


def _check_trace_files(source: TraceSource) -> TraceFileInfo:
    fmt = source.format
    if fmt == "mooncake":
        _first_jsonl_object(source.path)
        return TraceFileInfo({}, frozenset(("arrival_time_us", "input_tokens", "output_tokens", "prefix_group", "prefix_blocks")))
    if fmt == "trace_v2":
        header_path, csv_path = trace_v2_paths(source.path)
        header = _read_header(header_path)
        problems = _Problems(header_path)
        for key, message in _replay_header_problems(header):
            problems.add(f"key {key}", message)
        problems.raise_if_any()
        names = _csv_header(csv_path)
        problems = _Problems(csv_path)
        _require_columns(names, _REQUIRED, problems)
        if source.arrival_column == "send_time_us":
            _require_columns(names, ("send_time_us",), problems, " (arrival_column: send_time_us replays the send times)")
        return TraceFileInfo(header, frozenset(c for c in names if c in _KINDS))
    names = _csv_header(source.path)
    problems = _Problems(source.path)
    if fmt == "azure":
        _require_columns(names, _AZURE_COLUMNS, problems)
        return TraceFileInfo({}, frozenset(("arrival_time_us", "input_tokens", "output_tokens")))
    if fmt == "burstgpt":
        _require_columns(names, _BURSTGPT_COLUMNS, problems)
        return TraceFileInfo({}, frozenset(("arrival_time_us", "input_tokens", "output_tokens", "status", "error_message")))
    if fmt == "csv":
        mapping = _column_mapping(names, source.columns, problems)
        return TraceFileInfo({}, frozenset("arrival_time_us" if f in _ARRIVAL_FIELDS else f for f in mapping))
    raise ScenarioError(str(source.path), [("format", f"must be one of trace_v2, azure, mooncake, burstgpt, csv, got {fmt!r}")])


# --------------------------------------------------------------------------- replay


LOADED_TRACES_KEPT = 4
"""How many loaded traces :func:`load_trace` keeps in memory for the next load of the same
source and file contents (0 keeps none)."""

_loaded: OrderedDict[tuple[str, tuple[tuple[str, bytes | None], ...]], Trace] = OrderedDict()
_loaded_lock = threading.Lock()  # sweeps may load from threads


def _file_digests(source: TraceSource) -> tuple[tuple[str, bytes | None], ...]:
    """The contents' digest of each file *source* reads (None for a file that is not there)."""
    paths = trace_v2_paths(source.path) if source.format == "trace_v2" else (Path(source.path),)
    out = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                out.append((str(path), hashlib.file_digest(f, "blake2b").digest()))
        except OSError:
            out.append((str(path), None))
    return tuple(out)


def _copy_trace(trace: Trace) -> Trace:
    """A copy of *trace* whose header and frame its caller may change (without normalising
    the frame again)."""
    out = object.__new__(Trace)
    object.__setattr__(out, "header", copy.deepcopy(trace.header))
    object.__setattr__(out, "frame", trace.frame.copy())
    return out


def load_trace(source: TraceSource) -> Trace:
    """The trace a scenario's :class:`~simpy_llm.config.schema.TraceSource` names, ready to replay.

    The last :data:`LOADED_TRACES_KEPT` traces loaded stay in memory, keyed by the source and
    the digest of its files' contents: loading the same source again while its files are
    unchanged (a fit replays its trace hundreds of times, a sweep or capacity study once per
    point) copies the kept trace instead of parsing the files again. Each call returns a
    trace of its own.

    1. Read ``source.path`` by ``source.format`` (``trace_v2``: :func:`read_trace_v2`,
       ``azure``, ``mooncake``, ``burstgpt``, ``csv``: :func:`read_csv_mapped` with
       ``source.columns``).
    2. With ``arrival_column: send_time_us`` (an observed trace), the send times
       become the arrivals and rows never sent are left out: the server saw the
       requests when they were sent, which a lagging client or a closed-loop
       session makes differ from the targets in ``arrival_time_us``.
    3. Order the rows by arrival (stable: ties keep file order) and keep the first
       ``max_requests``.
    4. Scale the arrivals: ``t' = first + round((t - first) * time_scale / rate_scale)``
       microseconds, ``first`` the earliest arrival. ``time_scale`` stretches the gaps,
       ``rate_scale`` divides them: they are inverses (``time_scale: 2`` =
       ``rate_scale: 0.5``), both kept so a scenario can say what it means. Measured
       times (``send_time_us``, ...) are not scaled.
    5. Fill blanks: ``client_id`` with ``source.client_id`` (default: the file's stem),
       ``tenant_id`` with the client id, ``slo_class`` with ``source.slo_class``.

    The header gains ``replay: {format, time_scale, rate_scale, max_requests, arrival_column}``.
    """
    key = (repr(source), _file_digests(source))
    with _loaded_lock:
        kept = _loaded.get(key)
        if kept is not None:
            _loaded.move_to_end(key)
    if kept is None:
        kept = _load_trace(source)
        with _loaded_lock:
            _loaded[key] = kept
            while len(_loaded) > LOADED_TRACES_KEPT:
                _loaded.popitem(last=False)
    return _copy_trace(kept)


def _load_trace(source: TraceSource) -> Trace:
    """:func:`load_trace` without the kept traces."""
    fmt = source.format  # (settings of another format are refused by TraceSource itself)
    readers: dict[str, Callable[[Any], Trace]] = {
        "trace_v2": read_trace_v2,
        "azure": read_azure,
        "mooncake": read_mooncake,
        "burstgpt": read_burstgpt,
        "csv": lambda p: read_csv_mapped(p, source.columns),
    }
    if fmt not in readers:
        raise ScenarioError(str(source.path), [("format", f"must be one of {', '.join(readers)}, got {fmt!r}")])
    trace = readers[fmt](source.path)
    frame = trace.frame
    if source.arrival_column == "send_time_us":
        sent = frame["send_time_us"]
        if len(frame) and not sent.notna().any():  # a generated trace: replaying it would send nothing
            raise ScenarioError(
                str(source.path), [("column send_time_us", "no row has a send time (not an observed trace): replay it at arrival_time_us")], "trace"
            )
        frame = frame[sent.notna()].copy()
        frame["arrival_time_us"] = frame["send_time_us"].astype(np.int64)
    t = frame["arrival_time_us"].to_numpy()
    if len(t) > 1 and not bool(np.all(t[1:] >= t[:-1])):
        frame = frame.iloc[np.argsort(t, kind="stable")]
    if source.max_requests is not None:
        frame = frame.iloc[: source.max_requests]
    frame = frame.reset_index(drop=True).copy()
    if len(frame) and (source.time_scale != 1.0 or source.rate_scale != 1.0):
        t = frame["arrival_time_us"].to_numpy()
        first = int(t.min())
        frame["arrival_time_us"] = first + np.rint((t - first) * source.time_scale / source.rate_scale).astype(np.int64)
    client = source.client_id or _stem(source.path)
    frame["client_id"] = frame["client_id"].where(frame["client_id"] != "", client)
    frame["tenant_id"] = frame["tenant_id"].where(frame["tenant_id"] != "", frame["client_id"])
    frame["slo_class"] = frame["slo_class"].where(frame["slo_class"] != "", source.slo_class)
    replay = {
        "format": fmt,
        "time_scale": source.time_scale,
        "rate_scale": source.rate_scale,
        "max_requests": source.max_requests,
        "arrival_column": source.arrival_column,
    }
    return Trace({**trace.header, "replay": replay}, frame)


SERVER_BLOCK_KEYS: dict[str, str] = {
    "max_num_seqs": "max_num_seqs",
    "block_size": "kv_block_size",
    "max_model_len": "max_model_len",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "enable_prefix_caching": "prefix_caching",
}
"""Keys of a trace header's ``server`` block (seed 000 §7) and the engine settings they
describe, for a vLLM-style block (``type`` vllm, sglang, emulated, other, or none). The
block's other keys (server type, model, tensor parallelism, GPU memory utilisation, ...)
describe the observed server and are not compared."""

LLAMACPP_BLOCK_KEYS: dict[str, str] = {
    "n_parallel": "max_num_seqs",
    "n_batch": "max_num_batched_tokens",
    "ctx_per_slot": "max_model_len",
    "cache_prompt": "prefix_caching",
}
"""The same for a ``type: llamacpp`` block (llama.cpp's own names): slots are the running
batch, the logical batch the tokens of a step, a slot's context the longest request, the
prompt cache prefix caching. llama.cpp clamps ``n_batch`` to the whole context
(``n_ctx``, else ``n_parallel x ctx_per_slot``), and the comparison does too."""


def emulated_server_block(scenario: Any, model: str) -> dict[str, Any]:
    """The ``server`` block describing *scenario*'s serving system as a server serving *model*
    (what ``simpy-llm serve`` reports about itself, and what a simulated observation's header
    holds): ``type: emulated``, ``model``, ``scenario`` (its name), the engine settings under
    vLLM's names (:data:`SERVER_BLOCK_KEYS`, each given when every replica group has the same
    value), ``replicas``, the whole ``serving`` section (as ``scenario_to_dict`` writes it),
    ``seed`` and ``simulation_mode``: with them a scenario rebuilds the serving system exactly.
    """
    from simpy_llm.config.loader import scenario_to_dict

    groups = scenario.serving.groups()
    out: dict[str, Any] = {"type": "emulated", "model": model, "scenario": scenario.name}
    for key, field in SERVER_BLOCK_KEYS.items():
        values = {getattr(g.engine, field) for g in groups}
        if len(values) == 1:
            out[key] = values.pop()
    out["replicas"] = scenario.serving.num_replicas
    out["serving"] = scenario_to_dict(scenario)["serving"]
    out["seed"] = scenario.seed
    out["simulation_mode"] = scenario.simulation.mode
    return out


def server_block_mismatches(header: Mapping[str, Any], engine: Any) -> list[tuple[str, str]]:
    """``(engine key, message)`` for each setting of the header's ``server`` block that
    differs from *engine* (an :class:`~simpy_llm.config.schema.EngineConfig`): the keys of
    :data:`LLAMACPP_BLOCK_KEYS` for a ``type: llamacpp`` block, of :data:`SERVER_BLOCK_KEYS`
    for any other. Keys absent or null in the block are not compared.

    >>> from simpy_llm.config.schema import EngineConfig
    >>> server_block_mismatches({"server": {"max_num_seqs": 4, "block_size": 16}}, EngineConfig())
    [('max_num_seqs', 'the trace was recorded with server.max_num_seqs = 4, the scenario has 256')]
    >>> server_block_mismatches({"server": {"type": "llamacpp", "n_parallel": 4, "cache_prompt": True}}, EngineConfig())
    [('max_num_seqs', 'the trace was recorded with server.n_parallel = 4, the scenario has 256')]
    """
    server = header.get("server") or {}
    if not isinstance(server, Mapping):
        return [("", f"the header's server block must be a mapping, got {server!r}")]
    keys = LLAMACPP_BLOCK_KEYS if server.get("type") == "llamacpp" else SERVER_BLOCK_KEYS
    out = []
    for key, field in keys.items():
        value = server.get(key)
        if value is None:
            continue
        if key == "n_batch":
            value = _effective_n_batch(server, value)
        if value != getattr(engine, field):
            shown = f"{server[key]!r}" if value == server[key] else f"{server[key]!r} (clamped to the context: {value!r})"
            out.append((field, f"the trace was recorded with server.{key} = {shown}, the scenario has {getattr(engine, field)!r}"))
    return out


def _effective_n_batch(server: Mapping[str, Any], n_batch: Any) -> Any:
    """llama.cpp's logical batch as it runs: at most the whole context."""
    n_ctx = server.get("n_ctx")
    if n_ctx is None and _is_int(server.get("n_parallel")) and _is_int(server.get("ctx_per_slot")):
        n_ctx = server["n_parallel"] * server["ctx_per_slot"]
    return min(n_batch, n_ctx) if _is_int(n_batch) and _is_int(n_ctx) else n_batch


def _stem(path: Path | str) -> str:
    p = Path(path)
    return p.name if p.is_dir() else p.stem


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
    from simpy_llm.workload.prefix import prefix_blocks

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
