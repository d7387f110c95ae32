"""The server's scraped time series against the replay's state at the same instants: reading the
scrapes, sampling the simulation at the scrape times, the MAE per series, and the report's table
and plots.

The trace is two requests sent together at t = 1 s to a one-slot server (``max_num_seqs: 1``,
KV blocks of 16 tokens, 10 of them) whose batch_table model takes 2 ms + 1 ms per prompt token
for a prefill step and 10 ms per decode step. By hand: request A (32 prompt tokens, 10 output)
prefills over [1.000, 1.034] s, then decodes its other 9 tokens until 1.124 s, while B waits; B
(48 prompt tokens, 6 output) prefills over [1.124, 1.174] s and decodes until 1.224 s. During a
prefill the KV cache holds the prompt's blocks: 2 of 10 for A (0.2), 3 of 10 for B (0.3).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from simpy_llm import scenario_from_dict
from simpy_llm.calibrate import compare, simulated_observation
from simpy_llm.calibrate.report import write_report
from simpy_llm.calibrate.timeseries import scraped_series
from simpy_llm.config import ScenarioError
from simpy_llm.workload.traces import read_trace_v2, write_trace_v2

MODEL = {"kind": "batch_table", "params": {"decode_step_us": [10000.0], "prefill_token_us": 1000.0, "prefill_step_us": 2000.0}}

# Scrape times and what the simulation holds then (module docstring), with the "scraped" values.
TIMES = [0.5, 1.02, 1.10, 1.15, 1.20, 3.0]
SIM_RUNNING = [0, 1, 1, 1, 1, 0]
SIM_WAITING = [0, 1, 1, 0, 0, 0]
SCRAPED_RUNNING = [0, 1, 2, 1, 1, 0]  # one off by 1: MAE 1/6
SCRAPED_WAITING = [0, 1, 1, 1, 0, 0]  # one off by 1: MAE 1/6
KV_TIMES = [0.5, 1.02, 1.15, 3.0]  # idle, A's prefill, B's prefill, idle
SIM_KV = [0.0, 0.2, 0.3, 0.0]
SCRAPED_KV = [0.0, 0.25, 0.3, 0.0]  # one off by 0.05: MAE 0.0125


def _observed(tmp_path: Path) -> Path:
    """The two-request trace of the module docstring, as an observer would have written it."""
    arrivals = pd.DataFrame({"request_id": [0, 1], "arrival_time_us": [1_000_000, 1_000_000],
                             "input_tokens": [32, 48], "output_tokens": [10, 6]})
    write_trace_v2(arrivals, tmp_path / "in")
    scenario = scenario_from_dict({
        "seed": 1,
        "workload": {"traces": [{"path": str(tmp_path / "in.csv")}]},
        "serving": {"engine": {"max_num_seqs": 1, "kv_block_size": 16, "kv_num_blocks": 10, "max_num_batched_tokens": 128,
                               "prefix_caching": False}, "latency_model": MODEL},
    })
    simulated_observation(scenario, tmp_path / "obs" / "trace")
    return tmp_path / "obs"


def _scrapes(names: tuple[str, str, str]) -> list[tuple[float, str, str, float | None, str]]:
    running, waiting, kv = names
    rows: list[tuple[float, str, str, float | None, str]] = []
    for t, r, w in zip(TIMES, SCRAPED_RUNNING, SCRAPED_WAITING, strict=True):
        rows += [(t, running, "", float(r), ""), (t, waiting, "", float(w), ""), (t, "llamacpp:n_decode_total", "", 7.0, "")]
    rows += [(t, kv, "", v, "") for t, v in zip(KV_TIMES, SCRAPED_KV, strict=True)]
    rows.append((2.0, "", "", None, "ClientConnectorError: refused"))  # a failed scrape: no value
    return rows


def _with_metrics(obs: Path, rows: list[tuple[float, str, str, float | None, str]]) -> Path:
    frame = pd.DataFrame(rows, columns=["time_s", "metric", "labels", "value", "error"])
    frame.to_csv(obs / "metrics.csv", index=False)
    header = yaml.safe_load((obs / "trace.yaml").read_text())
    header["metrics_file"] = "metrics.csv"
    (obs / "trace.yaml").write_text(yaml.safe_dump(header))
    return obs


@pytest.fixture(scope="module")
def calibration(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("ts")
    obs = _with_metrics(_observed(tmp), _scrapes(("llamacpp:requests_processing", "llamacpp:requests_deferred",
                                                  "llamacpp:kv_cache_usage_ratio")))
    return obs, compare(obs, n_resamples=50)


def test_the_trace_is_the_hand_counted_one(calibration) -> None:
    """The observed trace has the token times the module docstring counts by hand."""
    obs, _ = calibration
    f = read_trace_v2(obs / "trace").frame.set_index("request_id")
    assert f.loc[0, "first_token_time_us"] == 1_034_000 and f.loc[0, "last_chunk_time_us"] == 1_124_000
    assert f.loc[1, "first_token_time_us"] == 1_174_000 and f.loc[1, "last_chunk_time_us"] == 1_224_000


def test_each_series_is_the_simulated_state_at_the_scrape_times(calibration) -> None:
    """The report's running batch, queue depth and KV use hold, at each successful scrape, the
    scraped value and the state the hand count gives; the MAE is the mean absolute difference
    (1/6, 1/6 and 0.0125), in the series' unit."""
    _, cal = calibration
    ts = cal.report.timeseries
    assert list(ts) == ["queue_depth", "running_batch", "kv_usage"]
    running, waiting, kv = ts["running_batch"], ts["queue_depth"], ts["kv_usage"]
    assert (running["scraped_metric"], running["simulated_column"]) == ("llamacpp:requests_processing", "running")
    assert (waiting["scraped_metric"], kv["scraped_metric"]) == ("llamacpp:requests_deferred", "llamacpp:kv_cache_usage_ratio")
    assert running["time_s"] == TIMES and running["observed"] == SCRAPED_RUNNING and running["simulated"] == SIM_RUNNING
    assert waiting["simulated"] == SIM_WAITING and kv["time_s"] == KV_TIMES
    assert kv["simulated"] == pytest.approx(SIM_KV, abs=1e-12)
    assert running["n"] == waiting["n"] == 6 and kv["n"] == 4
    assert running["mae"] == pytest.approx(1 / 6) and waiting["mae"] == pytest.approx(1 / 6)
    assert kv["mae"] == pytest.approx(0.05 / 4)
    assert running["observed_mean"] == pytest.approx(5 / 6) and running["simulated_mean"] == pytest.approx(4 / 6)


def test_sampling_at_the_scrapes_leaves_the_replay_unchanged(tmp_path: Path, calibration) -> None:
    """The same trace compared without its metrics file gives the same requests, to the bit, and
    no time series."""
    _, cal = calibration
    plain = compare(_observed(tmp_path), n_resamples=50)
    pd.testing.assert_frame_equal(plain.requests, cal.requests)
    assert plain.report.timeseries == {}


def test_the_report_writes_the_table_and_a_plot_per_series(tmp_path: Path, calibration) -> None:
    """write_report puts the MAE per series into report.json and report.md and draws
    timeseries_<series>.png for each."""
    import json

    _, cal = calibration
    paths = write_report(cal.report, cal.samples, tmp_path)
    names = {p.name for p in paths}
    assert {"timeseries_queue_depth.png", "timeseries_running_batch.png", "timeseries_kv_usage.png"} <= names
    assert json.loads((tmp_path / "report.json").read_text())["timeseries"]["running_batch"]["mae"] == pytest.approx(1 / 6)
    md = (tmp_path / "report.md").read_text()
    assert "| running_batch | `llamacpp:requests_processing` | `running` | 6 | 0.167 | 0.833 | 0.667 |" in md
    assert "- [timeseries_kv_usage.png](timeseries_kv_usage.png)" in md


def test_label_sets_are_summed_for_counts_and_averaged_for_the_kv_fraction() -> None:
    """A metric with one series per replica (vLLM's engine label, the emulated server's): the
    running and waiting counts are summed over them, the KV fraction averaged; a vLLM name wins
    over llama.cpp's; failed scrapes are left out."""
    frame = pd.DataFrame(
        [(1.0, "vllm:num_requests_running", 'engine="0"', 1.0, ""), (1.0, "vllm:num_requests_running", 'engine="1"', 2.0, ""),
         (1.0, "llamacpp:requests_processing", "", 9.0, ""),
         (1.0, "vllm:kv_cache_usage_perc", 'engine="0"', 0.2, ""), (1.0, "vllm:kv_cache_usage_perc", 'engine="1"', 0.4, ""),
         (2.0, "", "", np.nan, "TimeoutError")],
        columns=["time_s", "metric", "labels", "value", "error"],
    )
    series = scraped_series(frame)
    assert sorted(series) == ["kv_usage", "running_batch"]
    assert series["running_batch"].metric == "vllm:num_requests_running" and series["running_batch"].value.tolist() == [3.0]
    assert series["kv_usage"].value.tolist() == pytest.approx([0.3])
    assert series["kv_usage"].time_s.tolist() == [1.0]


def test_a_metrics_file_without_known_series_or_missing_is_a_warning(tmp_path: Path) -> None:
    """A metrics file holding none of the series, or named but absent, is a report warning and no
    time series; one without the expected columns is an error naming the file."""
    obs = _with_metrics(_observed(tmp_path), [(1.0, "llamacpp:n_decode_total", "", 3.0, "")])
    warnings = compare(obs, n_resamples=50).report.warnings
    assert any("holds none of the series compared" in w for w in warnings)
    (obs / "metrics.csv").unlink()
    cal = compare(obs, n_resamples=50)
    assert cal.report.timeseries == {} and any("'metrics.csv', which is not beside it" in w for w in cal.report.warnings)
    (obs / "metrics.csv").write_text("when,what\n1,2\n")
    with pytest.raises(ScenarioError) as info:
        compare(obs, n_resamples=50)
    assert str(obs / "metrics.csv") in str(info.value) and "missing column(s) time_s, metric, value" in str(info.value)


def test_the_terminal_table_gives_each_series_mae(calibration) -> None:
    """report_table (simpy-llm calibrate's output) has a line per series with its MAE, the scrapes
    and the two means."""
    from rich.console import Console

    from simpy_llm.calibrate.report import report_table

    _, cal = calibration
    console = Console(record=True, width=220, color_system=None)
    console.print(report_table(cal.report))
    text = console.export_text()
    assert ("time series running_batch: MAE 0.167 over 6 scrapes (llamacpp:requests_processing against simulated "
            "running; means 0.833 and 0.667)") in text


def test_a_malformed_time_series_is_an_error_naming_it(calibration) -> None:
    """The report checks its time series: an unknown series name, or points that do not number n,
    raise naming the field and what is allowed."""
    import attrs

    _, cal = calibration
    running = cal.report.timeseries["running_batch"]
    with pytest.raises(ValueError, match=r"CalibrationReport.timeseries: unknown key\(s\) batch; allowed: queue_depth, running_batch, kv_usage"):
        attrs.evolve(cal.report, timeseries={"batch": running})
    with pytest.raises(ValueError, match=r"CalibrationReport.timeseries.running_batch: time_s, observed and simulated must be lists of n = 6"):
        attrs.evolve(cal.report, timeseries={"running_batch": {**running, "observed": running["observed"][:3]}})
