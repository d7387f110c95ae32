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

Bins with tails (seed 003 §5.4's own format)
--------------------------------------------
A file with ``bins`` instead of ``curves`` gives each position's mean and, optionally,
the 95th percentile of its per-round probability::

    method: eagle                 # required, one of METHODS (recorded)
    source: "SpecBench24"         # required, non-blank text
    interpolation: linear         # optional: log_linear (default) or linear, in context_len
    draw: beta                    # optional: mean (default) or beta
    bins:                         # required, non-empty, increasing (temperature, context_len)
      - context_len: 128          # required, whole number in [1, 2**24]
        temperature: 0.7          # optional: in every bin or in none
        acceptance:               # k=N: {mean, p95}; the same positions in every bin, k=1 among them
          k=1: {mean: 0.92, p95: 0.98}
          k=2: {mean: 0.85, p95: 0.93}
          k=4: {mean: 0.72, p95: 0.88}

``name`` (default: the file name without ``.yaml``), ``drafter``, ``verifier``,
``illustrative`` and ``notes`` are optional provenance. ``k=N`` is position ``N``'s
conditional acceptance, as a curve row's ``p_N``; a position between two given ones
(``k=3`` above) gets the linear interpolation of their ``mean`` and ``p95``, and
``k_max`` is the largest ``N``. ``p95`` is given for every position or for none.

``draw`` says how a round's acceptance is drawn. ``mean``: every round uses the
means, exactly as a ``curves`` file does (``p95``, when given, is kept on
:attr:`AcceptanceCurve.p95`, not simulated). ``beta``: each round draws its own
probabilities: one uniform ``v`` per round, shared by its positions, and position
``i`` gets the ``v``-quantile ``q_i(v)`` of the Beta distribution with the position's
mean and 95th percentile (:func:`fit_beta`). Rounds are independent, so a round's
accepted count has the law of the mixture over ``v``:
:meth:`AcceptanceModel.position_probabilities` gives its conditional probabilities
``S_i / S_{i-1}``, ``S_i = E[q_1(v) ... q_i(v)]``, and every method built on them
(expected tokens, the count's law, sampling) follows. ``docs/speculative.md`` ("The
acceptance pipeline") says why the positions share ``v``.

``method``, ``drafter``, ``verifier``, ``source``, ``illustrative`` and ``notes``
are provenance: kept on the :class:`AcceptanceModel`, not read by its
computations. Every method is modelled the same way: a chain of ``k`` drafts
accepted position by position with the curve's conditional probabilities.

Interpolation
-------------
* **context length**: linear in ``log(context_len)`` between neighbouring grid
  points; clamped (the end row) below the first and above the last grid point; a
  one-point grid is constant. A grid point returns its row exactly. A bins file with
  ``interpolation: linear`` is linear in ``context_len`` instead.
* **temperature**: linear in temperature between the two neighbouring curves
  (each first read at the context length), clamped outside the range.
  ``temperature=None`` is allowed only for a file with a single curve.
* with ``draw: beta``, the same weights apply to the neighbours' quantiles at the
  round's ``v``: between grid points a round's probability is the weighted mean of the
  neighbours' ``v``-quantiles, whose mean and 95th percentile are the interpolated
  mean and ``p95``.

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
import functools
import math
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from simpy_llm.serving.latency import profiles_dir

__all__ = [
    "DRAWS",
    "INTERPOLATIONS",
    "METHODS",
    "AcceptanceCurve",
    "AcceptanceModel",
    "fit_beta",
]

METHODS = ("standard", "greedy", "eagle", "medusa", "ngram")
"""Allowed ``method`` values: how the curve's drafts were made and verified
(``standard``: a draft model with speculative sampling, Leviathan et al. 2023 and
Chen et al. 2023; ``greedy``: argmax match; ``eagle``, ``medusa``: their chain
(top-1) drafts; ``ngram``: prompt-lookup drafts). Recorded, not read."""
MAX_K = 64
"""Longest curve (``k_max``) a file may give."""
DRAWS = ("mean", "beta")
"""How a round draws its acceptance (module docstring): ``mean``, the means every round;
``beta``, per round a quantile of each position's Beta (:func:`fit_beta`)."""
INTERPOLATIONS = ("log_linear", "linear")
"""How a curve is read between grid contexts: linear in ``log(context_len)`` or in ``context_len``."""
TAIL_QUANTILE = 0.95
"""The quantile a bins file's ``p95`` gives."""
STRATA = 1024
"""Strata of a round's quantile ``v`` over which ``draw: beta`` averages (finer towards 0 and 1)."""


MEMO_LIMIT = 1 << 16
"""Most answers an :class:`AcceptanceModel` remembers before starting afresh."""


def finite_number(value: Any) -> float | None:
    """*value* as a finite float, or None (bools, text and overflowing ints are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def lerp(a: float, b: float, t: float) -> float:
    # (1 - t) a + t b: exact at t = 0 and t = 1, so grid points return their values bit for bit.
    return (1.0 - t) * a + t * b


def _bracket(xs: tuple[float, ...], x: float) -> tuple[int, float]:
    """``(i, w)``: *x* lies at weight *w* between ``xs[i]`` and ``xs[i + 1]`` (``w = 0``: at
    ``xs[i]``, or clamped to an end), the rule of :meth:`AcceptanceCurve.at`."""
    if len(xs) == 1 or x <= xs[0]:
        return 0, 0.0
    if x >= xs[-1]:
        return len(xs) - 1, 0.0
    i = bisect.bisect_right(xs, x) - 1
    return i, (x - xs[i]) / (xs[i + 1] - xs[i])


# The strata of a round's quantile v: edges (1 - cos(pi j / N)) / 2, finer towards 0 and 1 where
# a Beta's quantile function is steep, so the mixture's products converge as 1 / N**2 (equal strata:
# as 1 / N). Each stratum's weight is its width.
_EDGES = 0.5 * (1.0 - np.cos(np.pi * np.arange(STRATA + 1) / STRATA))
_EDGES[0], _EDGES[-1] = 0.0, 1.0
_WEIGHTS = np.diff(_EDGES)


@functools.lru_cache(maxsize=4096)
def fit_beta(mean: float, p95: float) -> tuple[float, float]:
    """The Beta distribution ``(a, b)`` whose mean is *mean* and 95th percentile *p95*.

    With ``a = mean c`` and ``b = (1 - mean) c`` the mean is *mean* for every
    concentration ``c``; ``c`` is found by Brent's method (``scipy.optimize.brentq``) on
    ``log c`` so that ``scipy.special.betaincinv(a, b, 0.95) = p95``, ``c`` in
    [1e-4, 1e12], taking the largest ``c`` (the least spread) if several match.
    ``p95 == mean`` is no spread: a point mass at the mean, returned as ``(inf, inf)``.

    Raises
    ------
    ValueError
        *mean* or *p95* not a number in [0, 1], or no Beta distribution has them (a
        p95 below the mean, a p95 of 1 below a mean of 1, a mean of 0 or 1 with another p95).

    Examples
    --------
    >>> a, b = fit_beta(0.92, 0.98)
    >>> round(a, 3), round(b, 3)
    (29.913, 2.601)
    >>> from scipy import stats
    >>> round(float(stats.beta.mean(a, b)), 9), round(float(stats.beta.ppf(0.95, a, b)), 9)
    (0.92, 0.98)
    >>> fit_beta(0.8, 0.8)
    (inf, inf)
    """
    from scipy import optimize, special  # scipy.optimize takes a noticeable time to import: only tails need it

    m, q = finite_number(mean), finite_number(p95)
    if m is None or q is None or not (0.0 <= m <= 1.0 and 0.0 <= q <= 1.0):
        raise ValueError(f"mean and p95 must be numbers in [0, 1], got {mean!r} and {p95!r}")
    if q == m:
        return math.inf, math.inf
    why = f"no Beta distribution has mean {m:g} and 95th percentile {q:g}"
    if m in (0.0, 1.0) or q == 1.0:
        raise ValueError(f"{why}: a mean of 0 or 1 has no spread (p95 = mean), and a p95 of 1 needs a mean of 1")

    def gap(log_c: float) -> float:
        c = math.exp(log_c)
        return float(special.betaincinv(m * c, (1.0 - m) * c, TAIL_QUANTILE)) - q

    grid = np.linspace(math.log(1e12), math.log(1e-4), 161)  # from the least spread to the most
    c = np.exp(grid)
    gaps = special.betaincinv(m * c, (1.0 - m) * c, TAIL_QUANTILE) - q
    for j in range(len(grid) - 1):
        g0, g1 = gaps[j], gaps[j + 1]
        if np.isfinite(g0) and np.isfinite(g1) and (g0 < 0.0) != (g1 < 0.0):
            root = optimize.brentq(gap, float(grid[j + 1]), float(grid[j]), xtol=1e-13, rtol=1e-13)
            c_root = math.exp(root)
            return m * c_root, (1.0 - m) * c_root
    raise ValueError(f"{why}: the p95 must lie above the mean and below 1 (p95 = mean: no spread)")


@attrs.frozen
class _Tails:
    """One curve's per-round Betas (``draw: beta``), one per grid row and position."""

    a: np.ndarray
    """Beta ``a`` by (row, position); inf for a point mass at the mean."""
    b: np.ndarray
    """Beta ``b`` by (row, position)."""
    mean: np.ndarray
    """Means by (row, position)."""
    strata: np.ndarray
    """By (row, position, stratum): the Beta's mean over each stratum of the quantile ``v``."""

    @classmethod
    def of(cls, curve: AcceptanceCurve) -> _Tails:
        """The Betas of *curve*'s means and p95 (a ValueError when one cannot be fitted)."""
        from scipy import special  # imported where used, as in fit_beta

        mean = np.array(curve.acceptance, dtype=np.float64)
        fits = [[fit_beta(m, q) for m, q in zip(row, tail, strict=True)] for row, tail in zip(curve.acceptance, curve.p95, strict=True)]
        ab = np.array(fits, dtype=np.float64)
        a, b = ab[..., 0], ab[..., 1]
        point = np.isinf(a)
        a_, b_ = np.where(point, 1.0, a)[..., None], np.where(point, 1.0, b)[..., None]
        x = special.betaincinv(a_, b_, _EDGES)
        x[..., 0], x[..., -1] = 0.0, 1.0
        # The mean of x over the stratum (x_j, x_j+1]: int x f(x) dx = mean * (I_{x_j+1}(a + 1, b) - I_{x_j}(a + 1, b)).
        strata = mean[..., None] * np.diff(special.betainc(a_ + 1.0, b_, x), axis=-1) / _WEIGHTS
        strata = np.where(point[..., None], mean[..., None], np.clip(strata, 0.0, 1.0))
        return cls(a=a, b=b, mean=mean, strata=strata)

    def quantiles(self, row: int, v: np.ndarray) -> np.ndarray:
        """Each position's quantile at the uniforms *v*, by (position, draw), at grid row *row*."""
        from scipy import special  # imported where used, as in fit_beta

        a, b, mean = self.a[row], self.b[row], self.mean[row]
        point = np.isinf(a)
        q = special.betaincinv(np.where(point, 1.0, a)[:, None], np.where(point, 1.0, b)[:, None], v[None, :])
        return np.where(point[:, None], mean[:, None], q)


@attrs.frozen(kw_only=True)
class AcceptanceCurve:
    """The per-position acceptance probabilities of one temperature on a context grid.

    Examples
    --------
    >>> c = AcceptanceCurve(temperature=0.0, context_len=(128, 512), acceptance=((0.8, 0.6), (0.4, 0.2)))
    >>> c.at(128), c.at(256), c.at(10_000)     # exact, log-linear midpoint, clamped
    ((0.8, 0.6), (0.6000000000000001, 0.4), (0.4, 0.2))
    >>> AcceptanceCurve(temperature=0.0, context_len=(128, 512), acceptance=((0.8, 0.6), (0.4, 0.2)),
    ...                 interpolation="linear").at(256)       # a third of the way in tokens
    (0.6666666666666667, 0.4666666666666667)
    """

    temperature: float
    """Sampling temperature the curve was measured at (0 = argmax)."""
    context_len: tuple[int, ...]
    """Context lengths of the grid, tokens, strictly increasing."""
    acceptance: tuple[tuple[float, ...], ...]
    """``acceptance[r][i - 1]`` is ``p_i`` at ``context_len[r]``: the probability that
    draft position ``i`` is accepted given positions ``< i`` were (dimensionless, [0, 1]);
    with ``draw: beta``, the mean of the round's probability."""
    p95: tuple[tuple[float, ...], ...] = ()
    """The 95th percentile of each position's per-round probability, rows as
    :attr:`acceptance` (a bins file's ``p95``), or ``()`` when not given."""
    interpolation: str = attrs.field(default="log_linear", validator=attrs.validators.in_(INTERPOLATIONS))
    """Between grid contexts: linear in ``log(context_len)`` (``log_linear``) or in ``context_len`` (``linear``)."""
    _xs: tuple[float, ...] = attrs.field(init=False, repr=False, eq=False)
    _log: bool = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        log = self.interpolation == "log_linear"
        object.__setattr__(self, "_log", log)
        object.__setattr__(self, "_xs", tuple(math.log(c) if log else float(c) for c in self.context_len))
        if self.p95 and [len(r) for r in self.p95] != [len(r) for r in self.acceptance]:
            raise ValueError("p95 must have the rows of acceptance, position for position")

    def at(self, context_len: float) -> tuple[float, ...]:
        """``p_1 .. p_kmax`` at *context_len* tokens (> 0): linear in ``log(context_len)``
        (or in ``context_len``) between grid points, clamped outside the grid."""
        rows, xs = self.acceptance, self._xs
        x = math.log(context_len) if self._log else float(context_len)
        if len(xs) == 1 or x <= xs[0]:
            return rows[0]
        if x >= xs[-1]:
            return rows[-1]
        i = bisect.bisect_right(xs, x) - 1
        t = (x - xs[i]) / (xs[i + 1] - xs[i])
        return tuple(min(1.0, max(0.0, lerp(a, b, t))) for a, b in zip(rows[i], rows[i + 1], strict=True))

    def grid_point(self, context_len: float) -> tuple[int, float]:
        """``(r, w)``: *context_len* lies at weight *w* between grid rows ``r`` and ``r + 1``
        (``w = 0``: at row ``r``, or clamped to an end), as :meth:`at` reads it."""
        return _bracket(self._xs, math.log(context_len) if self._log else float(context_len))


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
    draw: str = attrs.field(default="mean", validator=attrs.validators.in_(DRAWS))
    """How a round's acceptance is drawn, one of :data:`DRAWS` (module docstring): ``beta``
    needs every curve's :attr:`AcceptanceCurve.p95`."""
    _memo: dict[tuple[Any, ...], tuple[float, ...]] = attrs.field(factory=dict, init=False, eq=False, repr=False)
    _cdf_memo: dict[tuple[Any, ...], tuple[float, ...]] = attrs.field(factory=dict, init=False, eq=False, repr=False)
    """:meth:`position_probabilities` answers by ``(context_len, k, temperature)`` and
    :meth:`accepted_at`'s CDFs (``k_max`` entries) by ``(context_len, temperature)``: a
    simulation asks for the same few contexts many times (each cleared past
    :data:`MEMO_LIMIT` entries)."""
    _tails: tuple[_Tails, ...] = attrs.field(factory=tuple, init=False, eq=False, repr=False)
    """Each curve's Betas with ``draw: beta``; empty with ``draw: mean``."""

    def __attrs_post_init__(self) -> None:
        if self.draw == "beta":
            missing = [c.temperature for c in self.curves if not c.p95]
            if missing:
                raise ValueError(f"draw 'beta' needs p95 on every curve; the curves at temperature(s) {missing} have none")
            object.__setattr__(self, "_tails", tuple(_Tails.of(c) for c in self.curves))

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
            if self._tails:
                return self._mixture(self._strata_at(c, 0, 0.0))[:k]
            return curves[0].at(c)[:k]
        t = float(temperature)
        if not (math.isfinite(t) and t >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
        temps = self.temperatures
        if self._tails:
            return self._mixture(self._strata_at(c, *_bracket(temps, t)))[:k]
        if len(curves) == 1 or t <= temps[0]:
            return curves[0].at(c)[:k]
        if t >= temps[-1]:
            return curves[-1].at(c)[:k]
        i = bisect.bisect_right(temps, t) - 1
        w = (t - temps[i]) / (temps[i + 1] - temps[i])
        lo, hi = curves[i].at(c), curves[i + 1].at(c)
        return tuple(min(1.0, max(0.0, lerp(a, b, w))) for a, b in zip(lo[:k], hi[:k], strict=True))

    # ------------------------------------------------------------------ draw: beta

    def _strata_at(self, c: float, n: int, w: float) -> np.ndarray:
        """By (position, stratum): each position's probability over the strata of ``v`` at
        context *c*, between curves ``n`` and ``n + 1`` at weight *w*."""

        def one(i: int) -> np.ndarray:
            strata = self._tails[i].strata
            r, u = self.curves[i].grid_point(c)
            return strata[r] if u == 0.0 else (1.0 - u) * strata[r] + u * strata[r + 1]

        s = one(n)
        return s if w == 0.0 else (1.0 - w) * s + w * one(n + 1)

    @staticmethod
    def _mixture(strata: np.ndarray) -> tuple[float, ...]:
        """``p_i = S_i / S_{i-1}`` with ``S_i = E[q_1(v) ... q_i(v)]`` over the strata of ``v``
        (a position after one never accepted, ``S_{i-1} = 0``, gets its mean)."""
        chain = np.cumprod(strata, axis=0) @ _WEIGHTS
        before = np.concatenate(([1.0], chain[:-1]))
        p = np.divide(chain, before, out=strata @ _WEIGHTS, where=before > 0.0)
        return tuple(float(x) for x in np.clip(p, 0.0, 1.0))

    def sample_round_probabilities(
        self, rng: np.random.Generator, context_len: float, k: int, n: int, temperature: float | None = None
    ) -> np.ndarray:
        """*n* rounds' own probabilities ``p_1 .. p_k``, an ``(n, k)`` float64 array.

        With ``draw: beta``, one ``rng.random(n)`` call gives each round its uniform
        ``v``, and position ``i`` of the round is the ``v``-quantile of its Beta, read
        between grid points as the interpolation of the neighbours' quantiles (module
        docstring); so each column has the position's mean and 95th percentile. With
        ``draw: mean`` every row is the means and nothing is drawn.

        Examples
        --------
        >>> from simpy_llm.speculative.curve_files import acceptance_from_dict
        >>> m = acceptance_from_dict({"method": "eagle", "source": "s", "draw": "beta", "bins": [
        ...     {"context_len": 128, "acceptance": {"k=1": {"mean": 0.9, "p95": 0.97}}}]})
        >>> p = m.sample_round_probabilities(np.random.default_rng(0), 128, 1, 100_000)
        >>> round(float(p.mean()), 2), round(float(np.quantile(p, 0.95)), 2)
        (0.9, 0.97)
        """
        self.position_probabilities(context_len, k, temperature)  # the argument checks
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"n must be a whole number >= 0, got {n!r}")
        k = int(k)
        if not self._tails:
            return np.tile(np.asarray(self.position_probabilities(context_len, k, temperature), dtype=np.float64), (int(n), 1))
        c = float(context_len)
        v = rng.random(int(n))

        def one(i: int) -> np.ndarray:
            tails = self._tails[i]
            r, u = self.curves[i].grid_point(c)
            q = tails.quantiles(r, v)
            return q if u == 0.0 else (1.0 - u) * q + u * tails.quantiles(r + 1, v)

        i, w = (0, 0.0) if temperature is None else _bracket(self.temperatures, float(temperature))
        q = one(i) if w == 0.0 else (1.0 - w) * one(i) + w * one(i + 1)
        return np.ascontiguousarray(q[:k].T)

    # ------------------------------------------------------------------ the chain

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


def shipped_dir() -> Path:
    """Where the shipped curves are (``profiles/acceptance``)."""
    return profiles_dir() / "acceptance"
