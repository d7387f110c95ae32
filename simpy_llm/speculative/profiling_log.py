"""The per-token profiling log: what acceptance models are trained and judged on (seed 003 §5.4).

Profiling-log schema (per-token granularity of §5.4, "Profiling Outputs & Granularity")
-------------------------------------------------------------------------------------
A :class:`pandas.DataFrame` with **one row per draft position that verification
reached** in one speculative step:

===============  ========================================================================
column           meaning
===============  ========================================================================
``context_len``  tokens already in the sequence before the step (whole number > 0)
``position``     1-based draft position ``i`` (whole number in 1..64)
``temperature``  sampling temperature of the step (finite, >= 0; 0 = argmax)
``accepted``     1 if the verifier accepted the draft at ``position``, else 0
``drafter``      optional: the draft model; every value must equal the bundle's ``drafter``
``verifier``     optional: the target model; every value must equal the bundle's ``verifier``
``prompt_class`` optional: recorded, not a feature (rows of all classes are pooled, in
                 the log's own proportions; to model one class, filter the log first)
===============  ========================================================================

Other columns (a step id, ``k``, latencies) are ignored. Verification stops at the first
rejection, so a row for position ``i`` exists **only when positions 1..i-1 of the same
step were accepted**: a step that proposed ``k`` drafts and had ``m`` accepted gives the
rows ``1..m`` with ``accepted = 1`` and, when ``m < k``, the row ``m + 1`` with
``accepted = 0`` (:func:`profiling_rows_from_steps` builds them from per-step counts).
Hence the fraction of accepted rows among those with a given ``(position,
context_len, temperature)`` estimates the **conditional** ``p_i`` of the curves, directly:
it is never normalised across positions (seed 003 Appendix B: probabilities that no
longer meant "position ``i`` accepted given ``< i`` were" made Spec++ pick wrong depths).
Logging positions after the first rejection would bias every ``p_i`` downwards;
:func:`check_profiling_log` rejects a log in which some ``(context_len,
temperature)`` has more rows at position ``i + 1`` than accepted rows at position ``i``.
Profile with a fixed ``k`` (= the ``k_max`` wanted): with an adaptive ``k`` that depends
on a request's past acceptance, deep positions over-represent easy requests.

Files
-----
:func:`read_profiling_log` reads a log from CSV (``.csv``), JSON lines (``.jsonl``, one
object per row) or Parquet (``.parquet``, needs pyarrow).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simpy_llm.config.validators import MAX_TOKENS
from simpy_llm.speculative.acceptance import MAX_K

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "LOG_COLUMNS",
    "LOG_SUFFIXES",
    "OPTIONAL_COLUMNS",
    "check_profiling_log",
    "profiling_rows_from_steps",
    "read_profiling_log",
]

LOG_COLUMNS = ("context_len", "position", "temperature", "accepted")
"""Required columns of a profiling log (module docstring)."""
OPTIONAL_COLUMNS = ("drafter", "verifier", "prompt_class")
"""Optional columns of a profiling log, read as provenance checks, not features."""
LOG_SUFFIXES = (".csv", ".jsonl", ".parquet")
"""The file types :func:`read_profiling_log` reads."""


def _first_bad(log: pd.DataFrame, bad: np.ndarray) -> str:
    """``"N row(s), first at index L"`` for the rows where *bad* is true."""
    where = np.flatnonzero(bad)
    return f"{where.size} row(s), first at index {log.index[where[0]]!r}"


def _column(log: pd.DataFrame, name: str) -> np.ndarray:
    """Column *name* as finite float64 values, or a ValueError naming it."""
    import pandas as pd

    series = log[name]
    if not (pd.api.types.is_numeric_dtype(series) or pd.api.types.is_bool_dtype(series)):
        raise ValueError(f"profiling log column {name!r} must be numeric, got dtype {series.dtype}")
    values = series.to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(values)
    if bad.any():
        raise ValueError(f"profiling log column {name!r} has missing or non-finite values: {_first_bad(log, bad)}")
    return values


def check_profiling_log(
    log: Any, *, drafter: str | None = None, verifier: str | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(context_len, position, temperature, accepted)`` of a valid log (module docstring),
    as float64 arrays.

    A ``drafter`` (``verifier``) column, when the log has one and *drafter* (*verifier*) is
    given, must hold that model only.

    Raises
    ------
    TypeError
        *log* is not a DataFrame.
    ValueError
        Naming the column and the problem: a missing required column, an empty log,
        non-numeric or missing values, a ``context_len`` not a whole number > 0, a
        ``position`` not a whole number in 1..64, a negative ``temperature``, an
        ``accepted`` other than 0/1, a ``drafter``/``verifier`` column naming another
        model, more rows at a position than acceptances at the one before.

    Examples
    --------
    >>> import pandas as pd
    >>> log = pd.DataFrame({"context_len": [100, 100], "position": [1, 2], "temperature": [0.0, 0.0], "accepted": [1, 0]})
    >>> [a.tolist() for a in check_profiling_log(log)]
    [[100.0, 100.0], [1.0, 2.0], [0.0, 0.0], [1.0, 0.0]]
    >>> check_profiling_log(log.drop(columns="accepted"))
    Traceback (most recent call last):
    ...
    ValueError: profiling log is missing column(s) 'accepted' (required: context_len, position, temperature, accepted)
    """
    import pandas as pd

    if not isinstance(log, pd.DataFrame):
        raise TypeError(f"the profiling log must be a pandas DataFrame, got {type(log).__name__}")
    missing = [c for c in LOG_COLUMNS if c not in log.columns]
    if missing:
        raise ValueError(
            f"profiling log is missing column(s) {', '.join(map(repr, missing))} (required: {', '.join(LOG_COLUMNS)})"
        )
    if len(log) == 0:
        raise ValueError("profiling log is empty: it has no rows")
    ctx, pos, temp, acc = (_column(log, c) for c in LOG_COLUMNS)
    bad = (ctx != np.floor(ctx)) | (ctx < 1) | (ctx > MAX_TOKENS)
    if bad.any():
        raise ValueError(
            f"profiling log column 'context_len' must hold whole numbers in [1, {MAX_TOKENS}] "
            f"(tokens before the step): {_first_bad(log, bad)} (value {ctx[bad][0]!r})"
        )
    bad = (pos != np.floor(pos)) | (pos < 1) | (pos > MAX_K)
    if bad.any():
        raise ValueError(
            f"profiling log column 'position' must hold whole numbers in [1, {MAX_K}] (1-based draft position): "
            f"{_first_bad(log, bad)} (value {pos[bad][0]!r})"
        )
    bad = temp < 0
    if bad.any():
        raise ValueError(
            f"profiling log column 'temperature' must be >= 0: {_first_bad(log, bad)} (value {temp[bad][0]!r})"
        )
    bad = (acc != 0) & (acc != 1)
    if bad.any():
        raise ValueError(f"profiling log column 'accepted' must be 0 or 1: {_first_bad(log, bad)} (value {acc[bad][0]!r})")
    for column, wanted in (("drafter", drafter), ("verifier", verifier)):
        if wanted is not None and column in log.columns:
            others = sorted({str(v) for v in log[column].unique()} - {wanted})
            if others:
                raise ValueError(
                    f"profiling log column {column!r} holds {others} besides {column}={wanted!r}: a bundle is one "
                    "drafter/verifier pair; filter the log first"
                )
    _check_chain(ctx, pos.astype(np.int64), temp, acc)
    return ctx, pos, temp, acc


def _check_chain(ctx: np.ndarray, pos: np.ndarray, temp: np.ndarray, acc: np.ndarray) -> None:
    """Positions are reached only after acceptances: at each ``(context_len, temperature)``,
    rows at position ``i + 1`` <= accepted rows at position ``i``."""
    import pandas as pd

    frame = pd.DataFrame({"c": ctx, "t": temp, "i": pos, "a": acc})
    counts = frame.groupby(["c", "t", "i"])["a"].agg(rows="size", accepted="sum").reset_index()
    before = counts[["c", "t", "i", "accepted"]].assign(i=counts["i"] + 1)
    joined = counts.merge(before, on=["c", "t", "i"], how="left", suffixes=("", "_before"))
    joined["accepted_before"] = joined["accepted_before"].fillna(0)
    over = joined[(joined["i"] > 1) & (joined["rows"] > joined["accepted_before"])]
    if len(over):
        row = over.iloc[0]
        i = int(row["i"])
        raise ValueError(
            f"profiling log column 'position': {int(row['rows'])} row(s) at position {i} but only "
            f"{int(row['accepted_before'])} accepted at position {i - 1} (context_len={row['c']:g}, "
            f"temperature={row['t']:g}); a row "
            "must exist only for positions reached, after every earlier position of the step was accepted "
            "(do not log positions after the first rejection)"
        )


def profiling_rows_from_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """Per-token rows (module docstring) from a per-step log: one row per speculative step
    with ``context_len``, ``temperature``, ``k`` (drafts proposed, >= 0) and
    ``accepted_count`` (0..k). A step gives rows ``1..m`` accepted and, when ``m < k``, row
    ``m + 1`` rejected; other columns (``drafter``, ``prompt_class``, ...) are copied.

    >>> import pandas as pd
    >>> steps = pd.DataFrame({"context_len": [100, 200], "temperature": [0.0, 0.0],
    ...                       "k": [3, 2], "accepted_count": [1, 2]})
    >>> profiling_rows_from_steps(steps)[["context_len", "position", "accepted"]].to_numpy().tolist()
    [[100, 1, 1], [100, 2, 0], [200, 1, 1], [200, 2, 1]]
    """
    import pandas as pd

    if not isinstance(steps, pd.DataFrame):
        raise TypeError(f"the step log must be a pandas DataFrame, got {type(steps).__name__}")
    needed = ("context_len", "temperature", "k", "accepted_count")
    missing = [c for c in needed if c not in steps.columns]
    if missing:
        raise ValueError(f"step log is missing column(s) {', '.join(map(repr, missing))} (required: {', '.join(needed)})")
    k, m = _column(steps, "k"), _column(steps, "accepted_count")
    bad = (k != np.floor(k)) | (k < 0) | (m != np.floor(m)) | (m < 0) | (m > k)
    if bad.any():
        raise ValueError(f"step log columns 'k', 'accepted_count' must be whole numbers with 0 <= accepted_count <= k: "
                         f"{_first_bad(steps, bad)}")
    k, m = k.astype(np.int64), m.astype(np.int64)
    n = np.minimum(m + 1, k)
    step = np.repeat(np.arange(len(steps)), n)
    starts = np.cumsum(n) - n
    position = np.arange(int(n.sum())) - np.repeat(starts, n) + 1
    out = steps.drop(columns=["k", "accepted_count"]).iloc[step].reset_index(drop=True)
    out["position"] = position
    out["accepted"] = (position <= m[step]).astype(np.int64)
    return out


def read_profiling_log(path: str | os.PathLike[str]) -> pd.DataFrame:
    """A profiling log (or a per-step log for :func:`profiling_rows_from_steps`) read from
    *path*: CSV (``.csv``), JSON lines (``.jsonl``) or Parquet (``.parquet``). The columns
    are read as they are; :func:`check_profiling_log` checks them.

    Raises
    ------
    ValueError
        Another suffix (naming the ones read), or a file that cannot be read or parsed.
    """
    import pandas as pd

    source = Path(path)
    suffix = source.suffix.lower()
    if suffix not in LOG_SUFFIXES:
        raise ValueError(f"{source}: a profiling log is a {', '.join(LOG_SUFFIXES)} file, got {suffix or 'no suffix'!r}")
    try:
        if suffix == ".csv":
            return pd.read_csv(source)
        if suffix == ".jsonl":
            return pd.read_json(source, lines=True)
        return pd.read_parquet(source)
    except (OSError, ValueError, ImportError) as exc:
        raise ValueError(f"{source}: cannot read the profiling log: {type(exc).__name__}: {exc}") from exc
