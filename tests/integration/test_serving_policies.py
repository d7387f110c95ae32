"""Scheduling, preemption, admission, routing and fleets from YAML, end to end."""

from __future__ import annotations

import copy

import attrs
import numpy as np
import pytest

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.config import ScenarioError
from simpy_llm.policies.scheduling import scheduler_policies
from simpy_llm.serving.views import LiveView
from tests.helpers import run, tiny_scenario


def _congested(**engine: object) -> dict:
    """Two equal clients (gold with priority 1 and SLO class tight, bronze with priority 0)
    sending more than a small replica serves for a while."""
    data = tiny_scenario()
    client = {
        "rate_fraction": 1.0,
        "arrival": {"process": "poisson"},
        "input_distribution": {"type": "exponential", "params": {"mean": 60}},
        "output_distribution": {"type": "exponential", "params": {"mean": 20}},
    }
    data["workload"]["clients"] = [
        {"id": "gold", "priority": 1, "slo_class": "tight", **client},
        {"id": "bronze", "priority": 0, "slo_class": "loose", **client},
    ]
    data["workload"]["aggregate_rate"] = 240.0
    data["workload"]["num_requests"] = 1500
    data["serving"]["engine"].update({"kv_num_blocks": 512, **engine})
    data["slo"] = {"tight": {"ttft_s": 0.05}, "loose": {"ttft_s": 5.0}}
    return data


def _mean_ttft(res, client: str) -> float:
    frame = res.to_dataframe()
    return float(frame.loc[frame["client_id"] == client, "ttft_s"].mean())


def test_priority_scheduling_shifts_latency_from_high_to_low_priority():
    """Under congestion the priority scheduler lowers the high-priority client's mean TTFT
    and raises the low-priority one's, compared with FCFS on the same arrivals."""
    fcfs = run(_congested())
    prio = run(_congested(scheduler={"kind": "priority"}))
    assert _mean_ttft(prio, "gold") < 0.5 * _mean_ttft(fcfs, "gold")
    assert _mean_ttft(prio, "bronze") > _mean_ttft(fcfs, "bronze")


def test_one_priority_level_gives_fcfs_records_byte_for_byte(tmp_path):
    """With every request at the same priority, the priority scheduler writes the same
    records file as FCFS."""
    data = _congested()
    data["workload"]["clients"][0]["priority"] = 0
    a = Simulation(scenario_from_dict(data)).run().save(tmp_path / "fcfs")
    data["serving"]["engine"]["scheduler"] = {"kind": "priority"}
    b = Simulation(scenario_from_dict(data)).run().save(tmp_path / "prio")
    assert (a / "records.csv").read_bytes() == (b / "records.csv").read_bytes()
    assert (a / "preemptions.csv").read_bytes() == (b / "preemptions.csv").read_bytes()


def test_edf_serves_the_tight_deadline_class_first():
    """EDF (deadline = arrival + the class's TTFT target) lowers the tight class's mean
    TTFT below FCFS's on the same arrivals."""
    fcfs = run(_congested())
    edf = run(_congested(scheduler={"kind": "edf"}))
    assert _mean_ttft(edf, "gold") < 0.5 * _mean_ttft(fcfs, "gold")


def test_sjf_lowers_mean_ttft_under_load():
    """Shortest prompt first gives a lower mean TTFT than FCFS on the same arrivals."""
    fcfs = run(_congested())
    sjf = run(_congested(scheduler={"kind": "sjf"}))
    assert sjf.summary()["latency_s"]["ttft"]["mean"] < fcfs.summary()["latency_s"]["ttft"]["mean"]


def test_a_custom_scheduler_registered_in_python_is_used_from_yaml():
    """A scheduler class registered by name and named in the scenario orders the queue:
    last come, first served admits each burst's latest arrivals first."""

    @scheduler_policies.register("test_lcfs")
    @attrs.define
    class LastComeFirstServed:
        def key(self, request, now_s):
            return -request.arrival_s

    try:
        res = run(_congested(scheduler={"kind": "test_lcfs"}))
        fcfs = run(_congested())
    finally:
        scheduler_policies._items.pop("test_lcfs")  # noqa: SLF001 - keep the registry as it was
    order = np.argsort(res.columns["first_scheduled_s"], kind="stable")
    assert not np.array_equal(order, np.argsort(fcfs.columns["first_scheduled_s"], kind="stable"))
    # Some request was admitted before an earlier arrival that was already waiting.
    c = res.columns
    assert np.any(
        (c["arrival_s"][:, None] < c["arrival_s"][None, :])
        & (c["first_scheduled_s"][:, None] > c["first_scheduled_s"][None, :])
        & (c["enqueue_s"][:, None] <= c["first_scheduled_s"][None, :])
    )


def _kv_starved(mode: str) -> dict:
    data = tiny_scenario()
    data["workload"]["aggregate_rate"] = 200.0
    data["workload"]["num_requests"] = 300
    data["workload"]["clients"][0]["input_distribution"] = {"type": "constant", "params": {"value": 30}}
    data["workload"]["clients"][0]["output_distribution"] = {"type": "constant", "params": {"value": 60}}
    data["serving"]["engine"].update({"kv_num_blocks": 40, "prefix_caching": False, "preemption_mode": mode})
    if mode == "swap":
        data["serving"]["engine"].update(
            {"swap_space_blocks": 400, "swap_kv_bytes_per_token": 131072.0, "swap_bandwidth_gb_per_s": 25.0}
        )
    return data


def test_swap_preemption_copies_kv_instead_of_recomputing_it():
    """With swap space, preempted requests are swapped out (mode swap) and resume without
    recomputing their KV: fewer prefill tokens are computed than with recompute, and all
    requests complete."""
    recompute = run(_kv_starved("recompute"))
    swap = run(_kv_starved("swap"))
    pre = swap.preemptions()
    assert len(pre) > 10 and set(pre["mode"]) == {"swap"}
    assert set(recompute.preemptions()["mode"]) == {"recompute"}
    assert swap.summary()["requests"]["completed"] == 300 == recompute.summary()["requests"]["completed"]
    assert swap._recorder.prefill_tokens[0] < recompute._recorder.prefill_tokens[0]  # noqa: SLF001
    # Nothing is recomputed: beyond the prompts, a swapped-in decoder computes only the
    # token it resumes with (its last emitted one), at most one per preemption.
    prompts = int(swap.columns["prompt_tokens"].sum())
    assert prompts <= swap._recorder.prefill_tokens[0] <= prompts + len(pre)  # noqa: SLF001


def test_swap_needs_space_and_a_copy_rate():
    """preemption_mode swap without swap space, or without a copy rate and no hardware in
    the latency model, is a scenario error naming the key."""
    data = _kv_starved("swap")
    data["serving"]["engine"]["swap_space_blocks"] = 0
    with pytest.raises(ScenarioError, match=r"serving\.engine\.swap_space_blocks"):
        scenario_from_dict(data)
    data = _kv_starved("swap")
    del data["serving"]["engine"]["swap_bandwidth_gb_per_s"]
    with pytest.raises(ScenarioError, match=r"serving\.engine\.swap_bandwidth_gb_per_s"):
        scenario_from_dict(data)


def test_prefix_groups_make_shared_prompts_faster_with_prefix_caching():
    """Requests sharing a 400-token system prompt get lower TTFT with prefix caching than
    without, and record the shared blocks as cached tokens."""
    data = tiny_scenario()
    data["workload"]["clients"][0].update({"prefix_group": "system", "prefix_length": 400})
    data["serving"]["engine"].update({"kv_num_blocks": 1024, "max_num_batched_tokens": 512})
    on = run(data)
    data["serving"]["engine"]["prefix_caching"] = False
    off = run(data)
    assert on.summary()["latency_s"]["ttft"]["mean"] < 0.7 * off.summary()["latency_s"]["ttft"]["mean"]
    cached = on.columns["cached_tokens"]
    assert cached[0] == 0 and np.all(cached[1:] == 400)  # blocks of 4 tokens: the whole prefix
    assert np.all(off.columns["cached_tokens"] == 0)


def test_admission_rejections_are_recorded_drops_with_their_reason():
    """max_queue rejects arrivals while the fleet's waiting queue is full: each rejected
    request is a dropped record with reason max_queue, counted by reason and class."""
    data = _congested()
    data["serving"]["admission"] = {"kind": "max_queue", "params": {"max_waiting": 5}}
    res = run(data)
    frame = res.to_dataframe()
    dropped = frame[frame["status"] == "dropped"]
    assert len(dropped) > 50
    assert set(dropped["dropped_reason"]) == {"max_queue"}
    assert (dropped["replica"] == -1).all()
    s = res.summary()
    assert s["requests"]["dropped_by_reason"] == {"max_queue": len(dropped)}
    assert sum(v.get("max_queue", 0) for v in s["requests"]["dropped_by_class"].values()) == len(dropped)
    assert s["requests"]["arrived"] == s["requests"]["completed"] + s["requests"]["dropped"]


def test_token_bucket_admission_limits_each_tenant_to_its_rate():
    """A token bucket of 20 requests/s (burst 5) per tenant admits about 20/s of each
    tenant's 120/s, and rejects the rest with reason token_bucket."""
    data = _congested()
    data["serving"]["admission"] = {"kind": "token_bucket", "params": {"rate": 20.0, "burst": 5.0}}
    res = run(data)
    frame = res.to_dataframe()
    span = float(frame["arrival_s"].max())
    for tenant in ("gold", "bronze"):
        admitted = frame[(frame["tenant_id"] == tenant) & (frame["status"] != "dropped")]
        assert len(admitted) <= 20.0 * span + 5.0 + 1e-9
        assert len(admitted) >= 20.0 * span * 0.9
    assert set(frame.loc[frame["status"] == "dropped", "dropped_reason"]) == {"token_bucket"}


def test_sessions_end_when_admission_drops_a_round():
    """A multi-turn round rejected by admission ends its session with reason dropped."""
    data = tiny_scenario()
    data["workload"]["clients"][0]["multi_turn"] = {"max_rounds": 4, "think_time": {"type": "constant", "params": {"value": 0.01}}}
    data["workload"]["aggregate_rate"] = 400.0
    data["serving"]["engine"]["kv_num_blocks"] = 2048
    data["serving"]["admission"] = {"kind": "max_queue", "params": {"max_waiting": 2}}
    res = run(data)
    reasons = res.sessions()["end_reason"].tolist()
    assert "dropped" in reasons
    assert res.summary()["requests"]["dropped_by_reason"].get("max_queue", 0) >= reasons.count("dropped")


def _fleet(router: str, rate: float) -> dict:
    """Two fast and two slow replicas (four times the step time) behind *router*."""
    data = tiny_scenario()
    data["workload"]["aggregate_rate"] = rate
    data["workload"]["num_requests"] = 3000
    data["workload"]["clients"][0]["output_distribution"] = {"type": "exponential", "params": {"mean": 40}}
    engine = {**data["serving"].pop("engine"), "kv_num_blocks": 512, "max_num_seqs": 16, "max_num_batched_tokens": 256}
    latency = data["serving"].pop("latency_model")
    slow = copy.deepcopy(latency)
    slow["params"] = {k: 4 * v for k, v in latency["params"].items()}
    data["serving"]["replica_groups"] = [
        {"name": "fast", "count": 2, "engine": engine, "latency_model": latency},
        {"name": "slow", "count": 2, "engine": engine, "latency_model": slow},
    ]
    data["serving"]["router"] = {"kind": router}
    return data


def _sustains(router: str, rate: float) -> bool:
    """The fleet keeps p90 TTFT under 0.5 s at *rate* (latency has not diverged)."""
    return run(_fleet(router, rate)).summary()["latency_s"]["ttft"]["p90"] < 0.5


def test_jsq_sustains_a_higher_load_than_round_robin_on_a_heterogeneous_fleet():
    """On two fast and two slow replicas, round robin sends the slow ones as much as the
    fast ones and its tail latency diverges at a load JSQ still serves (seed 003 §7.2)."""
    rates = [60.0, 90.0, 120.0, 180.0, 240.0, 300.0]
    rr = max((r for r in rates if _sustains("round_robin", r)), default=0.0)
    jsq = max((r for r in rates if _sustains("jsq", r)), default=0.0)
    assert jsq > rr
    assert rr > 0


def test_replica_groups_reach_records_views_and_capacities():
    """Each replica belongs to its group in the records and in the routers' views, and the
    faster group has the larger default capacity."""
    sim = Simulation(scenario_from_dict(_fleet("least_loaded", 100.0)))
    assert [v.group for v in sim.views] == ["fast", "fast", "slow", "slow"]
    assert sim.views[0].capacity == pytest.approx(4 * sim.views[2].capacity)
    res = sim.run()
    frame = res.to_dataframe()
    assert set(frame["replica_group"]) == {"fast", "slow"}
    assert (frame["replica_group"] == np.where(frame["replica"] < 2, "fast", "slow")).all()


def test_policies_see_read_only_views_not_replicas():
    """A routing policy gets views: reading works, writing replica state is impossible."""
    seen = []

    @attrs.define
    class Spy:
        def choose(self, request, view):
            seen.append(view)
            return 0

    data = tiny_scenario()
    sim = Simulation(scenario_from_dict(data), routing_policy=Spy())
    sim.run()
    view = seen[0][0]
    assert isinstance(view, LiveView)
    assert view.outstanding_requests >= 0
    with pytest.raises(AttributeError):
        view.outstanding_requests = 3
    with pytest.raises(AttributeError):
        view.waiting_requests = 3


def test_stale_views_change_routing_decisions():
    """With views refreshed every 0.5 s, least-loaded routing still balances by the
    router's own outstanding counts, but JSQ (replica-reported queues) sends whole bursts
    to one replica between refreshes, which fresh views do not."""
    fresh = run(_fleet("jsq", 200.0))
    data = _fleet("jsq", 200.0)
    data["serving"]["view_refresh_s"] = 0.5
    stale = run(data)
    assert not np.array_equal(fresh.columns["replica"], stale.columns["replica"])
    assert stale.summary()["latency_s"]["ttft"]["p90"] > fresh.summary()["latency_s"]["ttft"]["p90"]


def test_kv_num_blocks_auto_is_derived_from_the_hardware():
    """kv_num_blocks: auto sizes the cache from the GPU memory, weights and headroom of
    the latency model's hardware; without hardware it is a scenario error."""
    data = tiny_scenario()
    data["serving"]["latency_model"] = {"kind": "blis_linear", "params": {"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": 2}}
    data["serving"]["engine"]["kv_num_blocks"] = "auto"
    sim = Simulation(scenario_from_dict(data))
    from simpy_llm.serving.hardware import Hardware, auto_kv_blocks, gpu_spec, model_spec

    hw = Hardware(model=model_spec("llama-3.1-8b-instruct"), gpu=gpu_spec("H100"), tp=2)
    assert sim.replicas[0].kv.num_blocks == auto_kv_blocks(hw, 4) > 10_000
    data["serving"]["latency_model"] = {"kind": "blis_linear", "params": {"beta0_us": 100.0}}
    data["serving"]["latency_model"]["params"]["beta1_us"] = 1.0
    with pytest.raises(ScenarioError, match=r"serving\.engine\.kv_num_blocks"):
        scenario_from_dict(data)


def test_policy_objects_passed_in_python_replace_the_scenarios():
    """Scheduler and admission policy objects given to Simulation are the ones used."""
    from simpy_llm.policies.admission import MaxQueue
    from simpy_llm.policies.scheduling import PriorityScheduling

    data = _congested()
    sim = Simulation(scenario_from_dict(data), scheduler_policy=PriorityScheduling(), admission_policy=MaxQueue(max_waiting=5))
    assert all(isinstance(r.scheduler, PriorityScheduling) for r in sim.replicas)
    res = sim.run()
    assert set(res.to_dataframe().query("status == 'dropped'")["dropped_reason"]) == {"max_queue"}
    assert _mean_ttft(res, "gold") < _mean_ttft(run(_congested()), "gold")


def test_fcfs_keys_taken_as_zero_match_a_scheduler_asked_for_them(tmp_path):
    """FCFS's keys, which the engine takes as 0 without asking the policy, give the records
    of a registered scheduler whose key (asked for each request and preemption) is always
    0, byte for byte, on a congested replica that preempts."""

    @scheduler_policies.register("test_zero_key")
    @attrs.define
    class ZeroKey:
        def key(self, request, now_s):
            return 0

    data = _congested(kv_num_blocks=128)
    try:
        res_fcfs = Simulation(scenario_from_dict(data)).run()
        data["serving"]["engine"]["scheduler"] = {"kind": "test_zero_key"}
        res_asked = Simulation(scenario_from_dict(data)).run()
    finally:
        scheduler_policies._items.pop("test_zero_key")  # noqa: SLF001 - keep the registry as it was
    assert res_fcfs.summary()["preemptions"]["total"] > 0
    assert res_asked.to_dataframe().to_csv() == res_fcfs.to_dataframe().to_csv()
