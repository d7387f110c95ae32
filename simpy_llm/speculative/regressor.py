"""Acceptance regressors: tree ensembles trained on a per-token profiling log (seed 003 §5.4).

An alternative to the YAML acceptance curves of :mod:`simpy_llm.speculative.acceptance`
with the same interface: an :class:`AcceptanceRegressor` answers
``position_probabilities(context_len, k, temperature)`` (and everything built on it)
from a scikit-learn tree ensemble fitted on raw profiling rows, instead of interpolating
a table: a random forest (``RandomForestRegressor``, the default) or gradient-boosted
trees (``GradientBoostingRegressor``), chosen by ``estimator`` when training. Seed 003 §5.4 ("Aggregation & Interpreter Pipeline", step 3):
"the simulator either loads the aggregated tables or the trained regression bundle".
scikit-learn is needed to train or load a bundle (``pip install simpy-llm[learn]``),
not to import this module.

The profiling log
-----------------
A :class:`pandas.DataFrame` with one row per draft position that verification reached,
columns ``context_len``, ``position``, ``temperature`` and ``accepted`` (0/1), optionally
``drafter``, ``verifier`` and ``prompt_class``: its schema, its checks and how to read one
from a file are in :mod:`simpy_llm.speculative.profiling_log`. The share of accepted rows
among those with a given ``(position, context_len, temperature)`` estimates the
**conditional** ``p_i`` of the curves, directly: it is never normalised across positions.

The model
---------
Features ``(log(context_len), position, temperature)``, target ``accepted``. A
``RandomForestRegressor`` (squared error) on a 0/1 target predicts, in each leaf, the
fraction of accepted rows, so the forest's prediction is an estimate of ``P(accepted)``
and needs no ``predict_proba``. It is used rather than ``RandomForestClassifier``
because, on a 0/1 target, the squared-error split criterion is the Gini criterion up to a
factor of 2 (``p(1 - p)`` against ``2 p(1 - p)``), so both grow the same trees, while the
regressor's ``predict`` gives the probability in one column whatever classes the log
holds (a log in which every draft was accepted gives ``p = 1``; a classifier would have
a single ``predict_proba`` column to special-case). Predictions are clipped to [0, 1].

* A forest is **piecewise constant**: a query between two profiled context lengths (or
  temperatures) gets roughly the nearer one's value (split thresholds lie midway between
  neighbouring training values; with ``log(context_len)`` as the feature, "midway" is the
  geometric mean, the natural midpoint for the curves' log-linear interpolation, which a
  forest does not do). Outside the profiled range the end values hold, as the curves clamp.
  Profile the contexts and temperatures that the simulations will use, or a fine spread.
* ``min_samples_leaf`` (default 50) is the smoothing: a leaf pools at least that many
  rows, so sparse regions (deep positions at long contexts) share a leaf with neighbours
  rather than resting on a handful of rows. It pools, it never renormalises.
* All three features are tried at every split (``max_features=1.0``), and the forest
  predicts with ``n_jobs=1`` (Appendix B: process-parallel prediction of a few rows was
  10x slower).
* ``estimator="gradient_boosting"`` fits ``GradientBoostingRegressor`` (squared error, the
  same features and target) instead: ``n_estimators`` boosting rounds of trees of depth 3
  with leaves of at least ``min_samples_leaf`` rows, learning rate 0.1, every row in every
  round (no subsampling, so the fit draws nothing at random). Each round fits the residuals
  of the ones before; the sum is piecewise constant too, and its predictions are clipped
  to [0, 1]. It runs in one thread, and a lookup (``k_max`` rows) costs one pass over
  100 shallow trees, about a tenth of a 100-tree forest's. (scikit-learn's
  ``HistGradientBoostingRegressor`` is not used: it runs OpenMP threads on every
  prediction, whose start-up cost on a few rows is Appendix B's parallel overhead again.)
* ``estimator="mixture_of_experts"`` (seed 003 §5.4: "mixture-of-experts by context-length
  or temperature regime") splits the log into regimes by ``gate`` (``context_len`` or
  ``temperature``) at the ascending ``edges`` (regime ``i`` holds values in
  ``[edges[i-1], edges[i])``; the first starts at 0, the last has no end) and fits one
  expert per regime (a forest, or boosted trees with ``expert="gradient_boosting"``) on that
  regime's rows alone (:class:`RegimeExperts`). A query goes to the expert of its regime
  (hard gating: one expert answers, no blend), so a regime's answers come from its own
  rows only, whatever the others hold. Every regime must have rows: a regime without any
  is refused when training, naming it. Choose edges where acceptance changes character
  (a drafter trained on short contexts, a temperature above which sampling dominates).
* ``temperature=None`` is allowed only for a bundle trained on one temperature. A bundle
  trained on one temperature answers the same at every temperature (the feature was
  constant, so no split uses it), as a one-curve file does.

Lookups are memoised: one ``predict`` call gives all ``k_max`` positions at a
``(context_len, temperature)`` (Appendix B measured 55-60 ms per un-memoised forest
lookup; one call for a few rows costs milliseconds), remembered by exactly those
arguments; :meth:`AcceptanceRegressor.position_probabilities` then remembers each
answer by its exact ``(context_len, k, temperature)``, as
:class:`~simpy_llm.speculative.acceptance.AcceptanceModel` does. Each memo is emptied
once it holds :data:`~simpy_llm.speculative.acceptance.MEMO_LIMIT` entries. No two
contexts share an answer, so the answers are those without the memo.

Command line
------------
``python -m simpy_llm.speculative.train_acceptance LOG --out BUNDLE.joblib --drafter D
--verifier V --source S`` trains a bundle on a profiling log file, prints its in-sample
figures and, with ``--held-out LOG2``, its figures on a held-out log
(:mod:`simpy_llm.speculative.train_acceptance`).

Bundles
-------
:meth:`AcceptanceRegressor.save` writes a ``.joblib`` file holding a plain dict: a format
marker, the fitted forest, the metadata (name, drafter, verifier, method, source, notes,
``k_max``, training temperatures and row count) and the scikit-learn version it was
trained with. :func:`load_acceptance_regressor` checks the marker and the metadata, and
warns (``UserWarning``) when the installed scikit-learn differs from the one that
trained it: a forest unpickled by another version may fail or predict differently;
retrain from the log to be sure. **Loading a joblib (pickle) file runs code from it:
load only bundles you trust.**
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from simpy_llm.config.errors import ProblemList, ScenarioError
from simpy_llm.speculative.acceptance import MAX_K, MEMO_LIMIT, METHODS, AcceptanceModel
from simpy_llm.speculative.profiling_log import LOG_COLUMNS, check_profiling_log, profiling_rows_from_steps

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "BUNDLE_FORMAT",
    "ESTIMATORS",
    "EXPERTS",
    "FEATURES",
    "GATES",
    "LOG_COLUMNS",
    "AcceptanceRegressor",
    "RegimeExperts",
    "load_acceptance_regressor",
    "profiling_rows_from_steps",
    "train_acceptance_regressor",
]

ESTIMATORS = ("random_forest", "gradient_boosting", "mixture_of_experts")
"""The models :func:`train_acceptance_regressor` fits (module docstring)."""
EXPERTS = ("random_forest", "gradient_boosting")
"""The models a mixture's experts may be."""
GATES = ("context_len", "temperature")
"""What a mixture of experts routes a query by."""
FEATURES = ("log_context_len", "position", "temperature")
"""The forest's features, in column order: ``log(context_len)``, 1-based position, temperature."""
BUNDLE_FORMAT = "simpy_llm.acceptance_regressor"
"""Marker stored in every bundle file under ``"format"``."""
BUNDLE_VERSION = 1
"""Layout version of the bundle dict, stored under ``"format_version"``."""
_WHAT = "acceptance regressor"
_TEXTS = ("name", "drafter", "verifier", "source")


def _sklearn() -> Any:
    """The ``sklearn`` module, or an ImportError saying which extra provides it."""
    try:
        import sklearn
    except ImportError as exc:  # pragma: no cover - scikit-learn is in the test extra
        raise ImportError("acceptance regressors need scikit-learn: pip install 'simpy-llm[learn]'") from exc
    return sklearn


# --------------------------------------------------------------------------- the model


class RegimeExperts:
    """A mixture of experts with hard gating: one fitted model per regime of one feature
    (module docstring, ``mixture_of_experts``); ``predict`` routes each row to its regime's
    expert. Picklable, so a bundle holds it as it holds a forest.

    Examples
    --------
    >>> class Const:
    ...     def __init__(self, v): self.v = v
    ...     def predict(self, x): return np.full(len(x), self.v)
    >>> m = RegimeExperts(gate="context_len", edges=(1024.0,), experts=[Const(0.9), Const(0.5)])
    >>> x = np.array([[math.log(100), 1, 0.0], [math.log(1024), 1, 0.0], [math.log(5000), 2, 0.0]])
    >>> m.predict(x).tolist(), m.regime(512.0, 0.0), m.regime(2048.0, 0.0)
    ([0.9, 0.5, 0.5], 0, 1)
    """

    def __init__(self, *, gate: str, edges: tuple[float, ...], experts: list[Any]) -> None:
        if gate not in GATES:
            raise ValueError(f"gate must be one of {', '.join(GATES)}; got {gate!r}")
        if len(experts) != len(edges) + 1:
            raise ValueError(f"{len(edges)} edge(s) make {len(edges) + 1} regimes, got {len(experts)} expert(s)")
        self.gate = gate
        self.edges = tuple(float(e) for e in edges)
        self.experts = list(experts)
        self.n_features_in_ = len(FEATURES)

    def _column(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The gate's column of *x* and the edges on its scale (the context's log)."""
        if self.gate == "context_len":
            return x[:, 0], np.log(np.asarray(self.edges))
        return x[:, 2], np.asarray(self.edges)

    def regime(self, context_len: float, temperature: float) -> int:
        """The regime a query at *context_len* and *temperature* falls in."""
        value = context_len if self.gate == "context_len" else temperature
        return int(np.searchsorted(np.asarray(self.edges), value, side="right"))

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Each row's prediction by the expert of its regime."""
        values, edges = self._column(x)
        which = np.searchsorted(edges, values, side="right")
        out = np.empty(len(x), dtype=np.float64)
        for i in np.unique(which):
            rows = which == i
            out[rows] = self.experts[int(i)].predict(x[rows])
        return out


def _fit_one(kind: str, x: np.ndarray, y: np.ndarray, n_estimators: int, min_samples_leaf: int, random_state: int | None) -> Any:
    """A fitted forest or boosted-trees model (module docstring) of *kind*, one of :data:`EXPERTS`."""
    from sklearn.ensemble import GradientBoostingRegressor, RandomForestRegressor

    model: RandomForestRegressor | GradientBoostingRegressor
    if kind == "gradient_boosting":
        model = GradientBoostingRegressor(n_estimators=n_estimators, min_samples_leaf=min_samples_leaf, random_state=random_state)
    else:
        model = RandomForestRegressor(
            n_estimators=n_estimators, min_samples_leaf=min_samples_leaf, max_features=1.0,
            random_state=random_state, n_jobs=1,
        )
    model.fit(x, y)
    return model


class _ChainMethods:
    """What :class:`~simpy_llm.speculative.acceptance.AcceptanceModel` derives from
    ``position_probabilities``, shared as the very same functions (so a regressor and a
    curve with equal ``p_i`` give equal distributions, samples and draw orders). They
    read only ``position_probabilities``, ``accepted_distribution`` and ``_cdf_memo``."""

    __slots__ = ()
    accepted_distribution = AcceptanceModel.accepted_distribution
    expected_tokens = AcceptanceModel.expected_tokens
    rejection_probability = AcceptanceModel.rejection_probability
    sample_accepted = AcceptanceModel.sample_accepted
    accepted_at = AcceptanceModel.accepted_at
    sample_accepted_many = AcceptanceModel.sample_accepted_many


@attrs.frozen(kw_only=True, eq=False)
class AcceptanceRegressor(_ChainMethods):
    """Acceptance of a chain of drafts predicted by a RandomForest (module docstring).

    Made by :func:`train_acceptance_regressor` or :func:`load_acceptance_regressor`;
    the same methods and properties as
    :class:`~simpy_llm.speculative.acceptance.AcceptanceModel`, with the same argument
    rules: ``context_len`` > 0 tokens, ``k`` in 0..``k_max``, ``temperature`` >= 0 (None
    for a bundle trained on one temperature). ``accepted_distribution``,
    ``expected_tokens``, ``rejection_probability``, ``sample_accepted``, ``accepted_at``
    and ``sample_accepted_many`` are ``AcceptanceModel``'s own (their documentation
    applies as written).
    """

    estimator: Any = attrs.field(repr=False)
    """The fitted ``sklearn.ensemble.RandomForestRegressor``, ``GradientBoostingRegressor`` or
    :class:`RegimeExperts` (features :data:`FEATURES`)."""
    name: str
    """Name of the bundle."""
    drafter: str
    """The draft model (provenance)."""
    verifier: str
    """The target (verifier) model (provenance)."""
    method: str
    """How drafts were made and verified, one of :data:`~simpy_llm.speculative.acceptance.METHODS` (provenance)."""
    source: str
    """Where the profiling log comes from."""
    notes: str = ""
    """Free text."""
    k_max: int
    """Longest draft chain the bundle answers for (the log's largest position, by default)."""
    temperatures: tuple[float, ...]
    """The distinct temperatures of the training log, ascending."""
    n_rows: int
    """Rows of the profiling log it was trained on."""
    sklearn_version: str
    """The scikit-learn version that trained the forest."""
    path: str = ""
    """The bundle file it was loaded from (``""`` when trained in this process)."""
    _rows: dict[tuple[float, float], tuple[float, ...]] = attrs.field(factory=dict, init=False, repr=False)
    """``p_1 .. p_kmax`` by ``(context_len, temperature)``: one forest call each."""
    _memo: dict[tuple[Any, ...], tuple[float, ...]] = attrs.field(factory=dict, init=False, repr=False)
    _cdf_memo: dict[tuple[Any, ...], tuple[float, ...]] = attrs.field(factory=dict, init=False, repr=False)
    """:meth:`position_probabilities` answers by the exact ``(context_len, k, temperature)``
    and ``accepted_at``'s CDFs by ``(context_len, temperature)`` (each emptied past
    ``MEMO_LIMIT`` entries)."""

    @property
    def illustrative(self) -> bool:
        """False: a bundle is trained from a profiling log (check ``source``)."""
        return False

    @property
    def kind(self) -> str:
        """Which of :data:`ESTIMATORS` the bundle's model is."""
        # By the class name: a bundle is checked when made, and the name needs no scikit-learn import.
        if isinstance(self.estimator, RegimeExperts):
            return "mixture_of_experts"
        return "gradient_boosting" if type(self.estimator).__name__ == "GradientBoostingRegressor" else "random_forest"

    def _check_k(self, k: Any) -> int:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise TypeError(f"k must be a whole number, got {k!r}")
        if not 0 <= k <= self.k_max:
            raise ValueError(f"k = {k} is outside the regressor {self.name!r}: it covers k from 0 to {self.k_max}")
        return int(k)

    def position_probabilities(
        self, context_len: float, k: int, temperature: float | None = None
    ) -> tuple[float, ...]:
        """``(p_1, ..., p_k)``: the conditional acceptance probability of each draft position,
        the forest's predictions clipped to [0, 1].

        Raises
        ------
        TypeError
            *k* not a whole number.
        ValueError
            *k* above :attr:`k_max` (the message names both) or negative; a context
            length that is not a finite number > 0; a temperature that is not a finite
            number >= 0, or None for a bundle trained on several temperatures.
        """
        if type(k) is not int:
            # Before the memo, where 2.0 == 2 and True == 1 would find another call's answer.
            self._check_k(k)
        memo = self._memo
        found = memo.get((context_len, k, temperature))
        if found is not None:
            return found
        k_checked = self._check_k(k)
        c = float(context_len)
        if not (math.isfinite(c) and c > 0):
            raise ValueError(f"context_len must be a finite number > 0, got {context_len!r}")
        if temperature is None:
            if len(self.temperatures) > 1:
                raise ValueError(
                    f"regressor {self.name!r} has temperatures {list(self.temperatures)}: pass temperature="
                )
            t = self.temperatures[0]
        else:
            t = float(temperature)
            if not (math.isfinite(t) and t >= 0):
                raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
        answer = self._row(c, t)[:k_checked] if k_checked else ()
        if len(memo) >= MEMO_LIMIT:
            memo.clear()
        memo[(context_len, k, temperature)] = answer
        return answer

    def _row(self, c: float, t: float) -> tuple[float, ...]:
        """``p_1 .. p_kmax`` at context *c* and temperature *t*: one ``predict`` of k_max rows."""
        row = self._rows.get((c, t))
        if row is None:
            x = np.empty((self.k_max, len(FEATURES)), dtype=np.float64)
            x[:, 0] = math.log(c)
            x[:, 1] = np.arange(1, self.k_max + 1)
            x[:, 2] = t
            p = np.clip(self.estimator.predict(x), 0.0, 1.0)
            row = tuple(float(v) for v in p)
            if len(self._rows) >= MEMO_LIMIT:
                self._rows.clear()
            self._rows[(c, t)] = row
        return row

    # ------------------------------------------------------------------ bundles

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the bundle (module docstring) to *path*, which must end in ``.joblib``;
        returns the path. Read it back with :func:`load_acceptance_regressor`."""
        import joblib

        target = Path(path)
        if target.suffix != ".joblib":
            raise ValueError(f"an acceptance regressor bundle is a .joblib file, got {str(path)!r}")
        bundle = {
            "format": BUNDLE_FORMAT,
            "format_version": BUNDLE_VERSION,
            "sklearn_version": self.sklearn_version,
            "features": list(FEATURES),
            "model": self.estimator,
            "metadata": {
                "name": self.name, "drafter": self.drafter, "verifier": self.verifier, "method": self.method,
                "source": self.source, "notes": self.notes, "k_max": self.k_max,
                "temperatures": list(self.temperatures), "n_rows": self.n_rows,
            },
        }
        joblib.dump(bundle, target, compress=3)
        return target


# --------------------------------------------------------------------------- training


def _check_text(values: dict[str, Any], method: Any, notes: Any) -> None:
    for key, value in values.items():
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{key} must be non-blank text, got {value!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    if not isinstance(notes, str):
        raise ValueError(f"notes must be text, got {notes!r}")


def train_acceptance_regressor(
    log: pd.DataFrame,
    *,
    name: str,
    drafter: str,
    verifier: str,
    method: str = "standard",
    source: str,
    notes: str = "",
    k_max: int | None = None,
    n_estimators: int = 100,
    min_samples_leaf: int = 50,
    random_state: int | None = 0,
    estimator: str = "random_forest",
    gate: str = "context_len",
    edges: tuple[float, ...] = (),
    expert: str = "random_forest",
) -> AcceptanceRegressor:
    """Fit an :class:`AcceptanceRegressor` on a per-token profiling log (module docstring).

    With ``estimator="random_forest"`` (the default), fits
    ``RandomForestRegressor(n_estimators, min_samples_leaf, max_features=1.0,
    random_state, n_jobs=1)``; with ``"gradient_boosting"``,
    ``GradientBoostingRegressor(n_estimators, min_samples_leaf, random_state)`` (depth 3,
    learning rate 0.1); either on ``(log(context_len), position,
    temperature) -> accepted`` (a regressor on the 0/1 target: its predictions are
    acceptance probabilities; the module docstring says why not a classifier). With
    ``"mixture_of_experts"``, one *expert* (either of those) per regime of *gate* cut at
    *edges* (:class:`RegimeExperts`), each on its regime's rows; *gate* and *edges* are
    refused with another estimator, *edges* must be ascending, > 0 for ``context_len``
    and >= 0 for ``temperature``, and every regime must hold rows. *k_max*
    defaults to the log's largest position (every position up to it has rows: the chain
    check below rejects a log with a gap). The same *random_state* and log give the same
    model.

    Examples
    --------
    >>> import pandas as pd
    >>> steps = pd.DataFrame({"context_len": [256] * 400, "temperature": [0.0] * 400, "k": [2] * 400,
    ...                       "accepted_count": [0, 1, 2, 2] * 100})
    >>> m = train_acceptance_regressor(profiling_rows_from_steps(steps), name="toy", drafter="d", verifier="v",
    ...                                source="made up", estimator="gradient_boosting", n_estimators=20)
    >>> m.kind, [round(p, 2) for p in m.position_probabilities(256, 2)]      # 3 of 4, then 2 of 3
    ('gradient_boosting', [0.75, 0.67])

    >>> steps = pd.DataFrame({"context_len": [256] * 400 + [4096] * 400, "temperature": [0.0] * 800, "k": [1] * 800,
    ...                       "accepted_count": [1, 1, 1, 0] * 100 + [1, 0] * 200})
    >>> moe = train_acceptance_regressor(profiling_rows_from_steps(steps), name="toy", drafter="d", verifier="v",
    ...                                  source="made up", estimator="mixture_of_experts", edges=(1024,), n_estimators=5)
    >>> moe.kind, round(moe.position_probabilities(256, 1)[0], 2), round(moe.position_probabilities(4096, 1)[0], 2)
    ('mixture_of_experts', 0.75, 0.5)

    Raises
    ------
    TypeError
        *log* not a DataFrame.
    ValueError
        Naming the column and the problem: a missing required column, an empty log,
        non-numeric or missing values, a ``context_len`` not a whole number > 0, a
        ``position`` not a whole number in 1..64, a negative ``temperature``, an
        ``accepted`` other than 0/1, a ``drafter``/``verifier`` column naming another
        model, more rows at a position than acceptances at the one before; a *k_max*
        beyond the positions logged; blank metadata, an unknown *method*, *estimator*,
        *gate* or *expert*; bad *edges* or a regime without rows.
    ImportError
        scikit-learn is not installed.
    """
    _check_text({"name": name, "drafter": drafter, "verifier": verifier, "source": source}, method, notes)
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}; got {estimator!r}")
    mixture = estimator == "mixture_of_experts"
    _check_mixture(mixture, gate, edges, expert)
    ctx, pos, temp, acc = check_profiling_log(log, drafter=drafter, verifier=verifier)
    largest = int(pos.max())
    if k_max is None:
        k_max = largest
    elif isinstance(k_max, bool) or not isinstance(k_max, (int, np.integer)) or not 1 <= k_max <= largest:
        raise ValueError(f"k_max must be a whole number in [1, {largest}] (the log's largest position), got {k_max!r}")
    sklearn = _sklearn()
    x = np.column_stack([np.log(ctx), pos, temp])
    model: Any
    if mixture:
        cuts = tuple(float(e) for e in edges)
        which = np.searchsorted(np.asarray(cuts), ctx if gate == "context_len" else temp, side="right")
        experts = []
        for i in range(len(cuts) + 1):
            rows = which == i
            if not rows.any():
                low = "0" if i == 0 else f"{cuts[i - 1]:g}"
                high = f"{cuts[i]:g})" if i < len(cuts) else "inf)"
                raise ValueError(f"the {gate} regime [{low}, {high} has no rows in the log: move or drop an edge")
            experts.append(_fit_one(expert, x[rows], acc[rows], n_estimators, min_samples_leaf, random_state))
        model = RegimeExperts(gate=gate, edges=cuts, experts=experts)
    else:
        model = _fit_one(estimator, x, acc, n_estimators, min_samples_leaf, random_state)
    return AcceptanceRegressor(
        estimator=model, name=name, drafter=drafter, verifier=verifier, method=method, source=source, notes=notes,
        k_max=int(k_max), temperatures=tuple(float(t) for t in np.unique(temp)), n_rows=len(acc),
        sklearn_version=str(sklearn.__version__),
    )


def _check_mixture(mixture: bool, gate: Any, edges: Any, expert: Any) -> None:
    """Refuse a mixture's settings that are bad, or given without a mixture."""
    if not mixture:
        if gate != "context_len" or edges or expert != "random_forest":
            raise ValueError("gate, edges and expert belong to estimator='mixture_of_experts'")
        return
    if gate not in GATES:
        raise ValueError(f"gate must be one of {', '.join(GATES)}; got {gate!r}")
    if expert not in EXPERTS:
        raise ValueError(f"expert must be one of {', '.join(EXPERTS)}; got {expert!r}")
    values = list(edges)
    low = 0.0 if gate == "temperature" else None
    if (not values or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in values)
            or values != sorted(set(values)) or (low is None and values[0] <= 0) or (low is not None and values[0] < low)):
        bound = "> 0" if gate == "context_len" else ">= 0"
        raise ValueError(f"edges must be a non-empty ascending list of distinct numbers {bound} (the {gate} values "
                         f"where one regime ends and the next begins), got {edges!r}")


# --------------------------------------------------------------------------- loading


def _bundle_problems(bundle: Any, found: ProblemList) -> None:
    """Record what makes *bundle* (an unpickled object) not a valid bundle."""
    from sklearn.ensemble import GradientBoostingRegressor, RandomForestRegressor

    if not isinstance(bundle, dict) or bundle.get("format") != BUNDLE_FORMAT:
        found.add("format", f"not an acceptance regressor bundle (no {BUNDLE_FORMAT!r} marker)")
        return
    if bundle.get("format_version") != BUNDLE_VERSION:
        found.add("format_version", f"must be {BUNDLE_VERSION}, got {bundle.get('format_version')!r}")
    if not isinstance(bundle.get("sklearn_version"), str):
        found.add("sklearn_version", f"must be text, got {bundle.get('sklearn_version')!r}")
    if bundle.get("features") != list(FEATURES):
        found.add("features", f"must be {list(FEATURES)}, got {bundle.get('features')!r}")
    model = bundle.get("model")
    trees = (RandomForestRegressor, GradientBoostingRegressor)
    parts = model.experts if isinstance(model, RegimeExperts) else [model]
    if not all(isinstance(m, trees) and getattr(m, "n_features_in_", None) == len(FEATURES) for m in parts):
        found.add("model", f"must be a fitted RandomForestRegressor, GradientBoostingRegressor or RegimeExperts of them "
                           f"on {len(FEATURES)} features, got {type(model).__name__}")
    meta = bundle.get("metadata")
    if not isinstance(meta, dict):
        found.add("metadata", f"must be a mapping, got {meta!r}")
        return
    for key in _TEXTS:
        if not isinstance(meta.get(key), str) or not meta[key].strip():
            found.add(f"metadata.{key}", f"must be non-blank text, got {meta.get(key)!r}")
    if meta.get("method") not in METHODS:
        found.add("metadata.method", f"must be one of {', '.join(METHODS)}; got {meta.get('method')!r}")
    if not isinstance(meta.get("notes"), str):
        found.add("metadata.notes", f"must be text, got {meta.get('notes')!r}")
    k = meta.get("k_max")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        found.add("metadata.k_max", f"must be a whole number in [1, {MAX_K}], got {k!r}")
    temps = meta.get("temperatures")
    if (not isinstance(temps, list) or not temps
            or not all(isinstance(t, float) and math.isfinite(t) and t >= 0 for t in temps)
            or temps != sorted(set(temps))):
        found.add("metadata.temperatures", f"must be a non-empty ascending list of numbers >= 0, got {temps!r}")
    n = meta.get("n_rows")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        found.add("metadata.n_rows", f"must be a whole number >= 1, got {n!r}")


def load_acceptance_regressor(path: str | os.PathLike[str]) -> AcceptanceRegressor:
    """Read a bundle written by :meth:`AcceptanceRegressor.save`.

    **Security:** a joblib file is a pickle, and loading one executes code it contains:
    load only bundles you trust (ones you trained, or from a source you trust).

    Warns
    -----
    UserWarning
        When the bundle was trained with another scikit-learn version than the one
        installed (the forest may fail or predict differently; retrain from the log).

    Raises
    ------
    ScenarioError
        Naming the file: missing or unreadable, not a bundle of this kind, or with
        invalid metadata (each key path listed); ``what`` is ``"acceptance regressor"``.
    """
    source = str(path)
    if not Path(source).is_file():
        raise ScenarioError(source, [("", "no such file")], _WHAT)
    sklearn = _sklearn()
    import joblib

    try:
        bundle = joblib.load(source)
    except Exception as exc:  # noqa: BLE001 - unpickling can fail in many ways; all mean "not a bundle"
        raise ScenarioError(source, [("", f"cannot be read as a joblib bundle: {type(exc).__name__}: {exc}")], _WHAT) from exc
    found = ProblemList(_WHAT)
    _bundle_problems(bundle, found)
    found.raise_if_any(source)
    trained = bundle["sklearn_version"]
    if trained != sklearn.__version__:
        warnings.warn(
            f"{source}: acceptance regressor trained with scikit-learn {trained}, loaded with "
            f"{sklearn.__version__}: its forest may fail or predict differently; retrain it from the profiling log",
            UserWarning, stacklevel=2,
        )
    meta = bundle["metadata"]
    return AcceptanceRegressor(
        estimator=bundle["model"], name=meta["name"], drafter=meta["drafter"], verifier=meta["verifier"],
        method=meta["method"], source=meta["source"], notes=meta["notes"], k_max=meta["k_max"],
        temperatures=tuple(meta["temperatures"]), n_rows=meta["n_rows"], sklearn_version=trained, path=source,
    )
