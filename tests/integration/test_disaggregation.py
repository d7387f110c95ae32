"""Prefill/decode disaggregation against closed forms and the pattern DistServe reports.

An isolated request's timeline is fixed by the documented rules (``docs/network.md``):
its prefill replica's queueing overhead and one prefill step, the KV transfer (half the
round trip, the overhead, the bytes over the bandwidth), then on the decode replica one
step computing the first token's KV and emitting the second, and one decode step per
further token; the client's tokens come ``alpha2`` each after their steps.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.config import ScenarioError
from tests.helpers import run, tiny_groups, tiny_scenario

B0, B1, B2 = 2000e-6, 20e-6, 100e-6  # tiny_scenario's step coefficients, s
A0, A1, A2 = 300e-6, 2e-6, 50e-6


def _disaggregated(replicas: int = 4, prefill: int = 1, **kv_transfer: float) -> dict:
    data = tiny_scenario()
    serving = data["serving"]
    serving["replicas"] = replicas
    serving["latency_model"]["params"].update(alpha0_us=A0 * 1e6, alpha1_us=A1 * 1e6, alpha2_us=A2 * 1e6)
    serving["disaggregation"] = {"prefill_replicas": prefill, "kv_transfer": {"bytes_per_token": 1000.0, **kv_transfer}}
    return data


def test_an_isolated_requests_ttft_and_e2e_are_prefill_plus_transfer_plus_decode():
    """Requests far apart: TTFT = queueing + prefill step + transfer + alpha2, and E2E adds
    the decode replica's steps (one computing the first token's KV, one per further token)
    and alpha2 per token; the transfer is rtt/2 + overhead + P x bytes_per_token / bandwidth."""
    data = _disaggregated(bandwidth_gbps=0.8, rtt_ms=0.2, overhead_us=30.0)  # 1e8 bytes/s
    data["workload"]["aggregate_rate"] = 1.0
    data["serving"]["engine"].update(prefix_caching=False, max_num_batched_tokens=4096, kv_num_blocks=1024)  # one prefill step
    f = run(data).to_dataframe()
    done = f[f["output_tokens"] >= 2]
    p, o = done["prompt_tokens"], done["output_tokens"]
    transfer = 1e-4 + 30e-6 + p * 1000.0 / 1e8
    prefill = A0 + A1 * p + B0 + B1 * p
    np.testing.assert_allclose(done["kv_transfer_s"], transfer, rtol=1e-9)
    # atol: each replica's clock starts at its idle start rounded to the nanosecond
    # (docs/model.md "Clock"), here once per pool
    np.testing.assert_allclose(done["ttft_s"], prefill + transfer + A2, rtol=1e-9, atol=1e-9)
    decode = (B0 + B1) + (o - 2) * (B0 + B2)
    np.testing.assert_allclose(done["e2e_s"], prefill + transfer + decode + o * A2, rtol=1e-9, atol=2e-9)
    assert len(done) > 40


def test_requests_never_cross_pools():
    """Every handed-off request was prefilled in the prefill pool and decoded in the decode
    pool, and the decode router spread them (round robin) over the decode replicas."""
    res = run(_disaggregated(replicas=5, prefill=2))
    f = res.to_dataframe()
    handed = f[f["prefill_replica"] >= 0]
    assert len(handed) == (f["output_tokens"] >= 2).sum()
    assert set(handed["prefill_replica"]) <= {0, 1} and set(handed["replica"]) <= {2, 3, 4}
    counts = handed["replica"].value_counts()
    assert counts.max() - counts.min() <= 1
    assert (f.loc[f["output_tokens"] < 2, "replica"] <= 1).all()  # a one-token answer completes where it was prefilled
    s = res.summary()["disaggregation"]
    assert s["kv_transfers"] == len(handed) and s["kv_bytes"] == pytest.approx(1000.0 * handed["prompt_tokens"].sum())


def test_a_sessions_rounds_keep_their_decode_replica():
    """Multi-turn sessions: every round of a session decodes on the replica its first
    round used, while different sessions spread over the decode pool."""
    data = _disaggregated(replicas=4, prefill=1)
    data["workload"]["clients"][0]["multi_turn"] = {"max_rounds": 4, "think_time": {"type": "constant", "params": {"value": 0.2}}}
    data["workload"]["num_requests"] = 30
    f = run(data).to_dataframe()
    handed = f[f["prefill_replica"] >= 0]
    per_session = handed.groupby("session_id")["replica"].nunique()
    assert (per_session == 1).all() and len(per_session) >= 25
    assert handed.groupby("session_id")["replica"].first().nunique() == 3


def test_kv_transfers_cross_the_topologys_path():
    """With a clos topology the KV link between two replicas has the path's latency (two
    edge hops on one leaf, two edge and two spine hops across leaves) and its bottleneck
    bandwidth."""
    data = _disaggregated(replicas=3, prefill=1)
    data["workload"]["aggregate_rate"] = 1.0
    data["serving"]["engine"]["prefix_caching"] = False
    data["serving"]["disaggregation"]["topology"] = {
        "type": "clos", "endpoints": ["prefill/0", "decode/0", "decode/1"], "spine_count": 2, "leaf_count": 2,
        "hop_latency_ms": 0.5, "device_edge_latency_ms": 0.1, "edge_bandwidth_mbps": 800.0,
        "spine_bandwidth_mbps": 400.0, "attach": {"prefill/0": 0, "decode/0": 0, "decode/1": 1},
    }
    f = run(data).to_dataframe()
    handed = f[f["prefill_replica"] == 0]
    same_leaf = handed["replica"] == 1
    bytes_ = handed["prompt_tokens"] * 1000.0
    expected = np.where(same_leaf, 2 * 0.1e-3 + bytes_ / 1e8, 2 * 0.1e-3 + 2 * 0.5e-3 + bytes_ / 0.5e8)
    np.testing.assert_allclose(handed["kv_transfer_s"], expected, rtol=1e-9)
    assert same_leaf.any() and (~same_leaf).any()


def test_disaggregation_lowers_tpot_and_pays_the_transfer_in_ttft():
    """The pattern DistServe reports, on one workload and one fleet of 4 replicas with
    costly prefills (100 us per prompt token, 1,000-token prompts): at 12 requests/s,
    co-located replicas stall their decodes behind prefill chunks and 2 prefill + 2
    decode replicas give a much lower TPOT; at 1 request/s each request's TTFT is the
    co-located one plus its KV transfer."""
    def fleet(disaggregate: bool, rate: float) -> dict:
        data = _disaggregated(replicas=4, prefill=2, bandwidth_gbps=8.0, rtt_ms=0.1)
        data["workload"].update(aggregate_rate=rate, num_requests=1200)
        client = data["workload"]["clients"][0]
        client["input_distribution"] = {"type": "exponential", "params": {"mean": 1000}}
        client["output_distribution"] = {"type": "exponential", "params": {"mean": 100}}
        data["serving"]["engine"].update(max_num_batched_tokens=512, max_num_seqs=64, kv_num_blocks=16384)
        data["serving"]["latency_model"]["params"].update(beta0_us=5000.0, beta1_us=100.0, beta2_us=50.0)
        if not disaggregate:
            del data["serving"]["disaggregation"]
        return data

    busy = {d: run(fleet(d, 12.0)).summary()["latency_s"]["tpot"]["mean"] for d in (False, True)}
    assert busy[True] < 0.7 * busy[False]
    co, dis = (run(fleet(d, 1.0)).to_dataframe() for d in (False, True))
    handed = dis["prefill_replica"] >= 0
    extra = (dis["ttft_s"] - co["ttft_s"] - dis["kv_transfer_s"])[handed]
    assert handed.sum() > 1000
    assert abs(float(extra.median())) < 1e-9


def test_same_seed_gives_identical_records_when_disaggregated():
    """Determinism: a disaggregated scenario run twice gives the same records."""
    data = _disaggregated(replicas=4, prefill=2, bandwidth_gbps=1.0)
    assert run(data).to_dataframe().equals(run(data).to_dataframe())


def test_a_run_cut_during_transfers_loses_nothing():
    """until_s while KV is in transit: those requests are recorded in flight and
    arrived = completed + dropped + in_flight."""
    data = _disaggregated(replicas=3, prefill=1, bandwidth_gbps=0.001)  # transfers of ~0.5 s
    data["simulation"] = {"until_s": 0.8}
    s = run(data).summary()["requests"]
    assert s["in_flight"] > 0
    assert s["arrived"] == s["completed"] + s["dropped"] + s["in_flight"]


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (lambda d: d["serving"]["disaggregation"].update(prefill_replicas=4), "serving.disaggregation.prefill_replicas"),
        (lambda d: d["serving"]["disaggregation"].pop("prefill_replicas"), "serving.disaggregation.prefill_replicas"),
        (lambda d: d["serving"]["disaggregation"].update(colour="red"), "serving.disaggregation.colour"),
        (lambda d: d["serving"]["disaggregation"]["kv_transfer"].update(rtt_ms=-1), "serving.disaggregation.kv_transfer.rtt_ms"),
    ],
)
def test_bad_disaggregation_settings_name_their_key(change, key):
    """A wrong disaggregation setting is a ScenarioError naming its key path."""
    data = _disaggregated(replicas=4, prefill=1)
    change(data)
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(data)
    assert key in str(err.value)


def test_a_pool_role_needs_disaggregation():
    """A replica group with role prefill in a fleet without a disaggregation block is an
    error naming the group's role; so is a disaggregated fleet without a decode group."""
    data = tiny_groups({"name": "p", "count": 1, "role": "prefill"})
    with pytest.raises(ScenarioError, match=r"replica_groups\[0\]\.role"):
        scenario_from_dict(copy.deepcopy(data))
    data["serving"]["disaggregation"] = {"kv_transfer": {"bytes_per_token": 10.0}}
    with pytest.raises(ScenarioError, match="role: decode"):
        scenario_from_dict(data)


def test_heterogeneous_pools_from_replica_groups():
    """replica_groups with roles: a fast prefill group and a slower decode group run; the
    records name the groups through their replicas."""
    data = tiny_groups({"name": "fast-prefill", "count": 1, "role": "prefill"}, {"name": "slow-decode", "count": 2, "role": "decode"})
    data["serving"]["replica_groups"][1]["latency_model"]["params"]["beta2_us"] = 300.0
    data["serving"]["disaggregation"] = {"kv_transfer": {"bytes_per_token": 100.0}}
    res = Simulation(scenario_from_dict(data)).run()
    f = res.to_dataframe()
    assert set(f.loc[f["prefill_replica"] >= 0, "replica_group"]) == {"slow-decode"}
    assert res.summary()["requests"]["completed"] == 50


def test_link_figures_account_for_every_transfer(tmp_path):
    """The results list one KV link per (prefill, decode) pair; their delivered messages and
    bytes are the transfers', their utilisation is busy time over the run, and save()
    writes them to links.csv."""
    res = run(_disaggregated(replicas=5, prefill=2, bandwidth_gbps=0.1))
    links = res.links()
    assert len(links) == 2 * 3
    d = res.summary()["disaggregation"]
    assert links["delivered"].sum() == d["kv_transfers"] and links["bytes"].sum() == pytest.approx(d["kv_bytes"])
    assert (links["in_flight"] == 0).all() and (links["dropped"] == 0).all()
    np.testing.assert_allclose(links["utilisation"], links["busy_s"] / res.summary()["duration_s"], rtol=1e-12)
    assert (links["utilisation"] > 0).all()
    written: list = []
    res.save(tmp_path / "out", written=written)
    assert (tmp_path / "out" / "links.csv").exists()


def test_the_emulated_server_refuses_a_disaggregated_fleet():
    """The emulated server streams each request from one replica: a disaggregated scenario is
    a scenario error naming serving.disaggregation."""
    from simpy_llm.observe.emulate.server import EmulatedServer

    with pytest.raises(ScenarioError, match=r"serving\.disaggregation"):
        EmulatedServer(scenario_from_dict(_disaggregated()))


def test_kv_transfer_figures_beside_a_topology_are_refused():
    """With a topology the paths give each link its figures: a kv_transfer bandwidth given as
    well would be ignored, so it is an error naming it."""
    data = _disaggregated(replicas=2, prefill=1, bandwidth_gbps=10.0)
    data["serving"]["disaggregation"]["topology"] = {"type": "complete", "endpoints": ["prefill/0", "decode/0"], "rtt_ms": 0.01}
    with pytest.raises(ScenarioError, match=r"kv_transfer\.bandwidth_gbps"):
        scenario_from_dict(data)


def test_kv_transfers_dropped_by_an_outage_drop_their_requests_and_nothing_is_left_counted():
    """A KV link outage in drop mode: the requests whose KV was crossing are dropped as
    kv_transfer_outage; every decode replica ends with nothing outstanding in its router's
    view, and arrived = completed + dropped + in_flight."""
    data = _disaggregated(replicas=3, prefill=1, bandwidth_gbps=0.01)  # slow links: transfers in flight
    data["serving"]["disaggregation"]["kv_transfer"].update(outages=[{"start_s": 0.4, "end_s": 0.5}], outage_mode="drop")
    sim = Simulation(scenario_from_dict(data))
    res = sim.run()
    s = res.summary()["requests"]
    assert s["dropped_by_reason"].get("kv_transfer_outage", 0) > 0
    assert s["arrived"] == s["completed"] + s["dropped"] + s["in_flight"] == 50
    assert all(v.outstanding_requests == 0 for v in sim.views)


@pytest.mark.parametrize(
    ("name", "overrides"),
    [("disaggregated.yaml", ["workload.num_requests=600"]), ("two_clients.yaml", ["workload.num_requests=600"])],
)
def test_both_engine_modes_write_identical_records_across_links(name, overrides):
    """A disaggregated fleet over a clos fabric, and clients behind their networks: one event
    per batch change and one event per step give the same records."""
    from simpy_llm import load_scenario

    runs = [
        Simulation(load_scenario(f"scenarios/{name}", [*overrides, f"simulation.mode={mode}"])).run().to_dataframe()
        for mode in ("event_per_change", "event_per_step")
    ]
    assert runs[0].equals(runs[1])
