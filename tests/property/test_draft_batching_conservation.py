"""Draft-side batching on random small scenarios (hypothesis): every draft token a round asks
for is drafted in exactly one step, a device runs one step at a time with at most
``max_batch`` rounds of one drafter, and a run is reproducible."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from simpy_llm import Results, Simulation, scenario_from_dict
from simpy_llm.serving.devices import device_profile, device_profile_to_dict
from simpy_llm.speculative.draft_batching import DraftSteps
from tests.helpers import columns_equal
from tests.spec_helpers import flat_curve, spec_scenario

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)

BUSY_DEVICE = {
    "probabilities": [0.6, 0.5, 0.4, 0.3],
    "speculation": {"mode": "distributed", "gamma_policy": {"kind": "static", "params": {"gamma": 4}},
                    "acceptance_sampling": "bernoulli", "verify": {"max_microbatch": 8}},
    "drafters": [
        {"name": "d0", "latency_model": {"kind": "blis_linear", "params": {"beta0_us": 4000.0, "beta2_us": 800.0}}},
        {"name": "d1", "draft_token_ms": 6.0},
    ],
    "group": {"max_batch": 5, "max_wait_ms": 3.0, "escalate_below": 0.9,
              "think_time": {"type": "exponential", "params": {"mean": 0.05}}},
    "profile": {"availability": [{"start_s": 0.2, "end_s": 0.5}], "thermal": {"throttle_after_s": 0.5, "throttle_factor": 0.5}},
    "network": {"rtt_ms": 10.0, "bandwidth_mbps": 10.0, "loss_probability": 0.05, "retransmit_timeout_ms": 5.0, "max_retransmissions": 1},
    "requests": 40, "rate": 200.0, "prompt": 64, "output": 30, "devices": 2, "replicas": 2, "seed": 5,
}
"""Two devices each running five requests at once through an out-of-service window and
throttling, requests escalating to a second drafter, a few messages lost (always tried,
besides the drawn cases)."""


@st.composite
def batching_cases(draw: st.DrawFn) -> dict[str, Any]:
    """A small speculative scenario whose one draft group batches: its mode, γ policy,
    network, drafters (one, or two with escalation; each timed per token or by a latency
    model), think time, device profile (availability windows, throttling) and loads."""
    mode = draw(st.sampled_from(["distributed", "distributed", "hybrid"]))
    speculation: dict[str, Any] = {
        "mode": mode,
        "gamma_policy": draw(st.sampled_from([
            {"kind": "static", "params": {"gamma": draw(st.integers(1, 4))}},
            {"kind": "acceptance_backoff"},
            {"kind": "backpressure", "params": {"wait_high_s": 0.02, "wait_low_s": 0.005}},
        ])),
        "acceptance_sampling": draw(st.sampled_from(["bernoulli", "expected"])),
        "verify": {"max_microbatch": draw(st.integers(1, 8))},
    }
    if mode == "hybrid":
        speculation["mode_selector"] = {"kind": "latency"}
    drafters = []
    for i in range(draw(st.integers(1, 2))):
        if draw(st.booleans()):
            timing: dict[str, Any] = {"draft_token_ms": draw(st.floats(0.5, 20.0))}
        else:
            timing = {"latency_model": {"kind": "blis_linear", "params": {
                "beta0_us": draw(st.floats(500.0, 10_000.0)), "beta2_us": draw(st.floats(0.0, 3000.0))}}}
        drafters.append({"name": f"d{i}", **timing})
    group: dict[str, Any] = {"max_batch": draw(st.integers(2, 6))}
    if draw(st.booleans()):
        group["max_wait_ms"] = draw(st.floats(0.0, 20.0))
    if len(drafters) == 2:
        group["escalate_below"] = draw(st.floats(0.6, 0.99))
    if draw(st.booleans()):
        group["think_time"] = {"type": "exponential", "params": {"mean": draw(st.floats(0.01, 1.0))}}
    profile = None
    if draw(st.booleans()):
        start = draw(st.floats(0.0, 2.0))
        profile = {
            "availability": [{"start_s": start, "end_s": start + draw(st.floats(0.01, 1.0))}],
            "thermal": {"throttle_after_s": draw(st.floats(0.0, 2.0)), "throttle_factor": draw(st.floats(0.2, 1.0))},
        }
    network = None
    path = draw(st.sampled_from(["none", "clean", "lossy"]))
    if path != "none":
        network = {"rtt_ms": draw(st.floats(0.0, 50.0)), "bandwidth_mbps": draw(st.sampled_from([1.0, 10.0, 100.0]))}
    if path == "lossy":
        network.update({"loss_probability": draw(st.sampled_from([0.1, 0.2])), "retransmit_timeout_ms": 5.0, "max_retransmissions": 1})
    return {
        "probabilities": draw(st.lists(st.floats(0.0, 1.0), min_size=4, max_size=4)),
        "speculation": speculation, "drafters": drafters, "group": group, "profile": profile, "network": network,
        # enough requests arriving fast enough onto few devices that steps hold several rounds
        "requests": draw(st.integers(4, 40)), "rate": draw(st.floats(20.0, 500.0)), "prompt": draw(st.integers(1, 200)),
        "output": draw(st.integers(2, 40)), "devices": draw(st.integers(1, 2)), "replicas": draw(st.integers(1, 2)),
        "seed": draw(st.integers(0, 2**16)),
    }


def build(case: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The scenario data of *case*, with its curve (and device profile) written to a fresh directory."""
    folder = tmp_path_factory.mktemp("batching")
    curve = flat_curve(folder, case["probabilities"])
    speculation = dict(case["speculation"])
    if speculation["mode"] != "distributed":
        speculation["fused"] = {"draft_token_ms": 1.0, "acceptance": curve}
    group = dict(case["group"])
    group["drafters"] = [{**d, "acceptance": curve} for d in case["drafters"]]
    if case["profile"] is not None:
        data = device_profile_to_dict(device_profile("phone-snapdragon-8-gen-3"))
        data.update(id="test-phone", **case["profile"])
        file = folder / "phone.yaml"
        file.write_text(yaml.safe_dump(data))
        group["device"] = str(file)
    return spec_scenario(
        curve, requests=case["requests"], rate=case["rate"], prompt=case["prompt"], output=case["output"],
        devices=case["devices"], replicas=case["replicas"], network=case["network"], speculation=speculation,
        group=group, seed=case["seed"],
    )


def simulate_logging_steps(data: dict[str, Any]) -> tuple[Results, list[tuple[Any, ...]]]:
    """Run *data*, logging each draft step as it starts (device, time, the drafting time the
    device counted for it) and ends (device, time, its rounds' request ids and drafters)."""
    log: list[tuple[Any, ...]] = []
    begin, end = DraftSteps._begin_step, DraftSteps._end_step  # noqa: SLF001 - the steps under test

    def logged_begin(self: DraftSteps) -> None:
        device = self._step_s.__self__  # noqa: SLF001 - the device's bound method
        before = device.busy_s
        begin(self)
        log.append(("begin", (device.group, device.index), self.env.now, device.busy_s - before))

    def logged_end(self: DraftSteps, members: list[Any], event: Any) -> None:
        device = self._step_s.__self__  # noqa: SLF001
        ids, names = [m.req.id for m in members], [m.spec.drafter.name for m in members]
        log.append(("end", (device.group, device.index), self.env.now, ids, names))
        end(self, members, event)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DraftSteps, "_begin_step", logged_begin)
        patch.setattr(DraftSteps, "_end_step", logged_end)
        results = Simulation(scenario_from_dict(data)).run(progress=False)
    return results, log


@SETTINGS
@given(case=batching_cases())
@example(case=BUSY_DEVICE)
def test_every_requested_draft_token_is_drafted_in_exactly_one_step(case, tmp_path_factory):
    """Each completed request was in exactly as many draft steps as the drafts its verified
    distributed rounds carried (a dropped one in at most one round's more: drafted, then
    lost; a fused one in none); every
    step holds 1 to ``max_batch`` distinct rounds of one drafter and lasts its step time;
    a device's steps never overlap; every request ends completed or dropped on the network."""
    data = build(case, tmp_path_factory)
    results, log = simulate_logging_steps(data)
    max_batch = case["group"]["max_batch"]

    served: Counter[int] = Counter()
    by_device: dict[Any, list[tuple[Any, ...]]] = defaultdict(list)
    for entry in log:
        by_device[entry[1]].append(entry)
    for device, entries in by_device.items():
        assert [e[0] for e in entries] == ["begin", "end"] * (len(entries) // 2), device
        previous_end = -1.0
        for begin, end in zip(entries[::2], entries[1::2], strict=True):
            assert begin[2] >= previous_end, device
            assert end[2] == pytest.approx(begin[2] + begin[3], rel=1e-12, abs=1e-12), device
            ids, names = end[3], end[4]
            assert 1 <= len(ids) <= max_batch and len(set(ids)) == len(ids), (device, ids)
            assert len(set(names)) == 1, (device, names)
            served.update(ids)
            previous_end = end[2]

    frame = results.to_dataframe().set_index("request_id")
    assert sorted(frame.index) == list(range(data["workload"]["num_requests"]))
    rounds = results.spec_rounds()
    rounds = rounds[rounds["mode"] == "distributed"]  # a fused round drafts on the target
    asked = rounds.groupby("request_id")["gamma"].sum() if len(rounds) else pd.Series(dtype=int)
    k_max = data["speculation"]["k_max"]
    for rid, row in frame.iterrows():
        verified = int(asked.get(rid, 0))
        if row["spec_mode"] != "fused":
            assert verified == int(row["drafted_tokens"]), rid
        if row["status"] == "completed":
            assert served[rid] == verified, rid
            assert int(row["generated_tokens"]) == int(row["output_tokens"]), rid
        else:
            assert str(row["dropped_reason"]).startswith("network_"), (rid, row["dropped_reason"])
            assert 0 <= served[rid] - verified <= k_max, rid


@SETTINGS
@given(case=batching_cases())
@example(case=BUSY_DEVICE)
def test_batching_runs_are_reproducible(case, tmp_path_factory):
    """The same batching scenario run twice gives identical record columns and rounds."""
    data = build(case, tmp_path_factory)
    first = Simulation(scenario_from_dict(data)).run(progress=False)
    second = Simulation(scenario_from_dict(data)).run(progress=False)
    assert columns_equal(first, second) == []
    pd.testing.assert_frame_equal(first.spec_rounds(), second.spec_rounds())
