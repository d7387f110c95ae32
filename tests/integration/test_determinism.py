"""Same seed and config give byte-identical saved records; another seed does not; the workload
export generates exactly the requests the simulation receives."""

from __future__ import annotations

import numpy as np
import pytest

from simpy_llm import Simulation, load_scenario
from simpy_llm.workload.export import generate_requests

OVERRIDES = ["workload.num_requests=1500", "serving.engine.kv_num_blocks=600"]


def _save(tmp_path, name: str, extra: list[str]) -> dict[str, bytes]:
    scenario = load_scenario("scenarios/quickstart.yaml", OVERRIDES + extra)
    out = Simulation(scenario).run().save(tmp_path / name)
    return {f: (out / f).read_bytes() for f in ("records.csv", "preemptions.csv", "summary.json")}


def test_same_seed_gives_byte_identical_files(tmp_path):
    """Two runs with one seed write identical records, preemptions and summary files."""
    a = _save(tmp_path, "a", [])
    b = _save(tmp_path, "b", [])
    assert a == b
    assert a["preemptions.csv"].count(b"\n") > 1  # the KV cache is tight enough to preempt


def test_other_seed_gives_other_records(tmp_path):
    """Changing only the seed changes the records."""
    a = _save(tmp_path, "a", [])
    b = _save(tmp_path, "b", ["seed=43"])
    assert a["records.csv"] != b["records.csv"]


def test_fast_and_reference_modes_write_identical_records(tmp_path):
    """The two engine modes write byte-identical records for the quickstart."""
    a = _save(tmp_path, "a", ["simulation.mode=event_per_change"])
    b = _save(tmp_path, "b", ["simulation.mode=event_per_step"])
    assert a["records.csv"] == b["records.csv"]
    assert a["preemptions.csv"] == b["preemptions.csv"]


GENERATED = {
    "two_clients.yaml": ["workload.num_requests=1500"],
    "two_clients_by_reference.yaml": ["workload.num_requests=1500"],
    "servegen_multimodal.yaml": ["workload.horizon_s=60"],
    "azure_conversation_replay.yaml": ["workload.traces.0.max_requests=800"],
    "reasoning.yaml": ["workload.num_requests=300"],
}


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_generated_requests_are_the_simulated_arrivals(name: str) -> None:
    """``generate_requests`` (the workload export, which builds no simulation) gives exactly the
    requests the simulation receives: the same ids, clients, send times and lengths, in order."""
    scenario = load_scenario(f"scenarios/{name}", GENERATED[name])
    frame = generate_requests(scenario)
    records = Simulation(scenario).run().to_dataframe().sort_values("request_id").reset_index(drop=True)
    first_rounds = records[records.round_index == 0].reset_index(drop=True)
    assert len(frame) == len(first_rounds) > 100
    assert frame.request_id.tolist() == first_rounds.request_id.tolist()
    assert frame.client_id.tolist() == first_rounds.client_id.tolist()
    # A client with a network sent it upload_s before it reached the server (arrival_s).
    sent = first_rounds.arrival_s - first_rounds.upload_s
    np.testing.assert_allclose(frame.arrival_time_s, sent, rtol=0, atol=1e-9)
    assert frame.input_tokens.tolist() == first_rounds.prompt_tokens.tolist()
    assert frame.output_tokens.tolist() == first_rounds.output_tokens.tolist()


def test_event_count_does_not_depend_on_how_the_run_is_sliced():
    """A run reports the same SimPy event count in one piece as in progress slices of any size:
    the stops that slicing schedules (whose number may follow the wall clock) are not the
    model's events."""
    scenario = load_scenario("scenarios/quickstart.yaml", OVERRIDES)
    whole = Simulation(scenario).run(progress=False)
    sliced = [Simulation(scenario).run(progress=lambda *_: None, progress_every_s=every) for every in (0.5, 7.0)]
    assert [r.events for r in sliced] == [whole.events, whole.events]
    assert whole.events > 3 * len(whole)  # the model's own events are counted
