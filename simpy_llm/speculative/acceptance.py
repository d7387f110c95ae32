"""Acceptance models for speculative decoding: per-position acceptance curves (seed 003 §5.4).

A drafter proposes ``k`` tokens; the verifier checks them left to right and keeps
the prefix up to the first rejection, then adds one token of its own (the
correction token after a rejection, the bonus token when all ``k`` pass). An
**acceptance curve** gives, for one drafter/verifier pair, the conditional
probability ``p_i`` that draft position ``i`` is accepted *given that positions
1..i-1 were*, for ``i = 1..k_max``, on a grid of context lengths and, optionally,
for several sampling temperatures.

The ``p_i`` are conditional, one per position: they are never renormalised to sum
to 1 (seed 003 Appendix B: a lookup that renormalised or coarsely bucketed them
gave Spec++ wrong depths). ``P(exactly m drafts accepted) = p_1 ... p_m (1 -
p_{m+1})`` for ``m < k`` and ``p_1 ... p_k`` for ``m = k``.

File schema (YAML, one file per drafter/verifier pair; ``docs/speculative.md``)
-------------------------------------------------------------------------------
::

    name: example-pair            # required, non-blank text
    drafter: small-model          # required, non-blank text
    verifier: big-model           # required, non-blank text
    method: standard              # required, one of METHODS (recorded, see below)
    source: "where the numbers come from"   # required, non-blank text
    illustrative: true            # optional bool (default false): not measured data
    notes: "free text"            # optional text
    curves:                       # required, non-empty list, temperatures ascending
      - temperature: 0.0          # required, finite, >= 0
        context_len: [128, 2048]  # required, whole numbers in [1, 2**24], strictly increasing
        acceptance:               # one row per context_len: p_1 .. p_kmax, each in [0, 1]
          - [0.80, 0.76, 0.72]
          - [0.67, 0.64, 0.61]

Every row of every curve has the same length, ``k_max``. Unknown keys and every
other violation raise :class:`~simpy_llm.config.errors.ScenarioError` naming the
file and each key path (e.g. ``curves[0].acceptance[1][2]``).

``method``, ``drafter``, ``verifier``, ``source``, ``illustrative`` and ``notes``
are provenance: kept on the :class:`AcceptanceModel`, not read by its
computations. Every method is modelled the same way: a chain of ``k`` drafts
accepted position by position with the curve's conditional probabilities.

Interpolation
-------------
* **context length**: linear in ``log(context_len)`` between neighbouring grid
  points; clamped (the end row) below the first and above the last grid point; a
  one-point grid is constant. A grid point returns its row exactly.
* **temperature**: linear in temperature between the two neighbouring curves
  (each first read at the context length), clamped outside the range.
  ``temperature=None`` is allowed only for a file with a single curve.

Examples
--------
>>> from simpy_llm.speculative.curves import acceptance_model
>>> m = acceptance_model("illustrative-mobile")
>>> m.k_max, m.temperatures
(6, (0.0, 0.7))
>>> m.position_probabilities(128, 3, temperature=0.0)
(0.8, 0.76, 0.722)
>>> round(m.expected_tokens(128, 3, temperature=0.0), 6)     # 1 + .8 + .8*.76 + .8*.76*.722
2.846976
"""

from __future__ import annotations

import bisect
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from simpy_llm.config.errors import ProblemList
from simpy_llm.config.structure import read_yaml_file
from simpy_llm.config.validators import MAX_TOKENS
from simpy_llm.serving.latency import profiles_dir

__all__ = [
    "METHODS",
    "AcceptanceCurve",
    "AcceptanceModel",
    "acceptance_from_dict",
    "load_acceptance",
]

METHODS = ("standard", "greedy", "eagle", "medusa", "ngram")
"""Allowed ``method`` values: how the curve's drafts were made and verified
(``standard``: a draft model with speculative sampling, Leviathan et al. 2023 and
Chen et al. 2023; ``greedy``: argmax match; ``eagle``, ``medusa``: their chain
(top-1) drafts; ``ngram``: prompt-lookup drafts). Recorded, not read."""
MAX_K = 64
"""Longest curve (``k_max``) a file may give."""
_WHAT = "acceptance curve"
_TOP_KEYS = ("name", "drafter", "verifier", "method", "source", "illustrative", "notes", "curves")
_REQUIRED_TOP = ("name", "drafter", "verifier", "method", "source", "curves")
_CURVE_KEYS = ("temperature", "context_len", "acceptance")
_MAX_PROBLEMS = 25


MEMO_LIMIT = 1 << 16
"""Most answers an :class:`AcceptanceModel` remembers before starting afresh."""


def _lerp(a: float, b: float, t: float) -> float:
    # (1 - t) a + t b: exact at t = 0 and t = 1, so grid points return their values bit for bit.
    return (1.0 - t) * a + t * b


@attrs.frozen(kw_only=True)
class AcceptanceCurve:
    """The per-position acceptance probabilities of one temperature on a context grid.

    Examples
    --------
    >>> c = AcceptanceCurve(temperature=0.0, context_len=(128, 512), acceptance=((0.8, 0.6), (0.4, 0.2)))
    >>> c.at(128), c.at(256), c.at(10_000)     # exact, log-linear midpoint, clamped
    ((0.8, 0.6), (0.6000000000000001, 0.4), (0.4, 0.2))
    """

    temperature: float
    """Sampling temperature the curve was measured at (0 = argmax)."""
    context_len: tuple[int, ...]
    """Context lengths of the grid, tokens, strictly increasing."""
    acceptance: tuple[tuple[float, ...], ...]
    """``acceptance[r][i - 1]`` is ``p_i`` at ``context_len[r]``: the probability that
    draft position ``i`` is accepted given positions ``< i`` were (dimensionless, [0, 1])."""
    _logs: tuple[float, ...] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_logs", tuple(math.log(c) for c in self.context_len))

    def at(self, context_len: float) -> tuple[float, ...]:
        """``p_1 .. p_kmax`` at *context_len* tokens (> 0): linear in ``log(context_len)``
        between grid points, clamped outside the grid."""
        rows, xs = self.acceptance, self._logs
        x = math.log(context_len)
        if len(xs) == 1 or x <= xs[0]:
            return rows[0]
        if x >= xs[-1]:
            return rows[-1]
        i = bisect.bisect_right(xs, x) - 1
        t = (x - xs[i]) / (xs[i + 1] - xs[i])
        return tuple(min(1.0, max(0.0, _lerp(a, b, t))) for a, b in zip(rows[i], rows[i + 1], strict=True))


@attrs.frozen(kw_only=True)
class AcceptanceModel:
    """Acceptance of a chain of drafts for one drafter/verifier pair (:func:`load_acceptance`).

    Every method takes ``context_len`` (tokens already in the sequence, > 0), ``k``
    (drafts proposed, 0..``k_max``) and ``temperature`` (None for a one-curve file;
    module docstring for the interpolation rules).

    Examples
    --------
    >>> from simpy_llm.speculative.curves import acceptance_model
    >>> m = acceptance_model("t5-small_t5-xxl_ende")
    >>> m.position_probabilities(512, 3, temperature=1.0)
    (0.62, 0.62, 0.62)
    >>> m.accepted_distribution(512, 2, temperature=1.0)        # m = 0, 1, 2 drafts accepted
    (0.38, 0.2356, 0.3844)
    >>> rng = np.random.default_rng(0)
    >>> int(m.sample_accepted(rng, 512, 4, temperature=0.0)) in range(5)
    True
    """

    name: str
    """Name of the curve file (shipped files: the file name without ``.yaml``)."""
    drafter: str
    """The draft model (provenance)."""
    verifier: str
    """The target (verifier) model (provenance)."""
    method: str
    """How drafts were made and verified, one of :data:`METHODS` (provenance)."""
    source: str
    """Where the numbers come from."""
    illustrative: bool = False
    """True when the numbers are not measurements of the named pair (``source`` says why)."""
    notes: str = ""
    """Free text."""
    curves: tuple[AcceptanceCurve, ...]
    """One curve per temperature, temperatures strictly increasing."""
    path: str = ""
    """The file it was read from (``"<dict>"`` when built from a mapping)."""
    _memo: dict[tuple[Any, ...], tuple[float, ...]] = attrs.field(factory=dict, init=False, eq=False, repr=False)
    _cdf_memo: dict[tuple[Any, ...], tuple[float, ...]] = attrs.field(factory=dict, init=False, eq=False, repr=False)
    """:meth:`position_probabilities` answers by ``(context_len, k, temperature)`` and
    :meth:`accepted_at`'s CDFs (``k_max`` entries) by ``(context_len, temperature)``: a
    simulation asks for the same few contexts many times (each cleared past
    :data:`MEMO_LIMIT` entries)."""

    @property
    def k_max(self) -> int:
        """Longest draft chain the curves cover (positions per row)."""
        return len(self.curves[0].acceptance[0])

    @property
    def temperatures(self) -> tuple[float, ...]:
        """The temperatures of the curves, ascending."""
        return tuple(c.temperature for c in self.curves)

    # ------------------------------------------------------------------ lookups

    def _check_k(self, k: Any) -> int:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise TypeError(f"k must be a whole number, got {k!r}")
        if not 0 <= k <= self.k_max:
            raise ValueError(f"k = {k} is outside the curve {self.name!r}: it covers k from 0 to {self.k_max}")
        return int(k)

    def position_probabilities(
        self, context_len: float, k: int, temperature: float | None = None
    ) -> tuple[float, ...]:
        """``(p_1, ..., p_k)``: the conditional acceptance probability of each draft position.

        Raises
        ------
        ValueError
            *k* above :attr:`k_max` (the message names both) or negative; a context
            length that is not a finite number > 0; a temperature that is not a finite
            number >= 0, or None for a file with several temperatures.
        """
        memo = self._memo
        found = memo.get((context_len, k, temperature))
        if found is not None:
            return found
        answer = self._position_probabilities(context_len, k, temperature)
        if len(memo) >= MEMO_LIMIT:
            memo.clear()
        memo[(context_len, k, temperature)] = answer
        return answer

    def _position_probabilities(self, context_len: float, k: int, temperature: float | None) -> tuple[float, ...]:
        k = self._check_k(k)
        c = float(context_len)
        if not (math.isfinite(c) and c > 0):
            raise ValueError(f"context_len must be a finite number > 0, got {context_len!r}")
        curves = self.curves
        if temperature is None:
            if len(curves) > 1:
                raise ValueError(
                    f"curve {self.name!r} has temperatures {list(self.temperatures)}: pass temperature="
                )
            return curves[0].at(c)[:k]
        t = float(temperature)
        if not (math.isfinite(t) and t >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
        temps = self.temperatures
        if len(curves) == 1 or t <= temps[0]:
            return curves[0].at(c)[:k]
        if t >= temps[-1]:
            return curves[-1].at(c)[:k]
        i = bisect.bisect_right(temps, t) - 1
        w = (t - temps[i]) / (temps[i + 1] - temps[i])
        lo, hi = curves[i].at(c), curves[i + 1].at(c)
        return tuple(min(1.0, max(0.0, _lerp(a, b, w))) for a, b in zip(lo[:k], hi[:k], strict=True))

    def accepted_distribution(
        self, context_len: float, k: int, temperature: float | None = None
    ) -> tuple[float, ...]:
        """``P(M = m)`` for ``m = 0..k``, *M* the drafts accepted:
        ``p_1 ... p_m (1 - p_{m+1})`` for ``m < k`` and ``p_1 ... p_k`` for ``m = k``."""
        p = self.position_probabilities(context_len, k, temperature)
        out, run = [], 1.0
        for pi in p:
            out.append(run * (1.0 - pi))
            run *= pi
        out.append(run)
        return tuple(out)

    def expected_tokens(self, context_len: float, k: int, temperature: float | None = None) -> float:
        """Tokens one verification step emits on average: ``1 + sum_{i=1..k} prod_{j<=i} p_j``
        (the accepted prefix plus the verifier's correction or bonus token).

        >>> from simpy_llm.speculative.curves import acceptance_model
        >>> m = acceptance_model("t5-small_t5-xxl_ende")
        >>> round(m.expected_tokens(128, 2, temperature=0.0), 6)   # 1 + .75 + .75**2
        2.3125
        """
        total, run = 1.0, 1.0
        for pi in self.position_probabilities(context_len, k, temperature):
            run *= pi
            total += run
        return total

    def rejection_probability(self, context_len: float, position: int, temperature: float | None = None) -> float:
        """``1 - p_position``: the probability that draft *position* (1..k_max) is
        rejected given the earlier ones were accepted (what a Spec++-style policy
        compares with its threshold)."""
        if isinstance(position, bool) or not isinstance(position, (int, np.integer)) or position < 1:
            raise ValueError(f"position must be a whole number >= 1, got {position!r}")
        return 1.0 - self.position_probabilities(context_len, position, temperature)[-1]

    # ------------------------------------------------------------------ sampling

    def sample_accepted(
        self, rng: np.random.Generator, context_len: float, k: int, temperature: float | None = None
    ) -> int:
        """Drafts accepted in one verification step (0..k), by sequential Bernoulli draws.

        Draw order: for position ``i = 1, 2, ...`` one ``rng.random()`` uniform ``u_i``;
        the position is accepted when ``u_i < p_i``; drawing stops at the first
        rejection (returning ``i - 1``) or after position ``k`` (returning ``k``).
        So a step uses ``min(M + 1, k)`` uniforms, *M* the result.
        """
        accepted = 0
        for pi in self.position_probabilities(context_len, k, temperature):
            if not rng.random() < pi:
                return accepted
            accepted += 1
        return accepted

    def accepted_at(self, u: float, context_len: float, k: int, temperature: float | None = None) -> int:
        """Drafts accepted (0..k) for the uniform *u* in [0, 1): the inverse CDF of
        :meth:`accepted_distribution`, ``M = #{m < k : P(M <= m) <= u}``, so a uniform
        *u* gives *M* with exactly that distribution (one uniform per step, whatever *M*;
        the same rule as :meth:`sample_accepted_many`). The CDF is memoised with the
        probabilities.

        >>> from simpy_llm.speculative.curves import acceptance_model
        >>> m = acceptance_model("t5-small_t5-xxl_ende")
        >>> [m.accepted_at(u, 512, 2, temperature=1.0) for u in (0.0, 0.379, 0.38, 0.6155, 0.99)]
        [0, 0, 1, 1, 2]
        """
        key = (context_len, temperature)
        cdf = self._cdf_memo.get(key)
        if cdf is None:
            # The CDF's first k entries depend on p_1 .. p_k only: one CDF of k_max entries
            # answers every k (a γ that changes round to round finds it memoised).
            run, cum, out = 1.0, 0.0, []
            for pi in self.position_probabilities(context_len, self.k_max, temperature):
                cum += run * (1.0 - pi)
                run *= pi
                out.append(cum)
            if len(self._cdf_memo) >= MEMO_LIMIT:
                self._cdf_memo.clear()
            cdf = self._cdf_memo[key] = tuple(out)
        if type(k) is not int or not 0 <= k <= len(cdf):
            k = self._check_k(k)
        return bisect.bisect_right(cdf, u, 0, k)

    def sample_accepted_many(
        self, rng: np.random.Generator, context_len: float, k: int, n: int, temperature: float | None = None
    ) -> np.ndarray:
        """*n* independent draws of :meth:`sample_accepted`'s distribution, as an int64 array.

        Inverse-CDF: ``rng.random(n)`` (one uniform per draw, in order) placed in the
        cumulative :meth:`accepted_distribution`. Same distribution as the scalar
        method, but not the same values from the same stream.
        """
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"n must be a whole number >= 0, got {n!r}")
        pmf = self.accepted_distribution(context_len, k, temperature)
        cdf = np.cumsum(pmf[:-1])
        u = rng.random(int(n))
        return np.searchsorted(cdf, u, side="right").astype(np.int64)


# --------------------------------------------------------------------------- loading


def _number(value: Any) -> float | None:
    """*value* as a finite float, or None (bools, text and overflowing ints are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _text(data: Mapping[str, Any], key: str, found: ProblemList, required: bool) -> str:
    if key not in data:
        if required:
            found.add(key, "required key is missing")
        return ""
    value = data[key]
    if not isinstance(value, str) or (required and not value.strip()):
        found.add(key, f"must be {'non-blank ' if required else ''}text, got {value!r}")
        return ""
    return value


def _curve(raw: Any, where: str, found: ProblemList, k_max: list[int]) -> AcceptanceCurve | None:
    if not isinstance(raw, Mapping):
        found.add(where, f"must be a mapping with keys {', '.join(_CURVE_KEYS)}, got {raw!r}")
        return None
    before = len(found)
    for key in raw:
        if key not in _CURVE_KEYS:
            found.add(f"{where}.{key}", f"unknown key; allowed: {', '.join(_CURVE_KEYS)}")
    for key in _CURVE_KEYS:
        if key not in raw:
            found.add(f"{where}.{key}", "required key is missing")
    temperature = _number(raw.get("temperature"))
    if "temperature" in raw and (temperature is None or temperature < 0):
        found.add(f"{where}.temperature", f"must be a finite number >= 0, got {raw['temperature']!r}")
    grid: list[int] = []
    ctx = raw.get("context_len")
    if "context_len" in raw:
        if not isinstance(ctx, list) or not ctx:
            found.add(f"{where}.context_len", f"must be a non-empty list of whole numbers, got {ctx!r}")
        else:
            for j, c in enumerate(ctx):
                f = _number(c)
                if f is None or not f.is_integer() or not 1 <= f <= MAX_TOKENS:
                    found.add(f"{where}.context_len[{j}]", f"must be a whole number in [1, {MAX_TOKENS}], got {c!r}")
                    continue
                if grid and f <= grid[-1]:
                    found.add(f"{where}.context_len[{j}]", f"must be strictly increasing: {int(f)} after {grid[-1]}")
                grid.append(int(f))
    rows: list[tuple[float, ...]] = []
    acc = raw.get("acceptance")
    if "acceptance" in raw:
        if not isinstance(acc, list) or not acc:
            found.add(f"{where}.acceptance", f"must be a non-empty list of rows (one per context_len), got {acc!r}")
        else:
            if isinstance(ctx, list) and len(acc) != len(ctx):
                found.add(f"{where}.acceptance", f"has {len(acc)} row(s) for {len(ctx)} context_len value(s)")
            for r, row in enumerate(acc):
                at = f"{where}.acceptance[{r}]"
                if not isinstance(row, list) or not row:
                    found.add(at, f"must be a non-empty list p_1 .. p_kmax, got {row!r}")
                    continue
                if len(row) > MAX_K:
                    found.add(at, f"has {len(row)} positions; at most {MAX_K}")
                    continue
                if not k_max:
                    k_max.append(len(row))
                elif len(row) != k_max[0]:
                    found.add(at, f"has {len(row)} position(s); every row must have k_max = {k_max[0]} (the first row's)")
                values = []
                for i, p in enumerate(row):
                    f = _number(p)
                    if f is None or not 0.0 <= f <= 1.0:
                        found.add(f"{at}[{i}]", f"must be a probability in [0, 1], got {p!r}")
                    values.append(f)
                rows.append(tuple(values))  # type: ignore[arg-type]
    if len(found) > before:
        return None
    return AcceptanceCurve(temperature=float(temperature), context_len=tuple(grid), acceptance=tuple(rows))  # type: ignore[arg-type]


def acceptance_from_dict(data: Any, source: str = "<dict>") -> AcceptanceModel:
    """Validate a curve file's content (module docstring) into an :class:`AcceptanceModel`.

    Raises
    ------
    ScenarioError
        Naming *source* and listing every problem with its key path; ``what`` is
        ``"acceptance curve"``.

    Examples
    --------
    >>> m = acceptance_from_dict({"name": "x", "drafter": "d", "verifier": "v", "method": "standard",
    ...     "source": "made up", "curves": [{"temperature": 0, "context_len": [128], "acceptance": [[0.5]]}]})
    >>> m.position_probabilities(1_000, 1)
    (0.5,)
    >>> acceptance_from_dict({"name": "x", "colour": "red"})
    Traceback (most recent call last):
    ...
    simpy_llm.config.errors.ScenarioError: <dict>: 6 problem(s) in acceptance curve
      colour: unknown key; allowed: name, drafter, verifier, method, source, illustrative, notes, curves
      drafter: required key is missing
      verifier: required key is missing
      source: required key is missing
      method: required key is missing
      curves: required key is missing
    """
    found = ProblemList(_WHAT, _MAX_PROBLEMS)
    if not isinstance(data, Mapping):
        found.add("", f"must be a mapping with keys {', '.join(_TOP_KEYS)}, got {type(data).__name__}")
        found.raise_if_any(source)
    for key in data:
        if key not in _TOP_KEYS:
            found.add(str(key), f"unknown key; allowed: {', '.join(_TOP_KEYS)}")
    texts = {key: _text(data, key, found, key in _REQUIRED_TOP) for key in ("name", "drafter", "verifier", "source")}
    notes = _text(data, "notes", found, False)
    method = data.get("method")
    if "method" not in data:
        found.add("method", "required key is missing")
    elif method not in METHODS:
        found.add("method", f"must be one of {', '.join(METHODS)}; got {method!r}")
    illustrative = data.get("illustrative", False)
    if not isinstance(illustrative, bool):
        found.add("illustrative", f"must be true or false, got {illustrative!r}")
    raw_curves = data.get("curves")
    curves: list[AcceptanceCurve | None] = []
    if "curves" not in data:
        found.add("curves", "required key is missing")
    elif not isinstance(raw_curves, list) or not raw_curves:
        found.add("curves", f"must be a non-empty list of curves, got {raw_curves!r}")
    else:
        k_max: list[int] = []
        curves = [_curve(raw, f"curves[{n}]", found, k_max) for n, raw in enumerate(raw_curves)]
        for n in range(1, len(curves)):
            a, b = curves[n - 1], curves[n]
            if a is not None and b is not None and not b.temperature > a.temperature:
                found.add(f"curves[{n}].temperature", f"temperatures must be strictly increasing: {b.temperature} after {a.temperature}")
    found.raise_if_any(source)
    return AcceptanceModel(
        name=texts["name"], drafter=texts["drafter"], verifier=texts["verifier"], method=str(method),
        source=texts["source"], illustrative=bool(illustrative), notes=notes,
        curves=tuple(c for c in curves if c is not None), path=source,
    )


def load_acceptance(path: str | os.PathLike[str]) -> AcceptanceModel:
    """Read and validate a curve file (YAML; module docstring).

    Raises
    ------
    ScenarioError
        Naming the file and each key path; also for a missing file or one that is
        not YAML.

    Examples
    --------
    >>> m = load_acceptance(profiles_dir() / "acceptance" / "illustrative-mobile.yaml")
    >>> m.curves[0].context_len
    (128, 512, 2048, 8192)
    """
    return acceptance_from_dict(read_yaml_file(os.fspath(path), _WHAT), str(path))


def shipped_dir() -> Path:
    """Where the shipped curves are (``profiles/acceptance``)."""
    return profiles_dir() / "acceptance"
