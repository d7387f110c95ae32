"""Speculative decoding on random small scenarios (hypothesis): every request is accounted for
once, a completed request's rounds add up to its output, nothing is left on the targets, and
a run is reproducible."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from simpy_llm import Results, Simulation, scenario_from_dict
from tests.helpers import columns_equal
from tests.spec_helpers import flat_curve, spec_scenario

SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)

LOSSY_DISTRIBUTED = {
    "probabilities": [0.9, 0.7, 0.5, 0.3],
    "speculation": {
        "mode": "distributed", "gamma_policy": {"kind": "static", "params": {"gamma": 3}},
        "acceptance_sampling": "bernoulli",
        "verify": {"order": "edf", "max_microbatch": 4, "partial": "sampled", "sample_rate": 0.5, "rollback_penalty_ms": 1.0},
    },
    "network": {"rtt_ms": 20.0, "bandwidth_mbps": 10.0, "loss_probability": 0.1, "retransmit_timeout_ms": 5.0, "max_retransmissions": 1},
    "requests": 40, "rate": 20.0, "prompt": 64, "output": 40, "devices": 3, "replicas": 2, "draft_token_ms": 5.0, "seed": 3,
}
"""A distributed run whose bundles and verdicts are lost often enough to drop about a quarter
of its requests (always tried, besides the drawn cases)."""


@st.composite
def spec_cases(draw: st.DrawFn) -> dict[str, Any]:
    """Everything of a small speculative scenario but the curve file: its probabilities, and a
    ``speculation`` section whose fused acceptance is filled in once the curve is written."""
    mode = draw(st.sampled_from(["distributed", "fused", "hybrid"]))
    probabilities = draw(st.lists(st.floats(0.0, 1.0), min_size=4, max_size=4))
    gamma = draw(st.sampled_from([
        {"kind": "static", "params": {"gamma": draw(st.integers(1, 4))}},
        {"kind": "acceptance_backoff"},
        {"kind": "specpp"},
    ]))
    verify: dict[str, Any] = {
        "order": draw(st.sampled_from(["fcfs", "edf", "least_slack"])),
        "max_microbatch": draw(st.integers(1, 8)),
        "partial": draw(st.sampled_from(["all", "first_token", "sampled"])),
    }
    if verify["partial"] == "sampled":
        verify["sample_rate"] = draw(st.floats(0.0, 1.0))
    if verify["partial"] != "all":
        verify["rollback_penalty_ms"] = draw(st.floats(0.0, 5.0))
    speculation: dict[str, Any] = {
        "mode": mode,
        "gamma_policy": gamma,
        "acceptance_sampling": draw(st.sampled_from(["bernoulli", "expected"])),
        "verify": verify,
    }
    if mode == "hybrid":
        speculation["mode_selector"] = {"kind": "latency"}
    network = None
    path = draw(st.sampled_from(["none", "clean", "lossy"]))
    if path != "none":
        network = {"rtt_ms": draw(st.floats(0.0, 50.0)), "bandwidth_mbps": draw(st.sampled_from([1.0, 10.0, 100.0]))}
    if path == "lossy":
        network.update({
            "loss_probability": draw(st.sampled_from([0.1, 0.2, 0.3])), "retransmit_timeout_ms": 5.0,
            "max_retransmissions": draw(st.integers(0, 2)),
        })
    return {
        "probabilities": probabilities,
        "speculation": speculation,
        "network": network,
        "requests": draw(st.integers(1, 40)),
        "rate": draw(st.floats(1.0, 100.0)),
        "prompt": draw(st.integers(1, 200)),
        "output": draw(st.integers(1, 40)),
        "devices": draw(st.integers(1, 5)),
        "replicas": draw(st.integers(1, 3)),
        "draft_token_ms": draw(st.floats(0.5, 20.0)),
        "seed": draw(st.integers(0, 2**16)),
    }


def build(case: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The scenario data of *case*, with its flat curve written to a fresh directory."""
    curve = flat_curve(tmp_path_factory.mktemp("curve"), case["probabilities"])
    speculation = dict(case["speculation"])
    if speculation["mode"] != "distributed":
        speculation["fused"] = {"draft_token_ms": 1.0, "acceptance": curve}
    return spec_scenario(
        curve, requests=case["requests"], rate=case["rate"], prompt=case["prompt"], output=case["output"],
        devices=case["devices"], replicas=case["replicas"], draft_token_ms=case["draft_token_ms"],
        network=case["network"], speculation=speculation, seed=case["seed"],
    )


def simulate(data: dict[str, Any]) -> tuple[Simulation, Results]:
    sim = Simulation(scenario_from_dict(data))
    return sim, sim.run(progress=False)


@SETTINGS
@given(case=spec_cases())
@example(case=LOSSY_DISTRIBUTED)
def test_speculative_runs_conserve_requests_and_tokens(case, tmp_path_factory):
    """Every request ends once (completed or dropped on the network); a completed one made all
    its output, its rounds' tokens add up to output - 1 (the prefill makes the first), it never
    accepted more than it drafted; nothing stays live or holds KV on a target."""
    data = build(case, tmp_path_factory)
    n = data["workload"]["num_requests"]
    sim, res = simulate(data)
    cols = res.columns

    ids = sorted(int(i) for i in cols["request_id"])
    assert ids == list(range(n))
    status = [str(s) for s in cols["status"]]
    assert set(status) <= {"completed", "dropped"}, set(status)
    if case["network"] is None or "loss_probability" not in case["network"]:
        assert set(status) == {"completed"}

    rounds = res.spec_rounds()
    tokens_by_request = rounds.groupby("request_id")["tokens"].sum() if len(rounds) else pd.Series(dtype=int)
    for k, rid in enumerate(cols["request_id"]):
        rid = int(rid)
        assert cols["accepted_tokens"][k] <= cols["drafted_tokens"][k], rid
        if status[k] == "completed":
            output = int(cols["output_tokens"][k])
            assert cols["generated_tokens"][k] == output, rid
            assert int(tokens_by_request.get(rid, 0)) == output - 1, rid
            assert str(cols["dropped_reason"][k]) == "", rid
        else:
            assert str(cols["dropped_reason"][k]).startswith("network_"), (rid, cols["dropped_reason"][k])

    assert res._recorder.live == {}
    for replica in sim.replicas:
        assert replica.kv.used_blocks == 0
        assert not replica.running


@SETTINGS
@given(case=spec_cases())
@example(case=LOSSY_DISTRIBUTED)
def test_speculative_runs_are_reproducible(case, tmp_path_factory):
    """The same scenario run twice gives identical record columns and identical verify rounds."""
    data = build(case, tmp_path_factory)
    _, first = simulate(data)
    _, second = simulate(data)
    assert columns_equal(first, second) == []
    pd.testing.assert_frame_equal(first.spec_rounds(), second.spec_rounds())
