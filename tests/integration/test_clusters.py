"""Multi-cluster fleets, and seed 003's validation experiments §7.1–7.3 without speculation.

The seed's qualitative results are the references: with one replica per pool every
router agrees exactly (§7.1); on heterogeneous targets join-the-shortest-queue keeps a
higher throughput plateau and lower tails than round robin and random (§7.2), and so it
does across clusters (§7.3).
"""

from __future__ import annotations

import pytest

from simpy_llm import Simulation, load_scenario, scenario_from_dict
from simpy_llm.config import ScenarioError
from tests.helpers import tiny_groups, tiny_scenario


def _two_clusters(top: str = "least_loaded") -> dict:
    data = tiny_groups({"name": "fast", "count": 2}, {"name": "slow", "count": 1})
    serving = data["serving"]
    fast, slow = serving.pop("replica_groups")
    slow["latency_model"]["params"]["beta0_us"] = 8000.0
    serving["cluster_router"] = {"kind": top}
    serving["clusters"] = [
        {"name": "dc", "router": {"kind": "round_robin"}, "replica_groups": [fast]},
        {"name": "edge", "replica_groups": [slow]},
    ]
    data["workload"]["num_requests"] = 400
    return data


def test_each_cluster_routes_among_its_own_replicas():
    """A cluster's requests land only on its replicas, spread by its own router (round robin
    inside ``dc``), and the records and summary name the cluster."""
    res = Simulation(scenario_from_dict(_two_clusters())).run()
    f = res.to_dataframe()
    routed = f[f["replica"] >= 0]
    assert set(routed.loc[routed["cluster"] == "dc", "replica"]) == {0, 1}
    assert set(routed.loc[routed["cluster"] == "edge", "replica"]) == {2}
    dc = routed.loc[routed["cluster"] == "dc", "replica"].value_counts()
    assert abs(dc[0] - dc[1]) <= 1
    by_cluster = res.summary()["latency_s_by_cluster"]
    assert set(by_cluster) == {"dc", "edge"}


def test_a_cluster_router_needs_clusters():
    """cluster_router without clusters is an error naming it."""
    data = tiny_scenario()
    data["serving"]["cluster_router"] = {"kind": "jsq"}
    with pytest.raises(ScenarioError, match=r"serving\.cluster_router"):
        scenario_from_dict(data)


def test_the_top_router_sees_each_cluster_as_the_sum_of_its_replicas():
    """round_robin across two clusters sends each half the requests whatever their sizes;
    least_loaded, reading each cluster's summed outstanding requests, sends the slow
    one-replica cluster fewer."""
    rr = Simulation(scenario_from_dict(_two_clusters("round_robin"))).run().to_dataframe()
    assert (rr["cluster"] == "dc").sum() == (rr["cluster"] == "edge").sum() == 200
    ll = Simulation(scenario_from_dict(_two_clusters("least_loaded"))).run().to_dataframe()
    assert (ll["cluster"] == "edge").sum() < 150


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (lambda s: s.update(replicas=3), "serving.replicas"),
        (lambda s: s.update(router={"kind": "jsq"}), "serving.router"),
        (lambda s: s["clusters"][1].update(name="dc"), "serving.clusters"),
        (lambda s: s["clusters"][1]["replica_groups"][0].update(name="fast"), "serving.clusters"),
        (lambda s: s["clusters"][0].update(replica_groups=[]), "serving.clusters[0].replica_groups"),
        (lambda s: s["clusters"][0]["replica_groups"][0]["engine"].update(kv_num_blocks=0),
         "serving.clusters[0].replica_groups[0].engine.kv_num_blocks"),
    ],
)
def test_bad_cluster_settings_name_their_key(change, key):
    """A wrong multi-cluster setting is a ScenarioError naming its key path."""
    data = _two_clusters()
    change(data["serving"])
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(data)
    assert key in str(err.value)


def test_seed003_single_target_every_router_agrees():
    """§7.1: one prefill and one decode replica: round robin, random and least-loaded routers
    (entry and decode) give byte-identical records."""
    frames = []
    for kind in ("round_robin", "random", "least_loaded"):
        overrides = [f"serving.router.kind={kind}", f"serving.disaggregation.decode_router.kind={kind}", "workload.num_requests=150"]
        frames.append(Simulation(load_scenario("scenarios/seed003_single_target.yaml", overrides)).run().to_dataframe())
    assert frames[0].equals(frames[1]) and frames[0].equals(frames[2])


def _run(name: str, kind: str, rate: float, window_s: float, clusters: int = 0) -> dict:
    """The scenario under *kind* routing at *rate*, counted over the arrival window."""
    top = "cluster_router" if clusters else "router"
    overrides = [
        f"serving.{top}.kind={kind}", f"workload.aggregate_rate={rate}", f"workload.horizon_s={window_s}",
        f"simulation.until_s={window_s}", *(f"serving.clusters.{c}.router.kind={kind}" for c in range(clusters)),
    ]
    return Simulation(load_scenario(f"scenarios/{name}", overrides)).run().summary()


def test_seed003_heterogeneous_cluster_jsq_keeps_the_higher_plateau():
    """§7.2: three different targets at 12 requests/s over 120 s: jsq completes over 10 %
    more requests in the window than round robin and random, with under a fifth of their
    TTFT p95."""
    runs = {kind: _run("seed003_heterogeneous_cluster.yaml", kind, 12.0, 120.0) for kind in ("jsq", "round_robin", "random")}
    jsq = runs.pop("jsq")
    for other in runs.values():
        assert jsq["throughput"]["requests_per_s"] > 1.1 * other["throughput"]["requests_per_s"]
        assert jsq["latency_s"]["ttft"]["p95"] < 0.2 * other["latency_s"]["ttft"]["p95"]


def test_seed003_multi_cluster_jsq_at_both_levels_wins():
    """§7.3: nine targets in three clusters at 40 requests/s over 90 s: jsq across and within
    clusters completes over 10 % more requests than round robin or random at both levels,
    with a TTFT p95 under a tenth of theirs."""
    runs = {kind: _run("seed003_multi_cluster.yaml", kind, 40.0, 90.0, clusters=3) for kind in ("jsq", "round_robin", "random")}
    jsq = runs.pop("jsq")
    for other in runs.values():
        assert jsq["throughput"]["requests_per_s"] > 1.1 * other["throughput"]["requests_per_s"]
        assert jsq["latency_s"]["ttft"]["p95"] < 0.1 * other["latency_s"]["ttft"]["p95"]
