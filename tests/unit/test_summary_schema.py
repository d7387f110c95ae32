"""The summary's documented schema (simpy_llm.metrics.summary), its client-side latency
(non-streaming requests have no TTFT, TPOT or ITL), and its long-format frame."""

from __future__ import annotations

import ast
import inspect
import math
import types
import typing

import numpy as np
import pytest
import simpy

from simpy_llm import Recorder, Request, Results, Simulation, scenario_from_dict
from simpy_llm.config.schema import EngineConfig
from simpy_llm.metrics import summary as summary_module
from simpy_llm.metrics.summary import FRAME_COLUMNS, Summary, flatten_summary
from simpy_llm.serving.engine import Replica
from simpy_llm.serving.latency import BlisLinearLatency
from tests.helpers import tiny_scenario

NAN = math.nan


# --- helpers ------------------------------------------------------------------------
def _mismatches(value: object, tp: object, path: str = "summary") -> list[str]:
    """Where *value* strays from the schema type *tp*: missing or unknown keys of a
    TypedDict, and values of the wrong kind (recursively)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return []
        (tp,) = [a for a in args if a is not type(None)]
        return _mismatches(value, tp, path)
    if typing.is_typeddict(tp):
        if not isinstance(value, dict):
            return [f"{path}: {type(value).__name__}, not a dict"]
        hints = typing.get_type_hints(tp)
        problems = [f"{path}.{k}: missing" for k in sorted(tp.__required_keys__ - value.keys())]
        problems += [f"{path}.{k}: not in the schema" for k in sorted(value.keys() - hints.keys())]
        for key in value.keys() & hints.keys():
            problems += _mismatches(value[key], hints[key], f"{path}.{key}")
        return problems
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: {type(value).__name__}, not a dict"]
        problems = [f"{path}[{k!r}]: key not a str" for k in value if not isinstance(k, str)]
        for key, item in value.items():
            problems += _mismatches(item, args[1], f"{path}[{key!r}]")
        return problems
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: {type(value).__name__}, not a list"]
        return [p for i, item in enumerate(value) for p in _mismatches(item, args[0], f"{path}[{i}]")]
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, tp)
    return [] if ok else [f"{path}: {value!r} is not {getattr(tp, '__name__', tp)}"]


def _rich_scenario() -> dict:
    """Two replica groups; sessions; prefix caching; drops (too long, queue full); three SLO
    classes and tenants; streaming, non-streaming and mixed clients; preemptions."""
    client = {
        "arrival": {"process": "poisson"},
        "input_distribution": {"type": "exponential", "params": {"mean": 60}},
        "output_distribution": {"type": "exponential", "params": {"mean": 20}},
    }
    engine = {
        "max_num_seqs": 8, "max_num_batched_tokens": 64, "kv_block_size": 4, "kv_num_blocks": 40,
        "max_model_len": 150, "prefix_caching": True,
    }
    latency = {"kind": "blis_linear", "params": {"beta0_us": 2000.0, "beta1_us": 20.0, "beta2_us": 100.0}}
    return {
        "name": "rich",
        "seed": 3,
        "workload": {
            "aggregate_rate": 60.0,
            "num_requests": 150,
            "clients": [
                {**client, "id": "chat", "tenant_id": "a", "slo_class": "gold", "streaming": 0.5, "rate_fraction": 1.0,
                 "prefix_group": "sys", "prefix_length": 16,
                 "multi_turn": {"max_rounds": 3, "think_time": {"type": "constant", "params": {"value": 0.2}},
                                "context_growth": "fixed"}},
                {**client, "id": "batch", "tenant_id": "b", "slo_class": "silver", "streaming": False,
                 "rate_fraction": 1.0},
                {**client, "id": "api", "tenant_id": "c", "slo_class": "bronze", "rate_fraction": 1.0},
            ],
        },
        "serving": {
            "router": {"kind": "round_robin"},
            "admission": {"kind": "max_queue", "params": {"max_waiting": 6}},
            "replica_groups": [
                {"name": "big", "count": 1, "engine": engine, "latency_model": latency},
                {"name": "small", "count": 1, "engine": engine, "latency_model": latency},
            ],
        },
        "slo": {"gold": {"ttft_s": 0.5}, "silver": {"e2e_s": 5.0}, "bronze": {"e2e_s": 30.0}},
    }


@pytest.fixture(scope="module")
def rich_results() -> Results:
    return Simulation(scenario_from_dict(_rich_scenario())).run()


def _request(rid: int, *, streaming: bool = True, first_token_s: float = NAN, completion_s: float = NAN,
             output_tokens: int = 5, slo_class: str = "default", warm_up: bool = False) -> Request:
    started = not math.isnan(first_token_s)
    return Request(
        id=rid, client_id="c", prompt_tokens=10, output_tokens=output_tokens, arrival_s=0.0,
        enqueue_s=0.0 if started else NAN, first_scheduled_s=0.0 if started else NAN,
        first_token_s=first_token_s, completion_s=completion_s, streaming=streaming, slo_class=slo_class,
        replica=0, warm_up=warm_up,
    )


def _results(requests: list[Request]) -> Results:
    rec = Recorder()
    for req in requests:
        rec.on_arrival(req, req.arrival_s)
        if math.isnan(req.completion_s):
            rec.on_in_flight(req)
        else:
            req.generated_tokens = req.output_tokens
            rec.on_complete(req)
    return Results.from_recorder(
        rec, scenario=scenario_from_dict(tiny_scenario()), end_s=10.0, wall_s=1.0, events=0, steps=0, kv_blocks=[64]
    )


# --- the schema -----------------------------------------------------------------------
def test_the_scenario_exercises_every_open_ended_part(rich_results):
    """The run the schema is checked on has sessions, prefix hits, drops of two reasons,
    preemptions, non-streaming requests and three classes (else the check proves little)."""
    res = rich_results
    s = res.summary()
    assert s["sessions"]["count"] > 0
    assert s["prefix_cache"]["cached_tokens"] > 0
    assert set(s["requests"]["dropped_by_reason"]) == {"max_model_len", "max_queue"}
    assert s["preemptions"]["total"] > 0
    assert sorted(s["latency_s_by_class"]) == ["bronze", "gold", "silver"]
    assert 0 < int((res.columns["streaming"] == 0).sum()) < len(res)


def test_summary_keys_match_the_typed_dict_exactly(rich_results):
    """Every key of a rich run's summary, at every depth, is declared in the Summary
    TypedDict with a matching kind of value, and every required key is there."""
    assert _mismatches(rich_results.summary(), Summary) == []


@pytest.mark.parametrize("name", ["multi_bin_dynamic.yaml", "multi_bin_only.yaml"])
def test_batch_server_summaries_match_the_typed_dict_exactly(name):
    """A fleet of request-level batch servers (dynamic and fixed, with and without a memory
    limit) has a batch_servers section, one entry per server, that matches the schema."""
    from simpy_llm import load_scenario

    s = Simulation(load_scenario(f"scenarios/{name}", {"workload.num_requests": 1500})).run().summary()
    assert sorted(s["batch_servers"]) == [str(i) for i in range(len(s["engine"]["busy_s"]))]
    assert _mismatches(s, Summary) == []


@pytest.mark.parametrize("name", ["agentic_react.yaml", "agentic_mcts.yaml"])
def test_agentic_summaries_match_the_typed_dict_exactly(name):
    """A run of agentic sessions (a loop; fan-out and a tool with a capacity) has a
    workflows section, one entry per workflow, that matches the schema."""
    from simpy_llm import load_scenario

    s = Simulation(load_scenario(f"scenarios/{name}", {"workload.num_requests": 60})).run().summary()
    assert len(s["workflows"]) == 1 and next(iter(s["workflows"].values()))["sessions"] == 60
    assert _mismatches(s, Summary) == []


def test_summary_without_replica_groups_leaves_out_only_the_optional_keys():
    """Results built without replica groups omit engine.group and gpu_utilization.by_group,
    which the schema declares NotRequired, and otherwise match it."""
    s = _results([_request(0, first_token_s=1.0, completion_s=2.0)]).summary()
    assert "group" not in s["engine"] and "by_group" not in s["gpu_utilization"]
    assert _mismatches(s, Summary) == []


def test_the_schema_check_catches_an_undeclared_key(rich_results):
    """The checker itself: an extra nested key and a missing one are both reported."""
    s = rich_results.summary()
    s["latency_s"]["ttft"]["p999"] = 1.0
    del s["throughput"]["requests_per_s"]
    assert sorted(_mismatches(s, Summary)) == [
        "summary.latency_s.ttft.p999: not in the schema",
        "summary.throughput.requests_per_s: missing",
    ]


def test_every_schema_key_has_a_docstring():
    """Each field of each TypedDict in simpy_llm.metrics.summary is followed by a docstring."""
    tree = ast.parse(inspect.getsource(summary_module))
    undocumented = []
    classes = 0
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            classes += 1
            body = node.body
            for i, item in enumerate(body):
                if isinstance(item, ast.AnnAssign):
                    nxt = body[i + 1] if i + 1 < len(body) else None
                    documented = (
                        isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                        and isinstance(nxt.value.value, str) and nxt.value.value.strip()
                    )
                    if not documented:
                        undocumented.append(f"{node.name}.{item.target.id}")
    assert classes >= 15
    assert undocumented == []


# --- client-side latency -----------------------------------------------------------------
def test_ttft_and_tpot_leave_out_non_streaming_requests_e2e_keeps_them():
    """Streaming requests with TTFT 1 and 2 s and a non-streaming one with 10 s: TTFT mean
    1.5 over 2 requests; TPOT over the same 2; E2E over all 3."""
    res = _results([
        _request(0, first_token_s=1.0, completion_s=5.0),
        _request(1, first_token_s=2.0, completion_s=6.0),
        _request(2, streaming=False, first_token_s=10.0, completion_s=12.0),
    ])
    lat = res.summary()["latency_s"]
    assert lat["ttft"]["mean"] == pytest.approx(1.5) and lat["ttft"]["count"] == 2
    assert lat["tpot"]["mean"] == pytest.approx(1.0) and lat["tpot"]["count"] == 2  # (5 - 1) / 4
    assert lat["e2e"]["mean"] == pytest.approx((5 + 6 + 12) / 3) and lat["e2e"]["count"] == 3
    assert lat["queue_delay"]["count"] == 3


def test_counts_leave_out_one_token_outputs_from_tpot_and_unfinished_requests_from_all():
    """A one-token output has no TPOT; a request in flight counts nowhere."""
    res = _results([
        _request(0, first_token_s=1.0, completion_s=1.0, output_tokens=1),
        _request(1, first_token_s=1.0, completion_s=3.0),
        _request(2),
    ])
    lat = res.summary()["latency_s"]
    assert (lat["ttft"]["count"], lat["tpot"]["count"], lat["e2e"]["count"]) == (2, 1, 2)


def test_only_non_streaming_requests_give_none_ttft_with_count_zero():
    """With no streaming request TTFT and TPOT have no value (None) and count 0."""
    lat = _results([_request(0, streaming=False, first_token_s=1.0, completion_s=2.0)]).summary()["latency_s"]
    assert lat["ttft"] == {"mean": None, "p50": None, "p90": None, "p95": None, "p99": None, "count": 0}
    assert lat["tpot"]["count"] == 0 and lat["e2e"]["count"] == 1


def test_latency_by_class_leaves_out_non_streaming_requests_too():
    """Per class, TTFT is over the class's streaming requests only (E2E over all)."""
    res = _results([
        _request(0, first_token_s=1.0, completion_s=2.0, slo_class="gold"),
        _request(1, streaming=False, first_token_s=3.0, completion_s=4.0, slo_class="gold"),
    ])
    gold = res.summary()["latency_s_by_class"]["gold"]
    assert gold["ttft"]["mean"] == pytest.approx(1.0)
    assert gold["e2e"]["mean"] == pytest.approx(3.0)


def test_goodput_still_judges_ttft_targets_on_every_request():
    """A non-streaming request meeting the TTFT target counts as good: SLOs are unchanged."""
    data = tiny_scenario()
    data["slo"] = {"default": {"ttft_s": 5.0}}
    rec = Recorder()
    req = _request(0, streaming=False, first_token_s=1.0, completion_s=9.0)
    rec.on_arrival(req, 0.0)
    req.generated_tokens = req.output_tokens
    rec.on_complete(req)
    res = Results.from_recorder(rec, scenario=scenario_from_dict(data), end_s=10.0, wall_s=1.0, events=0, steps=0,
                                kv_blocks=[64])
    assert res.summary()["goodput"]["fraction"] == 1.0


LATENCY = BlisLinearLatency(beta0_us=1000.0, beta1_us=10.0, beta2_us=100.0, alpha0_us=500.0, alpha2_us=50.0)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
def test_engine_tallies_itl_gaps_of_measured_streaming_requests_only(fast, preemption_mode):
    """On a replica short of KV (preemptions), the ITL tally holds exactly the gaps of the
    streaming, non-warm-up requests: the sum of their output tokens - 1."""
    swap = ({"swap_space_blocks": 64, "swap_kv_bytes_per_token": 1e5, "swap_bandwidth_gb_per_s": 10.0}
            if preemption_mode == "swap" else {})
    engine = EngineConfig(max_num_seqs=6, max_num_batched_tokens=64, kv_block_size=4, kv_num_blocks=24,
                          preemption_mode=preemption_mode, **swap)
    env = simpy.Environment()
    inbox = simpy.Store(env)
    rec = Recorder()
    rep = Replica(env, 0, inbox, engine, LATENCY, rec, fast=fast)
    rng = np.random.default_rng(5)
    reqs = [
        Request(id=i, client_id="c", prompt_tokens=int(rng.integers(4, 40)), output_tokens=int(rng.integers(1, 30)),
                arrival_s=float(i) * 0.002, streaming=bool(i % 3), warm_up=i % 5 == 0)
        for i in range(60)
    ]

    def send():
        for req in reqs:
            yield env.timeout(req.arrival_s - env.now)
            rec.on_arrival(req, env.now)
            inbox.put(req)

    env.process(send())
    env.run()
    assert rep.num_preemptions > 0
    assert all(r.generated_tokens == r.output_tokens for r in reqs)
    measured_streaming = [r for r in reqs if r.streaming and not r.warm_up]
    assert rec.itl.count == sum(r.output_tokens - 1 for r in measured_streaming)
    assert rec.itl.count < sum(r.output_tokens - 1 for r in reqs)


def test_itl_reports_its_gaps_and_requests_in_a_run(rich_results):
    """In a run with streaming, mixed and non-streaming clients, ITL's count is the token
    gaps of the measured streaming requests and requests those with two or more tokens."""
    c = rich_results.columns
    streaming = (c["streaming"] == 1) & (c["warm_up"] == 0)
    itl = rich_results.summary()["latency_s"]["itl"]
    assert itl["count"] == int(np.maximum(c["generated_tokens"][streaming] - 1, 0).sum())
    assert itl["requests"] == int((c["generated_tokens"][streaming] >= 2).sum())
    assert 0 < itl["requests"] < len(rich_results)


# --- long format -----------------------------------------------------------------------
def test_summary_frame_has_a_row_per_number_of_the_summary(rich_results):
    """summary_frame() is the flattened summary: the documented columns, one float per number."""
    frame = rich_results.summary_frame()
    assert tuple(frame.columns) == FRAME_COLUMNS
    assert frame["value"].dtype == np.float64
    assert len(frame) == len(flatten_summary(rich_results.summary()))
    assert not frame.duplicated(["section", "metric", "statistic", "group"]).any()


def test_summary_frame_query_finds_the_run_and_each_class_ttft_p99(rich_results):
    """metric == 'ttft' and statistic == 'p99' gives the run's value (empty group) and one
    row per class and per tenant, each equal to the summary's."""
    s = rich_results.summary()
    rows = rich_results.summary_frame().query("metric == 'ttft' and statistic == 'p99'")
    run_row = rows[rows["section"] == "latency_s"]
    assert run_row["group"].tolist() == [""]
    assert run_row["value"].item() == pytest.approx(s["latency_s"]["ttft"]["p99"])
    by_class = rows[rows["section"] == "latency_s_by_class"]
    assert by_class["group"].tolist() == sorted(s["latency_s_by_class"])
    for name, value in zip(by_class["group"], by_class["value"], strict=True):
        expected = s["latency_s_by_class"][name]["ttft"]["p99"]
        assert value == pytest.approx(NAN if expected is None else expected, nan_ok=True)
    assert rows[rows["section"] == "latency_s_by_tenant"]["group"].tolist() == ["a", "b", "c"]


def test_summary_frame_names_open_ended_keys_in_group(rich_results):
    """Drop counts per class and reason are grouped 'class/reason'; per-replica values by
    index; a bare number has statistic 'value'; None becomes NaN."""
    frame = rich_results.summary_frame()
    s = rich_results.summary()
    drops = frame.query("section == 'requests' and statistic == 'dropped_by_class'")
    by_class = s["requests"]["dropped_by_class"]
    expected = {f"{cls}/{reason}": n for cls, by in by_class.items() for reason, n in by.items()}
    assert dict(zip(drops["group"], drops["value"], strict=True)) == expected
    busy = frame.query("section == 'engine' and statistic == 'busy_s'")
    assert busy["group"].tolist() == ["0", "1"]
    assert frame.query("section == 'duration_s'")[["metric", "statistic"]].values.tolist() == [["duration_s", "value"]]


def test_flatten_turns_none_into_nan_and_skips_strings():
    """None statistics are NaN rows; string values (replica group names) have no row."""
    res = _results([_request(0, streaming=False, first_token_s=1.0, completion_s=2.0)])
    s = res.summary()
    s["engine"]["group"] = ["g"]
    rows = {(r[0], r[1], r[2], r[3]): r[4] for r in flatten_summary(s)}
    assert math.isnan(rows[("latency_s", "ttft", "p50", "")])
    assert ("engine", "engine", "group", "0") not in rows


@pytest.mark.parametrize(
    ("name", "keys", "overrides"),
    [
        ("disaggregated.yaml", ("disaggregation", "network"), {"workload.num_requests": 500}),
        ("two_clients.yaml", ("client_latency_s", "network"), {"workload.num_requests": 500}),
        ("heterogeneous_fleet.yaml", ("devices",), {"workload.num_requests": 500}),
        ("seed003_multi_cluster.yaml", ("latency_s_by_cluster",), {"workload.horizon_s": 10}),
        ("speculative_mobile_cloud.yaml", ("speculation", "devices", "network"), {"workload.horizon_s": 10}),
    ],
)
def test_network_device_and_cluster_summaries_match_the_typed_dict_exactly(name, keys, overrides):
    """Disaggregation, client networks, device profiles and clusters add their optional
    sections, and the whole summary still matches the schema."""
    from simpy_llm import load_scenario

    s = Simulation(load_scenario(f"scenarios/{name}", overrides)).run().summary()
    assert all(k in s for k in keys)
    assert _mismatches(s, Summary) == []
