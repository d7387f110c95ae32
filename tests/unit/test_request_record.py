"""``Results.records()`` yields every record field."""

from __future__ import annotations

from simpy_llm import RequestRecord, Simulation, load_scenario


def test_records_yields_one_record_per_request_with_its_values():
    """``records()`` gives one frozen record per request, in id order, with the columns' values."""
    results = Simulation(load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=20"])).run(progress=False)
    records = list(results.records())
    assert all(isinstance(r, RequestRecord) for r in records)
    assert [r.request_id for r in records] == list(range(20))
    assert records[3].completion_s == results.columns["completion_s"][3]
    assert records[3].draft_group == "" and records[3].spec_rounds == 0
