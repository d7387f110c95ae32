"""Speculation on a disaggregated fleet (``docs/speculative.md``, "Speculation with
disaggregated pools, cold starts and warm state").

The expectations are computed by hand from the latency model's coefficients, the KV link's
figures and the draft network's round trip, never by the code under test; conservation is
counted from the records, the KV transfers and the replicas' step counters.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.config import ScenarioError
from tests.spec_helpers import flat_curve, spec_scenario

B0, B1, B2 = 5e-3, 50e-6, 200e-6  # spec_scenario's step coefficients, s
A0, A1, A2 = 300e-6, 2e-6, 50e-6  # queueing overhead and per-token output overhead, s
KV_BYTES, KV_BANDWIDTH, KV_RTT, KV_OVERHEAD = 1000.0, 1e8, 0.4e-3, 30e-6  # bytes per token, bytes/s, s, s


def _disaggregated(curve: str, *, prefill: int = 1, decode: int = 1, **kwargs: Any) -> dict[str, Any]:
    """spec_scenario on *prefill* + *decode* replicas, with the alphas and a KV link of known figures."""
    data = spec_scenario(curve, replicas=prefill + decode, **kwargs)
    serving = data["serving"]
    serving["latency_model"]["params"].update(alpha0_us=A0 * 1e6, alpha1_us=A1 * 1e6, alpha2_us=A2 * 1e6)
    serving["engine"]["prefix_caching"] = False
    serving["disaggregation"] = {
        "prefill_replicas": prefill,
        "kv_transfer": {"bytes_per_token": KV_BYTES, "bandwidth_gbps": KV_BANDWIDTH * 8 / 1e9, "rtt_ms": KV_RTT * 1e3,
                        "overhead_us": KV_OVERHEAD * 1e6},
    }
    return data


def _run(data: dict[str, Any]) -> tuple[Simulation, Any]:
    sim = Simulation(scenario_from_dict(data))
    return sim, sim.run(progress=False)


@pytest.mark.parametrize("mode", ["distributed", "fused"])
def test_an_isolated_requests_ttft_and_rounds_are_the_sums_of_their_parts(tmp_path, mode):
    """One request, static γ = 3, expected acceptance: its TTFT is the prefill replica's
    queueing overhead and prefill pass, the KV transfer (one-way latency, overhead, prompt
    bytes over the bandwidth) and the decode replica's output overhead; its first round ends
    a round after the KV arrives, and each round takes its parts exactly: distributed, the
    verdict down and the bundle up (the round trip r), γ drafted tokens and the verify pass;
    fused, γ fused draft steps and the verify pass. The verify pass is beta0 + beta2 (γ + 1)."""
    prompt, gamma, d, fused_d, r = 100, 3, 10e-3, 2e-3, 20e-3
    curve = flat_curve(tmp_path, [0.8, 0.8, 0.8, 0.8])
    speculation: dict[str, Any] = {"mode": mode, "acceptance_sampling": "expected", "gamma_policy": {"kind": "static", "params": {"gamma": gamma}}}
    if mode == "fused":
        speculation["fused"] = {"draft_token_ms": fused_d * 1e3, "acceptance": curve}
    data = _disaggregated(curve, requests=1, rate=1.0, prompt=prompt, output=30, devices=1, draft_token_ms=d * 1e3,
                          network={"rtt_ms": r * 1e3}, speculation=speculation)
    sim, res = _run(data)
    row = res.to_dataframe().iloc[0]
    transfer = KV_RTT / 2 + KV_OVERHEAD + prompt * KV_BYTES / KV_BANDWIDTH
    prefill = A0 + A1 * prompt + B0 + B1 * prompt
    assert (row["prefill_replica"], row["replica"], row["spec_mode"]) == (0, 1, mode)
    assert row["kv_transfer_s"] == pytest.approx(transfer, abs=1e-12)
    # atol 1e-9: the prefill replica's clock starts at its idle start rounded to the nanosecond (docs/model.md "Clock")
    assert row["ttft_s"] == pytest.approx(prefill + transfer + A2, abs=1e-9)
    rounds = res.spec_rounds()
    assert (rounds["replica"] == 1).all() and rounds["gamma"].iloc[0] == gamma
    ahead = r if mode == "distributed" else 0.0
    per_token = d if mode == "distributed" else fused_d
    parts = ahead + rounds["gamma"].to_numpy() * per_token + B0 + B2 * (rounds["gamma"].to_numpy() + 1)
    delivered = row["arrival_s"] + prefill + transfer
    assert rounds["time_s"].iloc[0] == pytest.approx(delivered + parts[0], abs=1e-9)
    np.testing.assert_allclose(np.diff(rounds["time_s"].to_numpy()), parts[1:], rtol=0, atol=1e-12)
    assert rounds["tokens"].sum() == 29 and row["status"] == "completed"
    assert sim.recorder.prefill_tokens[0] == prompt and sim.recorder.prefill_tokens[1] == 0


def test_a_delivered_request_waits_for_kv_room_and_starts_when_a_departure_frees_it(tmp_path):
    """A decode server with room for one request at a time: the second request's KV arrives
    while the first holds the KV, and its first round starts the instant the first leaves
    (its first round ends one round after that completion)."""
    prompt, output, gamma = 100, 10, 2
    curve = flat_curve(tmp_path, [1.0, 1.0, 1.0, 1.0])
    speculation = {"mode": "fused", "fused": {"draft_token_ms": 0.0, "acceptance": curve},
                   "acceptance_sampling": "expected", "gamma_policy": {"kind": "static", "params": {"gamma": gamma}}}
    data = _disaggregated(curve, requests=2, rate=1000.0, prompt=prompt, output=output, devices=2, speculation=speculation)
    data["serving"]["engine"].update(kv_block_size=1, kv_num_blocks=prompt + output + 5, max_num_batched_tokens=prompt)  # one request's KV
    data["speculation"]["verify"] = {"max_kv_utilization": 1.0}
    _sim, res = _run(data)
    frame = res.to_dataframe().sort_values("request_id")
    first, second = frame.iloc[0], frame.iloc[1]
    rounds = res.spec_rounds()
    later = rounds[rounds["request_id"] == second["request_id"]]
    assert later["time_s"].iloc[0] == pytest.approx(first["completion_s"] - output * A2 + B0 + B2 * (gamma + 1), abs=1e-12)
    assert (frame["status"] == "completed").all()


@st.composite
def _cases(draw: st.DrawFn) -> dict[str, Any]:
    mode = draw(st.sampled_from(["distributed", "fused", "hybrid"]))
    return {
        "mode": mode, "prefill": draw(st.integers(1, 2)), "decode": draw(st.integers(1, 3)),
        "requests": draw(st.integers(1, 25)), "rate": draw(st.floats(1.0, 200.0)), "prompt": draw(st.integers(2, 200)),
        "output": draw(st.integers(1, 30)), "devices": draw(st.integers(1, 4)), "kv_blocks": draw(st.sampled_from([16, 4096])),
        "probability": draw(st.floats(0.0, 1.0)), "seed": draw(st.integers(0, 2**16)),
        "sampling": draw(st.sampled_from(["bernoulli", "expected"])), "loss": draw(st.sampled_from([0.0, 0.3])),
    }


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture], derandomize=True)
@given(case=_cases())
def test_every_request_is_prefilled_once_on_the_prefill_pool_and_verified_only_on_the_decode_pool(case, tmp_path):
    """Random small disaggregated speculative runs: every request ends once (completed, or
    dropped by a lost KV transfer); the prefill pool computed each prompt that was handed off
    or completed there exactly once and the decode pool computed none; each request's KV
    crossed at most once (once for every request with two or more tokens, unless lost), every
    verify round ran on the decode pool, a completed request's rounds add up to its output
    minus the first token, and nothing is left on any replica."""
    curve = flat_curve(tmp_path, [case["probability"]] * 4)
    speculation: dict[str, Any] = {"mode": case["mode"], "acceptance_sampling": case["sampling"]}
    if case["mode"] != "distributed":
        speculation["fused"] = {"draft_token_ms": 1.0, "acceptance": curve}
    if case["mode"] == "hybrid":
        speculation["mode_selector"] = {"kind": "latency"}
    data = _disaggregated(
        curve, prefill=case["prefill"], decode=case["decode"], requests=case["requests"], rate=case["rate"],
        prompt=case["prompt"], output=case["output"], devices=case["devices"], speculation=speculation, seed=case["seed"],
        network={"rtt_ms": 5.0},
    )
    data["serving"]["engine"].update(kv_num_blocks=case["kv_blocks"], max_num_batched_tokens=256)  # 16 blocks: about one request's KV
    if case["loss"]:
        data["serving"]["disaggregation"]["kv_transfer"].update(loss_probability=case["loss"], max_retransmissions=0, retransmit_timeout_ms=1.0)
    sim, res = _run(data)
    frame = res.to_dataframe()
    assert sorted(frame["request_id"]) == list(range(case["requests"]))
    completed = frame[frame["status"] == "completed"]
    dropped = frame[frame["status"] != "completed"]
    assert set(dropped["dropped_reason"]) <= {"kv_transfer_loss"}
    prefill_pool, decode_pool = set(range(case["prefill"])), set(range(case["prefill"], case["prefill"] + case["decode"]))
    transfers = res.kv_transfers()
    assert transfers["request_id"].is_unique
    handed = frame[frame["output_tokens"] >= 2]
    assert set(transfers["request_id"]) == set(handed["request_id"]) - set(dropped["request_id"])  # a lost transfer is not one
    assert set(transfers["prefill_replica"]) <= prefill_pool and set(transfers["decode_replica"]) <= decode_pool
    assert set(frame["prefill_replica"][frame["prefill_replica"] >= 0]) <= prefill_pool
    assert sum(sim.recorder.prefill_tokens[i] for i in prefill_pool) == frame["prompt_tokens"].sum()
    assert all(sim.recorder.prefill_tokens[j] == 0 for j in decode_pool)
    rounds = res.spec_rounds()
    assert set(rounds["replica"]) <= decode_pool
    tokens = rounds.groupby("request_id")["tokens"].sum()
    for _, row in completed.iterrows():
        assert int(tokens.get(row["request_id"], 0)) == row["output_tokens"] - 1
        if row["output_tokens"] >= 2:
            assert row["replica"] in decode_pool and row["prefill_replica"] in prefill_pool
    assert res._recorder.live == {}
    for j in decode_pool:
        server = sim.replicas[j]
        assert server.kv.used_blocks == 0 and not server.running and not server.in_flight()


def test_a_planner_with_disaggregated_speculation_is_refused(tmp_path):
    """A planner resizes a co-located speculative fleet only: with disaggregation it is refused at its key."""
    curve = flat_curve(tmp_path, [0.5] * 4)
    data = _disaggregated(curve, decode=2)
    data["planner"] = {"interval_s": 1.0, "candidates": {"gamma": [2, 3]}}
    with pytest.raises(ScenarioError, match="planner"):
        scenario_from_dict(data)


def test_draft_groups_bound_to_targets_are_refused_on_a_disaggregated_fleet(tmp_path):
    """A draft group's ``targets`` name replicas the entry router (the prefill pool) would
    choose among: refused, naming the key."""
    curve = flat_curve(tmp_path, [0.5] * 4)
    data = _disaggregated(curve, decode=2)
    data["speculation"]["drafts"][0]["targets"] = ["decode/0"]
    with pytest.raises(ScenarioError, match=r"speculation\.drafts\[0\]\.targets"):
        scenario_from_dict(data)
