"""A trace CSV read by pyarrow's CSV reader gives what pandas' reader gives: the same cells,
dtypes, line numbers and problems (simpy_llm/workload/traces/columns.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simpy_llm.config.errors import ScenarioError
from simpy_llm.workload.traces import columns

pytest.importorskip("pyarrow")

PIECES = st.sampled_from(["a", "1", "12", "é", " ", ",", '"', '""', "\n", "\r\n", "\r", "\ufeff", "x y", "NA", "null", "\x00", "\t"])
TEXTS = st.lists(PIECES, max_size=40).map("".join)
ROWS = st.lists(st.lists(st.sampled_from(["", "7", "ab", '"q,1"', '"a""b"', " s ", "é"]), min_size=1, max_size=4), min_size=1, max_size=6)


def _read(path: Path, arrow: bool) -> tuple[object, object]:
    """``_read_csv_strings`` of *path* by the pyarrow path (when it takes the file) or by pandas'."""
    keep = columns._STR_DTYPE
    if not arrow:
        columns._STR_DTYPE = None  # the pyarrow path then declines every file
    try:
        df, lines = columns._read_csv_strings(path)
    except ScenarioError as exc:
        return None, list(exc.problems)
    finally:
        columns._STR_DTYPE = keep
    return df, lines.tolist()


def _same(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(data)
    a, a_lines = _read(path, arrow=True)
    b, b_lines = _read(path, arrow=False)
    assert a_lines == b_lines
    if b is None:
        assert a is None
        return
    assert isinstance(a, pd.DataFrame) and isinstance(b, pd.DataFrame)
    assert list(a.columns) == list(b.columns)
    assert list(a.dtypes) == list(b.dtypes)
    assert a.equals(b)
    assert a.index.equals(b.index)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=300)
@given(TEXTS)
def test_any_text_reads_the_same(tmp_path: Path, text: str) -> None:
    """Any text (quotes, separators, line ends of every kind, a byte-order mark, NUL) reads to
    the same frame and line numbers, or fails with the same problems, by either reader."""
    _same(tmp_path, text.encode())


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ROWS, st.sampled_from(["\n", "\r\n"]), st.booleans())
def test_tables_read_the_same(tmp_path: Path, rows: list[list[str]], end: str, last_end: bool) -> None:
    """CSV tables (short and long rows, quoted cells with separators and doubled quotes, blank
    cells) read the same by either reader."""
    text = end.join(",".join(row) for row in rows) + (end if last_end else "")
    _same(tmp_path, text.encode())


def test_a_trace_takes_the_arrow_path() -> None:
    """The committed trace of blis_linear is read by pyarrow (the fast path is taken), as pandas reads it."""
    path = Path(__file__).parents[2] / "data" / "blis_linear" / "trace.csv"
    if columns._STR_DTYPE is None:
        pytest.skip("pandas does not hold strings in pyarrow here")
    assert columns._read_csv_arrow(path) is not None
    a, a_lines = _read(path, arrow=True)
    b, b_lines = _read(path, arrow=False)
    assert isinstance(a, pd.DataFrame) and a.equals(b) and a_lines == b_lines


def test_invalid_utf8_is_left_to_pandas(tmp_path: Path) -> None:
    """A file that is not UTF-8 is declined by the pyarrow path, and pandas' path reports it."""
    path = tmp_path / "t.csv"
    path.write_bytes(b"a,b\n\xff,1\n")
    assert columns._read_csv_arrow(path) is None
    with pytest.raises(ScenarioError, match="not UTF-8"):
        columns._read_csv_strings(path)
