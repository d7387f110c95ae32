"""Replaying an observed trace through a scenario and joining the two sides: the scenario a
header implies, warm-up and failure exclusion, replayed session content and prefix groups."""

from __future__ import annotations

import warnings
from pathlib import Path

import attrs
import numpy as np
import pandas as pd
import pytest
import yaml

from simpy_llm.calibrate import compare, scenario_from_trace, simulated_observation
from simpy_llm.calibrate.compare import observed_latencies
from simpy_llm.config import ScenarioError
from simpy_llm.config.errors import ScenarioWarning
from simpy_llm.loading import scenario_from_dict
from simpy_llm.workload.traces import read_trace_v2, write_trace_v2

MODEL = {"kind": "batch_table", "params": {"decode_step_us": [10000.0, 15000.0], "prefill_token_us": 1000.0, "prefill_step_us": 2000.0}}


def _chat_scenario(**changes):
    data = {
        "seed": 5,
        "workload": {"aggregate_rate": 0.5, "num_requests": 12, "clients": [{
            "id": "chat", "arrival": {"process": "poisson"}, "prefix_group": "sys", "prefix_length": 40,
            "input_distribution": {"type": "uniform", "params": {"low": 20, "high": 60}},
            "output_distribution": {"type": "uniform", "params": {"low": 5, "high": 20}},
            "multi_turn": {"max_rounds": 3, "think_time": {"type": "constant", "params": {"value": 1.0}}},
        }]},
        "serving": {"engine": {"preset": "llamacpp", "n_parallel": 2, "ctx_per_slot": 2048}, "latency_model": MODEL},
    }
    return scenario_from_dict(data).replace(**changes) if changes else scenario_from_dict(data)


def test_scenario_from_a_llamacpp_header_uses_the_preset():
    """A llama.cpp server block becomes the llamacpp preset with the block's settings, and the
    profile's latency model; without a profile the call names both ways out."""
    trace = read_trace_v2("tests/data/calibration/llamacpp_open_loop")
    s = scenario_from_trace(trace, profile={"latency_model": MODEL}, trace_csv="tests/data/calibration/llamacpp_open_loop/trace.csv")
    engine = s.serving.engine
    server = trace.header["server"]
    assert (engine.max_num_seqs, engine.max_model_len, engine.prefix_caching) == (
        server["n_parallel"], server["ctx_per_slot"], server["cache_prompt"]
    )
    assert engine.ubatch_tokens == server["n_ubatch"] and engine.prefill_breaks == (4 + server["n_ubatch"], 4)
    assert s.workload.traces[0].arrival_column == "send_time_us"
    with pytest.raises(ScenarioError, match="give a fitted profile"):
        scenario_from_trace(trace, trace_csv="x.csv")


def test_a_llamacpp_header_with_a_kv_stream_per_slot_replays_passes_by_slot():
    """The launcher's traces say ``kv_unified: false``: the replay cuts each step by slot, as
    that server did, and warns of nothing."""
    trace = read_trace_v2("tests/data/calibration/llamacpp_open_loop")
    assert trace.header["server"]["kv_unified"] is False and trace.header["server"]["n_parallel"] == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScenarioWarning)
        s = scenario_from_trace(trace, profile={"latency_model": MODEL}, trace_csv="tests/data/calibration/llamacpp_open_loop/trace.csv")
    assert s.serving.engine.ubatch_split == "by_slot"


@pytest.mark.parametrize("kv_unified", [None, "absent"])
def test_a_llamacpp_header_that_does_not_say_its_kv_layout_warns_and_assumes_one_cache(tmp_path, kv_unified):
    """Several slots and no ``kv_unified`` (null or absent): the replay assumes one KV cache
    (passes in order) and a ScenarioWarning says so, naming the trace and the key to give."""
    trace = read_trace_v2("tests/data/calibration/llamacpp_open_loop")
    server = dict(trace.header["server"])
    if kv_unified == "absent":
        del server["kv_unified"]
    else:
        server["kv_unified"] = None
    header = {**trace.header, "server": server}
    unknown = attrs.evolve(trace, header=header)
    with pytest.warns(ScenarioWarning, match=r"trace\.csv: the llama\.cpp server block does not say kv_unified.*server\.kv_unified"):
        s = scenario_from_trace(unknown, profile={"latency_model": MODEL}, trace_csv="tests/data/calibration/llamacpp_open_loop/trace.csv")
    assert s.serving.engine.ubatch_split == "simple"


def test_a_one_slot_llamacpp_header_needs_no_kv_layout():
    """With one slot the KV layout cannot change a step: no warning."""
    trace = read_trace_v2("tests/data/calibration/llamacpp_open_loop")
    header = {**trace.header, "server": {**trace.header["server"], "n_parallel": 1, "kv_unified": None}}
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScenarioWarning)
        s = scenario_from_trace(attrs.evolve(trace, header=header), profile={"latency_model": MODEL},
                                trace_csv="tests/data/calibration/llamacpp_open_loop/trace.csv")
    assert s.serving.engine.ubatch_split == "simple"


def test_scenario_from_an_emulated_header_is_the_emulated_serving_system(tmp_path):
    """The emulated server's block carries its whole serving section: the replay runs it."""
    s = _chat_scenario()
    simulated_observation(s, tmp_path / "t")
    replay = scenario_from_trace(tmp_path / "t")
    assert replay.serving.engine == s.serving.engine and replay.serving.latency_model == s.serving.latency_model
    assert replay.seed == s.seed


def test_scenario_from_a_vllm_header_maps_its_engine_keys(tmp_path):
    """vLLM's keys map to the engine's (block_size -> kv_block_size, enable_prefix_caching ->
    prefix_caching, ...)."""
    simulated_observation(_chat_scenario(), tmp_path / "t")
    header = yaml.safe_load((tmp_path / "t.yaml").read_text())
    header["server"] = {"type": "vllm", "max_num_seqs": 7, "block_size": 32, "max_model_len": 4096,
                        "max_num_batched_tokens": 1024, "enable_prefix_caching": False}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(header))
    e = scenario_from_trace(tmp_path / "t", profile={"latency_model": MODEL}).serving.engine
    assert (e.max_num_seqs, e.kv_block_size, e.max_model_len, e.max_num_batched_tokens, e.prefix_caching) == (7, 32, 4096, 1024, False)


def test_replayed_sessions_find_their_earlier_rounds_and_the_shared_prefix(tmp_path):
    """Replaying a multi-turn trace (its header naming the prefix group's length and seed),
    every request finds in the cache exactly what it found in the run that recorded it."""
    s = _chat_scenario()
    simulated_observation(s, tmp_path / "t")
    header = yaml.safe_load((tmp_path / "t.yaml").read_text())
    header.update(prefix_groups={"sys": 40}, seed=5)
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(header))
    cal = compare(tmp_path / "t", n_resamples=50)
    r = cal.requests
    assert (r["cached_tokens_observed"] > 40).sum() >= 10  # later rounds reuse their conversation
    assert (r["cached_tokens_observed"] == r["cached_tokens_simulated"]).all()
    assert all(m.mape == 0.0 for m in cal.metrics.values())


def test_without_the_session_content_a_replay_misses_the_cache(tmp_path):
    """The check above can fail: with the rounds' session ids blanked, the replay finds only
    the shared prefix and predicts later rounds too slow."""
    simulated_observation(_chat_scenario(), tmp_path / "t")
    trace = read_trace_v2(tmp_path / "t")
    frame = trace.frame.copy()
    frame["session_id"] = ""
    write_trace_v2(frame, tmp_path / "u", header={**trace.header, "prefix_groups": {"sys": 40}, "seed": 5})
    cal = compare(tmp_path / "u", n_resamples=50)
    assert (cal.requests["cached_tokens_simulated"] < cal.requests["cached_tokens_observed"]).sum() >= 10
    assert cal.metrics["ttft"].bias > 0


def test_warm_up_and_failed_requests_are_simulated_but_not_compared(tmp_path):
    """The header's warm-up and failed requests load the replayed server but are left out of
    the statistics, and counted; warm_up_s leaves out the first seconds too."""
    s = _chat_scenario(**{"workload.clients.0.multi_turn": None, "workload.num_requests": 30})
    simulated_observation(s, tmp_path / "t", warm_up_requests=4)
    trace = read_trace_v2(tmp_path / "t")
    frame = trace.frame.copy()
    frame.loc[frame.request_id.isin([10, 11]), "status"] = "error"
    write_trace_v2(frame, tmp_path / "u", header=trace.header)
    cal = compare(tmp_path / "u", n_resamples=50)
    summary = cal.report.request_summary
    assert (summary["excluded_warm_up"], summary["excluded_failed"], summary["calibrated"]) == (4, 2, 24)
    assert cal.metrics["e2e"].n == 24
    later = compare(tmp_path / "u", n_resamples=50, warm_up_requests=0, warm_up_s=20.0)
    sent = observed_latencies(trace)[0]["send_s"]
    early = int((sent - sent.min() < 20.0).sum())
    assert later.report.request_summary["excluded_warm_up"] == early


def test_the_measured_round_trip_is_added_to_the_simulated_latencies(tmp_path):
    """With network.measured_rtt_ms in the header, the simulated TTFT and E2E are one round
    trip longer; TPOT is unchanged."""
    simulated_observation(_chat_scenario(), tmp_path / "t")
    base = compare(tmp_path / "t", n_resamples=50).requests
    header = yaml.safe_load((tmp_path / "t.yaml").read_text())
    header["network"] = {"measured_rtt_ms": 7.0}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(header))
    shifted = compare(tmp_path / "t", n_resamples=50).requests
    assert np.allclose(shifted["ttft_simulated_s"] - base["ttft_simulated_s"], 0.007)
    assert np.allclose(shifted["e2e_simulated_s"] - base["e2e_simulated_s"], 0.007)
    pd.testing.assert_series_equal(shifted["tpot_simulated_s"], base["tpot_simulated_s"])


def _half_streamed(tmp_path: Path) -> Path:
    """A simulated observation whose requests are half streamed, half answered in one piece."""
    s = _chat_scenario(**{"workload.clients.0.multi_turn": None, "workload.clients.0.streaming": 0.5,
                          "workload.num_requests": 16})
    simulated_observation(s, tmp_path / "t")
    return tmp_path / "t"


def test_the_clients_bandwidth_adds_each_prompts_upload_and_answers_download(tmp_path):
    """With network {bandwidth_mbps: 8, bytes_per_token: 100} one token takes 100 B / 1 MB/s =
    0.1 ms each way. By hand: a streamed request's TTFT and E2E grow by its prompt's upload plus
    one token's download (tokens cross as they are made), so its TPOT is unchanged; a request
    answered in one piece has its E2E grow by the upload plus the whole answer's download."""
    trace = _half_streamed(tmp_path)
    base = compare(trace, n_resamples=50).requests.set_index("request_id")
    header = yaml.safe_load((tmp_path / "t.yaml").read_text())
    header["network"] = {"measured_rtt_ms": 0.0, "bandwidth_mbps": 8, "bytes_per_token": 100}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(header))
    cal = compare(trace, n_resamples=50)
    moved = cal.requests.set_index("request_id")
    streamed = base["streaming"].to_numpy(dtype=bool)
    assert streamed.any() and (~streamed).any()
    token_s = 100 / (8e6 / 8)
    upload = base["input_tokens"].to_numpy() * token_s
    ttft_shift = (moved["ttft_simulated_s"] - base["ttft_simulated_s"]).to_numpy()
    e2e_shift = (moved["e2e_simulated_s"] - base["e2e_simulated_s"]).to_numpy()
    assert np.allclose(ttft_shift[streamed], upload[streamed] + token_s, atol=1.5e-6)
    assert np.allclose(e2e_shift[streamed], upload[streamed] + token_s, atol=1.5e-6)
    assert np.allclose(e2e_shift[~streamed], upload[~streamed] + base["output_tokens"].to_numpy()[~streamed] * token_s, atol=1.5e-6)
    pd.testing.assert_series_equal(moved["tpot_simulated_s"], base["tpot_simulated_s"])
    # Two requests by hand: 0 is streamed with 71 prompt tokens (7.1 ms up, 0.1 ms down);
    # 1 is answered in one piece, 94 prompt and 6 output tokens (9.4 ms up, 0.6 ms down).
    assert (base.loc[0, "streaming"], base.loc[0, "input_tokens"]) == (True, 71)
    assert (base.loc[1, "streaming"], base.loc[1, "input_tokens"], base.loc[1, "output_tokens"]) == (False, 94, 6)
    assert moved.loc[0, "ttft_simulated_s"] - base.loc[0, "ttft_simulated_s"] == pytest.approx(0.0072, abs=1.5e-6)
    assert moved.loc[0, "e2e_simulated_s"] - base.loc[0, "e2e_simulated_s"] == pytest.approx(0.0072, abs=1.5e-6)
    assert moved.loc[1, "e2e_simulated_s"] - base.loc[1, "e2e_simulated_s"] == pytest.approx(0.0100, abs=1.5e-6)
    assert any("at 8 Mbit/s (100 bytes per token)" in x for x in cal.report.known_limitations)


def test_a_bad_network_block_is_an_error_naming_the_header_and_key(tmp_path):
    """A bandwidth that is not a positive number (or a bad bytes_per_token) stops the comparison
    with a ScenarioError naming the header file and each key path."""
    trace = _half_streamed(tmp_path)
    header = yaml.safe_load((tmp_path / "t.yaml").read_text())
    header["network"] = {"bandwidth_mbps": "fast", "bytes_per_token": -1}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(header))
    with pytest.raises(ScenarioError) as info:
        compare(trace, n_resamples=50)
    assert info.value.source == str(tmp_path / "t.yaml")
    assert info.value.paths == ["network.bandwidth_mbps", "network.bytes_per_token"]
    assert "must be a number > 0 (megabits per second, each way) or null, got 'fast'" in str(info.value)
