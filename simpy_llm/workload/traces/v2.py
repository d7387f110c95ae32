"""Trace v2 files, a YAML header beside a CSV sharing its stem: the two paths of a trace
(:func:`trace_v2_paths`), reading both (:func:`read_trace_v2`, the header checked key by key),
and writing them, a whole trace at once (:func:`write_trace_v2`, :func:`write_generated_trace`)
or one row at a time, each flushed (:class:`TraceV2Writer`).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from datetime import UTC, date, datetime
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd
import yaml

from simpy_llm.config.errors import ScenarioError
from simpy_llm.workload.traces.columns import (
    _DEFAULTS,
    _KINDS,
    _MODES,
    _REQUIRED,
    TIME_UNIT,
    TRACE_VERSION,
    V2_COLUMNS,
    Trace,
    _bool_value,
    _complete_header,
    _kind,
    _parse_columns,
    _Problems,
    _read_csv_strings,
    _require_columns,
    _strings,
)

__all__ = [
    "TraceV2Writer",
    "read_trace_v2",
    "trace_v2_paths",
    "write_generated_trace",
    "write_trace_v2",
]


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
        position = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ScenarioError(source, [(position, f"not valid YAML: {exc.problem or exc}")]) from None
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
    columns; missing ones take the defaults of :func:`~simpy_llm.workload.traces.normalize_frame`.

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


_FAST_OTHER, _FAST_STR, _FAST_BOOL, _FAST_INT, _FAST_NINT = range(5)
"""How :meth:`TraceV2Writer.write_row` formats a column's usual values without
:func:`_format_cell`: ``str`` as it is (kind ``str``), ``int`` by ``str()`` (kinds ``int``
and ``nint``), ``bool`` as ``true``/``false`` (kind ``bool``), ``None`` as an empty cell
(kinds ``str`` and ``nint``); anything else (floats, numpy scalars, ``pd.NA``, subclasses)
goes through :func:`_format_cell`. The codes are ordered so that ``>= _FAST_INT`` means an
integer kind."""


def _fast_kind(kind: str) -> int:
    return {"str": _FAST_STR, "bool": _FAST_BOOL, "int": _FAST_INT, "nint": _FAST_NINT}.get(kind, _FAST_OTHER)


def _absent_cell(name: str, kind: str) -> str:
    """The cell of column *name* (of *kind*) in a row that leaves it out (not ``request_id``)."""
    default = _DEFAULTS.get(name, 0 if kind == "int" else None)
    return _format_cell(default, name, kind) if default is not None else ""


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
    frame: pd.DataFrame, path: Path | str, *, source: Any = None, seed: int | None = None, max_concurrency: int | None = None
) -> tuple[Path, Path]:
    """Write a generated workload (a frame with ``arrival_time_s`` in seconds, as
    :func:`simpy_llm.workload.export.generate_requests` makes) as a trace v2 with
    ``mode: generated``; returns ``(header_path, csv_path)``.

    Arrival times are rounded to whole microseconds. The header records the
    spec file (``workload_spec``), ``seed`` and the workload's cap on requests in flight
    (``max_concurrency``: the arrival times are when requests fall due, not when a capped
    client sends them) when given.
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
    if max_concurrency is not None:
        header["max_concurrency"] = int(max_concurrency)
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
    of :func:`~simpy_llm.workload.traces.normalize_frame` (``request_id``: the row's number), unknown
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
        # Each column's cell when a row leaves it out, made once (request_id: the row's number,
        # marked None); and the columns whose usual values (exactly str, int, bool or None) have
        # a cell that needs no checking: _format_cell gives the same for those.
        self._plan = [
            (name, kind, _fast_kind(kind), _absent_cell(name, kind) if name != "request_id" else None)
            for name, kind in self._kinds
        ]
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
        self._opened()
        return self

    def _opened(self) -> IO[str]:
        """The CSV file, opened (the header file and the CSV's header line written) if it
        was not yet."""
        if self._closed:
            raise ValueError("the writer is closed")
        file = self._file
        if file is None:
            _write_header(self.header_path, self.header)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            file = self._file = self.path.open("w", encoding="utf-8", newline="")
            self._writer = csv.writer(file, lineterminator="\n")
            self._writer.writerow(self.columns)
            file.flush()
        return file

    def write_row(self, row: Mapping[str, Any]) -> None:
        """Append one request (see the class docstring) and flush."""
        file = self._file
        if file is None:
            file = self._opened()
        if not self._known.issuperset(row):
            unknown = [k for k in row if k not in self._known]
            raise ValueError(f"unknown trace column(s) {', '.join(map(str, unknown))}; declare extra_columns")
        if "arrival_time_us" not in row:
            raise ValueError("a trace row needs arrival_time_us")
        cells: list[str] = []
        append = cells.append
        for name, kind, fast, absent in self._plan:
            if name in row:
                value = row[name]
                vtype = type(value)
                if vtype is str and fast == _FAST_STR:
                    append(value)
                elif vtype is int and fast >= _FAST_INT:
                    append(str(value))
                elif value is None and (fast == _FAST_STR or fast == _FAST_NINT):
                    append("")
                elif vtype is bool and fast == _FAST_BOOL:
                    append("true" if value else "false")
                else:
                    append(_format_cell(value, name, kind))
            elif absent is None:
                append(str(self.rows_written))
            else:
                append(absent)
        self._writer.writerow(cells)
        self.rows_written += 1
        if self.rows_written % self.flush_every == 0:
            file.flush()

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
        self._opened().close()
        self._closed = True

    def __enter__(self) -> TraceV2Writer:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()
