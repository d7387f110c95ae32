"""Cold starts and warm state of verify servers, and the mode choice they inform
(``docs/speculative.md``, "Speculation with disaggregated pools, cold starts and warm state").

Expectations are the documented closed forms, computed by hand from the load time, the
latency model's coefficients and the acceptance curves, never by the code under test.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from simpy_llm import Simulation, scenario_from_dict
from tests.spec_helpers import flat_curve, spec_scenario

B0, B1, B2 = 5e-3, 50e-6, 200e-6  # spec_scenario's step coefficients, s
LOAD_S = 0.25
DEVICE = {
    "id": "test-gpu", "role": "target", "vendor": "none", "description": "a test device",
    "compute": {"sustained_tflops": 100.0, "memory_bandwidth_gb_per_s": 1000.0},
    "memory": {"memory_gb": 80}, "energy": {"active_w": 400.0, "idle_w": 50.0},
    "cold_start": {"load_s": LOAD_S}, "sources": ["made up for a test"],
}


def _grouped(data: dict[str, Any], tmp_path, *groups: dict[str, Any]) -> dict[str, Any]:
    """*data*'s fleet as replica groups on the cold-starting device (each group's own keys over
    its engine and latency model)."""
    device = tmp_path / "device.yaml"
    device.write_text(yaml.safe_dump(DEVICE))
    serving = data["serving"]
    engine, latency = serving.pop("engine"), serving.pop("latency_model")
    serving.pop("replicas")
    serving["replica_groups"] = [
        {"count": 1, "engine": copy.deepcopy(engine), "latency_model": copy.deepcopy(latency), "device": str(device), **group}
        for group in groups
    ]
    return data


def _run(data: dict[str, Any]):
    sim = Simulation(scenario_from_dict(data))
    return sim, sim.run(progress=False)


def _two_requests_apart(tmp_path, gap_s: float, retention_s: float) -> dict[str, Any]:
    """Two requests on one draft device, the second starting *gap_s* after the first ends
    (think time), on one cold-starting verify server keeping its model *retention_s* idle."""
    curve = flat_curve(tmp_path, [0.8] * 4)
    data = spec_scenario(
        curve, requests=2, rate=1000.0, prompt=100, output=20, devices=1,
        group={"think_time": {"type": "constant", "params": {"value": gap_s}}},
        speculation={"acceptance_sampling": "expected", "gamma_policy": {"kind": "static", "params": {"gamma": 3}}},
    )
    return _grouped(data, tmp_path, {"name": "targets", "warm_retention_s": retention_s})


@pytest.mark.parametrize(("gap_s", "retention_s", "reloads"), [(2.0, 1.0, True), (0.5, 1.0, False)])
def test_an_idle_gap_longer_than_the_retention_pays_the_load_again(tmp_path, gap_s, retention_s, reloads):
    """The first request's TTFT is load + prefill pass; the second, arriving gap_s after the
    server went idle, pays the load again exactly when gap_s exceeds warm_retention_s. Each
    load is a cold start and counts as busy time."""
    sim, res = _run(_two_requests_apart(tmp_path, gap_s, retention_s))
    frame = res.to_dataframe().sort_values("request_id")
    prefill = B0 + B1 * 100
    first, second = frame.iloc[0], frame.iloc[1]
    assert first["ttft_s"] == pytest.approx(LOAD_S + prefill, abs=1e-12)
    assert second["arrival_s"] == pytest.approx(first["completion_s"] + gap_s, abs=1e-12)
    assert second["ttft_s"] == pytest.approx((LOAD_S if reloads else 0.0) + prefill, abs=1e-12)
    engine = res.summary()["engine"]
    assert engine["cold_starts"] == (2 if reloads else 1) == sim.replicas[0].cold_starts
    assert engine["cold_start_s"] == pytest.approx(engine["cold_starts"] * LOAD_S, abs=1e-12)
    busy_without_loads = engine["busy_s"][0] - engine["cold_starts"] * LOAD_S
    _, warm = _run(_two_requests_apart(tmp_path, gap_s, 10.0 * gap_s))  # never unloads between them
    warm_engine = warm.summary()["engine"]
    assert busy_without_loads == pytest.approx(warm_engine["busy_s"][0] - LOAD_S, abs=1e-12)


def test_a_server_holding_a_request_between_rounds_does_not_unload(tmp_path):
    """A request waiting for its bundle holds its KV on the server: the server keeps its model
    however long the rounds' gaps (a 1 s round trip against a 0.1 s retention): one cold start."""
    curve = flat_curve(tmp_path, [0.8] * 4)
    data = spec_scenario(curve, requests=1, output=20, devices=1, network={"rtt_ms": 1000.0},
                         speculation={"acceptance_sampling": "expected"})
    data = _grouped(data, tmp_path, {"name": "targets", "warm_retention_s": 0.1})
    _, res = _run(data)
    assert res.summary()["engine"]["cold_starts"] == 1
    assert len(res.spec_rounds()) > 3


def _disaggregated(tmp_path, speculation: dict[str, Any], *, draft_token_ms: float = 10.0, requests: int = 1,
                   rate: float = 1.0, retention_s: float | None = None) -> dict[str, Any]:
    """A warm prefill replica (no device) and a cold-starting decode verify server, KV over an
    ideal link (no latency, unlimited bandwidth)."""
    curve = speculation.pop("curve")
    data = spec_scenario(curve, requests=requests, rate=rate, prompt=100, output=30, devices=1,
                         draft_token_ms=draft_token_ms, speculation=speculation)
    decode: dict[str, Any] = {"name": "decode", "role": "decode"}
    if retention_s is not None:
        decode["warm_retention_s"] = retention_s
    data = _grouped(data, tmp_path, {"name": "prefill", "role": "prefill"}, decode)
    del data["serving"]["replica_groups"][0]["device"]
    data["serving"]["disaggregation"] = {"kv_transfer": {"bytes_per_token": 1.0, "rtt_ms": 0.0, "overhead_us": 0.0, "bandwidth_gbps": None}}
    return data


@pytest.mark.parametrize(("mode", "draft_token_ms", "first_round_s"), [
    ("fused", 10.0, LOAD_S + 3 * 2e-3),            # the load, then γ fused draft steps
    ("distributed", 10.0, LOAD_S),                 # drafting 30 ms runs during the 250 ms load
    ("distributed", 100.0, 0.3),                   # drafting 300 ms outlasts the load
])
def test_a_cold_decode_server_starts_loading_when_the_kv_arrives(tmp_path, mode, draft_token_ms, first_round_s):
    """The decode server loads when the first request's KV reaches it: a fused first round
    waits for the whole load; a distributed one drafts meanwhile (its verdict needs no target
    pass), so its verify pass starts at max(drafting, load) after the delivery. TTFT is the
    prefill replica's alone (B0 + B1 x prompt), the first round ends that plus the wait plus
    the verify pass B0 + B2 (γ + 1)."""
    curve = flat_curve(tmp_path, [0.8] * 4)
    speculation: dict[str, Any] = {"curve": curve, "mode": mode, "acceptance_sampling": "expected",
                                   "gamma_policy": {"kind": "static", "params": {"gamma": 3}}}
    if mode == "fused":
        speculation["fused"] = {"draft_token_ms": 2.0, "acceptance": curve}
    _, res = _run(_disaggregated(tmp_path, speculation, draft_token_ms=draft_token_ms))
    row = res.to_dataframe().iloc[0]
    prefill = B0 + B1 * 100
    assert row["ttft_s"] == pytest.approx(prefill, abs=1e-9)  # atol: the engine's nanosecond clock
    first = res.spec_rounds()["time_s"].iloc[0]
    assert first == pytest.approx(row["arrival_s"] + prefill + first_round_s + B0 + B2 * 4, abs=1e-9)
    assert res.summary()["engine"]["cold_starts"] == 1


def test_the_latency_selector_runs_fused_on_a_cold_decode_server_and_distributed_once_warm(tmp_path):
    """Hand-worked: drafter p = 0.5 (E_d = 1.875 at γ = 3), fused p = 0.9 (E_f = 3.439), 1 ms
    device drafting, 10 ms fused drafting, no round trip, verify pass V = 5.8 ms. Warm:
    distributed (3 + 5.8) / 1.875 = 4.69 ms < fused (30 + 5.8) / 3.439 = 10.41 ms per token.
    Cold (the 250 ms load ahead): distributed 4.69 + (250 - 3) / 1.875 = 136.4 ms > fused
    10.41 + 250 / 3.439 = 83.1 ms. The first request finds the decode server cold and runs
    fused; the second, a second later, finds it warm and runs distributed; with a 0.2 s
    retention (the server idles about 0.45 s between them) the second finds it cold again and runs fused."""
    poor, good = flat_curve(tmp_path, [0.5] * 4, "poor"), flat_curve(tmp_path, [0.9] * 4, "good")

    def modes(retention_s: float | None) -> list[str]:
        speculation = {"curve": poor, "mode": "hybrid", "mode_selector": {"kind": "latency"},
                       "fused": {"draft_token_ms": 10.0, "acceptance": good},
                       "gamma_policy": {"kind": "static", "params": {"gamma": 3}}, "acceptance_sampling": "expected"}
        data = _disaggregated(tmp_path, speculation, draft_token_ms=1.0, requests=2, retention_s=retention_s)
        data["workload"]["clients"][0]["arrival"] = {"process": "constant"}
        data["workload"]["aggregate_rate"] = 1.0  # one request a second, each alone
        data["speculation"]["drafts"][0]["count"] = 2
        _, res = _run(data)
        return list(res.to_dataframe().sort_values("request_id")["spec_mode"])

    assert modes(None) == ["fused", "distributed"]
    assert modes(0.2) == ["fused", "fused"]
