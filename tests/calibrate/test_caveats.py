"""The report's warnings about the observed run: a server without usage, a saturated load
generator (from the header's statistics, or from the rows of a trace without them), one prefix
group, too few requests, and a replay of the emulated server's own trace that a busy machine
put off its timing. Each test builds the situation in a trace and reads the report's warning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from simpy_llm import scenario_from_dict
from simpy_llm.calibrate import compare, simulated_observation
from simpy_llm.workload.traces import read_trace_v2, write_trace_v2

MODEL = {"kind": "batch_table", "params": {"decode_step_us": [10000.0, 15000.0], "prefill_token_us": 1000.0, "prefill_step_us": 2000.0}}
PROFILE = {"latency_model": MODEL}


def _scenario(num_requests: int = 40, groups: tuple[str | None, ...] = (None,)) -> Any:
    clients = []
    for i, group in enumerate(groups):
        client: dict[str, Any] = {
            "id": f"c{i}", "arrival": {"process": "poisson"},
            "input_distribution": {"type": "uniform", "params": {"low": 20, "high": 60}},
            "output_distribution": {"type": "uniform", "params": {"low": 5, "high": 20}},
        }
        if group is not None:
            client.update(prefix_group=group, prefix_length=10)
        clients.append(client)
    return scenario_from_dict({
        "seed": 5,
        "workload": {"aggregate_rate": 2.0, "num_requests": num_requests, "clients": clients},
        "serving": {"engine": {"preset": "llamacpp", "n_parallel": 2, "ctx_per_slot": 2048}, "latency_model": MODEL},
    })


def _trace(tmp_path: Path, scenario: Any = None, **header: Any) -> Path:
    """A simulated observation of *scenario* (default: 40 requests, no prefix group), with
    *header* entries added."""
    simulated_observation(scenario if scenario is not None else _scenario(), tmp_path / "t")
    if header:
        data = yaml.safe_load((tmp_path / "t.yaml").read_text())
        data.update(header)
        (tmp_path / "t.yaml").write_text(yaml.safe_dump(data))
    return tmp_path / "t"


def _rewrite(path: Path, change: Any) -> Path:
    """The trace at *path* with its frame changed by *change(frame)*, written beside it."""
    trace = read_trace_v2(path)
    frame = trace.frame.copy()
    change(frame)
    out = path.parent / "u"
    write_trace_v2(frame, out, header=trace.header)
    return out


def _warnings(path: Path, **kw: Any) -> list[str]:
    return compare(path, n_resamples=50, **kw).report.warnings


def test_a_clean_run_has_no_warning(tmp_path: Path) -> None:
    """40 requests sent on time, with usage, in no prefix group, replayed exactly: no warning."""
    assert _warnings(_trace(tmp_path)) == []


def test_answers_without_usage_are_warned_about(tmp_path: Path) -> None:
    """Answered requests whose server gave no usage (token sources `none` / `chunks`) are counted
    in a warning saying their token counts are the workload's; a failed one is not counted."""
    def no_usage(f: Any) -> None:
        f.loc[f.request_id.isin([3, 4]), "prompt_tokens_source"] = "none"
        f.loc[f.request_id.isin([4, 7]), "completion_tokens_source"] = "chunks"
        f.loc[f.request_id == 9, ["status", "prompt_tokens_source"]] = ["error", "none"]

    warnings = _warnings(_rewrite(_trace(tmp_path), no_usage))
    assert (
        "Server did not return usage metrics for 3 of 39 answered requests: their token counts are the workload's "
        "requested lengths, not the server's counts, and the replay uses them (less accurate)."
    ) in warnings


@pytest.mark.parametrize(
    ("stats", "expected"),
    [
        ({"requested_rate": 10.0, "achieved_rate": 10.0, "schedule_delay_p99_s": 0.05, "lagging": False, "concurrency": None},
         "the 99th percentile schedule delay 50 ms exceeds 10% of the mean inter-arrival time (100 ms)."),
        ({"requested_rate": 10.0, "achieved_rate": 8.5, "schedule_delay_p99_s": 0.001, "lagging": False, "concurrency": None},
         "the achieved send rate 8.5/s is 15% below the requested 10/s."),
        ({"requested_rate": 10.0, "achieved_rate": 10.0, "schedule_delay_p99_s": 0.001, "lagging": True,
          "lag_p50_s": 0.012, "lag_threshold_s": 0.01, "concurrency": None},
         "the client lagged (median lag 12.0 ms above its 10.0 ms threshold)."),
        ({"requested_rate": 10.0, "achieved_rate": 10.0, "schedule_delay_p99_s": 0.02, "lagging": False, "concurrency": 4},
         ("the 99th percentile schedule delay 20 ms exceeds 10% of the mean inter-arrival time (100 ms) (with a "
          "concurrency limit of 4, the delays include waiting for a free slot).")),
    ],
)
def test_a_saturated_load_generator_is_warned_about_from_the_header(tmp_path: Path, stats: dict[str, Any], expected: str) -> None:
    """The header's load_generator statistics: a p99 schedule delay above 10 % of the mean
    inter-arrival time (1 / requested rate), an achieved rate more than 10 % below the requested
    one, or a lagging client each make the saturation warning, which names the figures."""
    warnings = _warnings(_trace(tmp_path, load_generator=stats))
    found = [w for w in warnings if w.startswith("Load generator saturated: ")]
    assert len(found) == 1 and f"saturated: {expected}" in found[0]
    assert found[0].endswith("the comparison stands for the load that was sent.")


def test_a_load_generator_on_time_is_not_warned_about(tmp_path: Path) -> None:
    """Statistics within the thresholds (p99 delay 9 ms against 10 ms, 5 % below the rate) give
    no saturation warning."""
    stats = {"requested_rate": 10.0, "achieved_rate": 9.5, "schedule_delay_p99_s": 0.009, "lagging": False, "concurrency": None}
    assert not [w for w in _warnings(_trace(tmp_path, load_generator=stats)) if w.startswith("Load generator")]


def test_a_trace_without_statistics_is_judged_by_its_rows(tmp_path: Path) -> None:
    """A trace written before the header held the load statistics still loads; the delays come
    from its rows: one request sent 0.5 s after its target is the 99th percentile of 40 delays
    (the 40th smallest), far above 10 % of the mean inter-arrival time."""
    path = _trace(tmp_path)
    frame = read_trace_v2(path).frame
    gap_ms = (frame.arrival_time_us.max() - frame.arrival_time_us.min()) / 39 / 1e3

    def late(f: Any) -> None:
        for column in ("send_time_us", "first_chunk_time_us", "first_token_time_us", "last_chunk_time_us", "done_time_us"):
            f.loc[f.request_id == 20, column] += 500_000

    warnings = _warnings(_rewrite(path, late))
    assert "load_generator" not in read_trace_v2(tmp_path / "u").header
    expected = f"the 99th percentile schedule delay 500 ms exceeds 10% of the mean inter-arrival time ({gap_ms:.3g} ms)"
    assert any(w.startswith(f"Load generator saturated: {expected}") for w in warnings), warnings


def test_all_requests_in_one_prefix_group_are_warned_about(tmp_path: Path) -> None:
    """Every request in prefix group 'sys': a warning naming the group; two clients of which one
    has no group: none."""
    one = _warnings(_trace(tmp_path / "a", _scenario(groups=("sys",))))
    assert (
        "All requests are in one prefix group ('sys'): the server's prefix cache is heavily used, and its hit rates "
        "may differ from the simulator's where the server evicts at other times."
    ) in one
    mixed = _warnings(_trace(tmp_path / "b", _scenario(groups=("sys", None))))
    assert not [w for w in mixed if "prefix group" in w]


def test_fewer_than_30_requests_compared_are_warned_about(tmp_path: Path) -> None:
    """A trace of 12 requests: the seed's report-wide warning with the count; each metric's
    comparison says so too."""
    cal = compare(_trace(tmp_path, _scenario(num_requests=12)), n_resamples=50)
    assert "Insufficient requests for statistical significance (N < 30): 12 requests compared." in cal.report.warnings
    assert any("N < 30" in w for w in cal.metrics["e2e"].warnings)


def test_a_replay_of_the_emulated_server_off_by_more_than_its_timing_error(tmp_path: Path) -> None:
    """The emulated server's own trace (header server type `emulated`), replayed on the serving
    system it reports, with every answer received 20 ms later than simulated (a busy machine):
    the 90th percentile error of 20 ms exceeds the emulator's 5 ms and the report says so. Given a
    profile (another latency model), the errors are the model's and nothing is said."""
    def busy(f: Any) -> None:
        for column in ("first_chunk_time_us", "first_token_time_us", "last_chunk_time_us", "done_time_us"):
            f[column] += 20_000

    path = _rewrite(_trace(tmp_path), busy)
    assert read_trace_v2(path).header["server"]["type"] == "emulated"
    assert (
        "Replay of the emulated server's own trace: the 90th percentile of |simulated - observed| is 20.0 ms for E2E "
        "and 20.0 ms for TTFT, above the 5 ms the emulator keeps on an idle machine. The machine was busy while the "
        "trace was recorded: these errors measure that, not the model."
    ) in _warnings(path)
    assert not [w for w in _warnings(path, profile=PROFILE) if "emulated" in w]


def test_the_load_statistics_are_in_the_reports_trace_part(tmp_path: Path) -> None:
    """The header's load_generator block is carried into the report's trace part and report.md's
    summary; a trace without one has null there."""
    from simpy_llm.calibrate.report import write_report

    stats = {"requested_rate": 2.0, "achieved_rate": 2.0, "schedule_delay_p99_s": 0.001, "lagging": False, "concurrency": 3}
    cal = compare(_trace(tmp_path / "a", load_generator=stats), n_resamples=50)
    assert cal.report.trace["load_generator"] == stats
    write_report(cal.report, cal.samples, tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith("- Load generator: "))
    assert sorted(line.removeprefix("- Load generator: ").split(", ")) == sorted(
        ["requested_rate=2.0", "achieved_rate=2.0", "schedule_delay_p99_s=0.001", "lagging=False", "concurrency=3"])
    assert compare(_trace(tmp_path / "b"), n_resamples=50).report.trace["load_generator"] is None
