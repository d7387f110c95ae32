"""Measurement drift between two versions of a LUT file (seed 003 §5.3: "flags >5% deviation
from previous LUT version").

A LUT is re-measured when drivers, kernels or the serving engine change; a new version whose
latencies moved more than a few percent from the previous one's either reflects a real change
(which the user should know before trusting old results against new ones) or a measurement gone
wrong. :func:`lut_drift` compares the rows the two versions share (same
:data:`~simpy_llm.serving.lut.KEY_COLUMNS`): ``latency_ms`` on every shared row and
``latency_p95_ms`` where both give it. The ``lut`` latency model runs the check when given
``previous:`` (``drift: refuse`` or ``warn``), and ``simpy-llm lut-drift NEW OLD`` runs it from
a script (exit status 1 on drift).

Examples
--------
>>> import pandas as pd
>>> key = dict(phase="decode", model="m", hardware="g", tensor_parallel=1, pipeline_parallel=1,
...            dtype="fp16", fanout_k=1, microbatch=1)
>>> old = pd.DataFrame([dict(key, context_len=128, latency_ms=10.0, row=2), dict(key, context_len=512, latency_ms=12.0, row=3)])
>>> new = pd.DataFrame([dict(key, context_len=128, latency_ms=10.4, row=2), dict(key, context_len=512, latency_ms=13.2, row=3)])
>>> [(d.row, d.column, d.change) for d in lut_drift(new, old, tolerance=0.05)]
[(3, 'latency_ms', 0.1)]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["DEFAULT_DRIFT_TOLERANCE", "DRIFT_COLUMNS", "DriftRow", "LutDriftWarning", "describe_drift", "lut_drift", "shared_rows"]

DEFAULT_DRIFT_TOLERANCE = 0.05
"""The largest relative change of a shared row's latency that is not drift (the seed's 5 %)."""
DRIFT_COLUMNS = ("latency_ms", "latency_p95_ms")
"""The columns compared."""
_KEY = ("phase", "model", "hardware", "tensor_parallel", "pipeline_parallel", "dtype", "fanout_k", "context_len", "microbatch")
"""A row's identity (:data:`simpy_llm.serving.lut.KEY_COLUMNS`, repeated here so this module needs
nothing of the LUT reader)."""


class LutDriftWarning(UserWarning):
    """A LUT's latencies moved more than the tolerance from its previous version's (``drift: warn``)."""


@attrs.frozen
class DriftRow:
    """One shared row whose *column* moved more than the tolerance."""

    key: tuple[Any, ...]
    """The row's :data:`_KEY` values."""
    row: int
    """Its row in the new file (row 1 is the header)."""
    column: str
    """``latency_ms`` or ``latency_p95_ms``."""
    old: float
    """The previous version's value, ms."""
    new: float
    """The new value, ms."""

    @property
    def change(self) -> float:
        """``new / old - 1`` (rounded to 12 digits, so figures print as computed by hand); inf
        when a zero became non-zero."""
        return round(self.new / self.old - 1.0, 12) if self.old else math.inf

    def __str__(self) -> str:
        phase, model, hw, tp, pp, dtype, k, ctx, mb = self.key
        return (f"row {self.row} ({phase} {model} on {hw} tp{tp} pp{pp} {dtype} fanout_k {k}, context_len {ctx}, "
                f"microbatch {mb}): {self.column} {self.old:g} -> {self.new:g} ms ({self.change:+.1%})")


def lut_drift(
    new: pd.DataFrame, old: pd.DataFrame, tolerance: float = DEFAULT_DRIFT_TOLERANCE, where: Mapping[str, Any] | None = None,
) -> list[DriftRow]:
    """The shared rows of two LUT frames (:attr:`simpy_llm.serving.lut.Lut.frame`) whose latency
    changed by more than *tolerance* (relative, either way), in the new file's row order.

    *where* keeps only rows whose columns have these values (e.g. the model and hardware a
    latency model reads). Rows in only one version are not drift (a grid extended or cut).
    """
    if not 0 < tolerance < math.inf:
        raise ValueError(f"tolerance must be a positive number, got {tolerance!r}")
    before: dict[tuple[Any, ...], dict[str, float]] = {}
    for rec in _records(old, where):
        before[tuple(rec[k] for k in _KEY)] = rec
    out = []
    for rec in _records(new, where):
        key = tuple(rec[k] for k in _KEY)
        prev = before.get(key)
        if prev is None:
            continue
        for column in DRIFT_COLUMNS:
            a, b = prev.get(column, math.nan), rec.get(column, math.nan)
            if not (math.isfinite(a) and math.isfinite(b)):
                continue
            if abs(b - a) > tolerance * abs(a) + 1e-12:
                out.append(DriftRow(key=key, row=int(rec["row"]), column=column, old=float(a), new=float(b)))
    return out


def shared_rows(new: pd.DataFrame, old: pd.DataFrame, where: Mapping[str, Any] | None = None) -> int:
    """How many rows (of those matching *where*) the two versions share: the rows
    :func:`lut_drift` compares. None shared means there was nothing to compare, not "no drift".

    >>> import pandas as pd
    >>> key = dict(phase="decode", model="m", hardware="g", tensor_parallel=1, pipeline_parallel=1,
    ...            dtype="fp16", fanout_k=1, microbatch=1, latency_ms=1.0, row=2)
    >>> shared_rows(pd.DataFrame([dict(key, context_len=128)]), pd.DataFrame([dict(key, context_len=256)]))
    0
    """
    before = {tuple(rec[k] for k in _KEY) for rec in _records(old, where)}
    return sum(tuple(rec[k] for k in _KEY) in before for rec in _records(new, where))


def _records(frame: pd.DataFrame, where: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    if where:
        for column, value in where.items():
            frame = frame[frame[column] == value]
    return frame.to_dict("records")


def describe_drift(drift: list[DriftRow], tolerance: float, limit: int = 10) -> str:
    """The drifted rows as one message (the first *limit*, then how many more).

    >>> describe_drift([], 0.05)
    'no shared row moved more than 5%'
    """
    if not drift:
        return f"no shared row moved more than {tolerance:.0%}"
    shown = "; ".join(map(str, drift[:limit]))
    more = f"; and {len(drift) - limit} more" if len(drift) > limit else ""
    return f"{len(drift)} value(s) moved more than {tolerance:.0%} from the previous version: {shown}{more}"
