"""ServeGen data: per-client windowed arrival processes and empirical length PMFs.

Kept whole (over 800 lines): the readers of ServeGen's two file formats, the windowed arrival
process and the client builder share the window arithmetic of one data layout.

ServeGen (alibaba/ServeGen, Xiang et al. 2025) describes a model's workload
as a set of *clients* (API customers). Each client is two files in a
directory such as ``data/servegen/language/m-large``:

``chunk-<id>-trace.csv``
    No header, one row per 600 s window:
    ``window_start_s, rate_rps, cv, pattern, shape, scale`` where *pattern*
    is ``Gamma``, ``Weibull`` or empty (the client is idle in the window).
``chunk-<id>-dataset.json``
    A JSON object keyed by window start (every 21600 s = 6 h); each value
    maps a field to a *string* holding a Python dict literal
    ``{value: probability}`` (an empirical PMF, parsed here with
    :func:`ast.literal_eval`). Fields: ``input_tokens`` and ``output_tokens``
    (language); plus ``reason_ratio`` (reasoning); or ``text_tokens``,
    ``image_tokens``, ``audio_tokens``, ``video_tokens``, ``image_count``,
    ``audio_count``, ``video_count``, ``output_tokens`` (multimodal). A window
    whose fields are ``"{}"`` has no data.

:func:`load_servegen` turns a directory into :class:`ClientConfig` entries
(arrival process :class:`ServeGenWindows`, lengths
:class:`~simpy_llm.workload.distributions.Empirical`) plus the aggregate rate
to run them at. See ``docs/servegen.md`` for the semantics and the
simplifications.
"""

from __future__ import annotations

import ast
import functools
import itertools
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from simpy_llm.config.errors import FieldValueError, ScenarioError
from simpy_llm.config.schema import (
    ClientConfig,
    MultimodalConfig,
    ReasoningConfig,
    ServeGenConfig,
)
from simpy_llm.workload.arrivals import arrival_processes
from simpy_llm.workload.distributions import Empirical, SamplingError

__all__ = [
    "DATASET_WINDOW_S",
    "MAX_DRAW",
    "PATTERNS",
    "SKIP_PASSES",
    "WINDOW_S",
    "ServeGenWindows",
    "TraceWindow",
    "load_servegen",
    "merge_pmfs",
    "parse_pmf",
    "read_dataset",
    "read_trace",
]

WINDOW_S = 600.0
"""Length of a ServeGen trace window, seconds (the default of :class:`ServeGenWindows`)."""
DATASET_WINDOW_S = 21600.0
"""Spacing of ServeGen's dataset windows (6 h), seconds (informative: keys are checked
against the trace's window starts, not against this spacing)."""
MAX_DRAW = 1 << 16
"""Most gaps :class:`ServeGenWindows` draws at once (512 KiB of float64): a longer window is
drawn in pieces, so a busy window at a high ``rate_scale`` needs no memory in proportion."""
SKIP_PASSES = 1000
"""Passes over the windows that :class:`ServeGenWindows` runs one by one when none holds an
arrival; beyond, the empty passes are skipped at once (a very low rate)."""
PATTERNS = ("Gamma", "Weibull", "")
"""Inter-arrival patterns of a trace row; empty = idle window."""

_TRACE_FIELDS = ("window_start_s", "rate_rps", "cv", "pattern", "shape", "scale")
_LANGUAGE_FIELDS = frozenset({"input_tokens", "output_tokens"})
_REASON_FIELDS = _LANGUAGE_FIELDS | {"reason_ratio"}
_MODALITIES = ("image", "audio", "video")
_MULTIMODAL_FIELDS = frozenset(
    {"text_tokens", "output_tokens"} | {f"{m}_tokens" for m in _MODALITIES} | {f"{m}_count" for m in _MODALITIES}
)
_CHUNK_RE = re.compile(r"chunk-(\d+)-(trace\.csv|dataset\.json)")


# --------------------------------------------------------------------------- arrival process


def _float_tuple(values: Iterable[Any]) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


def _str_tuple(values: Iterable[Any]) -> tuple[str, ...]:
    return tuple("" if v is None else str(v) for v in values)


@arrival_processes.register("servegen_windows")
@attrs.frozen(kw_only=True)
class ServeGenWindows:
    """ServeGen's windowed arrivals: per window a rate and a Gamma/Weibull gap pattern.

    Window *i* lasts ``durations_s[i]`` seconds (default :data:`WINDOW_S` each),
    the windows follow each other from time 0, and after the last one the
    whole sequence repeats (period = the sum of the durations).

    ``times(rng, rate, chunk)`` honours the library contract: *rate* is the
    long-run mean rate. The data rates only give the *shape*: window *i*
    expects ``e_i = rates[i] * durations_s[i] * rate / mean_rate`` arrivals, so
    with ``rate == mean_rate`` every window gets exactly the data's rate. As in
    ServeGen, a window's arrival count is fixed in advance and its gaps are
    drawn from the named distribution (``rng.gamma(shape, scale)`` or
    ``scale * rng.weibull(shape)``) and rescaled to span the window: *n*
    arrivals take *n + 1* gaps, rescaled to sum to the window length, and the
    arrivals are the first *n* partial sums (all inside the window). Counts are
    rounded deterministically with the fractional part carried over: the
    count up to window *i* is ``round(sum of e_j up to i)``, so each window is
    within one request of ``e_i`` and the total is exact in the long run; the
    carry continues across repetitions. An empty pattern (or rate 0) is an
    idle window. Gaps are drawn at most :data:`MAX_DRAW` at a time, so memory
    does not grow with a window's count (see :meth:`_window`).

    Examples
    --------
    >>> p = ServeGenWindows(rates=(1.0, 0.0, 3.0), patterns=("Gamma", "", "Weibull"),
    ...                     shapes=(0.5, 0.0, 2.0), scales=(1.0, 0.0, 1.0))
    >>> round(p.mean_rate, 4), p.period_s
    (1.3333, 1800.0)
    >>> t = next(p.times(np.random.default_rng(0), rate=p.mean_rate, chunk=2400))
    >>> np.bincount((t // 600).astype(int), minlength=3).tolist()
    [600, 0, 1800]
    """

    rates: tuple[float, ...] = attrs.field(converter=_float_tuple)
    """Data rate of each window, requests/s (a shape: rescaled to the caller's rate)."""
    patterns: tuple[str, ...] = attrs.field(converter=_str_tuple)
    """``Gamma``, ``Weibull`` or ``""`` (idle) per window."""
    shapes: tuple[float, ...] = attrs.field(converter=_float_tuple)
    """Shape parameter of each window's gap distribution (ignored when idle)."""
    scales: tuple[float, ...] = attrs.field(converter=_float_tuple)
    """Scale parameter of each window's gap distribution (ignored when idle; it
    cancels in the rescaling but is kept as in the data)."""
    durations_s: tuple[float, ...] = attrs.field(default=(), converter=_float_tuple)
    """Length of each window, seconds (empty: :data:`WINDOW_S` each)."""

    def __attrs_post_init__(self) -> None:
        n = len(self.rates)
        if n == 0:
            raise FieldValueError("rates", "must give at least one window")
        for name in ("patterns", "shapes", "scales"):
            if len(getattr(self, name)) != n:
                raise FieldValueError(name, f"must have one entry per window ({n}), got {len(getattr(self, name))}")
        if self.durations_s and len(self.durations_s) != n:
            raise FieldValueError("durations_s", f"must be empty or have one entry per window ({n}), got {len(self.durations_s)}")
        for i, d in enumerate(self.durations_s):
            if not (math.isfinite(d) and d > 0):
                raise FieldValueError("durations_s", f"window {i}: must be > 0, got {d!r}")
        for i, (r, p, k, s) in enumerate(zip(self.rates, self.patterns, self.shapes, self.scales, strict=True)):
            if not (math.isfinite(r) and r >= 0):
                raise FieldValueError("rates", f"window {i}: must be >= 0, got {r!r}")
            if p not in PATTERNS:
                raise FieldValueError("patterns", f"window {i}: unknown pattern {p!r}; expected Gamma, Weibull or ''")
            if p and r > 0:
                if not (math.isfinite(k) and k > 0):
                    raise FieldValueError("shapes", f"window {i}: must be > 0, got {k!r}")
                if not (math.isfinite(s) and s > 0):
                    raise FieldValueError("scales", f"window {i}: must be > 0, got {s!r}")
        if not self.mean_rate > 0:
            raise FieldValueError("rates", "every window is idle; at least one needs a pattern and rate > 0")

    @classmethod
    def from_trace(
        cls, windows: Iterable[TraceWindow], start_s: float = 0.0, end_s: float | None = None
    ) -> ServeGenWindows:
        """The process of the trace *windows* inside [*start_s*, *end_s*), time 0 = *start_s*.

        Windows straddling the span are cut to it; gaps before the first window
        or between windows are idle. *end_s* defaults to the end of the last
        window (a later end adds an idle tail).
        """
        windows = tuple(windows)
        if end_s is None:
            end_s = windows[-1].end_s if windows else start_s
        spans = _span_windows(windows, start_s, end_s)
        return cls(
            rates=[w.rate for w, _ in spans],
            patterns=[w.pattern for w, _ in spans],
            shapes=[w.shape for w, _ in spans],
            scales=[w.scale for w, _ in spans],
            durations_s=[d for _, d in spans],
        )

    # -- derived quantities

    def _durations(self) -> np.ndarray:
        if self.durations_s:
            return np.asarray(self.durations_s, dtype=float)
        return np.full(len(self.rates), WINDOW_S)

    def _active_rates(self) -> np.ndarray:
        rates = np.asarray(self.rates, dtype=float)
        active = np.array([p != "" for p in self.patterns])
        return np.where(active, rates, 0.0)

    @property
    def period_s(self) -> float:
        """Length of one pass over the windows, seconds."""
        return float(self._durations().sum())

    @property
    def mean_rate(self) -> float:
        """Time-average of the data rates over one period, requests/s (idle windows count as 0)."""
        d = self._durations()
        return float((self._active_rates() * d).sum() / d.sum())

    def expected_counts(self, rate: float) -> np.ndarray:
        """Expected arrivals per window when run at long-run mean *rate*."""
        return self._active_rates() * self._durations() * (rate / self.mean_rate)

    # -- sampling

    def _gaps(self, rng: np.random.Generator, i: int, n: int) -> np.ndarray:
        shape, scale = self.shapes[i], self.scales[i]
        if self.patterns[i] == "Gamma":
            return rng.gamma(shape, scale, n)
        return scale * rng.weibull(shape, n)

    def _window(self, rng: np.random.Generator, i: int, n: int, lo: float, hi: float) -> Iterator[np.ndarray]:
        """The *n* arrival times of window *i* spanning ``[lo, hi)``, in pieces of at most
        :data:`MAX_DRAW` values.

        The *n + 1* gaps are rescaled by their sum, known only once all are drawn: a window
        of more than :data:`MAX_DRAW` gaps draws them twice from the same generator state, in
        pieces, first for the sum and then for the times. numpy draws element by element and
        the running sums carry over, so the times are those of a single draw, to the bit.
        """
        count = n + 1
        two_pass = count > MAX_DRAW
        total = 0.0
        if two_pass:
            restart = rng.bit_generator.state
            for k in range(0, count, MAX_DRAW):
                gaps = self._gaps(rng, i, min(MAX_DRAW, count - k))
                total = float(np.cumsum(np.concatenate(([total], gaps)))[-1])
            rng.bit_generator.state = restart
        last = np.nextafter(hi, -np.inf)
        acc = 0.0
        for k in range(0, count, MAX_DRAW):
            m = min(MAX_DRAW, count - k)
            cs = np.cumsum(np.concatenate(([acc], self._gaps(rng, i, m))))[1:]
            acc = float(cs[-1])
            if not two_pass:
                total = acc
            keep = cs[: min(m, n - k)]  # the last sum (all n + 1 gaps) is the window's end
            if math.isfinite(total) and total > 0:
                frac = keep / total
            else:  # every gap underflowed to 0 (tiny Gamma shapes): spread evenly
                frac = np.arange(k + 1, k + 1 + keep.size) / count
            # keep every arrival inside [lo, hi) whatever the rounding
            yield np.minimum(lo + (hi - lo) * frac, last)

    def times(self, rng: np.random.Generator, rate: float, chunk: int) -> Iterator[np.ndarray]:
        """Endless chunks of *chunk* increasing absolute arrival times (s) at long-run mean *rate*.

        Whole passes without an arrival (a rate so low that the expected arrivals per pass
        are far below one) are skipped with one multiplication once more than
        :data:`SKIP_PASSES` of them follow each other.
        """
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate must be a finite number > 0, got {rate!r}")
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk!r}")
        return _exact_chunks(self._pieces(rng, rate), chunk)

    def _pieces(self, rng: np.random.Generator, rate: float) -> Iterator[np.ndarray]:
        """Arrival times in time order, in pieces of at most :data:`MAX_DRAW`."""
        expected = self.expected_counts(rate)
        cum_expected = np.cumsum(expected)
        per_pass = float(cum_expected[-1])
        edges0 = np.concatenate([[0.0], np.cumsum(self._durations())])
        period = float(edges0[-1])
        carry = 0.0  # expected arrivals not yet generated (rounding remainder), in [-0.5, 0.5)
        if not (per_pass > 0 and math.isfinite(0.5 / per_pass)):
            raise SamplingError(f"at {rate!r} requests/s the expected arrivals per pass ({per_pass!r}) underflow", self)
        cycle = 0
        while True:
            # the next passes are empty while carry + per_pass stays below 0.5 (counts round to 0)
            empty = math.ceil((0.5 - carry) / per_pass) - 1
            if empty > SKIP_PASSES:
                carry += empty * per_pass
                cycle += empty
            reach = carry + cum_expected
            rounded = np.floor(reach + 0.5)
            counts = np.diff(rounded, prepend=0.0).astype(np.int64)
            carry = float(reach[-1] - rounded[-1])
            edges = edges0 + cycle * period
            for i in np.flatnonzero(counts > 0).tolist():
                yield from self._window(rng, i, int(counts[i]), edges[i], edges[i + 1])
            cycle += 1


def _exact_chunks(pieces: Iterator[np.ndarray], chunk: int) -> Iterator[np.ndarray]:
    """Arrays of exactly *chunk* values from the concatenation of *pieces*, holding at most
    *chunk* plus one piece at a time."""
    pending: list[np.ndarray] = []
    have = 0
    for piece in pieces:
        pending.append(piece)
        have += piece.size
        if have >= chunk:
            allt = np.concatenate(pending)
            k = 0
            while have - k >= chunk:
                yield allt[k : k + chunk]
                k += chunk
            pending = [allt[k:]]
            have -= k


# --------------------------------------------------------------------------- trace files


@attrs.frozen
class TraceWindow:
    """One row of a ``chunk-<id>-trace.csv``."""

    start_s: float
    """Window start, seconds from the data's start."""
    duration_s: float
    """Window length: up to the next row's start (the last row: the previous spacing,
    or :data:`WINDOW_S` for a one-row trace)."""
    rate: float
    """Requests/s in the window."""
    cv: float
    """Coefficient of variation of the gaps (informative; the pattern defines the gaps)."""
    pattern: str
    """``Gamma``, ``Weibull`` or ``""`` (idle)."""
    shape: float
    """Shape of the gap distribution."""
    scale: float
    """Scale of the gap distribution."""

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    @property
    def active(self) -> bool:
        """The window has arrivals."""
        return self.pattern != "" and self.rate > 0


_IDLE = TraceWindow(start_s=0.0, duration_s=0.0, rate=0.0, cv=0.0, pattern="", shape=0.0, scale=0.0)


def _span_windows(windows: tuple[TraceWindow, ...], start: float, end: float) -> list[tuple[TraceWindow, float]]:
    """(window, duration inside the span) covering [start, end) exactly; idle fillers for gaps."""
    out: list[tuple[TraceWindow, float]] = []
    t = start
    for w in windows:
        a, b = max(w.start_s, start), min(w.end_s, end)
        if b <= a:
            continue
        if a > t:
            out.append((_IDLE, a - t))
        out.append((w, b - a))
        t = b
    if end > t:
        out.append((_IDLE, end - t))
    return out


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _file_key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path), st.st_mtime_ns, st.st_size


def read_trace(path: str | Path) -> tuple[TraceWindow, ...]:
    """Parse a ``chunk-<id>-trace.csv``.

    Raises
    ------
    ScenarioError
        Naming the file and, per problem, ``line N``: a row without six fields,
        a non-numeric or negative number, an unknown pattern, a non-positive
        shape/scale in an active window, a window start that does not increase.
    """
    path = Path(path)
    return _read_trace_cached(*_file_key(path))


@functools.lru_cache(maxsize=1024)
def _read_trace_cached(path: str, _mtime: int, _size: int) -> tuple[TraceWindow, ...]:
    problems: list[tuple[str, str]] = []
    rows: list[tuple[float, float, float, str, float, float]] = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(path, [("", f"cannot read the trace: {exc}")]) from None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"line {lineno}"
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(_TRACE_FIELDS):
            problems.append(
                (where, f"expected {len(_TRACE_FIELDS)} comma-separated fields ({', '.join(_TRACE_FIELDS)}), got {len(parts)}")
            )
            continue
        values: dict[str, float] = {}
        bad = False
        for name, raw in zip(_TRACE_FIELDS, parts, strict=True):
            if name == "pattern":
                continue
            v = _number(raw)
            if v is None:
                problems.append((where, f"{name}: not a finite number: {raw!r}"))
                bad = True
            elif v < 0:
                problems.append((where, f"{name}: must be >= 0, got {raw}"))
                bad = True
            else:
                values[name] = v
        pattern = parts[3]
        if pattern not in PATTERNS:
            problems.append((where, f"pattern: unknown pattern {pattern!r}; expected Gamma, Weibull or empty"))
            bad = True
        if bad:
            continue
        if pattern and values["rate_rps"] > 0:
            for name in ("shape", "scale"):
                if values[name] <= 0:
                    problems.append((where, f"{name}: must be > 0 in an active ({pattern}) window, got {parts[_TRACE_FIELDS.index(name)]}"))
                    bad = True
        elif not pattern and values["rate_rps"] > 0:
            problems.append((where, f"rate_rps is {parts[1]} but the pattern is empty (an idle window has rate 0)"))
            bad = True
        if rows and values["window_start_s"] <= rows[-1][0]:
            problems.append((where, f"window_start_s must increase; {parts[0]} follows {rows[-1][0]:g}"))
            bad = True
        if bad:
            continue
        rows.append(
            (values["window_start_s"], values["rate_rps"], values["cv"], pattern, values["shape"], values["scale"])
        )
    if not rows and not problems:
        problems.append(("", "no windows (the file is empty)"))
    if problems:
        raise ScenarioError(path, problems)
    starts = [r[0] for r in rows]
    spacing = [b - a for a, b in itertools.pairwise(starts)]
    durations = [*spacing, spacing[-1] if spacing else WINDOW_S]
    return tuple(
        TraceWindow(start_s=s, duration_s=d, rate=r, cv=cv, pattern=p, shape=k, scale=sc)
        for (s, r, cv, p, k, sc), d in zip(rows, durations, strict=True)
    )


# --------------------------------------------------------------------------- dataset files

PMF = tuple[np.ndarray, np.ndarray]
"""(values, probabilities) of an empirical PMF, probabilities summing to 1."""


def parse_pmf(text: Any) -> PMF | None:
    """Parse one dataset field: a string holding a Python dict literal ``{value: probability}``.

    Returns ``None`` for ``"{}"`` (no data), else the values and the
    probabilities normalised to sum to 1 (they must already sum to 1 within
    1e-4). Uses :func:`ast.literal_eval`, never ``eval``.

    Raises
    ------
    ValueError
        Not a string, not a dict literal, non-numeric keys or probabilities,
        negative probabilities, probabilities that do not sum to 1.

    Examples
    --------
    >>> v, p = parse_pmf("{1: 0.25, 3: 0.75}")
    >>> v.tolist(), p.tolist()
    ([1.0, 3.0], [0.25, 0.75])
    >>> parse_pmf("{}") is None
    True
    >>> parse_pmf("{'a': 1.0}")
    Traceback (most recent call last):
    ...
    ValueError: non-numeric key 'a'
    """
    if not isinstance(text, str):
        raise ValueError(f"must be a string holding a dict literal, got {type(text).__name__}")
    try:
        pmf = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise ValueError(f"not a Python dict literal: {_clip(text)}") from None
    if not isinstance(pmf, dict):
        raise ValueError(f"not a dict literal (a {type(pmf).__name__}): {_clip(text)}")
    if not pmf:
        return None
    keys, probs_raw = list(pmf), list(pmf.values())
    values = _numbers(keys, "key")
    probs = _numbers(probs_raw, "probability")
    if np.any(probs < 0):
        i = int(np.argmax(probs < 0))
        raise ValueError(f"negative probability {probs_raw[i]!r} for {keys[i]!r}")
    total = float(probs.sum())
    if not abs(total - 1.0) <= 1e-4:
        raise ValueError(f"probabilities sum to {total:.6g}, not 1")
    return values, probs / total


def _numbers(items: list[Any], what: str) -> np.ndarray:
    """*items* as a float array; ValueError naming the first that is not a finite real number."""
    for x in items:
        if type(x) not in (int, float):  # literal_eval yields only builtins; bool is not a number here
            raise ValueError(f"non-numeric {what} {x!r}")
    try:
        arr = np.array(items, dtype=float)
    except OverflowError:
        arr = np.array([float("inf")] * len(items))
    if not np.all(np.isfinite(arr)):
        bad = next(x for x in items if not _finite(x))
        raise ValueError(f"non-finite {what} {bad!r}")
    return arr


def _finite(x: float) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def _clip(text: str, n: int = 60) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")


def read_dataset(path: str | Path, window_starts: Iterable[float] | None = None) -> dict[float, dict[str, PMF] | None]:
    """Parse a ``chunk-<id>-dataset.json``: window start -> field -> PMF (``None``: no data).

    A window with any field ``"{}"`` has no data (ServeGen skips it). With
    *window_starts* (the trace's), every key must be one of them.

    Raises
    ------
    ScenarioError
        Naming the file and ``window <start>, field <name>`` (or ``window <key>``,
        or ``line N`` for invalid JSON).
    """
    path = Path(path)
    data = _read_dataset_cached(*_file_key(path))
    if window_starts is not None:
        allowed = set(window_starts)
        stray = [k for k in data if k not in allowed]
        if stray:
            raise ScenarioError(
                str(path),
                [(f"window {_fmt(k)}", "not a window start of the client's trace") for k in stray],
            )
    return dict(data)


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


@functools.lru_cache(maxsize=256)
def _read_dataset_cached(path: str, _mtime: int, _size: int) -> dict[float, dict[str, PMF] | None]:
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ScenarioError(path, [(f"line {exc.lineno}", f"not valid JSON: {exc.msg}")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(path, [("", f"cannot read the dataset: {exc}")]) from None
    if not isinstance(raw, dict):
        raise ScenarioError(path, [("", f"must be a JSON object keyed by window start, got {type(raw).__name__}")])
    problems: list[tuple[str, str]] = []
    out: dict[float, dict[str, PMF] | None] = {}
    for key, fields in raw.items():
        start = _number(key)
        if start is None or start < 0:
            problems.append((f"window {key}", "not a window start (a number of seconds >= 0)"))
            continue
        if not isinstance(fields, dict):
            problems.append((f"window {key}", f"must map field names to PMF strings, got {type(fields).__name__}"))
            continue
        parsed: dict[str, PMF] = {}
        empty = False
        for name, text in fields.items():
            try:
                pmf = parse_pmf(text)
            except ValueError as exc:
                problems.append((f"window {key}, field {name}", str(exc)))
                continue
            if pmf is None:
                empty = True
            else:
                parsed[name] = pmf
        for values, probs in parsed.values():
            values.flags.writeable = False  # shared through the cache
            probs.flags.writeable = False
        out[start] = None if empty or not fields else parsed
    if problems:
        raise ScenarioError(path, problems)
    return dict(sorted(out.items()))


def _check_fields(path: Path, data: Mapping[float, dict[str, PMF] | None]) -> str:
    """The category (language / reasoning / multimodal) the fields say; every window must agree."""
    problems: list[tuple[str, str]] = []
    names: set[str] = set()
    for fields in data.values():
        if fields:
            names |= set(fields)
    if "reason_ratio" in names:
        category, required, allowed = "reasoning", _REASON_FIELDS, _REASON_FIELDS
    elif names & (_MULTIMODAL_FIELDS - _LANGUAGE_FIELDS):
        category, required, allowed = "multimodal", frozenset({"text_tokens", "output_tokens"}), _MULTIMODAL_FIELDS
    else:
        category, required, allowed = "language", _LANGUAGE_FIELDS, _LANGUAGE_FIELDS
    for start, fields in data.items():
        if not fields:
            continue
        where = f"window {_fmt(start)}"
        for name in sorted(set(fields) - allowed):
            problems.append((f"{where}, field {name}", f"unknown field for a {category} dataset; allowed: {', '.join(sorted(allowed))}"))
        for name in sorted(required - set(fields)):
            problems.append((f"{where}, field {name}", f"missing (a {category} dataset needs {', '.join(sorted(required))})"))
        if category == "multimodal":
            for kind in _MODALITIES:
                pair = {f"{kind}_tokens", f"{kind}_count"}
                if len(pair & set(fields)) == 1:
                    (name,) = pair - set(fields)
                    problems.append((f"{where}, field {name}", f"missing (give both {kind}_tokens and {kind}_count, or neither)"))
        for name, (values, _p) in fields.items():
            if name == "reason_ratio":
                if np.any((values < 0) | (values > 1)):
                    problems.append((f"window {_fmt(start)}, field {name}", "values must lie in [0, 1]"))
            elif np.any(values < 0):
                problems.append((f"window {_fmt(start)}, field {name}", "values must be >= 0"))
    if problems:
        raise ScenarioError(str(path), problems)
    return category


def merge_pmfs(pmfs: Iterable[PMF], weights: Iterable[float]) -> PMF | None:
    """The mixture of *pmfs* with *weights* (normalised); ``None`` when every weight is 0.

    Zero-probability values are dropped.

    >>> v, p = merge_pmfs([(np.array([1.0, 2.0]), np.array([0.5, 0.5])), (np.array([2.0]), np.array([1.0]))], [1, 3])
    >>> v.tolist(), p.tolist()
    ([1.0, 2.0], [0.125, 0.875])
    """
    vals: list[np.ndarray] = []
    probs: list[np.ndarray] = []
    for (v, p), w in zip(pmfs, weights, strict=True):
        if w > 0:
            vals.append(v)
            probs.append(p * w)
    if not vals:
        return None
    values, inverse = np.unique(np.concatenate(vals), return_inverse=True)
    mass = np.bincount(inverse, weights=np.concatenate(probs), minlength=len(values))
    keep = mass > 0
    values, mass = values[keep], mass[keep]
    return values, mass / mass.sum()


def _empirical(pmf: PMF) -> Empirical:
    values, probs = pmf  # sorted ascending, normalised (merge_pmfs)
    return Empirical(values=tuple(values.tolist()), probabilities=tuple(probs.tolist()))


# --------------------------------------------------------------------------- loader


@attrs.frozen
class _Candidate:
    chunk_id: int
    trace: tuple[TraceWindow, ...]
    dataset_path: Path
    requests: float  # in the span


def load_servegen(config: ServeGenConfig) -> tuple[list[ClientConfig], float]:
    """Load the ServeGen clients of ``config.path``; return them and the aggregate rate.

    One :class:`ClientConfig` per ``chunk-<id>`` with a dataset file (clients
    without one are skipped, as ServeGen does) that sends requests inside the
    span: id ``"<directory name>/<id>"``, ``rate_fraction`` = its mean data
    rate over the span (requests/s), arrival :class:`ServeGenWindows` of its
    windows in the span, lengths :class:`Empirical` PMFs. The aggregate rate is
    the sum of the kept clients' mean rates times ``rate_scale``; run at it,
    every window gets its data rate times ``rate_scale``.

    The span is ``config.span_s`` = [start, end) seconds of the data (default:
    all of it; an end past the data is cut to the data's end); windows
    straddling it are cut, and simulation time 0 is the span's start. Beyond
    the span each client's pattern repeats.

    Lengths do not change with time inside a run: each field's PMF is the
    mixture of the dataset windows (6 h blocks), each weighted by the requests
    the trace gives the windows that use it inside the span (a trace window
    uses the latest non-empty dataset window at or before it, ServeGen's rule,
    or the first one when none is earlier). Per-item modality token PMFs
    (``image_tokens`` ...) are weighted by requests x that block's mean item
    count.

    Raises
    ------
    ScenarioError
        Naming the directory (missing, no traces, nothing to load) or the file
        and line/window/field of a malformed trace or dataset.
    """
    root = Path(config.path)
    if not root.is_dir():
        raise ScenarioError(str(root), [("path", "no such directory (expected ServeGen chunk-<id>-trace.csv files)")])
    traces: dict[int, Path] = {}
    datasets: dict[int, Path] = {}
    for entry in root.iterdir():
        m = _CHUNK_RE.fullmatch(entry.name)
        if m:
            (traces if m.group(2) == "trace.csv" else datasets)[int(m.group(1))] = entry
    if not traces:
        raise ScenarioError(str(root), [("path", "no chunk-<id>-trace.csv files in the directory")])
    orphans = sorted(set(datasets) - set(traces))
    if orphans:
        raise ScenarioError(
            str(root), [(datasets[i].name, f"no matching chunk-{i}-trace.csv") for i in orphans]
        )
    if not datasets:
        raise ScenarioError(
            str(root), [("path", "no chunk-<id>-dataset.json files: no client has lengths (clients without one are skipped)")]
        )
    windows = {cid: read_trace(traces[cid]) for cid in sorted(datasets)}
    data_end = max((w[-1].end_s for w in windows.values() if w), default=0.0)
    start, end = (0.0, data_end) if config.span_s is None else (float(config.span_s[0]), float(config.span_s[1]))
    if not (math.isfinite(start) and start >= 0 and end > start):
        raise ScenarioError(str(root), [("span_s", f"must be [start, end) with 0 <= start < end, got {config.span_s!r}")])
    end = min(end, data_end)
    if end <= start:
        raise ScenarioError(str(root), [("span_s", f"starts at or after the end of the data ({data_end:g} s)")])

    candidates = []
    for cid, trace in windows.items():
        requests = sum(w.rate * d for w, d in _span_windows(trace, start, end) if w.active)
        if requests > 0:
            candidates.append(_Candidate(cid, trace, datasets[cid], requests))
    candidates.sort(key=lambda c: (-c.requests, c.chunk_id))

    clients: list[tuple[int, ClientConfig]] = []
    for cand in candidates:
        if config.max_clients is not None and len(clients) >= config.max_clients:
            break
        client = _client(root, cand, start, end, config.slo_class)
        if client is not None:
            clients.append((cand.chunk_id, client))
    if not clients:
        raise ScenarioError(
            str(root), [("", f"no client with a dataset sends requests in the span [{start:g}, {end:g}) s")]
        )
    clients.sort(key=lambda x: x[0])
    out = [c for _, c in clients]
    return out, sum(c.rate_fraction for c in out) * config.rate_scale


def _client(root: Path, cand: _Candidate, start: float, end: float, slo_class: str) -> ClientConfig | None:
    trace = cand.trace
    data = read_dataset(cand.dataset_path, [w.start_s for w in trace])
    category = _check_fields(cand.dataset_path, data)
    keys = [k for k, v in data.items() if v]
    if not keys:
        return None  # no length data at all
    key_arr = np.array(keys)
    weights = np.zeros(len(keys))
    for w, d in _span_windows(trace, start, end):
        if w.active:
            j = max(int(np.searchsorted(key_arr, w.start_s, side="right")) - 1, 0)
            weights[j] += w.rate * d
    blocks = [block for block in data.values() if block]  # those of keys, in the same order

    def merged(name: str) -> PMF:
        pmf = merge_pmfs([b[name] for b in blocks], weights.tolist())
        assert pmf is not None  # every block has the field (_check_fields) and the span has a request
        return pmf

    arrival = ServeGenWindows.from_trace(trace, start, end)
    output = _empirical(merged("output_tokens"))
    multimodal = reasoning = None
    if category == "multimodal":
        text = _empirical(merged("text_tokens"))
        parts: dict[str, Empirical] = {}
        none: PMF = (np.array([0.0]), np.array([1.0]))  # a block without the modality: no items
        for kind in _MODALITIES:
            count_pmfs = [b.get(f"{kind}_count", none) for b in blocks]
            counts = merge_pmfs(count_pmfs, weights.tolist())
            if counts is None or not np.any((counts[0] > 0) & (counts[1] > 0)):
                continue  # never an item of this kind in the span
            # per-item tokens: weight each block by its expected number of items
            mean_items = np.array([float(np.dot(*c)) for c in count_pmfs])
            token_pmfs = [b.get(f"{kind}_tokens", none) for b in blocks]
            per_item = merge_pmfs(token_pmfs, (weights * mean_items).tolist())
            if per_item is None:
                continue
            parts[f"{kind}_distribution"] = _empirical(per_item)
            parts[f"{kind}_count_distribution"] = _empirical(counts)
        multimodal = MultimodalConfig(text_distribution=text, **parts)
        inp = text
    else:
        inp = _empirical(merged("input_tokens"))
        if category == "reasoning":
            reasoning = ReasoningConfig(reason_ratio_distribution=_empirical(merged("reason_ratio")))
    return ClientConfig(
        id=f"{root.name}/{cand.chunk_id}",
        rate_fraction=cand.requests / (end - start),
        arrival=arrival,
        input_distribution=inp,
        output_distribution=output,
        slo_class=slo_class,
        multimodal=multimodal,
        reasoning=reasoning,
    )
