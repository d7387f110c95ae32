"""The request-level batch server: its config checks, service models, bins, partial batches,
memory limit and place in a fleet."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simpy_llm import ScenarioError, Simulation, load_scenario, scenario_from_dict
from simpy_llm.config.schema import (
    SLA_CONTROLLER_KINDS,
    BatchServerConfig,
    BinsConfig,
    DynamicBatchingConfig,
    MemoryLimitConfig,
    PolicySpec,
)
from simpy_llm.entities import Request
from simpy_llm.metrics.results import CONVERGENCE_WINDOW_BATCHES, _controller_stats
from simpy_llm.policies.batching import (
    SLA_CONTROLLERS,
    CorrectedSLAController,
    SLAController,
)
from simpy_llm.policies.predictors import OutputPredictor
from simpy_llm.serving.batching import LatencyModelBatches, LinearBatchModel, SampledServiceTimes
from simpy_llm.serving.latency import BlisLinearLatency
from simpy_llm.workload.distributions import Uniform
from tests.batching_helpers import serve

SPEC = PolicySpec(kind="sampled", params={"distribution": {"type": "constant", "params": {"value": 1.0}}})
LLAMA = {"kind": "blis_linear", "params": {"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": 2}}


def _problem(overrides: dict, scenario: str = "multi_bin_only.yaml") -> list[tuple[str, str]]:
    with pytest.raises(ScenarioError) as info:
        load_scenario(f"scenarios/{scenario}", overrides)
    return info.value.problems


def _request(i: int, prompt: int = 10, output: int = 10) -> Request:
    return Request(id=i, client_id="c", prompt_tokens=prompt, output_tokens=output, arrival_s=0.0)


# --- config -------------------------------------------------------------------------
def test_batch_size_and_dynamic_are_exclusive():
    """A batch server takes exactly one of a fixed batch_size and dynamic, naming the key."""
    problems = _problem({"serving.batch_server.dynamic": {"d_sla_s": 1.0}})
    assert problems[0][0] == "serving.batch_server.batch_size" and "exactly one" in problems[0][1]
    problems = _problem({"serving.batch_server.batch_size": None})
    assert problems[0][0] == "serving.batch_server.batch_size"


def test_max_wait_applies_only_to_a_fixed_batch_size():
    """max_wait_s with dynamic batching is rejected (dynamic batches form when the server is free)."""
    problems = _problem(
        {"serving.batch_server.batch_size": None, "serving.batch_server.max_wait_s": 1.0,
         "serving.batch_server.dynamic": {"d_sla_s": 1.0}}
    )
    assert problems[0][0] == "serving.batch_server.max_wait_s"


def test_engine_settings_are_rejected_on_a_batch_server():
    """Engine settings would be ignored by a batch server, so they are an error."""
    problems = _problem({"serving.engine": {"max_num_seqs": 4}})
    assert problems[0][0] == "serving.engine" and "batch_server" in problems[0][1]


def test_a_latency_model_is_required_exactly_when_the_service_model_uses_it():
    """'sampled' takes no latency model (given: an error); 'latency_model' needs one (missing: an error)."""
    assert _problem({"serving.latency_model": LLAMA})[0][0] == "serving.latency_model"
    problems = _problem({"serving.batch_server.service": {"kind": "latency_model"}})
    assert problems[0] == ("serving.latency_model", "required by batch_server.service kind 'latency_model'")


@pytest.mark.parametrize(
    ("override", "path", "words"),
    [
        ({"serving.batch_server.service.kind": "nope"}, "serving.batch_server.service.kind", "one of: latency_model, linear, sampled"),
        ({"serving.batch_server.service": {"kind": "linear", "params": {"base_s": 0.1}}},
         "serving.batch_server.service.params.seq_len_coeff_s", "required"),
        ({"serving.batch_server.service.params.distribution.params.hig": 3},
         "serving.batch_server.service.params.distribution.params.hig", "unknown key"),
        ({"serving.batch_server.bins.boundaries": [1.0]}, "serving.batch_server.bins.boundaries", "count - 1 = 3"),
        ({"serving.batch_server.bins.boundaries": [1.0, 3.0, 2.0]}, "serving.batch_server.bins.boundaries", "increasing"),
        ({"serving.batch_server.bins.warmup_requests": 2}, "serving.batch_server.bins.warmup_requests", "at least count"),
        ({"serving.batch_server.bins.boundaries": [1.0, 2.0, 2.5]}, "serving.batch_server.bins.warmup_requests", "without explicit"),
    ],
)
def test_bad_batch_server_settings_name_their_key(override, path, words):
    """Each bad setting is reported at its key path, saying what is allowed."""
    (problem,) = _problem(override)
    assert problem[0] == path and words in problem[1]


def test_dynamic_settings_are_checked():
    """b_min above b_max, an unknown bin selector and a memory limit given twice are errors."""
    base = {"serving.batch_server.batch_size": None}
    assert _problem({**base, "serving.batch_server.dynamic": {"d_sla_s": 1.0, "b_min": 9, "b_max": 4}})[0][0] == (
        "serving.batch_server.dynamic.b_min"
    )
    assert _problem({**base, "serving.batch_server.dynamic": {"d_sla_s": 1.0, "bin_selection": {"kind": "x"}}})[0][0] == (
        "serving.batch_server.dynamic.bin_selection.kind"
    )
    twice = {"d_sla_s": 1.0, "memory": {"capacity_tokens": 100, "gpu_memory_gb": 80.0}}
    assert _problem({**base, "serving.batch_server.dynamic": twice})[0][0] == "serving.batch_server.dynamic.memory.gpu_memory_gb"


def test_sla_controller_and_averaging_settings_are_checked():
    """An unknown sla_controller names the allowed ones; ema_alpha with window_batches (one of
    them would be ignored) and a batch server's own d_sla_s with dynamic batching are errors."""
    base = {"serving.batch_server.batch_size": None}
    (problem,) = _problem({**base, "serving.batch_server.dynamic": {"d_sla_s": 1.0, "sla_controller": "pid"}})
    assert problem[0] == "serving.batch_server.dynamic.sla_controller" and "corrected, seed" in problem[1]
    (problem,) = _problem({**base, "serving.batch_server.dynamic": {"d_sla_s": 1.0, "ema_alpha": 0.3, "window_batches": 8}})
    assert problem[0] == "serving.batch_server.dynamic.ema_alpha" and "window_batches" in problem[1]
    (problem,) = _problem({**base, "serving.batch_server.dynamic": {"d_sla_s": 1.0}, "serving.batch_server.d_sla_s": 2.0})
    assert problem[0] == "serving.batch_server.d_sla_s" and "dynamic.d_sla_s" in problem[1]
    (problem,) = _problem({**base, "serving.batch_server.dynamic": {"d_sla_s": 1.0, "window_batches": 0}})
    assert problem[0] == "serving.batch_server.dynamic.window_batches"
    memory = {"capacity_tokens": 100, "window_batches": 0}
    (problem,) = _problem({**base, "serving.batch_server.dynamic": {"d_sla_s": 1.0, "memory": memory}})
    assert problem[0] == "serving.batch_server.dynamic.memory.window_batches"


@pytest.mark.parametrize(
    ("settings", "kind", "averaging"),
    [
        ({}, CorrectedSLAController, {"alpha": 0.2, "window_batches": None}),
        ({"sla_controller": "seed", "ema_alpha": 0.5}, SLAController, {"alpha": 0.5, "window_batches": None}),
        ({"sla_controller": "corrected", "window_batches": 7}, CorrectedSLAController, {"window_batches": 7}),
    ],
)
def test_the_server_builds_the_named_controller_with_its_averaging(settings, kind, averaging):
    """``corrected`` is the default; ``seed`` builds seed 001's controller; ema_alpha (default
    0.2), window_batches, eps_d_s and the memory window reach the objects that use them."""
    memory = MemoryLimitConfig(capacity_tokens=1000, window_batches=3)
    config = BatchServerConfig(service=SPEC, dynamic=DynamicBatchingConfig(d_sla_s=4.0, memory=memory, **settings))
    _, _, server = serve(config, [0.0], [1.0])
    controller = server.sizer.controller
    assert type(controller) is kind
    assert {name: getattr(controller, name) for name in averaging} == averaging
    assert controller.eps_d_s == pytest.approx(0.4)
    assert server.sizer.memory_window_batches == 3


def test_the_controller_names_match_the_config():
    """The names the config accepts are exactly the built-in controllers."""
    assert set(SLA_CONTROLLER_KINDS) == set(SLA_CONTROLLERS)


def test_memory_capacity_follows_from_device_figures():
    """eta = (M_max - M_model) / kv_bytes_per_token, whole tokens (seed 001 §2.2)."""
    memory = MemoryLimitConfig(gpu_memory_gb=80.0, model_memory_gb=16.0, kv_bytes_per_token=131072.0)
    assert memory.eta_tokens == 64_000_000_000 // 131072


def test_eps_defaults_to_a_tenth_of_the_target():
    """Without eps_d_s the controller's band is 10 % of D_SLA."""
    assert DynamicBatchingConfig(d_sla_s=4.0).tolerance_s == pytest.approx(0.4)


# --- service models ------------------------------------------------------------------
def test_sampled_service_times_come_from_the_stream_in_order():
    """Sampled sizes are the distribution's draws from the replica's stream, in arrival order;
    negative draws count as 0."""
    model = SampledServiceTimes(distribution=Uniform(low=1.0, high=3.0), rng=np.random.default_rng(9))
    sizes = [model.size(_request(i)) for i in range(5)]
    assert sizes == Uniform(low=1.0, high=3.0).sample(np.random.default_rng(9), 4096)[:5].tolist()
    negative = SampledServiceTimes(distribution={"type": "normal", "params": {"mean": -5.0, "std_dev": 0.1}})
    assert negative.size(_request(0)) == 0.0


def test_linear_model_follows_the_seed_formula():
    """base + a * max_seq_len * (1 + beta (n - 1) / n), with a request's size its prompt plus output."""
    model = LinearBatchModel(base_s=0.5, seq_len_coeff_s=0.01, batch_penalty=2.0)
    reqs = [_request(0, 100, 50), _request(1, 300, 100), _request(2, 10, 10)]
    sizes = [model.size(r) for r in reqs]
    assert sizes == [150.0, 400.0, 20.0]
    assert model.batch_time_s(reqs, sizes) == pytest.approx(0.5 + 0.01 * 400 * (1 + 2.0 * 2 / 3))


def test_latency_model_batches_prefill_every_prompt_then_decode_the_whole_batch():
    """A static batch on a latency model: one prefill step of all prompts, then
    (longest output - 1) decode steps of the full batch."""
    latency = BlisLinearLatency.from_params({"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": 2})
    model = LatencyModelBatches(latency=latency)
    reqs = [_request(0, 100, 5), _request(1, 200, 40), _request(2, 50, 12)]
    sizes = [model.size(r) for r in reqs]
    expected = latency.step_time_s(350, 0) + 39 * latency.step_time_s(0, 3)
    assert model.batch_time_s(reqs, sizes) == pytest.approx(expected)


# --- bins and batches -------------------------------------------------------------------
def test_equal_mass_boundaries_come_from_the_warm_up_sample_and_rebin_the_waiting():
    """With a warm-up of 8, the 1/4, 2/4, 3/4 quantiles of the first 8 predicted sizes are the
    boundaries; until then every request queues in bin 0, and those still waiting move to their bins."""
    config = BatchServerConfig(service=SPEC, bins=BinsConfig(count=4, warmup_requests=8), batch_size=100)
    sizes = [8.0, 1.0, 7.0, 2.0, 6.0, 3.0, 5.0, 4.0, 0.5, 9.0]
    requests, _, server = serve(config, [0.0] * 10, sizes)
    assert server.queue.boundaries == tuple(np.quantile(sizes[:8], [0.25, 0.5, 0.75]).tolist())
    assert [r.bin for r in requests] == [3, 0, 3, 0, 2, 1, 2, 1, 0, 3]
    assert server.queue.queue_lengths == [3, 2, 2, 3]


def test_a_partial_batch_forms_only_for_an_idle_server():
    """With B = 3 and max_wait_s = 1: two lone requests leave together after waiting 1 s; while
    the server is busy an overdue bin waits, and is served before a fuller but younger bin forms."""
    config = BatchServerConfig(service=SPEC, bins=BinsConfig(count=1), batch_size=3, max_wait_s=1.0)
    requests, _, _ = serve(config, [0.0, 0.2, 1.5, 1.6, 1.7, 1.8], [4.0, 1.0, 2.0, 1.0, 1.0, 1.0])
    starts = [r.first_scheduled_s for r in requests]
    ends = [r.completion_s for r in requests]
    assert starts[:2] == [1.0, 1.0] and ends[:2] == [5.0, 5.0]  # partial batch of 2, after 1 s
    assert starts[2:5] == [5.0, 5.0, 5.0] and ends[2:5] == [7.0, 7.0, 7.0]  # full batch formed at 1.7
    assert starts[5] == 7.0 and ends[5] == 8.0  # alone and overdue when the server frees


def test_without_max_wait_a_partial_bin_waits_forever():
    """The theory's setting: requests that never make up a full batch are still waiting at the end."""
    config = BatchServerConfig(service=SPEC, bins=BinsConfig(count=1), batch_size=3)
    requests, _, server = serve(config, [0.0, 0.1, 0.2, 0.3], [1.0] * 4)
    assert [math.isnan(r.completion_s) for r in requests] == [False, False, False, True]
    assert [r.id for r in server.in_flight()] == [3]


def test_dynamic_batches_stop_before_the_memory_limit():
    """The dynamic batcher cuts a batch before the request whose predicted KV tokens would
    take it over the limit, and drops a request that alone exceeds it (reason memory)."""
    memory = MemoryLimitConfig(capacity_tokens=1000, safety_fraction=0.0)
    config = BatchServerConfig(
        service=SPEC, dynamic=DynamicBatchingConfig(d_sla_s=5.0, b_min=8, b_max=8, memory=memory)
    )
    prompts = [100, 300, 300, 300, 100, 1200]
    requests, recorder, server = serve(config, [0.0, 0.1, 0.1, 0.1, 0.1, 0.1], [1.0] * 6,
                                       prompt_tokens=prompts, output_tokens=[100] * 6)
    assert requests[5].dropped_reason == "memory"
    batches = [(size, mem) for _r, _i, _b, size, _f, _s, _e, _t, _m, _l, mem in recorder.batches]
    assert batches == [(1, 200), (2, 800), (2, 600)]
    assert server.kv.peak_used_blocks == 800


def test_noisy_predictions_can_overflow_the_memory_and_the_summary_counts_it():
    """The limit is enforced on predicted tokens: with noisy predictions a batch may hold more,
    and summary()["batch_servers"][...]["memory"]["overflows"] counts those batches."""
    data = {
        "seed": 2,
        "workload": {"aggregate_rate": 100.0, "num_requests": 400, "clients": [{
            "id": "c", "arrival": {"process": "poisson"},
            "input_distribution": {"type": "constant", "params": {"value": 100}},
            "output_distribution": {"type": "exponential", "params": {"mean": 100}}}]},
        "serving": {"batch_server": {
            "service": {"kind": "linear", "params": {"base_s": 0.1, "seq_len_coeff_s": 0.001}},
            "bins": {"predictor": {"kind": "noisy", "sigma": 1.0, "seed": 1}},
            "dynamic": {"d_sla_s": 100.0, "b_max": 64, "memory": {"capacity_tokens": 4000, "safety_fraction": 0.0}}}},
    }
    results = Simulation(scenario_from_dict(data)).run()
    memory = results.summary()["batch_servers"]["0"]["memory"]
    frame = results.batches()
    assert memory["overflows"] == int((frame["memory_tokens"] > 4000).sum()) > 0
    assert memory["peak_tokens"] == frame["memory_tokens"].max() > memory["limit_tokens"] == 4000


def test_bin_selection_longest_queue_takes_the_fullest_bin():
    """Dynamic batching with longest_queue batches from the bin holding the most requests."""
    config = BatchServerConfig(
        service=SPEC, bins=BinsConfig(count=2, boundaries=(2.0,)),
        dynamic=DynamicBatchingConfig(d_sla_s=5.0, b_min=8, b_max=8, bin_selection=PolicySpec(kind="longest_queue")),
    )
    # The first request starts alone; meanwhile bin 1 gets 3 requests and bin 0 gets 2.
    _requests, recorder, _ = serve(config, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5], [1.0, 1.0, 3.0, 3.0, 1.0, 3.0])
    assert [b[2] for b in recorder.batches] == [0, 1, 0]
    assert [b[3] for b in recorder.batches] == [1, 3, 2]


# --- SLA and controller figures of the summary ------------------------------------------------
def _two_length_fleet(d_sla_s: float | None) -> dict:
    """A fixed B = 1 server with the linear service (0.1 s + 0.01 s per token of the longest
    sequence): a short client's requests (100 tokens) take 1.1 s, a long client's (300) 3.1 s."""
    server = {"service": {"kind": "linear", "params": {"base_s": 0.1, "seq_len_coeff_s": 0.01}}, "batch_size": 1}
    if d_sla_s is not None:
        server["d_sla_s"] = d_sla_s
    clients = [
        {"id": name, "rate_fraction": share, "arrival": {"process": "poisson"},
         "input_distribution": {"type": "constant", "params": {"value": tokens // 2}},
         "output_distribution": {"type": "constant", "params": {"value": tokens // 2}}}
        for name, share, tokens in (("short", 0.7, 100), ("long", 0.3, 300))
    ]
    return {"seed": 4, "workload": {"aggregate_rate": 0.2, "num_requests": 400, "clients": clients},
            "serving": {"batch_server": server}}


def test_a_fixed_b_server_reports_its_violation_rate_against_its_d_sla():
    """With ``d_sla_s`` a fixed-B server's summary judges its batches like a dynamic batcher's:
    at 2 s every long request (3.1 s) misses and no short one (1.1 s) does, so the violation
    rate is the long client's share of the completed requests, counted from the records."""
    results = Simulation(scenario_from_dict(_two_length_fleet(2.0))).run()
    frame = results.to_dataframe()
    done = frame[frame.status == "completed"]
    sla = results.summary()["batch_servers"]["0"]["sla"]
    assert sla["d_sla_s"] == 2.0
    assert sla["violation_rate"] == (done.client_id == "long").sum() / len(done)
    assert 0.2 < sla["violation_rate"] < 0.4


def test_a_fixed_b_server_without_a_target_reports_no_violation_rate():
    """Without ``d_sla_s`` there is nothing to judge a fixed-B server's batches against: the
    target and the rate are None (not 0)."""
    results = Simulation(scenario_from_dict(_two_length_fleet(None))).run()
    assert results.summary()["batch_servers"]["0"]["sla"] == {"d_sla_s": None, "violation_rate": None}


def test_convergence_is_the_start_of_the_first_window_in_the_settled_band():
    """The settled target is the median of the last W targets; convergence_s is the start of
    the first W consecutive batches all within max(10 %, 1) of it. A short early visit to
    the band does not count.

    Targets: 20 for 3 batches, 40 for 5, then 19, 20, 21 repeating 20 times; batch i starts at
    10 i s. The last 50 are 20, 21 and 16 more rounds: sixteen 19s, seventeen 20s and 21s, so
    their median is 20 and the band 18 to 22. The first three batches are in it but only the
    window from batch 8 (80 s) holds 50."""
    targets = np.array([20] * 3 + [40] * 5 + [19, 20, 21] * 20, dtype=float)
    stats = _controller_stats(targets, 10.0 * np.arange(targets.size))
    assert CONVERGENCE_WINDOW_BATCHES == 50
    assert stats == {"final_b_target": 21, "settled_b_target": 20.0, "convergence_s": 80.0}


def test_a_target_that_never_stays_in_its_band_has_not_settled():
    """Targets alternating 10 and 30: the median of the last 50 is 20, no target lies within 2
    of it, so there is a settled value but no convergence time; with fewer than W batches
    there is neither."""
    targets = np.array([10, 30] * 40, dtype=float)
    stats = _controller_stats(targets, np.arange(targets.size, dtype=float))
    assert stats == {"final_b_target": 30, "settled_b_target": 20.0, "convergence_s": None}
    short = _controller_stats(targets[:49], np.arange(49, dtype=float))
    assert short == {"final_b_target": 10, "settled_b_target": None, "convergence_s": None}


def test_the_cli_table_shows_each_servers_sla_miss_and_settled_target():
    """``simpy-llm run``'s batch-server table gives the static server its violation rate and
    the dynamic one its settled target with the time it settled (or "unsettled")."""
    import copy

    from simpy_llm.cli import _batch_server_table

    results = Simulation(load_scenario("scenarios/dynamic_only.yaml", {"workload.num_requests": 3000})).run()
    servers = results.summary()["batch_servers"]

    def rows(data):
        table = _batch_server_table(data, results.replica_groups, "t")
        columns = [list(column.cells) for column in table.columns]
        return {name: [cells[i] for cells in columns] for i, name in enumerate(data)}

    controller = servers["0"]["controller"]
    dynamic, static = rows(servers)["0"], rows(servers)["1"]
    assert dynamic[-1] == f"{controller['settled_b_target']:g} ({controller['convergence_s']:.0f} s)"
    assert static[-1] == "-" and static[6] == f"{servers['1']['sla']['violation_rate']:.1%}"
    unsettled = copy.deepcopy(servers)
    unsettled["0"]["controller"]["convergence_s"] = None
    assert rows(unsettled)["0"][-1] == f"{controller['settled_b_target']:g} (unsettled)"


# --- in a fleet ----------------------------------------------------------------------------
def test_continuous_and_batch_replicas_share_one_scenario():
    """A fleet may mix a continuous-batching group and a batch-server group on one latency
    model; both serve their share, and only the batch server has batch records."""
    results = Simulation(load_scenario("scenarios/continuous_vs_static.yaml", {"workload.num_requests": 600})).run()
    frame = results.to_dataframe()
    assert frame.groupby("replica_group")["status"].apply(lambda s: (s == "completed").sum()).to_dict() == {
        "continuous": 300, "static": 300,
    }
    assert set(results.batches()["replica_group"]) == {"static"}
    assert (frame.loc[frame.replica_group == "continuous", "bin"] == -1).all()


def test_a_token_listener_needs_continuous_batching():
    """Per-token streaming (the emulated server's token listener) is refused for batch servers."""
    with pytest.raises(ValueError, match="continuous-batching"):
        Simulation(load_scenario("scenarios/multi_bin_only.yaml"), token_listener=lambda *a: None)


def test_the_emulated_server_refuses_batch_servers():
    """The emulated server streams per-token timing, which a batch server has not: a scenario
    with one is a scenario error naming the group."""
    from simpy_llm.observe.emulate.server import EmulatedServer

    with pytest.raises(ScenarioError, match=r"batch servers \(static\)"):
        EmulatedServer(load_scenario("scenarios/continuous_vs_static.yaml"))


def test_same_seed_gives_identical_batch_records(tmp_path):
    """Two runs of one scenario and seed write byte-identical records and batches."""
    paths = []
    for name in ("a", "b"):
        scenario = load_scenario("scenarios/multi_bin_dynamic.yaml", {"workload.num_requests": 2000})
        paths.append(Simulation(scenario).run().save(tmp_path / name))
    for f in ("records.csv", "batches.csv", "summary.json"):
        assert (paths[0] / f).read_bytes() == (paths[1] / f).read_bytes()


def test_a_batch_server_scenario_builds_from_a_dict():
    """scenario_from_dict accepts a batch server with a sampled service and oracle bins."""
    data = {
        "workload": {"aggregate_rate": 1.0, "num_requests": 10, "clients": [{
            "id": "c", "arrival": {"process": "poisson"},
            "input_distribution": {"type": "constant", "params": {"value": 10}},
            "output_distribution": {"type": "constant", "params": {"value": 10}}}]},
        "serving": {"batch_server": {"service": {"kind": "sampled", "params": {"distribution": {"type": "constant", "params": {"value": 0.5}}}},
                                     "bins": {"predictor": {"kind": "noisy", "sigma": 0.2}}, "batch_size": 2}},
    }
    scenario = scenario_from_dict(data)
    assert scenario.serving.batch_server.bins.predictor == OutputPredictor(kind="noisy", sigma=0.2)
    assert Simulation(scenario).run().summary()["requests"]["completed"] == 10


def test_per_bin_queue_lengths_add_up_to_the_sampled_queue():
    """The bins' time-weighted mean queue lengths (from the records) add up to the mean of the
    server's queue length sampled every 0.5 s, within 2 %."""
    scenario = load_scenario(
        "scenarios/dynamic_only.yaml",
        {"workload.num_requests": 3000, "simulation.timeseries_interval_s": 0.5,
         "serving.replica_groups.0.batch_server.bins": {"count": 3, "boundaries": [300.0, 600.0]}},
    )
    results = Simulation(scenario).run()
    by_bin = results.summary()["batch_servers"]["0"]["by_bin"]
    samples = results.timeseries()
    sampled = samples.loc[samples.replica == 0, "waiting"].mean()
    assert len(by_bin) == 3 and min(b["mean_queue_length"] for b in by_bin.values()) > 0
    assert sum(b["mean_queue_length"] for b in by_bin.values()) == pytest.approx(sampled, rel=0.02)


def test_latency_model_batches_carry_the_models_request_overheads():
    """On the latency_model service a request enters its bin after the model's queueing time
    and reaches the client output_tokens * output_token_overhead_s after its batch ends."""
    results = Simulation(load_scenario("scenarios/continuous_vs_static.yaml", {"workload.num_requests": 400})).run()
    frame = results.to_dataframe()
    static = frame[frame.replica_group == "static"]
    latency = BlisLinearLatency.from_params({"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": 2})
    assert latency.output_token_overhead_s > 0
    queueing = static.prompt_tokens.map(latency.queueing_time_s)
    assert np.allclose(static.enqueue_s - static.arrival_s, queueing, rtol=1e-9, atol=1e-12)
    batches = results.batches().set_index("start_s")["end_s"]
    ends = static.first_scheduled_s.map(batches)
    assert np.allclose(static.completion_s, ends + static.output_tokens * latency.output_token_overhead_s, rtol=1e-12)
    assert (static.first_token_s == static.completion_s).all()


def test_a_batch_server_with_a_latency_model_shows_routers_a_comparable_capacity():
    """With a latency model a batch server's default capacity is decode tokens per second of a
    full batch, as a continuous engine's; without one it is 1."""
    from simpy_llm.serving.fleet import plan_fleet

    plans = plan_fleet(load_scenario("scenarios/continuous_vs_static.yaml").serving)
    latency = plans[1].latency
    assert plans[1].capacity == pytest.approx(16 / latency.step_time_s(0, 16))
    assert plans[0].capacity == pytest.approx(64 / latency.step_time_s(0, 64))
    assert plan_fleet(load_scenario("scenarios/multi_bin_only.yaml").serving)[0].capacity == 1.0
