"""Whole-number columns of a trace CSV read through pyarrow's cast give what the per-cell
parsing gives: the same numbers, blanks and problems (simpy_llm/workload/traces/columns.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simpy_llm.config.errors import ScenarioError
from simpy_llm.workload.traces.columns import _parse_int, _plain_ints, _Problems

pytest.importorskip("pyarrow")

CELLS = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(str),
    st.integers(0, 10**6).map(lambda v: f"00{v}"),
    st.sampled_from(["", " 7", "8 ", "+9", "12.0", "1e3", "x", "-0", "9223372036854775808", "١٢", "3.5"]),
)


def _parse(series: pd.Series, **kwargs: object) -> tuple[object, list[tuple[str, str]]]:
    problems = _Problems("t.csv")
    lines = np.arange(len(series)) + 2
    try:
        out = _parse_int(series, lines, "c", problems, **kwargs)
        problems.raise_if_any()
    except ScenarioError as exc:
        return None, list(exc.problems)
    return out, []


@given(st.lists(CELLS, min_size=1, max_size=12), st.booleans(), st.sampled_from([None, 0]), st.booleans())
def test_arrow_cast_parses_as_the_cells_do(cells: list[str], non_negative: bool, default: int | None, nullable: bool) -> None:
    """On any cells, the column held by pyarrow parses to the same values (and dtype) or the same
    problems as the same cells held as Python strings."""
    arrow = pd.Series(cells, dtype=pd.StringDtype("pyarrow"))
    plain = pd.Series(cells, dtype=object)
    kwargs = {"non_negative": non_negative, "default": default, "nullable": nullable}
    a, a_problems = _parse(arrow, **kwargs)
    b, b_problems = _parse(plain, **kwargs)
    assert a_problems == b_problems
    if b is None:
        assert a is None
    elif nullable:
        assert pd.array(a).equals(pd.array(b))
    else:
        assert isinstance(a, np.ndarray) and a.dtype == np.int64 and np.array_equal(a, b)


def test_only_plain_integers_take_the_cast() -> None:
    """The cast takes blank cells and plain decimal integers; anything else is left to the per-cell parsing."""
    ints, blank = _plain_ints(pd.Series(["5", "", "-3", "007"], dtype=pd.StringDtype("pyarrow")))
    assert ints.tolist() == [5, 0, -3, 7] and blank.tolist() == [False, True, False, False]
    for cell in ("12.0", " 1", "+1", "1e3"):
        assert _plain_ints(pd.Series(["1", cell], dtype=pd.StringDtype("pyarrow"))) is None
    assert _plain_ints(pd.Series(["1", "2"], dtype=object)) is None


def test_chunked_columns_take_the_cast(tmp_path) -> None:
    """A column pandas read in several chunks (a long file) parses as one in a single chunk."""
    from simpy_llm.workload.traces.columns import _read_csv_strings

    n = 300_000
    (tmp_path / "t.csv").write_text("a,b\n" + "".join(f"{i},{'' if i % 7 else i}\n" for i in range(n)))
    df, _ = _read_csv_strings(tmp_path / "t.csv")
    ints, blank = _plain_ints(df["a"])
    assert ints.tolist() == list(range(n)) and not blank.any() and ints.flags.writeable
    b, blank_b = _plain_ints(df["b"])
    assert blank_b.tolist() == [bool(i % 7) for i in range(n)]
    b[blank_b] = -1
    assert b.tolist() == [-1 if i % 7 else i for i in range(n)]
