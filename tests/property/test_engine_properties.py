"""Properties of whole simulations on random small scenarios (hypothesis).

Each example draws a scenario small enough to run in milliseconds but varied
enough to reach preemption, chunked prefill, several replicas and routers.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simpy_llm import Results, Simulation, scenario_from_dict
from simpy_llm.config.errors import ScenarioWarning
from simpy_llm.serving import engine as engine_module
from tests.helpers import columns_equal
from tests.helpers import run as run_quietly

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


@st.composite
def scenarios(draw, allow_until: bool = False):
    """Random small scenarios as plain data."""
    block = draw(st.sampled_from([1, 2, 4, 16]))
    max_seqs = draw(st.integers(1, 8))
    budget = draw(st.integers(max_seqs, 96))
    chunked = draw(st.booleans())
    min_blocks = -(-budget // block)
    blocks = draw(st.integers(min_blocks, min_blocks + 40))
    dist = st.sampled_from(
        [
            {"type": "constant", "params": {"value": draw(st.integers(1, 40))}},
            {"type": "exponential", "params": {"mean": draw(st.floats(1, 40))}},
            {"type": "gaussian", "params": {"mean": 20, "std_dev": 15, "min": 1, "max": 60}},
        ]
    )
    arrival = draw(st.sampled_from([{"process": "poisson"}, {"process": "gamma", "cv": 3.0}, {"process": "gamma", "cv": 0.3}]))
    data = {
        "seed": draw(st.integers(0, 2**16)),
        "workload": {
            "aggregate_rate": draw(st.floats(5, 400)),
            "num_requests": draw(st.integers(1, 60)),
            "clients": [
                {
                    "id": "a",
                    "rate_fraction": 1.0,
                    "arrival": arrival,
                    "input_distribution": draw(dist),
                    "output_distribution": draw(dist),
                },
                {
                    "id": "b",
                    "rate_fraction": draw(st.sampled_from([0.0, 0.5, 2.0])),
                    "arrival": {"process": "poisson"},
                    "priority": draw(st.sampled_from([0, 1, -1])),
                    "slo_class": "fast",
                    "prefix_group": draw(st.sampled_from(["", "sys"])),
                    "prefix_length": draw(st.sampled_from([0, 8, 24])),
                    "input_distribution": {"type": "constant", "params": {"value": 3}},
                    "output_distribution": {"type": "constant", "params": {"value": 1}},
                },
            ],
        },
        "serving": {
            "replicas": draw(st.integers(1, 3)),
            "router": {"kind": draw(st.sampled_from(["round_robin", "random", "least_loaded"]))},
            "engine": {
                "max_num_seqs": max_seqs,
                "max_num_batched_tokens": budget,
                "chunked_prefill": chunked,
                "kv_block_size": block,
                "kv_num_blocks": blocks,
                "prefix_caching": draw(st.booleans()),
                "scheduler": draw(
                    st.sampled_from(
                        [
                            {"kind": "fcfs"},
                            {"kind": "priority"},
                            {"kind": "sjf"},
                            {"kind": "sjf", "params": {"by": "output", "predictor": {"kind": "noisy", "sigma": 0.5}}},
                            {"kind": "edf", "params": {"default_ttft_s": 0.05}},
                        ]
                    )
                ),
                **draw(
                    st.sampled_from(
                        [
                            {},
                            {"preemption_mode": "swap", "swap_space_blocks": 8, "swap_kv_bytes_per_token": 4096.0,
                             "swap_bandwidth_gb_per_s": 0.5},
                        ]
                    )
                ),
            },
            "latency_model": {
                "kind": "blis_linear",
                "params": {
                    "beta0_us": draw(st.sampled_from([0.0, 500.0, 5000.0])),
                    "beta1_us": draw(st.sampled_from([10.0, 300.0])),
                    "beta2_us": draw(st.sampled_from([50.0, 1000.0])),
                    "alpha0_us": draw(st.sampled_from([0.0, 2000.0])),
                    "alpha2_us": draw(st.sampled_from([0.0, 100.0])),
                },
            },
        },
    }
    # Client a's class is "default": its target is edf's default_ttft_s (a class without an entry is refused).
    data["slo"] = {"fast": {"ttft_s": 0.02}, "default": {"ttft_s": 0.05}}
    if allow_until and draw(st.booleans()):
        data["simulation"] = {"until_s": draw(st.floats(0.01, 1.0))}
    return data


def idle_client_warning(data: dict[str, Any]) -> Any:
    """Expect the ScenarioWarning for client b when it draws rate_fraction 0 (it is then left
    out); otherwise expect none (the suite turns any warning into an error)."""
    if data["workload"]["clients"][1]["rate_fraction"] == 0:
        return pytest.warns(ScenarioWarning, match="client 'b' has rate_fraction 0")
    return contextlib.nullcontext()


def run(data: dict[str, Any], mode: str | None = None) -> Results:
    """Run *data* (see :func:`tests.helpers.run`), checking the idle client's warning."""
    with idle_client_warning(data):
        return run_quietly(data, mode)


@SETTINGS
@given(scenarios(allow_until=True))
def test_event_per_change_equals_event_per_step(data):
    """The fast engine (one event per composition change) gives records identical to
    the per-step engine (one event per step), preemptions included, also when the run is
    cut short by until_s."""
    fast = run(data, "event_per_change")
    ref = run(data, "event_per_step")
    assert columns_equal(fast, ref) == []
    assert fast.preemptions().equals(ref.preemptions())
    assert fast.steps == ref.steps
    assert fast.summary()["batch_size"]["histogram"] == ref.summary()["batch_size"]["histogram"]
    kv_fast = fast.summary()["kv_utilization"]["time_weighted_mean"]
    kv_ref = ref.summary()["kv_utilization"]["time_weighted_mean"]
    assert math.isclose(kv_fast, kv_ref, rel_tol=1e-9, abs_tol=1e-12)


@SETTINGS
@given(scenarios(allow_until=True))
def test_conservation_every_request_recorded_once(data):
    """arrived = completed + dropped + in flight, and every request id appears exactly once."""
    res = run(data)
    s = res.summary()["requests"]
    assert s["arrived"] == s["completed"] + s["dropped"] + s["in_flight"]
    ids = res.columns["request_id"]
    assert len(ids) == s["arrived"]
    assert np.array_equal(ids, np.arange(len(ids)))


@SETTINGS
@given(scenarios())
def test_causality_of_lifecycle_timestamps(data):
    """For completed requests arrival <= enqueue <= first scheduled <= first token <= completion,
    and each generated exactly its output tokens."""
    res = run(data)
    c = res.columns
    done = c["status"] == "completed"
    for earlier, later in (
        ("arrival_s", "enqueue_s"),
        ("enqueue_s", "first_scheduled_s"),
        ("first_scheduled_s", "first_token_s"),
        ("first_token_s", "completion_s"),
    ):
        assert np.all(c[earlier][done] <= c[later][done]), (earlier, later)
    assert np.array_equal(c["generated_tokens"][done], c["output_tokens"][done])


@SETTINGS
@given(scenarios())
def test_every_preempted_request_completes_exactly_once(data):
    """A preempted request is recomputed and completes once; the preemption table and the
    per-request counts agree."""
    res = run(data)
    c = res.columns
    pre = res.preemptions()
    counts = pre.groupby("request_id").size().to_dict()
    for rid, n in counts.items():
        assert c["status"][rid] == "completed"
        assert c["num_preemptions"][rid] == n
    assert int(c["num_preemptions"].sum()) == len(pre)


class _CheckedReplica(engine_module.Replica):
    """A replica that checks its KV accounting before every scheduling decision."""

    def _plan(self):
        self._check_kv()
        return super()._plan()

    def _admit(self, chunks, budget, pending=0):
        # The engine admits without _plan when nobody is prefilling: checked here then (nothing
        # of the step is taken before admission without planned chunks or a CPU tier).
        if not chunks and self._tier is None:
            self._check_kv()
        return super()._admit(chunks, budget, pending)

    def _check_kv(self):
        bs = self.kv.block_size
        held = 0
        for req in self.running.values():
            tokens = req.kv_tokens if req.decode_anchor_step < 0 else self._decoder_kv_tokens(req)
            held += -(-tokens // bs)
        if self.prefix_cache is None:
            assert held == self.kv.used_blocks, (held, self.kv.used_blocks)
        else:  # shared blocks are held by several requests but used once
            assert self.kv.used_blocks <= held, (held, self.kv.used_blocks)
        assert 0 <= self.kv.used_blocks <= self.kv.num_blocks


@SETTINGS
@given(scenarios())
def test_kv_blocks_match_requests_and_stay_within_capacity(data):
    """At every step boundary the used KV blocks equal the sum over running requests of
    ceil(tokens / block_size), never negative nor above capacity, and all are freed at the end."""
    import simpy_llm.simulation as sim_module

    original = sim_module.Replica
    sim_module.Replica = _CheckedReplica
    try:
        with idle_client_warning(data):
            sim = Simulation(scenario_from_dict(data))
        sim.run()
    finally:
        sim_module.Replica = original
    for rep in sim.replicas:
        assert rep.kv.used_blocks == 0
        assert rep.kv.peak_used_blocks <= rep.kv.num_blocks
