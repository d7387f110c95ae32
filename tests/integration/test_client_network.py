"""A client's ``network`` shapes what it sees: uploads before the router, downloads after.

The references are closed forms: a request crosses its client's uplink in half a round
trip plus its bytes over the bandwidth (shared equally with the client's other uploads
in flight), and every token reaches the client half a round trip plus one token's bytes
after the server emits it (``docs/network.md``).
"""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from simpy_llm.config.schema import NetworkConfig
from simpy_llm.entities import Request
from simpy_llm.metrics.recorder import Recorder
from simpy_llm.network.client import ClientNetwork
from simpy_llm.wire import Wire
from tests.helpers import run, tiny_scenario


def _with_network(data: dict, **network: float) -> dict:
    data["workload"]["clients"][0]["network"] = dict(network)
    return data


def test_client_ttft_and_e2e_are_the_servers_plus_one_round_trip():
    """With RTT r and unlimited bandwidth, every request reaches the server r/2 after the
    client sent it, the server sees the same requests as without a network (every arrival
    shifted alike), and the client's TTFT and E2E are the server's plus r exactly."""
    r = 0.08
    plain = run(tiny_scenario()).to_dataframe()
    far = run(_with_network(tiny_scenario(), rtt_ms=r * 1e3)).to_dataframe()
    np.testing.assert_allclose(far["upload_s"], r / 2, rtol=0, atol=1e-12)
    assert (far["download_s"] == r / 2).all()
    np.testing.assert_allclose(far["arrival_s"] - far["upload_s"], plain["arrival_s"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(far["ttft_s"], plain["ttft_s"], rtol=0, atol=1e-9)
    np.testing.assert_allclose(far["e2e_s"], plain["e2e_s"], rtol=0, atol=1e-9)
    np.testing.assert_allclose(far["client_ttft_s"], far["ttft_s"] + r, rtol=0, atol=1e-12)
    np.testing.assert_allclose(far["client_e2e_s"], far["e2e_s"] + r, rtol=0, atol=1e-12)


def test_without_a_network_client_and_server_views_are_equal():
    """A client without a network: upload_s and download_s are 0, the client's TTFT and E2E
    are the server's, and the summary has no client_latency_s."""
    res = run(tiny_scenario())
    f = res.to_dataframe()
    assert (f["upload_s"] == 0).all() and (f["download_s"] == 0).all()
    assert (f["client_ttft_s"] == f["ttft_s"]).all() and (f["client_e2e_s"] == f["e2e_s"]).all()
    assert "client_latency_s" not in res.summary()


def test_an_isolated_upload_takes_half_the_rtt_plus_its_bytes_over_the_bandwidth():
    """Requests far apart (no two uploads at once): upload_s = rtt/2 + prompt_tokens x
    bytes_per_token / bandwidth, and download_s = rtt/2 + bytes_per_token / bandwidth."""
    data = _with_network(tiny_scenario(), rtt_ms=20.0, bandwidth_mbps=0.1, bytes_per_token=50.0)
    data["workload"]["aggregate_rate"] = 0.25  # uploads of ~0.24 s, 4 s apart on average
    f = run(data).to_dataframe()
    bw = 0.1e6 / 8
    expected = 0.01 + f["prompt_tokens"] * 50.0 / bw
    sent = f["arrival_s"] - f["upload_s"]
    gap_before = sent.diff().fillna(np.inf)
    gap_after = -sent.diff(-1).fillna(-np.inf)
    alone = (gap_before > expected.shift().fillna(0)) & (gap_after > expected)
    assert alone.sum() > 40
    np.testing.assert_allclose(f["upload_s"][alone], expected[alone], rtol=1e-12)
    np.testing.assert_allclose(f["download_s"], 0.01 + 50.0 / bw, rtol=1e-12)


def test_a_clients_concurrent_uploads_share_its_bandwidth():
    """Two prompts a client sends at once, of P1 < P2 bytes over bandwidth B: the first
    arrives after rtt/2 + 2 P1 / B, the second after rtt/2 + (P1 + P2) / B (processor
    sharing); another client's upload is unaffected."""
    env = simpy.Environment()
    sent, arrivals = Wire(env), Wire(env)
    seen: dict[int, float] = {}
    arrivals.connect(lambda r: seen.__setitem__(r.id, env.now))
    net = NetworkConfig(rtt_ms=10.0, bandwidth_mbps=8.0, bytes_per_token=10.0)  # 1e6 bytes/s
    ClientNetwork(env, sent, arrivals, Recorder(), {"a": net, "b": net})
    for rid, client, tokens in ((0, "a", 1000), (1, "a", 3000), (2, "b", 3000)):
        sent.put(Request(id=rid, client_id=client, prompt_tokens=tokens, output_tokens=1, arrival_s=0.0))
    env.run()
    p1, p2, bw = 1000 * 10.0, 3000 * 10.0, 1e6
    assert seen[0] == pytest.approx(0.005 + 2 * p1 / bw, rel=1e-12)
    assert seen[1] == pytest.approx(0.005 + (p1 + p2) / bw, rel=1e-12)
    assert seen[2] == pytest.approx(0.005 + p2 / bw, rel=1e-12)


def test_slo_targets_are_judged_on_what_the_client_sees():
    """A TTFT target every request meets at the server but none meets at the client
    (server TTFT + rtt above it) gives goodput 0, and the summary reports both views."""
    data = _with_network(tiny_scenario(), rtt_ms=1000.0)
    data["workload"]["clients"][0]["slo_class"] = "interactive"
    data["slo"] = {"interactive": {"ttft_s": 0.9}}
    res = run(data)
    s = res.summary()
    f = res.to_dataframe()
    assert f["ttft_s"].max() < 0.9 < f["client_ttft_s"].min()
    assert s["goodput"]["fraction"] == 0.0
    assert s["client_latency_s"]["ttft"]["mean"] == pytest.approx(s["latency_s"]["ttft"]["mean"] + 1.0, rel=1e-12)
    assert s["client_latency_s"]["e2e"]["count"] == s["latency_s"]["e2e"]["count"] == 50


def test_a_sessions_next_round_is_sent_after_the_client_has_the_answer():
    """A multi-turn client with a network sends round k+1 its think time after it has round
    k's last token: at round k's completion plus download_s plus the think time."""
    data = _with_network(tiny_scenario(), rtt_ms=40.0, bandwidth_mbps=10.0)
    client = data["workload"]["clients"][0]
    client["multi_turn"] = {"max_rounds": 3, "think_time": {"type": "constant", "params": {"value": 0.5}}}
    data["workload"]["num_requests"] = 20
    f = run(data).to_dataframe().sort_values(["session_id", "round_index"])
    sent = f["arrival_s"] - f["upload_s"]
    previous = f.groupby("session_id").shift(1)
    later = f["round_index"] > 0
    assert later.sum() >= 20
    expected = previous["completion_s"] + previous["download_s"] + 0.5
    np.testing.assert_allclose(sent[later], expected[later], rtol=0, atol=1e-12)


def test_requests_still_uploading_when_the_run_stops_are_recorded_in_flight():
    """until_s cutting a run while requests cross their client's network: they are
    recorded in flight with upload_s NaN, and arrived = completed + dropped + in_flight."""
    data = _with_network(tiny_scenario(), rtt_ms=2000.0)
    data["simulation"] = {"until_s": 1.5}
    res = run(data)
    s = res.summary()["requests"]
    f = res.to_dataframe()
    uploading = f["upload_s"].isna()
    assert uploading.sum() > 10 and (f.loc[uploading, "status"] == "in_flight").all()
    assert s["arrived"] == s["completed"] + s["dropped"] + s["in_flight"] == 50


def test_same_seed_gives_identical_records_with_a_client_network():
    """Determinism: a scenario with a client network run twice gives the same records."""
    data = _with_network(tiny_scenario(), rtt_ms=30.0, bandwidth_mbps=1.0, bytes_per_token=20.0)
    a, b = run(data).to_dataframe(), run(data).to_dataframe()
    assert a.equals(b)


def test_a_lossy_uplink_retransmits_and_drops_what_it_gives_up_on():
    """A client network losing half its transmissions, retransmitting after 50 ms at most
    once: every request that arrived took rtt/2 plus 0 or 1 timeouts (no bandwidth limit),
    the others are dropped as network_loss with upload_s NaN, about a quarter of all (p^2),
    and arrived = completed + dropped + in_flight."""
    data = _with_network(tiny_scenario(), rtt_ms=20.0, loss_probability=0.5, retransmit_timeout_ms=50.0, max_retransmissions=1)
    data["workload"]["num_requests"] = 400
    res = run(data)
    f = res.to_dataframe()
    lost = f["dropped_reason"] == "network_loss"
    assert f.loc[lost, "upload_s"].isna().all() and (f.loc[lost, "status"] == "dropped").all()
    assert 0.18 < lost.mean() < 0.32
    arrived = f.loc[~lost, "upload_s"]
    np.testing.assert_allclose(np.minimum(abs(arrived - 0.01), abs(arrived - 0.06)), 0, atol=1e-9)
    assert (abs(arrived - 0.06) < 1e-9).any() and (abs(arrived - 0.01) < 1e-9).any()
    s = res.summary()
    assert s["requests"]["dropped_by_reason"]["network_loss"] == lost.sum()
    assert s["requests"]["arrived"] == s["requests"]["completed"] + s["requests"]["dropped"] + s["requests"]["in_flight"] == 400
    assert s["network"]["links"]["client/c0/up"]["retransmissions"] > 0


def test_a_sessions_dropped_upload_ends_the_session():
    """A multi-turn client whose uplink drops everything sent during an outage: a round lost
    there ends its session (no later round of it is sent)."""
    data = _with_network(tiny_scenario(), rtt_ms=10.0, outages=[{"start_s": 0.3, "end_s": 0.6}], outage_mode="drop")
    data["workload"]["clients"][0]["multi_turn"] = {"max_rounds": 5, "think_time": {"type": "constant", "params": {"value": 0.1}}}
    data["workload"]["num_requests"] = 40
    f = run(data).to_dataframe()
    lost = f[f["dropped_reason"] == "network_outage"]
    assert len(lost) > 0
    for sid, rnd in zip(lost["session_id"], lost["round_index"], strict=True):
        assert (f.loc[f["session_id"] == sid, "round_index"] <= rnd).all()
