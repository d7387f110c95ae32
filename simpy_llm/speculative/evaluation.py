"""Held-out evaluation of an acceptance model: seed 003 §5.4's "validation hook".

A fitted acceptance model (a curve, :mod:`simpy_llm.speculative.acceptance`, or a
regressor bundle, :mod:`simpy_llm.speculative.regressor`) is judged on a held-out
per-token profiling log (:mod:`simpy_llm.speculative.profiling_log`): each row is one
draft position that verification reached, with its outcome ``y`` (``accepted``, 0/1), and
the model's prediction for it is ``p = position_probabilities(context_len, position,
temperature)[-1]``, the conditional probability that the position is accepted given the
ones before it were, which is what the row records.

Over the ``N`` rows:

* **MAE** ``= mean |y - p|``, the mean absolute error of the predicted probability
  against the 0/1 outcome (per row, not per step: a per-token log does not say how many
  drafts a step proposed after its first rejection);
* **Brier score** ``= mean (y - p)**2``, a proper score: its expectation is smallest at the
  true probabilities;
* **expected calibration error** over ``B`` fixed bins of equal width on [0, 1] (bin
  ``b`` holds the rows with ``b / B <= p < (b + 1) / B``, the last bin also ``p = 1``):
  ``ECE = sum_b (n_b / N) |mean_b(y) - mean_b(p)|``. The per-bin means are the
  **reliability curve** (:class:`ReliabilityBin`, non-empty bins only).

The mean prediction and the observed acceptance rate over all rows are reported too (a
difference is a bias).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import numpy as np

from simpy_llm.speculative.profiling_log import check_profiling_log

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["AcceptanceEvaluation", "AcceptanceLookup", "ReliabilityBin", "evaluate_acceptance", "predicted_acceptance"]


class AcceptanceLookup(Protocol):
    """What an evaluation asks of a model: both curves and regressor bundles answer it."""

    @property
    def name(self) -> str:
        """The model's name."""
        ...

    @property
    def k_max(self) -> int:
        """The longest draft chain it answers for."""
        ...

    def position_probabilities(self, context_len: float, k: int, temperature: float | None = None) -> tuple[float, ...]:
        """``(p_1, ..., p_k)``, each conditional on the positions before it."""
        ...


@attrs.frozen(kw_only=True)
class ReliabilityBin:
    """One bin of the reliability curve: the rows whose prediction lies in ``[lower, upper)``."""

    lower: float
    """Lower edge of the bin (a prediction)."""
    upper: float
    """Upper edge of the bin (the last bin includes it)."""
    rows: int
    """Rows whose prediction falls in the bin."""
    mean_predicted: float
    """Mean prediction of those rows."""
    observed_rate: float
    """Share of those rows accepted."""


@attrs.frozen(kw_only=True)
class AcceptanceEvaluation:
    """A model's errors on a held-out profiling log (module docstring)."""

    model: str
    """Name of the model evaluated."""
    rows: int
    """Rows of the log (draft positions reached)."""
    mae: float
    """Mean absolute error ``mean |y - p|``."""
    brier: float
    """Brier score ``mean (y - p)**2``."""
    ece: float
    """Expected calibration error over :attr:`bins` equal-width bins."""
    bins: int
    """Bins of the reliability curve and the ECE."""
    mean_predicted: float
    """Mean prediction over all rows."""
    observed_rate: float
    """Share of all rows accepted."""
    reliability: tuple[ReliabilityBin, ...]
    """The reliability curve: one entry per non-empty bin, in order."""

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready)."""
        return attrs.asdict(self, value_serializer=lambda _inst, _field, v: list(v) if isinstance(v, tuple) else v)

    def report(self) -> str:
        """The figures and the reliability curve as text.

        >>> print(AcceptanceEvaluation(model="m", rows=4, mae=0.25, brier=0.125, ece=0.0, bins=2, mean_predicted=0.5,
        ...     observed_rate=0.5, reliability=(ReliabilityBin(lower=0.5, upper=1.0, rows=4, mean_predicted=0.5,
        ...     observed_rate=0.5),)).report())
        m on 4 rows: MAE 0.2500, Brier 0.1250, ECE 0.0000 (2 bins); mean prediction 0.5000, observed rate 0.5000
          predicted in    rows  mean predicted  observed
          [0.50, 1.00]       4          0.5000    0.5000
        """
        lines = [
            f"{self.model} on {self.rows} rows: MAE {self.mae:.4f}, Brier {self.brier:.4f}, ECE {self.ece:.4f} "
            f"({self.bins} bins); mean prediction {self.mean_predicted:.4f}, observed rate {self.observed_rate:.4f}",
            "  predicted in    rows  mean predicted  observed",
        ]
        for b in self.reliability:
            close = "]" if b.upper == 1.0 else ")"
            lines.append(f"  [{b.lower:.2f}, {b.upper:.2f}{close} {b.rows:7d} {b.mean_predicted:15.4f} {b.observed_rate:9.4f}")
        return "\n".join(lines)


def predicted_acceptance(model: AcceptanceLookup, log: pd.DataFrame) -> np.ndarray:
    """The model's prediction for each row of the profiling *log*: ``p_position`` at the
    row's context length and temperature (one model lookup per distinct ``(context_len,
    temperature)``), as a float64 array in the log's row order.

    Raises
    ------
    ValueError
        An invalid log (:func:`~simpy_llm.speculative.profiling_log.check_profiling_log`)
        or a position beyond the model's ``k_max``.
    """
    ctx, pos, temp, _ = check_profiling_log(log)
    return _predict(model, ctx, pos, temp)


def _predict(model: AcceptanceLookup, ctx: np.ndarray, pos: np.ndarray, temp: np.ndarray) -> np.ndarray:
    """Each checked row's ``p_position`` (:func:`predicted_acceptance`)."""
    deepest = int(pos.max())
    if deepest > model.k_max:
        raise ValueError(
            f"profiling log column 'position' reaches {deepest}, but the model {model.name!r} covers k up to {model.k_max}"
        )
    pairs, inverse = np.unique(np.column_stack([ctx, temp]), axis=0, return_inverse=True)
    table = np.array([model.position_probabilities(int(c), deepest, float(t)) for c, t in pairs], dtype=np.float64)
    return table[inverse.reshape(-1), pos.astype(np.int64) - 1]


def evaluate_acceptance(model: AcceptanceLookup, log: pd.DataFrame, *, bins: int = 10) -> AcceptanceEvaluation:
    """MAE, Brier score and expected calibration error of *model* on the held-out profiling
    *log*, with the reliability curve over *bins* equal-width bins (module docstring).

    Raises
    ------
    ValueError
        An invalid log, a position beyond the model's ``k_max``, or *bins* not a whole number >= 1.

    Examples
    --------
    >>> import pandas as pd
    >>> from simpy_llm.speculative.curves import acceptance_model
    >>> curve = acceptance_model("t5-small_t5-xxl_ende")        # p_i = 0.75 at temperature 0
    >>> log = pd.DataFrame({"context_len": [512] * 4, "position": [1, 2, 1, 1], "temperature": [0.0] * 4,
    ...                     "accepted": [1, 0, 1, 0]})
    >>> e = evaluate_acceptance(curve, log, bins=4)
    >>> e.mae, e.brier, e.ece                                   # |y - .75|: .25, .75, .25, .75
    (0.5, 0.3125, 0.25)
    """
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or bins < 1:
        raise ValueError(f"bins must be a whole number >= 1, got {bins!r}")
    ctx, pos, temp, y = check_profiling_log(log)
    p = _predict(model, ctx, pos, temp)
    n = len(y)
    which = np.minimum((p * bins).astype(np.int64), bins - 1)
    counts = np.bincount(which, minlength=bins)
    sum_p = np.bincount(which, weights=p, minlength=bins)
    sum_y = np.bincount(which, weights=y, minlength=bins)
    curve = tuple(
        ReliabilityBin(lower=b / bins, upper=(b + 1) / bins, rows=int(counts[b]),
                       mean_predicted=float(sum_p[b] / counts[b]), observed_rate=float(sum_y[b] / counts[b]))
        for b in range(bins) if counts[b]
    )
    return AcceptanceEvaluation(
        model=model.name, rows=n, mae=float(np.mean(np.abs(y - p))), brier=float(np.mean((y - p) ** 2)),
        ece=math.fsum(float(abs(sum_y[b] - sum_p[b])) for b in range(bins)) / n, bins=int(bins),
        mean_predicted=float(p.mean()), observed_rate=float(y.mean()), reliability=curve,
    )
