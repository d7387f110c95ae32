"""The trace writer's rows as the load generator writes them: the cells of the usual values
(exactly str, int, bool or None) made without the general formatting are the same bytes as the
general formatting gives, for any mix of values."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm.observe.loadgen import OBSERVER_COLUMNS
from simpy_llm.workload.traces import TraceV2Writer
from simpy_llm.workload.traces.columns import _DEFAULTS
from simpy_llm.workload.traces.v2 import _format_cell


class _Text(str):
    """A str subclass: not the fast path's exact type."""


def _reference_line(writer: TraceV2Writer, row: dict[str, Any], rows_written: int) -> str:
    """The line the writer wrote before its fast path: every cell through _format_cell."""
    cells = []
    for name, kind in writer._kinds:
        if name in row:
            cells.append(_format_cell(row[name], name, kind))
        elif name == "request_id":
            cells.append(str(rows_written))
        else:
            default = _DEFAULTS.get(name, 0 if kind == "int" else None)
            cells.append(_format_cell(default, name, kind) if default is not None else "")
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow(cells)
    return out.getvalue()


_VALUES = st.one_of(
    st.none(),
    st.integers(-(2**62), 2**62),
    st.booleans(),
    st.text(max_size=12),
    st.text(max_size=6).map(_Text),
    st.sampled_from([pd.NA, float("nan"), 3.0, 2.5, np.int64(7), np.bool_(True), np.float64(4.0), "a,b", 'q"x', "l\nm"]),
)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_rows_of_any_values_are_the_bytes_of_the_general_formatting(data: st.DataObject, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Rows whose columns hold any mix of values (ints, bools, None, strings and str subclasses,
    pd.NA, NaN and whole floats, numpy scalars, or are left out) are written as the lines the
    general formatting of every cell gives; a row it refuses is refused with the same error."""
    path = tmp_path_factory.mktemp("rows") / "trace"
    with TraceV2Writer(path, extra_columns=OBSERVER_COLUMNS) as writer:
        expected = []
        for _ in range(data.draw(st.integers(1, 4))):
            names = data.draw(st.lists(st.sampled_from(writer.columns), unique=True))
            row = {name: data.draw(_VALUES) for name in names}
            row["arrival_time_us"] = data.draw(st.integers(0, 10**12))
            try:
                line = _reference_line(writer, row, writer.rows_written)
            except (ValueError, TypeError) as exc:
                with pytest.raises(type(exc), match=None):
                    writer.write_row(row)
                continue
            writer.write_row(row)
            expected.append(line)
    text = Path(writer.path).read_bytes().decode("utf-8")  # bytes as written: no newline translation
    header = ",".join(writer.columns) + "\n"
    assert text == header + "".join(expected)
