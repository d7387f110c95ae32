"""A latency model read off a lookup table (LUT) of measured step latencies: ``lut``.

Kept whole (over 800 lines): reading a LUT file, checking its rows and interpolating its
grid share one table layout.

Registered as ``lut`` in :data:`~simpy_llm.serving.latency_base.latency_models`.
A LUT file (seed 003 §5.2) is a CSV with one row per measured configuration:

* **key columns** (required): ``phase``, ``model``, ``hardware``,
  ``tensor_parallel``, ``pipeline_parallel``, ``context_len``, ``microbatch``,
  ``fanout_k``, ``dtype``;
* ``latency_ms`` (required): the mean latency of one engine step (forward
  pass) of that configuration, ms;
* optional columns, validated when present: ``latency_p95_ms`` (its 95th
  percentile; read by ``tail: sampled``), ``peak_mem_mb``, ``kv_delta_mb``,
  ``energy_mj``, ``cost_nonatt_ms``, ``cost_attn_ms``, ``attn_mode``,
  ``source``, ``notes`` (kept in :attr:`Lut.frame`; the ``lut`` latency model
  does not read them).

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
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import numpy as np

from simpy_llm.config.errors import FieldValueError, ProblemList, ScenarioError
from simpy_llm.config.paths import resolve_path
from simpy_llm.config.validators import MAX_COEFFICIENT_US, MAX_TOKENS, at_least, at_most
from simpy_llm.serving.hardware import Hardware, gpu_spec, resolve_hardware
from simpy_llm.serving.latency_base import RequestOverheads, latency_models
from simpy_llm.serving.profiled import operator_table, vidur_models

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "DTYPES",
    "KEY_COLUMNS",
    "OPTIONAL_COLUMNS",
    "PHASES",
    "REQUIRED_COLUMNS",
    "Lut",
    "LutLatency",
    "LutSlice",
    "load_lut",
    "lognormal_sigma",
]

PHASES = ("prefill", "draft_decode", "verify", "fused_decode", "decode")
"""Allowed ``phase`` values: the seed's four, plus ``decode`` (plain decoding, one token per sequence)."""
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
_MAX_PROBLEMS = 25
"""Problems listed in one error (a file with more says how many were left out)."""

Z95 = statistics.NormalDist().inv_cdf(0.95)
"""The standard normal's 95th percentile, 1.6448536..."""
MAX_P95_RATIO = math.exp(Z95 * Z95 / 2)
"""Largest p95 / mean a lognormal has (3.8687..., at sigma = Z95)."""


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
    _cx: tuple[float, ...] = attrs.field(init=False, repr=False)
    _mx: tuple[float, ...] = attrs.field(init=False, repr=False)
    _z: tuple[tuple[float, ...], ...] = attrs.field(init=False, repr=False)
    _q: tuple[tuple[float, ...], ...] = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        for name in ("context_len", "microbatch", "latency_ms", "latency_p95_ms", "rows"):
            getattr(self, name).setflags(write=False)
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
    ) -> LutSlice:
        """A slice from ``(context_len, microbatch, latency_ms[, latency_p95_ms])`` points
        forming a full grid (no file rows: :attr:`rows` are 0).

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
        return cls(
            key=tuple(key),
            context_len=np.array(cs, dtype=float),
            microbatch=np.array(bs, dtype=float),
            latency_ms=z,
            latency_p95_ms=q,
            rows=np.zeros(z.shape, dtype=np.int64),
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


def _read_cells(path: Path, source: str) -> list[list[str]]:
    """The file's records as lists of stripped strings (header first)."""
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
        slices[key] = LutSlice(
            key=key, context_len=cs.astype(float), microbatch=bs.astype(float),
            latency_ms=zz, latency_p95_ms=qq, rows=rr,
        )
    return slices


@functools.lru_cache(maxsize=32)
def _cached_lut(path: str, _mtime_ns: int, _size: int) -> Lut:
    return load_lut(path)


def _lut_for(path: str) -> Lut:
    """:func:`load_lut`, cached per file version (path, modification time, size)."""
    try:
        st = os.stat(path)
    except OSError:
        return load_lut(path)  # reports the problem
    return _cached_lut(path, st.st_mtime_ns, st.st_size)


# --------------------------------------------------------------------------- the latency model


def lognormal_sigma(mean: float, p95: float) -> float:
    """The sigma of the lognormal with this *mean* and 95th percentile *p95* (0 when
    ``p95 <= mean``: no spread).

    From ``mean = exp(mu + s**2 / 2)`` and ``p95 = exp(mu + z s)`` (``z`` =
    :data:`Z95`), ``ln(p95 / mean) = z s - s**2 / 2``, whose smaller root is ``s =
    z - sqrt(z**2 - 2 ln(p95 / mean))``; the larger root (``s > z``) is the
    heavy-tailed lognormal whose p95 has fallen back towards its mean, not meant by a
    p95 above the mean. A ratio above :data:`MAX_P95_RATIO` (3.87), which no lognormal
    has, gives ``s = z``, the largest ratio's sigma.

    >>> s = lognormal_sigma(10.0, 13.0)
    >>> round(s, 6)
    0.168095
    >>> mu = math.log(10.0) - s * s / 2      # that lognormal's mean and p95
    >>> round(math.exp(mu + s * s / 2), 9), round(math.exp(mu + Z95 * s), 9)
    (10.0, 13.0)
    >>> lognormal_sigma(10.0, 9.0)
    0.0
    """
    if not (mean > 0.0 and p95 > mean):
        return 0.0
    disc = Z95 * Z95 - 2.0 * math.log(p95 / mean)
    return Z95 - math.sqrt(disc) if disc > 0.0 else Z95


def _text(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    name = attr.alias or attr.name
    if not isinstance(value, str):
        raise FieldValueError(name, f"must be a string, got {value!r}")
    if not value:
        raise FieldValueError(name, "must not be empty")


def _whole(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_INT:
        raise FieldValueError(attr.name, f"must be a whole number in [1, {_MAX_INT}], got {value!r}")


def _choice(allowed: tuple[str, ...]) -> Any:
    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if value not in allowed:
            raise FieldValueError(attr.name, f"must be one of {', '.join(allowed)}; got {value!r}")

    return check


def _generator(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not isinstance(value, np.random.Generator):
        raise FieldValueError("rng", f"must be a numpy Generator (set by the simulation, not the scenario), got {value!r}")


_coefficient = [at_least(0), at_most(MAX_COEFFICIENT_US)]


@latency_models.register("lut")
@attrs.frozen(kw_only=True)
class LutLatency(RequestOverheads):
    """Step time read off a LUT file's ``prefill`` and ``decode`` slices.

    A step with ``P`` prefill tokens and ``D`` decoding requests whose KV caches hold
    ``C`` tokens in all takes

    ``step = prefill(context_len=P, microbatch=1) + decode(context_len=C / D, microbatch=D)``

    (ms in the table, s returned), each term read from the slice of that phase with
    this model, hardware, TP, PP, dtype and ``fanout_k = 1`` by
    :meth:`LutSlice.latency_ms_at`; a term with no tokens costs 0. The prefill term
    times all of a step's prefill chunks as **one sequence of their total length**
    starting from an empty cache: ``prefill_attention_pairs`` is not read, so the
    attention over a chunk's cached prefix and the split of a step's tokens among
    several prompts are not modelled (the file's prefill rows are whole prompts). The
    decode term reads the decoders' mean context, so it is exact for equal contexts
    and, where the table is linear in ``context_len`` (decode attention is), for
    unequal ones too.

    With ``tail: sampled`` each non-zero term is instead drawn from the lognormal
    whose mean and 95th percentile are the interpolated ``latency_ms`` and
    ``latency_p95_ms`` (:func:`lognormal_sigma`; a term whose p95 is not above its mean
    stays at its mean), independently for the two terms and for every call. The
    engine calls ``step_time_s`` once per scheduling decision and a stretch of
    identical decode steps reuses that one duration, so the draw is per scheduling
    decision, not per forward pass. The draws come from the ``rng`` argument (a
    numpy Generator; ``needs_rng`` on the class asks the simulation to pass one of its
    streams); a sampled model without one raises on its first step.

    ``queueing_time_s`` and ``output_token_overhead_s`` are BLIS's ``alpha``
    overheads (:class:`~simpy_llm.serving.latency_base.RequestOverheads`).

    Examples
    --------
    >>> from simpy_llm.serving.latency import profiles_dir
    >>> m = LutLatency(path=str(profiles_dir() / "luts" / "example_small.csv"),
    ...                model="example-8b", hardware="example-gpu")
    >>> m.step_time_s(512, 0)                                  # the prefill row at 512 tokens
    0.04
    >>> m.step_time_s(0, 4, decode_context_tokens=4 * 512)      # the decode row (512, 4)
    0.0095
    >>> round(m.step_time_s(320, 4, decode_context_tokens=4 * 512), 6)   # both terms
    0.0355
    """

    uses_context: ClassVar[bool] = True
    """The engine passes ``decode_context_tokens`` (and ``prefill_attention_pairs``, not read)."""
    needs_rng: ClassVar[bool] = True
    """The simulation should pass a random stream as ``rng`` (drawn from only with ``tail: sampled``)."""

    path: str = attrs.field(converter=resolve_path, validator=_text)
    """The LUT file (CSV). A relative path is resolved by :func:`~simpy_llm.config.paths.resolve_path`:
    against the scenario file's directory while a scenario file is loaded, else the current directory."""
    model: str = attrs.field(validator=_text)
    """The ``model`` column of the rows to use (matched exactly)."""
    hardware_name: str = attrs.field(alias="hardware", validator=_text)
    """The ``hardware`` column of the rows to use (matched exactly); the YAML key and
    constructor argument are ``hardware``. (The attribute ``hardware`` is the
    :class:`~simpy_llm.serving.hardware.Hardware`, as for the other latency models.)"""
    tensor_parallel: int = attrs.field(default=1, validator=_whole)
    """The ``tensor_parallel`` column of the rows to use."""
    pipeline_parallel: int = attrs.field(default=1, validator=_whole)
    """The ``pipeline_parallel`` column of the rows to use."""
    dtype: str = attrs.field(default="fp16", validator=_choice(DTYPES))
    """The ``dtype`` column of the rows to use: fp16, bf16 or fp8."""
    tail: str = attrs.field(default="mean", validator=_choice(("mean", "sampled")))
    """``mean``: every step takes the interpolated ``latency_ms``; ``sampled``: lognormal
    draws with that mean and the interpolated ``latency_p95_ms`` (class docstring)."""
    alpha0_us: float = attrs.field(default=0.0, validator=_coefficient)
    """Fixed arrival-to-queue delay per request, µs."""
    alpha1_us: float = attrs.field(default=0.0, validator=_coefficient)
    """Arrival-to-queue delay per prompt token, µs."""
    alpha2_us: float = attrs.field(default=0.0, validator=_coefficient)
    """Post-processing per output token, µs."""
    rng: np.random.Generator | None = attrs.field(default=None, eq=False, repr=False, validator=_generator)
    """Random stream of ``tail: sampled`` (set by the simulation, not the scenario); unused with ``tail: mean``."""
    lut: Lut = attrs.field(init=False, repr=False, eq=False)
    """The loaded file."""
    prefill: LutSlice = attrs.field(init=False, repr=False, eq=False)
    """The ``prefill`` slice used."""
    decode: LutSlice = attrs.field(init=False, repr=False, eq=False)
    """The ``decode`` slice used."""

    def __attrs_post_init__(self) -> None:
        try:
            lut = _lut_for(self.path)
        except ScenarioError as exc:
            listed = "; ".join(f"{w}: {m}" if w else m for w, m in exc.problems)
            raise FieldValueError("path", f"LUT file {exc.source}: {listed}") from None
        object.__setattr__(self, "lut", lut)
        object.__setattr__(self, "prefill", self._slice(lut, "prefill"))
        object.__setattr__(self, "decode", self._slice(lut, "decode"))
        if self.tail == "sampled":
            for part in (self.prefill, self.decode):
                missing = part.rows[~np.isfinite(part.latency_p95_ms)]
                if missing.size:
                    raise FieldValueError(
                        "tail", f"sampled needs latency_p95_ms at every grid point of the {part.key[0]} slice; "
                        f"{self.path} leaves it blank at row(s) {', '.join(map(str, sorted(missing.tolist())[:10]))}"
                    )
                with np.errstate(divide="ignore", invalid="ignore"):
                    ratio = part.latency_p95_ms / part.latency_ms
                over = (ratio > MAX_P95_RATIO) | ((part.latency_ms == 0) & (part.latency_p95_ms > 0))
                if over.any():
                    r = int(part.rows[over][0])
                    raise FieldValueError(
                        "tail", f"sampled: row {r} of {self.path} has latency_p95_ms / latency_ms above "
                        f"{MAX_P95_RATIO:.4f}, more than any lognormal's p95 / mean"
                    )

    def _slice(self, lut: Lut, phase: str) -> LutSlice:
        key = (phase, self.model, self.hardware_name, self.tensor_parallel, self.pipeline_parallel, self.dtype, 1)
        found = lut.slices.get(key)
        if found is not None:
            return found
        # Blame the first parameter no slice of the file matches.
        keys = list(lut.slices)
        checks = (
            ("model", 1, self.model),
            ("hardware", 2, self.hardware_name),
            ("tensor_parallel", 3, self.tensor_parallel),
            ("pipeline_parallel", 4, self.pipeline_parallel),
            ("dtype", 5, self.dtype),
        )
        for param, index, value in checks:
            narrowed = [k for k in keys if k[index] == value]
            if not narrowed:
                raise FieldValueError(
                    param, f"{lut.source} has no rows with {param} {value!r}; its slices: {lut.describe(keys)}"
                )
            keys = narrowed
        raise FieldValueError(
            "path", f"{lut.source} has no {phase} rows with fanout_k 1 for {self.model} on {self.hardware_name} "
            f"tp{self.tensor_parallel} pp{self.pipeline_parallel} {self.dtype} (the lut model needs its prefill "
            f"and decode slices); it has: {lut.describe(keys)}"
        )

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> LutLatency:
        """Build from scenario params (the keys of the class docstring; ``hardware`` for
        the hardware column), rejecting unknown keys and ``rng``."""
        names = [a.alias or a.name for a in attrs.fields(cls) if a.init and a.name != "rng"]
        for key in params:
            if key == "rng":
                raise FieldValueError("rng", "is set by the simulation, not the scenario")
            if key not in names:
                raise FieldValueError(str(key), f"unknown parameter of lut; allowed: {', '.join(names)}")
        for key in ("path", "model", "hardware"):
            if key not in params:
                raise FieldValueError(key, "required key is missing")
        return cls(**params)

    @property
    def hardware(self) -> Hardware | None:
        """The :class:`~simpy_llm.serving.hardware.Hardware` the rows describe, or None.

        The model is found among the shipped model configurations
        (``profiles/models``, by name or alias, case-insensitively) or, failing that,
        among the Vidur profile folders (shape from the profile, as the ``profile``
        model takes it); the GPU among the shipped GPUs (``profiles/gpus.yaml``). None
        when either is unknown, the TP degree does not shard the model, or the rows are
        for pipeline parallelism (``pipeline_parallel > 1``) or ``fp8`` (whose bytes per
        value ``Hardware`` does not take from the LUT).
        """
        if self.pipeline_parallel != 1 or self.dtype == "fp8":
            return None
        found = resolve_hardware(self.model, self.hardware_name, self.tensor_parallel)
        if found is not None:
            return found
        for vgpu, models in vidur_models().items():
            if self.model in models:
                try:
                    spec = operator_table(vgpu, self.model, 1).model
                    return Hardware(model=spec, gpu=gpu_spec(self.hardware_name), tp=self.tensor_parallel)
                except FieldValueError:
                    return None
        return None

    def _draw_ms(self, part: LutSlice, context_len: float, microbatch: float) -> float:
        w = part.weights(context_len, microbatch)
        mean = part._blend(part._z, w)  # noqa: SLF001 - the slice's own tables
        if not mean > 0.0:
            return 0.0
        sigma = lognormal_sigma(mean, part._blend(part._q, w))  # noqa: SLF001
        if sigma == 0.0:
            return mean
        rng = self.rng
        if rng is None:
            raise RuntimeError(
                "LutLatency with tail: sampled has no random stream: build it with rng=<numpy Generator> "
                "(needs_rng on the class asks the simulation for one of its streams)"
            )
        return mean * math.exp(sigma * float(rng.standard_normal()) - 0.5 * sigma * sigma)

    def mean_step_time_s(
        self, prefill_tokens: int, decode_tokens: int, decode_context_tokens: float = 0, prefill_attention_pairs: float = 0
    ) -> float:
        """The expected step time, s: :meth:`step_time_s` with ``tail: mean`` (draws nothing)."""
        ms = 0.0
        if prefill_tokens > 0:
            ms += self.prefill.latency_ms_at(prefill_tokens, 1)
        if decode_tokens > 0:
            ms += self.decode.latency_ms_at(decode_context_tokens / decode_tokens, decode_tokens)
        return ms / 1e3

    def verify_time_s(self, contexts: list[int], verified: list[int]) -> float | None:
        """A speculative verify pass read off the file's ``verify`` rows, s; None when the file
        has no ``verify`` slice for this model and hardware with ``fanout_k`` equal to the
        pass's largest verified count (the caller then times it as a decode step).

        The pass of ``len(contexts)`` sequences reads the slice at their mean context and
        ``microbatch = len(contexts)`` (drawn, with ``tail: sampled``).
        """
        fanout = max(verified, default=0)
        key = ("verify", self.model, self.hardware_name, self.tensor_parallel, self.pipeline_parallel, self.dtype, fanout)
        part = self.lut.slices.get(key)
        if part is None:
            return None
        context = sum(contexts) / len(contexts)
        if self.tail == "mean":
            return part.latency_ms_at(context, len(contexts)) / 1e3
        return self._draw_ms(part, context, len(contexts)) / 1e3

    def step_time_s(
        self, prefill_tokens: int, decode_tokens: int, decode_context_tokens: float = 0, prefill_attention_pairs: float = 0
    ) -> float:
        if self.tail == "mean":
            return self.mean_step_time_s(prefill_tokens, decode_tokens, decode_context_tokens)
        ms = 0.0
        if prefill_tokens > 0:
            ms += self._draw_ms(self.prefill, prefill_tokens, 1)
        if decode_tokens > 0:
            ms += self._draw_ms(self.decode, decode_context_tokens / decode_tokens, decode_tokens)
        return ms / 1e3
