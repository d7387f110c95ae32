"""The planner's parallelism candidates: it picks the tensor-parallel degree the roofline's
closed form says is better, keeps the fleet's GPUs, records the change, and refuses what
cannot be rebuilt at another degree."""

from __future__ import annotations

import functools

import pytest

from simpy_llm import Simulation, load_scenario
from simpy_llm.config.errors import ScenarioError
from simpy_llm.loading import scenario_from_dict
from simpy_llm.serving.roofline import RooflineLatency

PROMPT, OUTPUT = 512, 128
"""Every request's lengths (tokens)."""


def _scenario(planner: dict | None, *, replicas: int = 2, tp: int = 1, rate: float = 1.0, requests: int = 40) -> dict:
    """Llama-3.1-8B on H100s under the roofline, evenly spaced requests of fixed lengths."""
    return {
        "name": "parallelism", "seed": 11,
        "workload": {"aggregate_rate": rate, "num_requests": requests, "clients": [{
            "id": "c", "slo_class": "chat", "arrival": {"process": "constant"},
            "input_distribution": {"type": "constant", "params": {"value": PROMPT}},
            "output_distribution": {"type": "constant", "params": {"value": OUTPUT}},
        }]},
        "serving": {
            "replicas": replicas, "router": {"kind": "round_robin"},
            "engine": {"max_num_seqs": 64, "max_num_batched_tokens": 2048, "kv_block_size": 16, "kv_num_blocks": "auto"},
            "latency_model": {"kind": "roofline", "params": {"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": tp}},
        },
        "slo": {"chat": {"ttft_s": 1.0, "tpot_s": 0.05}},
        **({"planner": planner} if planner is not None else {}),
    }


LATENCY_PLANNER = {
    "interval_s": 10, "objective": "-latency_s.e2e.mean",
    "candidates": {"parallelism": [{"tp": 1}, {"tp": 2}]},
}


@functools.cache
def _planned():
    return Simulation(scenario_from_dict(_scenario(LATENCY_PLANNER))).run(progress=False)


def _lone_e2e_s(tp: int) -> float:
    """End-to-end time of a request alone on a replica at *tp*, by the roofline's arithmetic:
    its prefill step, then one decode step per further output token at its growing context."""
    model = RooflineLatency(model="llama-3.1-8b-instruct", gpu="H100", tp=tp)
    prefill = model.step_time_s(PROMPT, 0, prefill_attention_pairs=PROMPT * (PROMPT + 1) // 2)
    return prefill + sum(model.step_time_s(0, 1, decode_context_tokens=PROMPT + k) for k in range(OUTPUT - 1))


def test_the_planner_picks_the_degree_with_the_shorter_closed_form_latency():
    """At one request a second no two requests overlap, so each what-if's mean end-to-end
    latency is the closed-form time of a lone request at its degree; tp 2 halves the
    weight reads of a decode step, so the planner moves from tp 1 to tp 2 at its first tick."""
    frame = _planned().planner_decisions()
    first = frame[frame["tick"] == 0].set_index("candidate")
    for tp in (1, 2):
        assert -first.loc[f"parallelism={tp}", "score"] == pytest.approx(_lone_e2e_s(tp), rel=1e-3)
    assert _lone_e2e_s(2) < _lone_e2e_s(1)
    assert first.loc["parallelism=2", "applied"] and not first.loc["parallelism=1", "chosen"]
    assert _planned().summary()["planner"]["final"] == {"parallelism": 2}


def test_the_change_is_recorded_and_new_work_runs_on_the_new_layout():
    """The decision table shows both candidates at each tick, one change (at the first
    tick, 10 s), the same 2 GPUs for each; requests arriving before it ran on the two tp 1
    replicas, those after on the one tp 2 replica built after them."""
    results = _planned()
    frame = results.planner_decisions()
    assert (frame.groupby("tick").size() == 2).all()
    assert set(frame["gpus"]) == {2}
    assert frame["applied"].sum() == 1 and frame.loc[frame["applied"], "time_s"].tolist() == [10.0]
    records = results.to_dataframe()
    before = records[records["arrival_s"] < 10.0]
    after = records[records["arrival_s"] > 10.0]
    assert set(before["replica"]) == {0, 1} and set(after["replica"]) == {2}
    assert results.summary()["planner"]["changes"] == 1


def test_gpu_seconds_count_the_layout_in_use():
    """Two GPUs serve throughout (two tp 1 replicas, then one tp 2 replica; a lone request
    finishes within a second, so the drain overlaps by less than that)."""
    results = _planned()
    stats = results.summary()["planner"]
    end_s = stats["gpu_seconds"] / stats["mean_gpus"]
    assert 2 * end_s <= stats["gpu_seconds"] <= 2 * end_s + 2 * _lone_e2e_s(1)


def test_each_layout_keeps_the_fleets_gpus():
    """Four tp 1 replicas give two tp 2 replicas and one tp 4 replica (GPUs = replicas x tp),
    built after the scenario's own; only the scenario's layout is active at the start."""
    planner = {"interval_s": 10, "candidates": {"parallelism": [{"tp": 1}, {"tp": 2}, {"tp": 4}]}}
    sim = Simulation(scenario_from_dict(_scenario(planner, replicas=4)))
    assert sim.layouts == {1: [0, 1, 2, 3], 2: [4, 5], 4: [6]}
    assert [p.gpus for p in sim.plans] == [1, 1, 1, 1, 2, 2, 4]
    assert sim.planner is not None and sim.planner.control.active == [True] * 4 + [False] * 3
    gpus = sim.planner.control.gpus
    assert gpus({"parallelism": 1}) == gpus({"parallelism": 2}) == gpus({"parallelism": 4}) == 4


def test_the_same_seed_gives_the_same_records():
    """Two runs of one planned scenario give identical records and decisions."""
    again = Simulation(scenario_from_dict(_scenario(LATENCY_PLANNER))).run(progress=False)
    assert again.to_dataframe().equals(_planned().to_dataframe())
    assert again.planner_decisions().equals(_planned().planner_decisions())


def _problem(data: dict) -> str:
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data)
    return str(info.value)


def test_a_latency_model_that_cannot_change_tp_is_refused():
    """blis_linear given as coefficients names no hardware: refused at the planner's key,
    naming the latency model."""
    data = _scenario(LATENCY_PLANNER)
    data["serving"]["latency_model"] = {"kind": "blis_linear", "params": {"beta0_us": 5000, "beta1_us": 1, "beta2_us": 1}}
    data["serving"]["engine"]["kv_num_blocks"] = 4096
    message = _problem(data)
    assert "planner.candidates.parallelism: serving.latency_model (blis_linear) cannot change its tensor-parallel degree" in message


def test_gpus_that_do_not_split_are_refused():
    """Three tp 1 replicas cannot become tp 2 replicas: refused at that candidate's tp."""
    message = _problem(_scenario(LATENCY_PLANNER, replicas=3))
    assert "planner.candidates.parallelism[1].tp: serving.count: 3 replicas x tp 1 = 3 GPUs do not split into replicas of tp 2" in message


def test_pipeline_parallelism_is_not_offered():
    """Only tp is modelled: a pp key is unknown."""
    planner = {**LATENCY_PLANNER, "candidates": {"parallelism": [{"tp": 1, "pp": 2}]}}
    assert "planner.candidates.parallelism[0].pp: unknown key; allowed: tp" in _problem(_scenario(planner))


def test_parallelism_excludes_active_replicas():
    """The GPU budget sets the replicas, so active_replicas alongside is refused."""
    planner = {**LATENCY_PLANNER, "candidates": {"parallelism": [{"tp": 1}], "active_replicas": [1, 2]}}
    assert "planner.candidates.parallelism: excludes active_replicas" in _problem(_scenario(planner))


def test_a_disaggregated_fleet_is_refused():
    """Parallelism candidates are for a co-located fleet (not yet per pool)."""
    data = _scenario(LATENCY_PLANNER, replicas=4)
    data["serving"]["disaggregation"] = {"prefill_replicas": 2}
    data["planner"] = {**LATENCY_PLANNER, "candidates": {"parallelism": [{"tp": 1}, {"tp": 2}]}}
    assert "planner.candidates.parallelism: not supported yet with serving.disaggregation" in _problem(data)


def test_verify_servers_change_layout_under_speculative_decoding():
    """The shipped speculative planner scenario on one tp 2 verify server, the planner
    choosing between it and two tp 1 servers: it moves to tp 1 (two servers' queues beat
    one faster server's at this load) at its first tick; prompts routed after it go to the
    two servers built after the first, and every request still gets all its tokens."""
    overrides = [
        "serving.latency_model.params.tp=2", "planner.candidates={parallelism: [{tp: 1}, {tp: 2}]}",
        "workload.num_requests=150",
    ]
    sim = Simulation(load_scenario("scenarios/planner_speculative.yaml", overrides))
    results = sim.run(progress=False)
    assert sim.layouts == {2: [0], 1: [1, 2]}
    applied = results.planner_decisions().query("applied")
    assert applied[["time_s", "candidate"]].values.tolist() == [[20.0, "parallelism=1"]]
    records = results.to_dataframe()
    assert set(records.loc[records["arrival_s"] < 20.0, "replica"]) == {0}
    assert set(records.loc[records["arrival_s"] > 20.0, "replica"]) == {1, 2}
    assert (records["generated_tokens"] == records["output_tokens"]).all()
    rounds = results.spec_rounds()
    late = set(records.loc[records["arrival_s"] > 20.0, "request_id"])
    assert set(rounds.loc[rounds["request_id"].isin(late), "replica"]) == {1, 2}


def test_a_degree_out_of_range_or_listed_twice_is_refused():
    """tp is an integer in [1, 64], each listed once."""
    zero = {**LATENCY_PLANNER, "candidates": {"parallelism": [{"tp": 0}]}}
    assert "planner.candidates.parallelism[0].tp: must be >= 1" in _problem(_scenario(zero))
    twice = {**LATENCY_PLANNER, "candidates": {"parallelism": [{"tp": 2}, {"tp": 2}]}}
    assert "planner.candidates.parallelism: lists a tp twice: [2, 2]" in _problem(_scenario(twice))
