"""LUT files (seed 003 §5.2): reading, checking and interpolating a lookup table of measured
step latencies, which the ``lut`` latency model (:mod:`simpy_llm.serving.lut`) reads.

A LUT file is a CSV (or Parquet, by its ``.parquet`` / ``.pq`` ending, read through the
``parquet`` extra and checked cell by cell as a CSV is) with one row per measured
configuration:

* **key columns** (required): ``phase``, ``model``, ``hardware``,
  ``tensor_parallel``, ``pipeline_parallel``, ``context_len``, ``microbatch``,
  ``fanout_k``, ``dtype``;
* ``latency_ms`` (required): the mean latency of one engine step (forward
  pass) of that configuration, ms;
* optional columns, validated when present: ``latency_p95_ms`` (its 95th
  percentile; read by ``tail: sampled``), ``energy_mj`` (a step's energy),
  ``kv_delta_mb`` (the KV a step adds), ``cost_nonatt_ms`` and ``cost_attn_ms``
  (the step's latency split into attention and the rest; on a row that gives both
  they must add up to ``latency_ms`` within 1 %), all read by the ``lut`` model;
  ``peak_mem_mb``, ``attn_mode``, ``source``, ``notes`` (kept in :attr:`Lut.frame`).

``phase`` is one of the seed's ``prefill``, ``draft_decode``, ``verify``,
``fused_decode``, or ``decode``: plain (non-speculative) decoding, one token
per sequence, which the seed's enumeration lacks. ``context_len`` is the
prompt length for ``prefill`` and the per-sequence KV length for the decode
phases; ``microbatch`` the number of sequences in the step.

The rows sharing ``(phase, model, hardware, tensor_parallel,
pipeline_parallel, dtype, fanout_k)`` form a **slice**: a full rectangular
grid over ``context_len`` x ``microbatch`` (:class:`LutSlice`), read by
bilinear interpolation and linear extrapolation (:meth:`LutSlice.latency_ms_at`).
``docs/latency.md`` (section ``lut``) states every rule and assumption.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from simpy_llm.config.errors import ProblemList, ScenarioError
from simpy_llm.config.validators import MAX_COEFFICIENT_US, MAX_TOKENS

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "DECODE_PHASES",
    "DTYPES",
    "GRID_COLUMNS",
    "KEY_COLUMNS",
    "OPTIONAL_COLUMNS",
    "PARQUET_SUFFIXES",
    "PHASES",
    "REQUIRED_COLUMNS",
    "SLICE_COLUMNS",
    "SPLIT_TOLERANCE",
    "Lut",
    "LutSlice",
    "load_lut",
    "load_lut_cached",
]

PHASES = ("prefill", "draft_decode", "verify", "fused_decode", "decode")
"""Allowed ``phase`` values: the seed's four, plus ``decode`` (plain decoding, one token per sequence)."""
DECODE_PHASES = ("decode", "draft_decode")
"""The phases whose rows the ``lut`` model's decode term can read (its ``decode_phase``)."""
DTYPES = ("fp16", "bf16", "fp8")
"""Allowed ``dtype`` values."""
ATTN_MODES = ("batched", "per_request")
"""Allowed ``attn_mode`` values."""
SLICE_COLUMNS = ("phase", "model", "hardware", "tensor_parallel", "pipeline_parallel", "dtype", "fanout_k")
"""The columns that name a slice (a grid over ``context_len`` x ``microbatch``)."""
KEY_COLUMNS = (*SLICE_COLUMNS, "context_len", "microbatch")
"""The columns that identify a row: no two rows may share them."""
REQUIRED_COLUMNS = (
    "phase", "model", "hardware", "tensor_parallel", "pipeline_parallel",
    "context_len", "microbatch", "fanout_k", "dtype", "latency_ms",
)
"""Columns every LUT has (the seed's required columns, less ``peak_mem_mb``, ``kv_delta_mb``
and ``energy_mj``, which no latency model reads)."""
OPTIONAL_COLUMNS = (
    "latency_p95_ms", "peak_mem_mb", "kv_delta_mb", "energy_mj",
    "cost_nonatt_ms", "cost_attn_ms", "attn_mode", "source", "notes",
)
"""Columns a LUT may have; a blank cell is a missing value."""
_INT_COLUMNS = ("tensor_parallel", "pipeline_parallel", "context_len", "microbatch", "fanout_k")
_MAX_INT = MAX_TOKENS
"""Largest integer in an integer column (context lengths and batch sizes beyond any engine)."""
_MAX_MS = MAX_COEFFICIENT_US / 1e3
"""Largest time in a time column, ms (1,000 s, the bound of every latency coefficient)."""
_NONNEGATIVE = ("latency_p95_ms", "peak_mem_mb", "energy_mj", "cost_nonatt_ms", "cost_attn_ms")
GRID_COLUMNS = ("energy_mj", "kv_delta_mb", "cost_nonatt_ms", "cost_attn_ms")
"""Optional numeric columns a slice keeps on its grid (:attr:`LutSlice.columns`) for the
``lut`` model to read: step energy, KV growth per step, and the attention / non-attention split."""
SPLIT_TOLERANCE = 0.01
"""Largest relative gap allowed between ``cost_nonatt_ms + cost_attn_ms`` and ``latency_ms``
on a row that gives both parts."""
_MAX_PROBLEMS = 25
"""Problems listed in one error (a file with more says how many were left out)."""

# --------------------------------------------------------------------------- the table


def _axis(xs: tuple[float, ...], x: float) -> tuple[int, int, float]:
    """Neighbours ``i, j`` and weight ``t`` of *x* on the sorted grid *xs*: the value is
    ``(1 - t) * v[i] + t * v[j]``; ``t`` falls outside [0, 1] beyond the grid (linear
    extrapolation from the two end points); a one-point axis is constant."""
    n = len(xs)
    if n == 1:
        return 0, 0, 0.0
    i = bisect.bisect_right(xs, x) - 1
    if i < 0:
        i = 0
    elif i > n - 2:
        i = n - 2
    x0, x1 = xs[i], xs[i + 1]
    return i, i + 1, (x - x0) / (x1 - x0)


def _axis_vec(xs: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_axis` for an array of points (``numpy.searchsorted``)."""
    n = len(xs)
    if n == 1:
        zero = np.zeros(x.shape, dtype=np.intp)
        return zero, zero, np.zeros(x.shape)
    i = np.clip(np.searchsorted(xs, x, side="right") - 1, 0, n - 2)
    x0, x1 = xs[i], xs[i + 1]
    return i, i + 1, (x - x0) / (x1 - x0)


@attrs.frozen(kw_only=True, eq=False)
class LutSlice:
    """The rows of one (phase, model, hardware, TP, PP, dtype, fanout) as a grid.

    ``latency_ms[i, j]`` is the row at ``context_len[i]`` and ``microbatch[j]``;
    both axes ascend. The arrays are read-only.

    Examples
    --------
    >>> s = LutSlice.from_points(("decode", "m", "g", 1, 1, "fp16", 1),
    ...                          [(100, 1, 10.0), (200, 1, 12.0), (100, 4, 14.0), (200, 4, 20.0)])
    >>> s.latency_ms_at(100, 4), s.latency_ms_at(150, 2)
    (14.0, 13.0)
    >>> s.latency_ms_at(300, 1)       # past the last context: along the last two points
    14.0
    >>> s.latency_ms_at(1, 1)         # before the first: the same line, never below 0
    8.02
    """

    key: tuple[str, str, str, int, int, str, int]
    """``(phase, model, hardware, tensor_parallel, pipeline_parallel, dtype, fanout_k)``."""
    context_len: np.ndarray
    """Context lengths of the grid, ascending, tokens."""
    microbatch: np.ndarray
    """Microbatch sizes of the grid, ascending, sequences."""
    latency_ms: np.ndarray
    """Mean step latency at each grid point, ms, shape ``(len(context_len), len(microbatch))``."""
    latency_p95_ms: np.ndarray
    """95th percentile at each grid point, ms (NaN where the file leaves it blank)."""
    rows: np.ndarray
    """The file row of each grid point (row 1 is the header, as a spreadsheet numbers them)."""
    columns: Mapping[str, np.ndarray] = attrs.field(factory=dict)
    """The optional numeric columns the file has (:data:`GRID_COLUMNS`), each on the grid (NaN
    where the file leaves a cell blank)."""
    _cx: tuple[float, ...] = attrs.field(init=False, repr=False)
    _mx: tuple[float, ...] = attrs.field(init=False, repr=False)
    _z: tuple[tuple[float, ...], ...] = attrs.field(init=False, repr=False)
    _q: tuple[tuple[float, ...], ...] = attrs.field(init=False, repr=False)
    _extra: dict[str, tuple[tuple[float, ...], ...]] = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        for name in ("context_len", "microbatch", "latency_ms", "latency_p95_ms", "rows"):
            getattr(self, name).setflags(write=False)
        for grid in self.columns.values():
            grid.setflags(write=False)
        object.__setattr__(self, "_extra", {k: tuple(tuple(map(float, r)) for r in v) for k, v in self.columns.items()})
        # Plain tuples for the scalar path: bisect and float arithmetic on Python floats are
        # several times faster than numpy on one point.
        object.__setattr__(self, "_cx", tuple(map(float, self.context_len)))
        object.__setattr__(self, "_mx", tuple(map(float, self.microbatch)))
        object.__setattr__(self, "_z", tuple(tuple(map(float, r)) for r in self.latency_ms))
        object.__setattr__(self, "_q", tuple(tuple(map(float, r)) for r in self.latency_p95_ms))

    @classmethod
    def from_points(
        cls,
        key: tuple[Any, ...],
        points: Iterable[tuple[int, int, float] | tuple[int, int, float, float]],
        columns: Mapping[str, Iterable[tuple[int, int, float]]] | None = None,
    ) -> LutSlice:
        """A slice from ``(context_len, microbatch, latency_ms[, latency_p95_ms])`` points
        forming a full grid (no file rows: :attr:`rows` are 0), with optional *columns*
        (:data:`GRID_COLUMNS`) as ``(context_len, microbatch, value)`` points on it.

        Raises :class:`ValueError` when the points miss a grid point or repeat one.
        """
        pts = [tuple(p) for p in points]
        cs = sorted({int(p[0]) for p in pts})
        bs = sorted({int(p[1]) for p in pts})
        z = np.full((len(cs), len(bs)), np.nan)
        q = np.full((len(cs), len(bs)), np.nan)
        seen = set()
        for p in pts:
            i, j = cs.index(int(p[0])), bs.index(int(p[1]))
            if (i, j) in seen:
                raise ValueError(f"grid point (context_len {p[0]}, microbatch {p[1]}) given twice")
            seen.add((i, j))
            z[i, j] = float(p[2])
            if len(p) > 3:
                q[i, j] = float(p[3])
        if len(seen) != z.size:
            raise ValueError(f"{len(seen)} points do not fill the {len(cs)} x {len(bs)} grid")
        grids = {}
        for name, given in (columns or {}).items():
            if name not in GRID_COLUMNS:
                raise ValueError(f"column must be one of {', '.join(GRID_COLUMNS)}, got {name!r}")
            grid = np.full(z.shape, np.nan)
            for c, b, v in given:
                grid[cs.index(int(c)), bs.index(int(b))] = float(v)
            grids[name] = grid
        return cls(
            key=tuple(key),
            context_len=np.array(cs, dtype=float),
            microbatch=np.array(bs, dtype=float),
            latency_ms=z,
            latency_p95_ms=q,
            rows=np.zeros(z.shape, dtype=np.int64),
            columns=grids,
        )

    @property
    def has_p95(self) -> bool:
        """Whether every grid point has a ``latency_p95_ms``."""
        return bool(np.isfinite(self.latency_p95_ms).all())

    def weights(self, context_len: float, microbatch: float) -> tuple[int, int, int, int, float, float]:
        """``(i0, i1, j0, j1, tc, tb)``: the grid cell of a point and its position in it
        (outside [0, 1] beyond the grid)."""
        i0, i1, tc = _axis(self._cx, context_len)
        j0, j1, tb = _axis(self._mx, microbatch)
        return i0, i1, j0, j1, tc, tb

    @staticmethod
    def _blend(z: tuple[tuple[float, ...], ...], w: tuple[int, int, int, int, float, float]) -> float:
        i0, i1, j0, j1, tc, tb = w
        # (1 - t) a + t b (not a + t (b - a)): exact at t = 0 and t = 1, so grid points return
        # their table values bit for bit.
        lo = (1.0 - tb) * z[i0][j0] + tb * z[i0][j1]
        hi = (1.0 - tb) * z[i1][j0] + tb * z[i1][j1]
        return (1.0 - tc) * lo + tc * hi

    def latency_ms_at(self, context_len: float, microbatch: float) -> float:
        """Mean latency at a point, ms: bilinear inside the grid, extrapolated linearly
        from the last two grid points of each axis outside it, never below 0.

        A grid point returns its table value exactly; an axis with one grid point is
        constant along it.
        """
        v = self._blend(self._z, self.weights(context_len, microbatch))
        return v if v > 0.0 else 0.0

    def complete(self, column: str) -> bool:
        """Whether the file gives *column* (one of :data:`GRID_COLUMNS`) at every grid point."""
        grid = self.columns.get(column)
        return grid is not None and bool(np.isfinite(grid).all())

    def column_at(self, column: str, context_len: float, microbatch: float) -> float:
        """*column* (one of :data:`GRID_COLUMNS`, given at every grid point: :meth:`complete`)
        at a point, by the rule of :meth:`latency_ms_at`; never below 0 except ``kv_delta_mb``.

        >>> s = LutSlice.from_points(("decode", "m", "g", 1, 1, "fp16", 1), [(100, 1, 10.0), (200, 1, 12.0)],
        ...                          columns={"energy_mj": [(100, 1, 4.0), (200, 1, 6.0)]})
        >>> s.column_at("energy_mj", 150, 1)
        5.0
        """
        v = self._blend(self._extra[column], self.weights(context_len, microbatch))
        return v if v > 0.0 or column == "kv_delta_mb" else 0.0

    def p95_ms_at(self, context_len: float, microbatch: float) -> float:
        """``latency_p95_ms`` at a point, by the same rule as :meth:`latency_ms_at` (NaN
        when a grid point it uses has none)."""
        v = self._blend(self._q, self.weights(context_len, microbatch))
        return v if not v < 0.0 else 0.0

    def interpolate(self, context_len: Any, microbatch: Any, column: str = "latency_ms") -> np.ndarray:
        """:meth:`latency_ms_at` (or, with ``column="latency_p95_ms"``, :meth:`p95_ms_at`)
        at many points at once (arrays broadcast against each other).

        >>> s = LutSlice.from_points(("prefill", "m", "g", 1, 1, "fp16", 1), [(128, 1, 10.0), (256, 1, 20.0)])
        >>> s.interpolate([64, 128, 192, 512], 1).tolist()
        [5.0, 10.0, 15.0, 40.0]
        """
        if column not in ("latency_ms", "latency_p95_ms"):
            raise ValueError(f"column must be latency_ms or latency_p95_ms, got {column!r}")
        z = getattr(self, column)
        c, b = np.broadcast_arrays(np.asarray(context_len, dtype=float), np.asarray(microbatch, dtype=float))
        i0, i1, tc = _axis_vec(self.context_len, c)
        j0, j1, tb = _axis_vec(self.microbatch, b)
        lo = (1.0 - tb) * z[i0, j0] + tb * z[i0, j1]
        hi = (1.0 - tb) * z[i1, j0] + tb * z[i1, j1]
        out = (1.0 - tc) * lo + tc * hi
        return np.where(out < 0.0, 0.0, out)


@attrs.frozen(kw_only=True, eq=False)
class Lut:
    """A validated LUT file (:func:`load_lut`)."""

    source: str
    """The file it was read from."""
    frame: pd.DataFrame
    """Every row, typed (integer key columns, float times; optional columns as present,
    blanks as NaN or empty strings), with a ``row`` column giving its file row."""
    slices: Mapping[tuple[Any, ...], LutSlice]
    """The slices by key ``(phase, model, hardware, tensor_parallel, pipeline_parallel, dtype, fanout_k)``."""

    def describe(self, keys: Iterable[tuple[Any, ...]] | None = None) -> str:
        """The slice keys (all, or *keys*) as text, for error messages."""
        keys = sorted(self.slices if keys is None else keys, key=str)
        return "; ".join(
            f"{p} {m} on {h} tp{tp} pp{pp} {d} fanout_k {k}" for p, m, h, tp, pp, d, k in keys
        ) or "nothing"


# --------------------------------------------------------------------------- loading


PARQUET_SUFFIXES = (".parquet", ".pq")
"""File name endings read as Parquet (every other file is read as CSV)."""


def _parquet_text(value: Any) -> str:
    """A Parquet cell as the text a CSV would hold: null and NaN blank, numbers by ``repr``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return value if isinstance(value, str) else repr(value)


def _read_parquet_cells(path: Path, source: str) -> list[list[str]]:
    """A Parquet LUT's records as text cells (header first), so it passes the CSV's checks:
    a null (or NaN) is a blank cell, a number its shortest round-tripping text."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ScenarioError(
            source, [("", "reading a Parquet LUT needs pyarrow: pip install 'simpy-llm[parquet]' (or give a CSV)")],
            what="LUT",
        ) from None
    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise ScenarioError(source, [("", f"cannot read the file as Parquet: {exc}")], what="LUT") from None
    columns = [[_parquet_text(v) for v in col.to_pylist()] for col in table.columns]
    return [list(table.column_names), *(list(rec) for rec in zip(*columns, strict=True))]


def _read_cells(path: Path, source: str) -> list[list[str]]:
    """The file's records as lists of stripped strings (header first)."""
    if path.suffix.lower() in PARQUET_SUFFIXES:
        return [[v.strip() for v in rec] for rec in _read_parquet_cells(path, source)]
    import pandas as pd  # only when a LUT is read: a run without one need not load pandas

    try:
        raw = pd.read_csv(
            path, header=None, dtype=str, keep_default_na=False, na_filter=False,
            skip_blank_lines=False, encoding="utf-8-sig",
        )
    except pd.errors.EmptyDataError:
        raise ScenarioError(source, [("", "the file is empty; a LUT is a CSV with a header row")], what="LUT") from None
    except (OSError, UnicodeError, ValueError, pd.errors.ParserError) as exc:
        raise ScenarioError(source, [("", f"cannot read the file as CSV: {exc}")], what="LUT") from None
    return [["" if not isinstance(v, str) else v.strip() for v in rec] for rec in raw.itertuples(index=False, name=None)]


def _int_cell(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        f = float(text)
    except ValueError:
        return None
    return int(f) if math.isfinite(f) and f.is_integer() else None


def _float_cell(text: str) -> float | None:
    try:
        f = float(text)
    except ValueError:
        return None
    return f if math.isfinite(f) else None


def load_lut(path: str | os.PathLike[str]) -> Lut:
    """Read and validate a LUT file.

    Checks, each problem naming its file row (row 1 is the header, as a spreadsheet
    numbers rows) and column: every required column present and no unknown or
    repeated one; ``phase``, ``dtype`` and ``attn_mode`` within their enumerations;
    ``model`` and ``hardware`` not blank; the integer columns whole numbers in [1,
    16777216]; the times finite, >= 0 and <= 1e6 ms (``kv_delta_mb`` any finite
    number); no two rows with the same key (:data:`KEY_COLUMNS`); within a slice,
    ``latency_ms`` non-decreasing in ``context_len`` at fixed ``microbatch`` and in
    ``microbatch`` at fixed ``context_len``; and every slice a full grid (each of its
    ``context_len`` values with each of its ``microbatch`` values).

    Raises
    ------
    ScenarioError
        Listing every problem as ``("row N: COLUMN", message)`` (``(COLUMN,
        message)`` for a header problem); ``what`` is ``"LUT"``.

    Examples
    --------
    >>> from simpy_llm.serving.latency import profiles_dir
    >>> lut = load_lut(profiles_dir() / "luts" / "example_small.csv")
    >>> s = lut.slices[("decode", "example-8b", "example-gpu", 1, 1, "fp16", 1)]
    >>> s.context_len.tolist(), s.microbatch.tolist()
    ([128.0, 512.0, 2048.0], [1.0, 4.0, 16.0])
    """
    source = str(path)
    records = _read_cells(Path(path), source)
    found = ProblemList("LUT", _MAX_PROBLEMS)
    header = records[0] if records else []
    allowed = (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS)
    where: dict[str, int] = {}
    for k, name in enumerate(header):
        if not name:
            found.add(f"column {k + 1}", "has no name; allowed columns: " + ", ".join(allowed))
        elif name in where:
            found.add(name, f"repeated column (columns {where[name] + 1} and {k + 1})")
        elif name not in allowed:
            found.add(name, "unknown column; allowed: " + ", ".join(allowed))
        else:
            where[name] = k
    for name in REQUIRED_COLUMNS:
        if name not in where:
            found.add(name, "required column is missing; the required columns are " + ", ".join(REQUIRED_COLUMNS))
    found.raise_if_any(source)

    # ---- one row at a time
    data: dict[str, list[Any]] = {name: [] for name in (*where, "row")}
    for n, rec in enumerate(records[1:], start=2):
        if not any(rec):
            continue  # a blank line
        cells = {name: (rec[k] if k < len(rec) else "") for name, k in where.items()}
        bad = False

        def problem(column: str, message: str) -> None:
            nonlocal bad
            bad = True
            found.add(f"row {n}: {column}", message)  # noqa: B023 - used at once

        parsed: dict[str, Any] = {}
        for name, text in cells.items():
            if name == "phase":
                if text not in PHASES:
                    problem(name, f"must be one of {', '.join(PHASES)}; got {text!r}")
                parsed[name] = text
            elif name == "dtype":
                if text not in DTYPES:
                    problem(name, f"must be one of {', '.join(DTYPES)}; got {text!r}")
                parsed[name] = text
            elif name in ("model", "hardware"):
                if not text:
                    problem(name, "must not be blank")
                parsed[name] = text
            elif name in _INT_COLUMNS:
                whole = _int_cell(text)
                if whole is None or not 1 <= whole <= _MAX_INT:
                    problem(name, f"must be a whole number in [1, {_MAX_INT}]; got {text!r}")
                parsed[name] = whole
            elif name == "latency_ms":
                value = _float_cell(text)
                if value is None or not 0 <= value <= _MAX_MS:
                    problem(name, f"must be a number in [0, {_MAX_MS:g}] ms; got {text!r}")
                parsed[name] = value
            elif name in _NONNEGATIVE or name == "kv_delta_mb":
                if not text:
                    parsed[name] = math.nan
                    continue
                value = _float_cell(text)
                low = 0 if name in _NONNEGATIVE else -_MAX_MS
                if value is None or not low <= value <= _MAX_MS:
                    what = "a finite number" if low < 0 else "a number >= 0"
                    problem(name, f"must be blank or {what} (at most {_MAX_MS:g}); got {text!r}")
                parsed[name] = value
            elif name == "attn_mode":
                if text and text not in ATTN_MODES:
                    problem(name, f"must be blank or one of {', '.join(ATTN_MODES)}; got {text!r}")
                parsed[name] = text
            else:  # source, notes: free text
                parsed[name] = text
        parts = (parsed.get("cost_nonatt_ms", math.nan), parsed.get("cost_attn_ms", math.nan))
        if not bad and all(p is not None and math.isfinite(p) for p in parts):
            total, latency = parts[0] + parts[1], parsed["latency_ms"]
            if abs(total - latency) > SPLIT_TOLERANCE * latency + 1e-9:
                problem("cost_attn_ms", f"cost_nonatt_ms + cost_attn_ms = {total:g} ms differs from latency_ms "
                        f"{latency:g} by more than {SPLIT_TOLERANCE:.0%}: the two parts split the step's latency")
        if not bad:
            for name, value in parsed.items():
                data[name].append(value)
            data["row"].append(n)
    found.raise_if_any(source)
    if not data["row"]:
        found.add("", "the file has a header but no rows")
        found.raise_if_any(source)

    import pandas as pd

    frame = pd.DataFrame(data)
    for name in _INT_COLUMNS:
        frame[name] = frame[name].astype(np.int64)
    slices = _build_slices(frame, found)
    found.raise_if_any(source)
    return Lut(source=source, frame=frame, slices=slices)


def _build_slices(frame: pd.DataFrame, found: ProblemList) -> dict[tuple[Any, ...], LutSlice]:
    """Group the typed rows into slices, checking keys, monotonicity and the grid."""
    slices: dict[tuple[Any, ...], LutSlice] = {}
    has_p95 = "latency_p95_ms" in frame.columns
    for key, group in frame.groupby(list(SLICE_COLUMNS), sort=False):
        key = tuple(v.item() if isinstance(v, np.generic) else v for v in key)
        c = group["context_len"].to_numpy()
        b = group["microbatch"].to_numpy()
        z = group["latency_ms"].to_numpy(dtype=float)
        q = group["latency_p95_ms"].to_numpy(dtype=float) if has_p95 else np.full(len(group), np.nan)
        rows = group["row"].to_numpy()
        label = f"{key[0]} {key[1]} on {key[2]} tp{key[3]} pp{key[4]} {key[5]} fanout_k {key[6]}"
        ok = True
        # no repeated key
        first: dict[tuple[int, int], int] = {}
        for ci, bi, r in zip(c.tolist(), b.tolist(), rows.tolist(), strict=True):
            if (ci, bi) in first:
                ok = False
                found.add(
                    f"row {r}: context_len, microbatch",
                    f"repeats row {first[(ci, bi)]}: the same phase, model, hardware, tensor_parallel, "
                    f"pipeline_parallel, dtype, fanout_k, context_len ({ci}) and microbatch ({bi})",
                )
            else:
                first[(ci, bi)] = r
        if not ok:
            continue
        # monotone in each axis, along the points present
        for axis, other, axis_name, other_name in ((c, b, "context_len", "microbatch"), (b, c, "microbatch", "context_len")):
            order = np.lexsort((axis, other))
            for u, v in itertools.pairwise(order):
                if other[u] == other[v] and z[v] < z[u]:
                    ok = False
                    found.add(
                        f"row {rows[v]}: latency_ms",
                        f"{z[v]:g} ms at {axis_name} {axis[v]} is below {z[u]:g} ms at {axis_name} {axis[u]} "
                        f"(row {rows[u]}); latency must not decrease as {axis_name} grows "
                        f"(slice {label}, {other_name} {other[v]})",
                    )
        cs, bs = np.unique(c), np.unique(b)
        if len(group) != len(cs) * len(bs):
            ok = False
            missing = sorted({(x, y) for x in cs.tolist() for y in bs.tolist()} - set(first))
            shown = ", ".join(f"({x}, {y})" for x, y in missing[:6]) + (" ..." if len(missing) > 6 else "")
            found.add(
                f"row {rows.min()}: context_len, microbatch",
                f"slice {label} (rows {', '.join(map(str, sorted(rows.tolist())[:8]))}"
                f"{' ...' if len(rows) > 8 else ''}) is not a full grid: its {len(cs)} context_len and "
                f"{len(bs)} microbatch values need {len(cs) * len(bs)} rows, it has {len(group)}; "
                f"missing (context_len, microbatch): {shown}. Interpolation needs every combination",
            )
        if not ok:
            continue
        i = np.searchsorted(cs, c)
        j = np.searchsorted(bs, b)
        zz = np.empty((len(cs), len(bs)))
        qq = np.empty_like(zz)
        rr = np.empty(zz.shape, dtype=np.int64)
        zz[i, j], qq[i, j], rr[i, j] = z, q, rows
        grids = {}
        for name in GRID_COLUMNS:
            if name in frame.columns:
                grids[name] = np.full(zz.shape, np.nan)
                grids[name][i, j] = group[name].to_numpy(dtype=float)
        slices[key] = LutSlice(
            key=key, context_len=cs.astype(float), microbatch=bs.astype(float),
            latency_ms=zz, latency_p95_ms=qq, rows=rr, columns=grids,
        )
    return slices


@functools.lru_cache(maxsize=32)
def _cached_lut(path: str, _mtime_ns: int, _size: int) -> Lut:
    return load_lut(path)


def load_lut_cached(path: str) -> Lut:
    """:func:`load_lut`, cached per file version (path, modification time, size)."""
    try:
        st = os.stat(path)
    except OSError:
        return load_lut(path)  # reports the problem
    return _cached_lut(path, st.st_mtime_ns, st.st_size)
