"""``Results.records()`` yields every record field."""

from __future__ import annotations

import attrs

from simpy_llm import Simulation, load_scenario
from simpy_llm.metrics.recorder import RECORD_FIELDS
from simpy_llm.metrics.results import RequestRecord


def test_request_record_has_exactly_the_record_fields_in_order():
    """``RequestRecord``'s fields are the recorder's columns, in order (a column added to one
    and not the other breaks ``records()``)."""
    assert [a.name for a in attrs.fields(RequestRecord)] == [name for name, _ in RECORD_FIELDS]


def test_records_yields_one_record_per_request_with_its_values():
    """``records()`` gives one frozen record per request, in id order, with the columns' values."""
    results = Simulation(load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=20"])).run(progress=False)
    records = list(results.records())
    assert [r.request_id for r in records] == list(range(20))
    assert records[3].completion_s == results.columns["completion_s"][3]
    assert records[3].draft_group == "" and records[3].spec_rounds == 0
