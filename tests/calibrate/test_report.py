"""The calibration report: its checks, report.json read back, report.md's content, the plots,
byte-identical rewrites, the terminal table, and the report without matplotlib."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from simpy_llm.calibrate.report import (
    KNOWN_LIMITATIONS,
    CalibrationReport,
    report_table,
    report_to_dict,
    throughput_comparison,
    write_report,
)
from simpy_llm.calibrate.stats import compare_metric

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _samples() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """TTFT around 100 ms (simulated 5 % high), ITL spanning three decades, E2E of seconds
    predicted 50 % low, TPOT without any pair."""
    rng = np.random.default_rng(42)
    ttft = rng.lognormal(np.log(0.1), 0.3, 300)
    itl = 10.0 ** rng.uniform(-4.0, -1.0, 2000)
    e2e = rng.lognormal(np.log(3.0), 0.4, 300)
    return {
        "ttft": (ttft, ttft * 1.05 * np.exp(rng.normal(0, 0.02, 300))),
        "itl": (itl, itl * np.exp(rng.normal(0, 0.05, 2000))),
        "tpot": (np.array([]), np.array([])),
        "e2e": (e2e, e2e * 0.5 * np.exp(rng.normal(0, 0.3, 300))),
    }


def _request_summary(**changes: int) -> dict[str, int]:
    base = {"total": 320, "ok": 310, "error": 5, "timeout": 3, "cancelled": 2,
            "excluded_warm_up": 10, "excluded_failed": 10, "calibrated": 300}
    return {**base, **changes}


def _report(samples: dict[str, Any] | None = None, **changes: Any) -> CalibrationReport:
    samples = samples if samples is not None else _samples()
    fields: dict[str, Any] = {
        "trace": {"path": "runs/real/trace.csv", "num_requests": 320, "duration_s": 64.5,
                  "server_config_provided": True, "server": {"max_num_seqs": 4, "engine": "llama.cpp"}},
        "request_summary": _request_summary(),
        "warm_up": {"requests": 10, "seconds": 5.0},
        "metrics": {m: compare_metric(m, o, s, seed=1, n_resamples=200) for m, (o, s) in samples.items()},
        "throughput": throughput_comparison(observed_output_tokens_per_s=120.0, simulated_output_tokens_per_s=90.0,
                                            observed_requests_per_s=4.8, simulated_requests_per_s=4.8),
        "config_match": {"matched": ["max_num_seqs=4"], "defaulted": ["kv_num_blocks (no server config)"]},
        "scenario": {"name": "quickstart", "latency_model": {"kind": "blis_linear", "params": {"beta0_us": np.float64(2000.0)}}},
        "warnings": ["The load generator fell behind its schedule."],
    }
    fields.update(changes)
    return CalibrationReport(**fields)


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[CalibrationReport, Path, list[Path]]:
    """The report of :func:`_report`, written once with its samples: (report, directory, paths)."""
    out = tmp_path_factory.mktemp("report")
    report = _report()
    return report, out, write_report(report, _samples(), out)


# --- report.json ------------------------------------------------------------------------------
def test_report_json_reads_back_with_every_part_and_the_comparisons_values(written):
    """report.json holds every part of the report; its values are the report's and the comparisons'."""
    report, out, _ = written
    data = json.loads((out / "report.json").read_text())
    assert list(data) == ["trace", "request_summary", "warm_up", "metrics", "throughput", "timeseries", "config_match",
                          "known_limitations", "scenario", "fit", "warnings"]
    assert data["timeseries"] == {}  # no scraped samples given
    assert data["trace"]["server"] == {"max_num_seqs": 4, "engine": "llama.cpp"}
    assert data["request_summary"] == _request_summary()
    assert list(data["metrics"]) == ["ttft", "itl", "tpot", "e2e"]
    ttft = report.metrics["ttft"]
    assert data["metrics"]["ttft"]["mape"] == ttft.mape
    assert data["metrics"]["ttft"]["mape_ci"] == list(ttft.mape_ci)
    assert data["metrics"]["e2e"]["bias_direction"] == "under-predict"
    assert data["metrics"]["tpot"]["n"] == 0 and data["metrics"]["tpot"]["rating"] is None
    assert data["throughput"]["output_tokens_per_s"]["relative_error"] == pytest.approx(-0.25)
    assert data["known_limitations"] == list(KNOWN_LIMITATIONS)
    assert data["scenario"]["latency_model"]["params"]["beta0_us"] == 2000.0
    assert data["fit"] is None
    assert data == report_to_dict(report)


def test_nan_in_free_form_data_becomes_null_and_numpy_numbers_plain_numbers(tmp_path):
    """JSON has no NaN: a NaN given in a free-form part is written as null; numpy numbers as numbers."""
    report = _report(fit={"r2": np.float32(0.5), "residual_s": float("nan"), "coef": np.array([1, 2])})
    write_report(report, {}, tmp_path)
    assert json.loads((tmp_path / "report.json").read_text())["fit"] == {"r2": 0.5, "residual_s": None, "coef": [1, 2]}


# --- report.md --------------------------------------------------------------------------------
def test_report_md_has_a_row_per_metric_with_its_figures_and_rating(written):
    """report.md's metrics table has each metric's row: n, p50s, MAPE with interval, rating."""
    report, out, _ = written
    md = (out / "report.md").read_text()
    table = md.split("## Metrics")[1].split("### Percentile errors")[0]
    rows = {line.split(" | ")[0][2:]: line for line in table.splitlines() if line.startswith("| ")}
    c = report.metrics["ttft"]
    assert rows["ttft"].startswith(f"| ttft | 300 | {c.observed.p50 * 1e3:.1f} ms | {c.simulated.p50 * 1e3:.1f} ms |")
    assert f"{c.mape * 100:.1f}% [{c.mape_ci[0] * 100:.1f}, {c.mape_ci[1] * 100:.1f}]" in rows["ttft"]
    assert rows["ttft"].endswith(f" | {c.rating} |")
    assert f"| e2e | 300 | {report.metrics['e2e'].observed.p50:.2f} s |" in md
    assert "under-predict" in rows["e2e"] and rows["e2e"].endswith(" | poor |")
    assert rows["tpot"].startswith("| tpot | 0 | - |")


def test_report_md_states_requests_warm_up_config_limitations_and_warnings(written):
    """report.md gives the request summary, warm-up, configuration match, every known
    limitation, the report's warnings and each metric's."""
    md = (written[1] / "report.md").read_text()
    assert "320 requests: 310 ok, 5 error, 3 timeout, 2 cancelled; left out 10 warm-up and 10 failed; 300 compared" in md
    assert "Warm-up left out: the first 10 requests and the first 5 s." in md
    assert "- Matched: `max_num_seqs=4`" in md and "- Defaulted: `kv_num_blocks (no server config)`" in md
    for limitation in KNOWN_LIMITATIONS:
        assert f"- {limitation}" in md
    assert "- The load generator fell behind its schedule." in md
    assert "- tpot: No valid pairs of tpot: nothing to compare." in md
    assert "| output tokens/s | 120.0 | 90.0 | -25.0% |" in md
    assert "kind: blis_linear" in md


def test_further_exclusion_counts_are_kept_and_shown(tmp_path):
    """An extra excluded_<reason> count is kept in request_summary and named in report.md."""
    report = _report(request_summary=_request_summary(excluded_no_usage=4, calibrated=296))
    write_report(report, {}, tmp_path)
    assert report.request_summary["excluded_no_usage"] == 4
    assert "left out 10 warm-up, 10 failed and 4 no usage; 296 compared" in (tmp_path / "report.md").read_text()


# --- plots ------------------------------------------------------------------------------------
def test_each_metric_with_data_gets_three_valid_png_plots(written):
    """qq_, cdf_ and scatter_<metric>.png are written for each metric with pairs (not for TPOT,
    which has none), are PNG files matplotlib reads back, and are listed in report.md."""
    import matplotlib.image

    _, out, paths = written
    plots = sorted(p.name for p in out.glob("*.png"))
    assert plots == sorted(f"{kind}_{m}.png" for kind in ("qq", "cdf", "scatter") for m in ("ttft", "itl", "e2e"))
    assert sorted(p.name for p in paths) == sorted(["report.json", "report.md", *plots])
    md = (out / "report.md").read_text()
    for name in plots:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE)
        image = matplotlib.image.imread(out / name)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
        assert f"[{name}]({name})" in md


def test_a_metric_without_samples_gets_its_qq_plot_only(tmp_path):
    """Without samples for a metric, its QQ plot (from the comparison) is drawn, but no CDF or scatter."""
    samples = _samples()
    write_report(_report(samples), {"ttft": samples["ttft"]}, tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [
        "cdf_ttft.png", "qq_e2e.png", "qq_itl.png", "qq_ttft.png", "scatter_ttft.png"]


def test_log_axes_only_when_values_span_more_than_two_decades(tmp_path, monkeypatch):
    """ITL (three decades) is plotted on log axes; TTFT and E2E (within two decades) on linear ones."""
    from matplotlib.axes import Axes

    calls: list[tuple[str, str]] = []
    original = Axes.set_xscale

    def record(self, value, **kwargs):
        calls.append((self.get_title().split(":")[0], value))
        return original(self, value, **kwargs)

    monkeypatch.setattr(Axes, "set_xscale", record)
    write_report(_report(), _samples(), tmp_path)
    logged = {title for title, value in calls if value == "log"}
    assert logged == {"ITL"}


def test_samples_for_a_metric_outside_the_report_are_an_error_and_nothing_is_written(tmp_path):
    """Samples naming a metric the report lacks raise ValueError before any file is written."""
    samples = _samples()
    report = _report({"ttft": samples["ttft"]})
    with pytest.raises(ValueError, match=r"itl.*not in the report; the report has: ttft"):
        write_report(report, samples, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_samples_that_are_not_the_compared_pairs_are_an_error(tmp_path):
    """Samples whose valid pairs differ in number from the comparison's n raise ValueError."""
    samples = _samples()
    report = _report({"ttft": samples["ttft"]})
    obs, sim = samples["ttft"]
    with pytest.raises(ValueError, match=r"299 valid pairs, but the report's comparison of ttft has n = 300"):
        write_report(report, {"ttft": (obs[:299], sim[:299])}, tmp_path)


# --- determinism ------------------------------------------------------------------------------
def test_the_same_report_written_twice_gives_byte_identical_files(written, tmp_path):
    """Two reports of the same inputs and seed, written to two directories, are byte for byte equal."""
    a = written[2]
    b = write_report(_report(), _samples(), tmp_path)
    assert [p.name for p in a] == [p.name for p in b]
    for pa, pb in zip(a, b, strict=True):
        assert pa.read_bytes() == pb.read_bytes(), pa.name


# --- without matplotlib -----------------------------------------------------------------------
def test_without_matplotlib_writing_a_report_fails_before_writing_anything(tmp_path, monkeypatch):
    """matplotlib is a dependency: with it not importable (a broken install) write_report raises
    ImportError and writes nothing, rather than a report without its plots."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError):
        write_report(_report(), _samples(), tmp_path / "out")
    assert not (tmp_path / "out").exists()


# --- terminal ---------------------------------------------------------------------------------
def test_report_table_renders_ratings_times_requests_and_limitations():
    """The rich table shows each metric with its rating word, times in ms below 1 s and in s
    above, then the request summary and the known limitations."""
    report = _report()
    console = Console(record=True, width=220, color_system=None)
    console.print(report_table(report))
    text = console.export_text()
    lines = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    for metric in ("ttft", "itl", "e2e"):
        assert report.metrics[metric].rating in lines[metric]
    assert f"{report.metrics['ttft'].observed.p50 * 1e3:.1f} ms" in lines["ttft"]
    assert f"{report.metrics['e2e'].observed.p50:.2f} s" in lines["e2e"]
    assert "300 compared" in text
    assert "limitation: Prefix cache divergence" in text and "limitation: Speculative decoding" in text


# --- checks on the report's parts ---------------------------------------------------------------
def test_known_limitations_always_come_first_and_a_callers_follow_once():
    """The standard limitations are stated even when the caller gives others, which follow, without repeats."""
    mine = "All clients share one prefix group: prefix-cache hit rates may be unrealistically high."
    report = _report(known_limitations=[mine, KNOWN_LIMITATIONS[1], mine])
    assert report.known_limitations == [*KNOWN_LIMITATIONS, mine]


def test_a_missing_request_count_is_an_error_naming_it_and_the_allowed_keys():
    """request_summary without ``ok`` raises ValueError naming the key and listing the allowed ones."""
    summary = _request_summary()
    del summary["ok"]
    with pytest.raises(ValueError, match=r"request_summary: missing key\(s\) ok; allowed: total, ok, error"):
        _report(request_summary=summary)


def test_request_counts_must_add_up():
    """ok + error + timeout + cancelled must equal total."""
    with pytest.raises(ValueError, match="ok \\+ error \\+ timeout \\+ cancelled = 320, but total = 321"):
        _report(request_summary=_request_summary(total=321))


def test_an_unknown_trace_key_is_an_error_listing_the_allowed_ones():
    """trace accepts path, num_requests, duration_s, server_config_provided, server, hardware, network only."""
    trace = {"path": "t.csv", "num_requests": 1, "duration_s": 1.0, "server_config_provided": False, "gpu": "A100"}
    with pytest.raises(ValueError, match="trace: unknown key\\(s\\) gpu; allowed: path, num_requests"):
        _report(trace=trace)


def test_a_comparison_filed_under_another_metric_is_an_error():
    """metrics["ttft"] must hold the TTFT comparison; an unknown metric name is refused."""
    samples = _samples()
    with pytest.raises(ValueError, match=r"metrics\.ttft holds the comparison of 'e2e'"):
        _report(metrics={"ttft": compare_metric("e2e", *samples["e2e"], n_resamples=20)})
    with pytest.raises(ValueError, match="unknown metric\\(s\\) latency; allowed: ttft, itl, tpot, e2e"):
        _report(metrics={"latency": compare_metric("e2e", *samples["e2e"], n_resamples=20)})


def test_free_form_parts_must_be_plain_data():
    """A scenario holding an object JSON cannot hold is refused, naming where it is."""
    with pytest.raises(TypeError, match=r"scenario\.engine: object is not plain data"):
        _report(scenario={"engine": object()})


def test_throughput_relative_error_is_relative_to_the_observed_rate():
    """relative_error = (simulated - observed) / observed; None when nothing was observed or a rate is unknown."""
    tp = throughput_comparison(observed_output_tokens_per_s=0.0, simulated_output_tokens_per_s=5.0,
                               observed_requests_per_s=2.0, simulated_requests_per_s=2.5)
    assert tp["output_tokens_per_s"]["relative_error"] is None
    assert tp["requests_per_s"] == {"observed": 2.0, "simulated": 2.5, "relative_error": 0.25}
    unknown = throughput_comparison(observed_output_tokens_per_s=1.0, simulated_output_tokens_per_s=None,
                                    observed_requests_per_s=None, simulated_requests_per_s=2.0)
    assert unknown["output_tokens_per_s"]["relative_error"] is None and unknown["requests_per_s"]["observed"] is None


def test_warm_up_of_zero_is_reported_as_none(tmp_path):
    """A warm-up of 0 requests and 0 s left nothing out: report.md says none."""
    write_report(_report(warm_up={"requests": 0, "seconds": 0.0}), {}, tmp_path)
    assert "Warm-up left out: none." in (tmp_path / "report.md").read_text()


def test_metrics_are_kept_in_the_reports_order():
    """Whatever order the caller gives, the report keeps the metrics in METRICS order."""
    samples = _samples()
    report = _report(metrics={m: compare_metric(m, *samples[m], n_resamples=20) for m in ("e2e", "ttft")})
    assert list(report.metrics) == ["ttft", "e2e"]


def test_write_report_creates_the_output_directory(tmp_path):
    """The output directory is created with its parents."""
    out = tmp_path / "deep" / "er"
    write_report(_report(), {}, out)
    assert (out / "report.json").is_file() and (out / "report.md").is_file()
    assert isinstance(json.loads((out / "report.json").read_text()), dict)
    assert Path(out / "report.md").read_text().startswith("# Calibration report\n")
