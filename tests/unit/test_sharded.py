"""Exact sharded runs (simpy_llm.explore.sharded) and the all-fields view mode they rest on.

A sharded run must give the single run's records byte for byte; each refused feature is
named by its key; with ``view_refresh_fields: all`` a router inside a refresh window
does not see the departures of that window.
"""

from __future__ import annotations

import copy
import gc
import itertools
import math
import os
import pickle
import socket
import warnings
from collections.abc import Iterator
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Listener
from typing import Any

import attrs
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.config import ScenarioError
from simpy_llm.entities import Request
from simpy_llm.explore import sharded
from simpy_llm.explore.sharded import ShardedRun, run_sharded, sharding_problems
from simpy_llm.explore.sharded_arrivals import _Arrivals, _delay_to, _Share
from simpy_llm.explore.sharded_hosts import _no_delay, _Piped, _ShardHost, piped_host
from simpy_llm.kernel import Environment
from simpy_llm.metrics.monitors import LevelMonitor
from simpy_llm.metrics.recorder import Recorder
from simpy_llm.serving.views import FullSnapshotView, SnapshotView
from simpy_llm.wire import Wire
from simpy_llm.workload.checks import check_spec_files
from simpy_llm.workload.generator import WorkloadGenerator
from simpy_llm.workload.sessions import ReplayedContexts
from simpy_llm.workload.sources import build_sources
from tests.helpers import tiny_scenario

_ROUTERS = ("least_loaded", "jsq", "power_of_d", "least_outstanding_tokens")


def _fleet(clusters: int, per_cluster: int = 2, *, delta: float = 0.05, requests: int = 300) -> dict[str, Any]:
    """A loaded fleet of *clusters* clusters (or, with 0, of *per_cluster* replicas behind one
    router), each of its own speed, on views refreshed every *delta* with every field. The
    entry router reads outstanding counts, so when a departure is seen changes the routing."""
    data = tiny_scenario()
    serving = data["serving"]
    engine, latency = serving.pop("engine"), serving.pop("latency_model")
    data["workload"].update(aggregate_rate=150.0, num_requests=requests)
    serving.update(view_refresh_s=delta, view_refresh_fields="all")
    if clusters == 0:
        serving.update(replicas=per_cluster, engine=engine, latency_model=latency, router={"kind": "least_outstanding_tokens"})
        return data
    serving.pop("replicas")
    serving["cluster_router"] = {"kind": "least_loaded"}  # reads outstanding counts: departures matter
    serving["clusters"] = []
    for c in range(clusters):
        lat = copy.deepcopy(latency)
        lat["params"]["beta0_us"] = 2000.0 * (1 + c % 3)
        serving["clusters"].append({
            "name": f"c{c}", "router": {"kind": _ROUTERS[c % len(_ROUTERS)]},
            "replica_groups": [{"name": f"g{c}", "count": per_cluster, "engine": copy.deepcopy(engine), "latency_model": lat}],
        })
    return data


def _same_records(data: dict[str, Any], **how: Any) -> pd.DataFrame:
    scenario = scenario_from_dict(data)
    single = Simulation(scenario).run(progress=False).to_dataframe()
    sharded = run_sharded(scenario, **how).to_dataframe()
    assert sharded.to_csv() == single.to_csv()
    return single


def test_two_clusters_in_process_give_the_single_runs_records():
    """Two clusters as two in-process shards: the records equal the single run's, byte for byte."""
    assert len(_same_records(_fleet(2), shards=2)) == 300


def test_four_clusters_in_process_give_the_single_runs_records():
    """Four clusters as four in-process shards (cluster routers of four kinds, one drawing
    from its random stream): the records equal the single run's."""
    _same_records(_fleet(4), shards=4)


def test_four_clusters_on_two_shards_give_the_single_runs_records():
    """Shards of several clusters each (two of four) give the same records."""
    _same_records(_fleet(4), shards=2)


def test_replica_groups_as_shards_give_the_single_runs_records():
    """Without clusters, contiguous runs of replicas as shards (3 of 6) give the same records."""
    _same_records(_fleet(0, per_cluster=6), shards=3)


def test_a_replayed_trace_with_sessions_gives_the_single_runs_records(tmp_path):
    """A replayed trace whose sessions' rounds go to different clusters (each round takes
    its session's previous one as context, which the prefix caches find) gives the single
    run's records."""
    rows = ["arrival_time_s,input_tokens,output_tokens,session_id,round_index"]
    for k in range(240):
        session, round_index = k % 12, k // 12
        rows.append(f"{0.004 * k:.3f},{40 + 30 * round_index},{3 + k % 5},s{session},{round_index}")
    path = tmp_path / "sessions.csv"
    path.write_text("\n".join(rows) + "\n")
    data = _fleet(2)
    data["workload"] = {"traces": [{"path": str(path), "format": "csv"}]}
    for cluster in data["serving"]["clusters"]:
        cluster["replica_groups"][0]["engine"].update(kv_num_blocks=4096, max_num_batched_tokens=4096)
    records = _same_records(data, shards=2)
    assert records["replica"].nunique() == 4 and (records["cached_tokens"] > 0).any()


def test_arrivals_on_the_window_boundaries_give_the_single_runs_records(tmp_path):
    """A trace whose requests arrive in bursts of four every 10 ms, so that bursts fall on
    the window boundaries (every 50 ms), gives the single run's records: a burst at a
    window's start comes after that instant's view refresh, as in one run (started as
    urgent, it came first, and 55 records differed)."""
    rows = ["arrival_time_s,input_tokens,output_tokens"]
    rows += [f"{0.01 * (k // 4):.2f},{30 + k % 7},{2 + k % 3}" for k in range(200)]
    path = tmp_path / "bursts.csv"
    path.write_text("\n".join(rows) + "\n")
    data = _fleet(2)
    data["workload"] = {"traces": [{"path": str(path), "format": "csv"}]}
    _same_records(data, shards=2)


def test_a_run_cut_at_until_gives_the_single_runs_records():
    """With ``simulation.until_s`` the last window ends there; in-flight and settled records
    equal the single run's."""
    data = _fleet(2, requests=600)
    data["simulation"] = {"until_s": 1.5}
    status = _same_records(data, shards=2)["status"]
    assert (status == "in_flight").any() and (status == "completed").any()


def test_a_run_cut_at_until_gives_the_single_runs_summary():
    """With ``simulation.until_s`` the summary (the requests in the system, replayed window
    by window, included) equals the single run's."""
    data = _fleet(2, requests=600)
    data["simulation"] = {"until_s": 1.5}
    scenario = scenario_from_dict(data)
    assert run_sharded(scenario, shards=2).summary() == Simulation(scenario).run(progress=False).summary()


def _in_process_client(workers: int) -> Iterator[Any]:
    """An in-process LocalCluster of *workers* workers and its Client. One cluster per size,
    never scaled: closing a cluster whose scaled-down workers were still retiring has failed in
    Dask's teardown (a ``KeyError`` on an ``inproc://`` address)."""
    distributed = pytest.importorskip("dask.distributed")
    with distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0") as cluster, \
            distributed.Client(cluster) as client:
        client.wait_for_workers(workers)
        yield client


@pytest.fixture(scope="module")
def dask_client_2():
    yield from _in_process_client(2)


@pytest.fixture(scope="module")
def dask_client_4():
    yield from _in_process_client(4)


def test_two_clusters_on_two_dask_workers_give_the_single_runs_records(dask_client_2):
    """Two clusters on two Dask workers (actors of a LocalCluster) give the single run's records."""
    _same_records(_fleet(2), client=dask_client_2)


def test_four_clusters_on_four_dask_workers_give_the_single_runs_records(dask_client_4):
    """Four clusters on four Dask workers give the single run's records."""
    _same_records(_fleet(4), client=dask_client_4)


@pytest.fixture(scope="module")
def tcp_dask_client():
    """Two Dask worker processes on loopback (reached over TCP) and their Client."""
    distributed = pytest.importorskip("dask.distributed")
    import dask

    # A loaded machine starts worker processes slowly; dask's own warnings about it say nothing here.
    with warnings.catch_warnings(), dask.config.set({"distributed.comm.timeouts.connect": "120s"}):
        warnings.filterwarnings("ignore", module="distributed")
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                      dashboard_address="127.0.0.1:0") as cluster, distributed.Client(cluster) as client:
            yield client


def test_worker_processes_called_over_their_own_connections_give_the_single_runs_records(tcp_dask_client, monkeypatch):
    """Shards on two worker processes reached over TCP are called over connections of their
    own (no Dask actor call per window) and give the single run's records."""
    assert {piped_host(a) for a in tcp_dask_client.scheduler_info()["workers"]} == {"127.0.0.1"}
    monkeypatch.setattr(sharded, "_Remote", None)  # a window called through Dask would fail here
    _same_records(_fleet(4), client=tcp_dask_client)


def test_workers_over_another_transport_are_called_through_dask(dask_client_2, monkeypatch):
    """Where a worker is reached otherwise than over TCP or in process, its slot is called
    through Dask's actor: the same records."""
    monkeypatch.setattr(sharded, "piped_host", lambda address: None)
    monkeypatch.setattr(sharded, "_Piped", None)  # a connection of its own would fail here
    _same_records(_fleet(2), client=dask_client_2)


@pytest.mark.parametrize(("address", "host"), [
    ("tcp://10.0.0.5:8786", "10.0.0.5"), ("tcp://node-3.cluster:40123", "node-3.cluster"),
    ("inproc://10.0.0.5/4242/7", "127.0.0.1"), ("tls://10.0.0.5:8786", None), ("tcp://[::1]:8786", None),
    ("ucx://10.0.0.5:13337", None),
])
def test_a_slots_connection_follows_the_workers_transport(address, host):
    """A slot's own connection listens on the worker's TCP host, on the loopback for an
    in-process worker, and is not used over TLS, UCX or IPv6 (Dask's transport is kept)."""
    assert piped_host(address) == host


def test_an_error_in_a_slot_is_raised_by_the_coordinator():
    """A call that fails in a slot served over its own connection raises the slot's error
    where it was called; the connection still answers the next call."""
    scenario = scenario_from_dict(_fleet(2))
    slot = _ShardHost(scenario, [[0]])
    key = b"k" * 32
    host = _Piped(slot.listen("127.0.0.1", key), key)
    try:
        message = pickle.dumps((np.array([0, 0, 0], dtype=np.int32).tobytes(), 1e-9))
        with pytest.raises(RuntimeError, match="made 0 arrivals where the coordinator routed 3"):
            host.call("advance", message)
        assert host.call("statics") == slot.statics()
    finally:
        host.close()


def test_a_window_made_ahead_is_the_window_made_at_once():
    """A slot that makes the next window's rows right after replying (as it does over its
    own connection) advances its shards to the same snapshots as one that makes them when
    the window comes, and counts that CPU apart."""
    scenario = scenario_from_dict(_fleet(2))
    ahead, at_once, counted = _ShardHost(scenario, [[0]]), _ShardHost(scenario, [[0]]), _Arrivals(scenario)
    for until in (0.05, 0.1, 0.15000000000000002, 0.2):  # the windows' ends, added up as the coordinator does
        targets = np.zeros(len(counted.every(until)), dtype=np.int32)
        message = pickle.dumps((targets.tobytes(), until))
        got, want = ahead.advance(message), at_once.advance(message)
        assert got[0] == want[0]
        assert want[4] == 0.0
        ahead.make_ahead()
    assert ahead._ahead is not None and ahead._ahead.until == 0.25


def test_an_error_making_a_window_ahead_is_raised_by_that_windows_call(monkeypatch):
    """A slot whose making of the next window's rows fails (after replying) raises the
    error in the call that advances that window, as if made there."""
    scenario = scenario_from_dict(_fleet(2))
    slot = _ShardHost(scenario, [[0], [1]])

    def fail(until: float) -> None:
        raise ValueError(f"no rows to {until}")

    monkeypatch.setattr(slot._arrivals, "window", fail)
    slot.make_ahead()
    with pytest.raises(ValueError, match=r"no rows to 0\.05"):
        slot.advance(pickle.dumps((b"", 0.05)))


def test_a_window_made_ahead_for_another_end_is_refused():
    """Rows made ahead for a window the coordinator does not send are an error, not
    routed as another window's."""
    scenario = scenario_from_dict(_fleet(2))
    slot = _ShardHost(scenario, [[0], [1]])
    slot.make_ahead()  # the window to 0.05
    with pytest.raises(RuntimeError, match=r"made the window to 0\.05 ahead; the coordinator sent 0\.1"):
        slot.advance(pickle.dumps((b"", 0.1)))


def _no_delay_option(conn: Any) -> int:
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_a_slots_connection_sends_each_message_at_once():
    """Both ends of a slot's connection turn Nagle's algorithm off (a reply over 16 kB is
    sent as two writes, whose second would wait for the peer's delayed acknowledgement)."""
    slot = _ShardHost(scenario_from_dict(_fleet(2)), [[0]])
    key = b"k" * 32
    host = _Piped(slot.listen("127.0.0.1", key), key)
    try:
        assert _no_delay_option(host.conn) != 0
    finally:
        host.close()
    with Listener(("127.0.0.1", 0)) as listener:  # without a key: the client connects before the accept
        client = Client(listener.address)
        with listener.accept() as served, client:
            assert _no_delay_option(served) == 0  # the default, which the slot's end changes
            _no_delay(served)
            assert _no_delay_option(served) != 0


def test_a_slots_connection_refuses_a_client_without_the_key():
    """Only a client answering the run's key is served by a slot."""
    slot = _ShardHost(scenario_from_dict(_fleet(2)), [[0]])
    address = slot.listen("127.0.0.1", b"a" * 32)
    with pytest.raises(AuthenticationError):
        _Piped(address, b"b" * 32)


def test_the_coordinator_makes_every_request_window_by_window():
    """The coordinator's arrivals, made window by window without an environment (empty
    windows among them), are the generator's requests, every one, field for field; the
    rows are exhausted after the last."""
    scenario = _two_client_workload(120)
    made = _Arrivals(scenario, quiet=False)
    got: list[Request] = []
    for until in (0.01, 0.3, 0.3, 1.0):
        got += made.every(until)
    assert not made.exhausted
    got += made.every(1e9)
    assert made.exhausted
    assert [attrs.asdict(r) for r in got] == [attrs.asdict(r) for r in _all_arrivals(scenario)]


def test_window_stats_count_the_coordinators_overlapped_work():
    """A run's window figures count its start, the arrivals made while the slots advanced,
    the records' return and the merge."""
    run = ShardedRun(scenario_from_dict(_fleet(2)), shards=2)
    run.run()
    w = run.windows
    assert w is not None
    assert w.start_s > 0 and w.make_cpu_s > 0 and w.finish_s > 0 and w.merge_s > 0


def test_window_stats_split_a_slots_time_before_its_shards_advance():
    """Each slot's CPU before its shards advance (reading the message, making its arrivals)
    is counted, and is part of the slot's CPU."""
    run = ShardedRun(scenario_from_dict(_fleet(2)), shards=2)
    run.run()
    w = run.windows
    assert w is not None
    assert len(w.host_prep_cpu_s) == len(w.host_cpu_s) == 1  # in process: one slot
    assert 0 < w.host_prep_cpu_s[0] <= w.host_cpu_s[0]


def test_the_windows_run_with_fewer_young_collections(monkeypatch):
    """While a sharded run's windows go, the collector's first threshold is at least
    YOUNG_THRESHOLD (the others unchanged), and it is the caller's again after, also when
    the run fails."""
    seen: list[tuple[int, int, int]] = []
    windows = ShardedRun._windows

    def watched(self, *args):
        seen.append(gc.get_threshold())
        return windows(self, *args)

    before = gc.get_threshold()
    monkeypatch.setattr(ShardedRun, "_windows", watched)
    run_sharded(scenario_from_dict(_fleet(2)), shards=2)
    assert seen == [(max(before[0], sharded.YOUNG_THRESHOLD), before[1], before[2])]
    assert gc.get_threshold() == before

    def failing(self, *args):
        raise OSError("a slot went away")

    monkeypatch.setattr(ShardedRun, "_windows", failing)
    with pytest.raises(OSError, match="went away"):
        run_sharded(scenario_from_dict(_fleet(2)), shards=2)
    assert gc.get_threshold() == before


def test_the_quiet_worker_settings_are_dasks_own_keys():
    """Every key of ``QUIET_WORKERS`` names a Dask setting (a misspelt key would be kept by
    ``dask.config.set`` and change nothing), and each differs from Dask's default."""
    dask = pytest.importorskip("dask")
    pytest.importorskip("dask.distributed")
    shipped = dask.config.merge(*dask.config.defaults)  # Dask's own defaults, whatever the user's files set
    for key, value in sharded.QUIET_WORKERS.items():
        assert dask.config.get(key, config=shipped) != value, key  # raises KeyError for an unknown key


def test_a_cluster_made_for_the_run_is_made_with_the_quiet_settings(monkeypatch):
    """``run_sharded(workers=N)`` makes its LocalCluster under ``QUIET_WORKERS`` (which the
    workers read as they start), and leaves Dask's settings as they were."""
    dask = pytest.importorskip("dask")
    distributed = pytest.importorskip("dask.distributed")
    seen: dict[str, Any] = {}

    class Made(Exception):
        pass

    def cluster(**kwargs: Any) -> None:
        seen.update({key: dask.config.get(key) for key in sharded.QUIET_WORKERS})
        raise Made

    monkeypatch.setattr(distributed, "LocalCluster", cluster)
    before = {key: dask.config.get(key) for key in sharded.QUIET_WORKERS}
    with pytest.raises(Made):
        run_sharded(scenario_from_dict(_fleet(2)), workers=2)
    assert seen == sharded.QUIET_WORKERS
    assert {key: dask.config.get(key) for key in sharded.QUIET_WORKERS} == before


def test_with_departures_read_live_the_shards_would_differ(monkeypatch):
    """The all-fields mode is what makes the run exact: with ``state`` (departures read
    live, which a coordinator cannot see) the shards' routing, hence records, would differ."""
    import simpy_llm.explore.sharded as sharded

    data = _fleet(2)
    data["serving"]["view_refresh_fields"] = "state"
    scenario = scenario_from_dict(data)
    monkeypatch.setattr(sharded, "_refuse_unshardable", lambda scenario: None)
    single = Simulation(scenario).run(progress=False).to_dataframe()
    assert (run_sharded(scenario, shards=2).to_dataframe()["replica"] != single["replica"]).any()


def test_every_request_is_recorded_once():
    """The merged records hold each request id exactly once, and every request arrived."""
    scenario = scenario_from_dict(_fleet(4))
    results = run_sharded(scenario, shards=4)
    ids = results.to_dataframe()["request_id"].tolist()
    assert ids == list(range(300))
    assert results.summary()["requests"]["arrived"] == 300


def test_the_summary_is_the_single_runs():
    """The merged summary equals the single run's exactly, requests in the system and the
    mean inter-token latency included (the gap tally's mean does not depend on the order
    the shards' gaps are merged in: with four shards, a sum in merge order differs in its
    last bits)."""
    scenario = scenario_from_dict(_fleet(4))
    single = Simulation(scenario).run(progress=False).summary()
    sharded = run_sharded(scenario, shards=4).summary()
    assert sharded == single


def test_window_stats_count_windows_and_requests():
    """A run's window figures count the windows up to the last completion and every request routed."""
    run = ShardedRun(scenario_from_dict(_fleet(2, delta=0.1)), shards=2, measure_messages=True)
    results = run.run()
    assert run.windows is not None
    assert run.windows.routed == 300
    last = results.to_dataframe()["completion_s"].max()
    assert run.windows.windows == math.ceil(last / 0.1 - 1e-9)
    assert run.windows.sent_bytes > 0 and run.windows.reply_bytes > 0


@pytest.mark.parametrize(("key", "change"), [
    ("serving.view_refresh_s", lambda d: d["serving"].update(view_refresh_s=None, view_refresh_fields="state")),
    ("serving.view_refresh_fields", lambda d: d["serving"].update(view_refresh_fields="state")),
    ("serving.cluster_router", lambda d: d["serving"].update(cluster_router={"kind": "prefix_affinity"})),
    ("serving.admission", lambda d: d["serving"].update(admission={"kind": "max_queue", "params": {"max_waiting": 4}})),
    ("workload.max_concurrency", lambda d: d["workload"].update(max_concurrency=4)),
    ("workload.clients[0].multi_turn", lambda d: d["workload"]["clients"][0].update(
        multi_turn={"max_rounds": 3, "think_time": {"type": "constant", "params": {"value": 1.0}}})),
    ("workload.clients[0].conversational_probability", lambda d: d["workload"]["clients"][0].update(
        conversational_probability=0.5, follow_up_think_time={"type": "constant", "params": {"value": 1.0}})),
    ("workload.clients[0].network", lambda d: d["workload"]["clients"][0].update(network={"rtt_ms": 10})),
    ("simulation.timeseries_interval_s", lambda d: d.update(simulation={"timeseries_interval_s": 1.0})),
])
def test_a_feature_not_sharded_is_refused_by_its_key(key, change):
    """Each feature the first version does not shard exactly is refused before anything
    runs, with its key path and the reason."""
    data = _fleet(2)
    change(data)
    scenario = scenario_from_dict(data)
    assert key in [k for k, _ in sharding_problems(scenario)]
    with pytest.raises(ScenarioError, match=key.replace(".", r"\.").replace("[", r"\[").replace("]", r"\]")):
        run_sharded(scenario)


def test_a_disaggregated_fleet_is_refused():
    """A disaggregated fleet (its KV hand-off would cross shards) is refused by its key."""
    data = tiny_scenario()
    serving = data["serving"]
    engine, latency = serving.pop("engine"), serving.pop("latency_model")
    serving.pop("replicas")
    serving.update(view_refresh_s=0.1, view_refresh_fields="all", replica_groups=[
        {"name": "p", "count": 1, "role": "prefill", "engine": engine, "latency_model": latency},
        {"name": "d", "count": 1, "role": "decode", "engine": engine, "latency_model": latency},
    ], disaggregation={"kv_transfer": {"bytes_per_token": 1000}})
    assert "serving.disaggregation" in [k for k, _ in sharding_problems(scenario_from_dict(data))]


def test_all_fields_need_a_refresh_period():
    """``view_refresh_fields: all`` without ``view_refresh_s`` is an error naming the key."""
    data = tiny_scenario()
    data["serving"]["view_refresh_fields"] = "all"
    with pytest.raises(ScenarioError, match=r"serving\.view_refresh_fields"):
        scenario_from_dict(data)


def _route_after_a_departure(fields: str) -> tuple[int, int, int]:
    """Two replicas behind least_loaded, views refreshed every 100 s: request 0 at time 0,
    request 1 once request 0 has finished (inside the first window), request 2 after the
    first refresh. Returns the three requests' replicas."""
    data = tiny_scenario()
    data["serving"].update(replicas=2, router={"kind": "least_loaded"}, view_refresh_s=100.0, view_refresh_fields=fields)
    sim = Simulation(scenario_from_dict(data), external_arrivals=True)
    env = sim.env
    sent = []

    def send() -> None:
        req = Request(id=next(sim.ids), client_id="c0", prompt_tokens=40, output_tokens=5, arrival_s=env.now)
        sim.recorder.on_arrival(req, env.now)
        sim.arrivals.put(req)
        sent.append(req)

    send()
    env.run(until=50.0)
    assert sim.replicas[0].departed == 1  # request 0 finished inside the window
    send()
    env.run(until=150.0)
    send()
    return sent[0].replica, sent[1].replica, sent[2].replica


def test_with_all_fields_routing_inside_a_window_ignores_its_departures():
    """With ``all``, a departure inside a window is not seen until the next refresh:
    least_loaded still counts request 0 on replica 0 and sends request 1 to replica 1;
    after the refresh, replica 0 is idle again and gets request 2."""
    assert _route_after_a_departure("all") == (0, 1, 0)


def test_with_state_fields_routing_sees_departures_at_once():
    """With the default ``state``, departures are read live: request 1 goes to the idle replica 0."""
    assert _route_after_a_departure("state")[:2] == (0, 0)


def test_the_simulation_builds_the_view_each_mode_names():
    """``state`` builds SnapshotViews, ``all`` FullSnapshotViews."""
    for fields, cls in (("state", SnapshotView), ("all", FullSnapshotView)):
        data = tiny_scenario()
        data["serving"].update(view_refresh_s=1.0, view_refresh_fields=fields)
        assert type(Simulation(scenario_from_dict(data)).views[0]) is cls


@settings(max_examples=300, deadline=None)
@given(now=st.floats(0.0, 1e7, allow_nan=False), ahead=st.floats(0.0, 1e7, allow_nan=False))
def test_a_delay_lands_on_the_arrival_to_the_bit(now, ahead):
    """The shard's delay to an arrival lands ``now + delay`` exactly on the arrival time,
    where ``at - now`` may miss it by an ulp."""
    at = now + ahead
    assert now + _delay_to(now, at) == at


@settings(max_examples=200, deadline=None)
@given(shards=st.lists(st.lists(st.tuples(st.integers(0, 12), st.sampled_from([-2, -1, 1, 1, 3])), max_size=40),
                       min_size=1, max_size=4),
       cuts=st.lists(st.integers(1, 12), max_size=6), late=st.lists(st.booleans(), min_size=200, max_size=200))
def test_the_requests_in_the_system_replayed_window_by_window_are_one_replays(shards, cuts, late):
    """The shards' changes of the requests in the system, replayed window by window (a
    change at a window's very end reported in that window or the next), give the level,
    peak and area of one replay of all of them, to the bit."""
    per_shard = [sorted((t / 4, d) for t, d in changes) for changes in shards]  # a shard's clock never goes back
    ends = sorted(set(c / 4 for c in cuts))
    windows: list[list[tuple[bytes, bytes]]] = []
    flips = iter(late)
    start = [0] * len(per_shard)
    for end in [*ends, math.inf]:
        window = []
        for s, changes in enumerate(per_shard):
            k = start[s]
            while k < len(changes) and (changes[k][0] < end or (changes[k][0] == end and next(flips, False))):
                k += 1
            part = changes[start[s]:k]
            start[s] = k
            window.append((np.array([t for t, _ in part], dtype=np.float64).tobytes(),
                           np.array([d for _, d in part], dtype=np.int64).tobytes()))
        windows.append(window)
    replayed = sharded._InSystem()
    for window, end in zip(windows, [*ends, math.inf], strict=True):
        replayed.add(window, end)
        replayed.replay()
    everything = [c for changes in per_shard for c in changes]
    one = LevelMonitor()
    one.replay(np.array([t for t, _ in everything], dtype=np.float64), np.array([d for _, d in everything], dtype=np.int64))
    got = replayed.level
    assert (got.level, got.peak, got.area(5.0)) == (one.level, one.peak, one.area(5.0))


class _Workload:
    """The reference: the scenario's arrivals made as a single run's generator makes them,
    through an environment (the same sources, streams and request ids), put into *outbox*
    as their times come."""

    def __init__(self, scenario: Any, env: Environment, outbox: Wire) -> None:
        self.env = env
        wl = scenario.workload
        check_spec_files(scenario)
        sources = build_sources(wl, default_seed=scenario.seed)
        replayed = ReplayedContexts() if sources.traces else None
        n_clients = len(sources.clients)

        def on_request(req: Request, source_index: int) -> None:
            if source_index >= n_clients and replayed is not None:
                replayed(req)

        self.generator = WorkloadGenerator(
            env, sources.generator_sources(), outbox, Recorder(), itertools.count(),
            num_requests=wl.num_requests, horizon_s=wl.horizon_s,
            on_request=on_request if replayed is not None else None, announce=False,
        )

    def run_until(self, until: float) -> None:
        self.env.run(until=until)


def _two_client_workload(requests: int) -> Any:
    data = tiny_scenario()
    data["workload"].update(num_requests=requests, clients=[
        {"id": "chat", "rate_fraction": 0.7, "arrival": {"process": "poisson"},
         "input_distribution": {"type": "exponential", "params": {"mean": 60}},
         "output_distribution": {"type": "exponential", "params": {"mean": 20}}},
        {"id": "batch", "rate_fraction": 0.3, "arrival": {"process": "gamma", "cv": 3.0},
         "input_distribution": {"type": "uniform", "params": {"low": 10, "high": 500}},
         "output_distribution": {"type": "uniform", "params": {"low": 1, "high": 50}}},
    ])
    return scenario_from_dict(data)


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.one_of(st.floats(0.001, 0.5), st.integers(0, 119)), min_size=1, max_size=40),
       keep=st.lists(st.booleans(), min_size=120, max_size=120))
def test_a_slot_makes_the_coordinators_arrivals_window_by_window(cuts, keep):
    """An executor slot's arrivals, made without an environment, are the coordinator's
    generator's, field for field, in windows of any length (some ending exactly at an
    arrival, which then falls in the next window), and a slot keeps only the rows routed
    to its shards, each with its target."""
    scenario = _two_client_workload(120)
    env = Environment()
    made: list[Request] = []
    outbox = Wire(env)
    outbox.connect(made.append)
    reference = _Workload(scenario, env, outbox)
    times = [r.arrival_s for r in _all_arrivals(scenario)]
    slot = _Arrivals(scenario)
    until, seen = 0.0, 0
    for cut in [*cuts, 1e9]:
        until = times[cut] if isinstance(cut, int) and times[cut] > until else until + (cut if isinstance(cut, float) else 0.25)
        reference.run_until(until)
        window = made[seen:]
        seen = len(made)
        share = _Share(slot)
        targets = np.array([7 * r.id for r in window], dtype=np.int64)
        slot.share(slot.window(until), targets, np.array([0 if keep[r.id] else -1 for r in window]), [share])
        kept = [r for r in window if keep[r.id]]
        assert share.targets == [7 * r.id for r in kept]
        assert [attrs.asdict(share.request(k)) for k in range(len(share))] == [attrs.asdict(r) for r in kept]
    assert seen == 120


def _all_arrivals(scenario: Any) -> list[Request]:
    env = Environment()
    made: list[Request] = []
    outbox = Wire(env)
    outbox.connect(made.append)
    _Workload(scenario, env, outbox).run_until(1e9)
    return made
