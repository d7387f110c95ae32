"""The simulated request record is declared once (``simpy_llm.metrics.record.RequestRecord``):
the recorder's columns, the DataFrame's record columns and dtypes and the trace v2 columns
all equal what the class declares, so a field added in one place only is caught."""

from __future__ import annotations

from array import array

import attrs
import pandas as pd
import pytest

from simpy_llm import Request, RequestRecord, Results, Simulation, scenario_from_dict
from simpy_llm.calibrate.synthetic import simulated_observation
from simpy_llm.metrics import recorder as recorder_module
from simpy_llm.metrics.record import (
    FRAME_DTYPES,
    RECORD_COLUMNS,
    RECORD_FIELDS,
    TRACE_COLUMNS,
)
from simpy_llm.metrics.recorder import Recorder
from simpy_llm.workload import traces
from simpy_llm.workload.traces import V2_COLUMNS, TraceRequest, read_trace_v2
from tests.helpers import tiny_scenario

KIND_OF_TYPE = {int: "i", float: "f", str: "s"}
TYPECODE_OF_KIND = {"i": "q", "f": "d", "s": "q"}  # strings are stored as integer codes


@pytest.fixture(scope="module")
def results() -> Results:
    return Simulation(scenario_from_dict(tiny_scenario())).run(progress=False)


def _declared() -> list[tuple[str, type]]:
    return [(f.name, f.type) for f in attrs.fields(RequestRecord)]


def test_the_derived_tables_follow_the_class_field_by_field():
    """``RECORD_FIELDS``, ``RECORD_COLUMNS``, ``FRAME_DTYPES`` name the class's fields in its
    order, with the kind its type gives; the recorder module exports the same ``RECORD_FIELDS``."""
    declared = _declared()
    assert [(name, KIND_OF_TYPE[t]) for name, t in declared] == list(RECORD_FIELDS)
    assert [c.name for c in RECORD_COLUMNS] == [name for name, _ in declared]
    assert list(FRAME_DTYPES) == [name for name, _ in declared]
    assert recorder_module.RECORD_FIELDS is RECORD_FIELDS


def test_the_recorder_keeps_one_column_per_declared_field_read_from_the_request():
    """A Recorder has exactly the declared columns, each an array of the declared kind's
    machine type (strings: codes with a name table); every column but ``status`` (which the
    recorder supplies) is read from a Request attribute that exists."""
    rec = Recorder()
    columns = rec.columns
    assert list(columns) == [name for name, _ in _declared()]
    for name, kind in RECORD_FIELDS:
        assert isinstance(columns[name], array) and columns[name].typecode == TYPECODE_OF_KIND[kind], name
    assert set(rec.codes) == {name for name, kind in RECORD_FIELDS if kind == "s"}
    request = Request(id=0, client_id="c", prompt_tokens=4, output_tokens=2, arrival_s=0.0)
    assert [c.name for c in RECORD_COLUMNS if c.attr is None] == ["status"]
    for column in RECORD_COLUMNS:
        if column.attr is not None:
            assert hasattr(request, column.attr), column


def test_the_frame_has_the_declared_columns_and_dtypes(results: Results):
    """``to_dataframe()`` starts with the declared fields, in order, each in its declared
    dtype (a field declared without one keeps the dtype pandas infers for text); the
    frozen columns hold them too."""
    frame = results.to_dataframe()
    names = [name for name, _ in _declared()]
    assert list(frame.columns[: len(names)]) == names
    assert list(results.columns) == names
    inferred_text = pd.DataFrame({"x": ["a"]})["x"].dtype
    for name, dtype in FRAME_DTYPES.items():
        assert str(frame[name].dtype) == (dtype if dtype is not None else str(inferred_text)), name


def test_records_are_the_frame_rows_as_objects(results: Results):
    """``records()`` yields one RequestRecord per row with that row's values."""
    frame = results.to_dataframe()
    records = list(results.records())
    assert len(records) == len(frame)
    row = frame.iloc[3]
    for name, value in attrs.asdict(records[3]).items():
        assert value == row[name] or (pd.isna(value) and pd.isna(row[name])), name  # NaN: a time never reached


def test_the_trace_columns_are_the_declared_ones():
    """Each field that declares a trace v2 column names one of ``V2_COLUMNS`` that a
    ``TraceRequest`` carries; the replay reads exactly those columns."""
    assert TRACE_COLUMNS == {c.name: c.trace for c in RECORD_COLUMNS if c.trace is not None}
    assert set(TRACE_COLUMNS.values()) <= set(V2_COLUMNS)
    assert set(TRACE_COLUMNS.values()) <= set(TraceRequest._fields)
    assert traces._RECORD_COLUMNS == tuple(TRACE_COLUMNS.values())


def test_a_simulated_observation_writes_the_declared_trace_columns(tmp_path):
    """The trace v2 a simulated observation writes holds, in each declared trace column,
    the record field's values."""
    scenario = scenario_from_dict(tiny_scenario())
    frame = Simulation(scenario).run(progress=False).to_dataframe().set_index("request_id", drop=False)
    trace = read_trace_v2(simulated_observation(scenario, tmp_path / "trace")[1]).frame.set_index("request_id", drop=False)
    assert len(trace) == len(frame)
    for name, column in TRACE_COLUMNS.items():
        assert trace[column].astype(object).tolist() == frame.loc[trace.index, name].astype(object).tolist(), name
