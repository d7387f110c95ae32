"""Trace v2 columns and the :class:`Trace`: the request columns and their kinds
(:data:`V2_COLUMNS`, :data:`EXTENSION_COLUMNS`, :data:`OBSERVED_COLUMNS`), the coercion of a
frame to them (:func:`normalize_frame`), the :class:`Trace` (a header and a normalised frame),
and the parsing of a CSV's string cells into those kinds, each problem reported with its line
(shared by the trace v2 reader and the importers of :mod:`simpy_llm.workload.traces.imported`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pandas as pd

from simpy_llm.config.errors import ScenarioError

__all__ = [
    "EXTENSION_COLUMNS",
    "OBSERVED_COLUMNS",
    "TIME_UNIT",
    "TRACE_VERSION",
    "V2_COLUMNS",
    "Trace",
    "normalize_frame",
    "us_from_s",
]


TRACE_VERSION = 2
"""The ``trace_version`` this package reads and writes."""
TIME_UNIT = "microseconds"
"""The ``time_unit`` of every trace v2 time column."""

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


def us_from_s(seconds: float) -> int:
    """Seconds to whole trace v2 microseconds (rounded to nearest).

    >>> us_from_s(1.5), us_from_s(0.0000014)
    (1500000, 1)
    """
    return round(seconds * 1e6)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
    """A request trace: the header and one frame row per request (see :mod:`simpy_llm.workload.traces`).

    The header always has ``trace_version: 2`` and ``time_unit: microseconds``;
    the frame is normalised by :func:`normalize_frame`. Rows stay in file
    order; :func:`~simpy_llm.workload.traces.trace_requests` gives them in arrival order.
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
    read = _read_csv_arrow(path)
    try:  # header=None: the header line fixes the field count, so no row can have more
        df = read if read is not None else pd.read_csv(
            path, header=None, dtype=str, keep_default_na=False, skip_blank_lines=False, encoding="utf-8"
        )
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


def _read_csv_arrow(path: Path | str) -> pd.DataFrame | None:
    """What :func:`pandas.read_csv` gives :func:`_read_csv_strings` for the CSV at *path*,
    parsed by pyarrow's CSV reader straight into the strings pandas holds in pyarrow (no Python
    string per cell); None when pandas does not hold strings in pyarrow, or the file is one
    this path does not take (every row with the header's field count, in valid UTF-8, no blank
    line, carriage return, NUL or quote), which pandas then reads, reporting any problem as it always did.

    On the files this path takes (plain cells, a byte-order mark or none) both readers give
    the same cells; a hypothesis test compares them on any text.
    """
    if _STR_DTYPE is None:
        return None
    import pyarrow as pa  # present whenever pandas holds strings in it
    import pyarrow.csv as pa_csv

    try:
        data = Path(path).read_bytes()
    except OSError:  # missing, a directory, unreadable: the pandas path says which
        return None
    if data[:1] == b"\n" or b"\n\n" in data or b"\r" in data or b"\x00" in data or b'"' in data:
        return None  # blank lines, carriage returns, NUL, quoting: where the readers may differ, pandas reads
    end = data.find(b"\n")
    read = pa_csv.ReadOptions(autogenerate_column_names=True, use_threads=False)
    try:
        fields = pa_csv.read_csv(pa.py_buffer(data[: end + 1] if end >= 0 else data), read_options=read).num_columns
        table = pa_csv.read_csv(
            pa.py_buffer(data),
            read_options=read,
            parse_options=pa_csv.ParseOptions(ignore_empty_lines=False),
            convert_options=pa_csv.ConvertOptions(
                column_types={f"f{i}": pa.large_string() for i in range(fields)},
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_columns != fields:
        return None
    df = table.to_pandas(types_mapper={pa.large_string(): _STR_DTYPE}.get)
    df.columns = pd.RangeIndex(fields)
    return df


def _pyarrow_str_dtype() -> Any:
    """pandas' ``str`` dtype when it holds strings in pyarrow, else None."""
    dtype = pd.Series([""], dtype=str).dtype
    return dtype if isinstance(dtype, pd.StringDtype) and dtype.storage == "pyarrow" else None


_STR_DTYPE = _pyarrow_str_dtype()
"""pandas' ``str`` dtype when it holds strings in pyarrow (what ``read_csv(dtype=str)`` gives), else None."""


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
    plain = _plain_ints(s)
    values: Any = None  # the cells as Python strings: made only when needed
    if plain is not None:
        ints, empty = plain
        any_empty = bool(empty.any())
    else:
        values = s.to_numpy(dtype=object)
        empty = values == ""
        any_empty = bool(empty.any())
        try:  # plain integers (numpy calls int() per cell)
            ints = np.zeros(len(values), dtype=np.int64)
            ints[~empty] = values[~empty].astype(np.int64) if any_empty else values.astype(np.int64)
        except (ValueError, OverflowError, TypeError):
            stripped = s.str.strip()
            empty = (stripped == "").to_numpy()
            any_empty = bool(empty.any())
            ok = s.str.fullmatch(_INT_RE).to_numpy(dtype=bool)
            problems.cells(~ok & ~empty, lines, column, values, lambda v: f"not a whole number: {v!r}")
            # copy=True: a column held by pyarrow gives a read-only view, and blanks are filled below
            ints = stripped.where(ok, "0").str.replace(r"\.0*$", "", regex=True).astype(np.int64).to_numpy(copy=True)
    if any_empty and default is None and not nullable:
        values = s.to_numpy(dtype=object) if values is None else values
        problems.cells(empty, lines, column, values, lambda v: "missing value")
    if non_negative and bool((negative := ~empty & (ints < 0)).any()):
        values = s.to_numpy(dtype=object) if values is None else values
        problems.cells(negative, lines, column, values, lambda v: f"must be >= 0, got {v.strip()}")
    if nullable:
        out = pd.array(ints, dtype="Int64")
        if any_empty:
            out[empty] = pd.NA
        return out
    if any_empty and default is not None:
        ints[empty] = default
    return ints


def _plain_ints(s: pd.Series) -> tuple[np.ndarray, np.ndarray] | None:
    """``(integers, empty)`` of a string column held by pyarrow (pandas' ``str`` dtype with
    pyarrow) whose every cell is blank or a plain decimal integer (digits after an optional
    ``-``) within int64; None for any other column, which the per-cell parsing reads.

    Arrow's cast accepts only such cells, each of which ``int()`` reads as the same number,
    so the parse is the per-cell one's without a Python string per cell (blank cells: 0).
    """
    dtype = s.dtype
    if not (isinstance(dtype, pd.StringDtype) and dtype.storage == "pyarrow"):
        return None
    import pyarrow as pa  # present whenever pandas holds strings in it
    import pyarrow.compute as pc

    cells = pa.array(s.array)
    if cells.null_count:  # a missing cell (a short row): the per-cell parsing reports it
        return None
    blank = pc.equal(cells, "")
    try:
        parsed = pc.cast(pc.if_else(blank, pa.scalar(None, cells.type), cells), pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    ints = np.asarray(parsed.fill_null(0), dtype=np.int64)  # an array or a chunked array alike
    if not ints.flags.writeable:  # a view of arrow's buffer: blanks are filled in place later
        ints = ints.copy()
    return ints, np.asarray(blank, dtype=bool)


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
