"""The HTML report's pages and figures, without a browser: what each holds, and that it needs no network."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from simpy_llm.cli import main
from simpy_llm.report import Page, Plot, Section, render_page
from simpy_llm.report.figures import cdf_figure, rate_curves_figure
from tests.report.conftest import EXPECTED_PLOTS, OBSERVED, ROOT

RUN = ["run", str(ROOT / "scenarios" / "quickstart.yaml"), "--set", "workload.num_requests=20", "--progress", "off"]
ROWS = [
    {"request_rate": 4.0, "ttft_p50_s": 0.4, "ttft_p99_s": 0.9, "e2e_p50_s": 3.0, "e2e_p99_s": 6.0},
    {"request_rate": 1.0, "ttft_p50_s": 0.1, "ttft_p99_s": 0.3, "e2e_p50_s": 1.5, "e2e_p99_s": 3.0},
]


@pytest.mark.parametrize("kind", sorted(EXPECTED_PLOTS))
def test_page_references_nothing_on_a_network(kind: str, pages: dict[str, Path]) -> None:
    """No script, stylesheet, image or frame of the page comes from http(s): plotly.js is inlined."""
    text = pages[kind].read_text(encoding="utf-8")
    tags = re.findall(r"<(?:script|link|img|iframe)\b[^>]*>", text, flags=re.IGNORECASE)
    assert tags and not [t for t in tags if re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", t, flags=re.IGNORECASE)]
    assert text.count("<script") >= len(EXPECTED_PLOTS[kind]) + 1  # the library once, then one per figure


@pytest.mark.parametrize("kind", sorted(EXPECTED_PLOTS))
def test_page_has_each_expected_figure_once(kind: str, pages: dict[str, Path]) -> None:
    """Each kind of page holds its figures' divs, each once, and plotly.js exactly once."""
    text = pages[kind].read_text(encoding="utf-8")
    for div_id in EXPECTED_PLOTS[kind]:
        assert text.count(f'id="{div_id}"') == 1, div_id
    assert text.count("plotly.js v") == 1


def test_compare_page_shows_the_reports_warnings_first(pages: dict[str, Path]) -> None:
    """The calibration page opens with its warnings box (before the first table), which holds the
    profile's fit warnings of this trace."""
    text = pages["compare"].read_text(encoding="utf-8")
    assert 0 < text.index('id="warnings"') < text.index("<table")
    assert "the profile&#x27;s fit warns" in text


def test_same_run_gives_byte_identical_page(tmp_path: Path) -> None:
    """The page holds no clock or random id: the same run written twice gives the same bytes."""
    for name in ("a", "b"):
        assert main([*RUN, "--html", str(tmp_path / f"{name}.html")]) == 0
    assert (tmp_path / "a.html").read_bytes() == (tmp_path / "b.html").read_bytes()


def test_report_of_a_run_directory_has_the_runs_figures(tmp_path: Path) -> None:
    """``simpy-llm report DIR`` on ``run --out DIR`` draws the same CDFs as ``run --html``; without
    sampling it says how to get the time series instead of drawing them."""
    assert main([*RUN, "--out", str(tmp_path / "run")]) == 0
    assert main(["report", str(tmp_path / "run"), "--html", str(tmp_path / "r.html")]) == 0
    text = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert all(f'id="run-cdf-{m}"' in text for m in ("ttft", "tpot", "e2e"))
    assert 'id="run-over-time"' not in text and "simulation.timeseries_interval_s" in text


def test_report_of_an_unknown_directory_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A directory that is no run, observe or compare output: exit 2, naming it and the files looked for; nothing written."""
    assert main(["report", str(ROOT / "scenarios"), "--html", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert "scenarios" in err and "report.json" in err and "trace.yaml" in err and "records.csv" in err
    assert not (tmp_path / "r.html").exists()


def test_unwritable_html_is_refused_before_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--html`` into a path under a file: exit 2 naming the option, and the run's --out is not written."""
    (tmp_path / "file").write_text("")
    assert main([*RUN, "--out", str(tmp_path / "out"), "--html", str(tmp_path / "file" / "r.html")]) == 2
    assert "--html" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_observe_page_of_a_trace_without_metrics_draws_no_server_series(tmp_path: Path) -> None:
    """An observed trace without metrics.csv gets every figure but the server's Prometheus series."""
    directory = tmp_path / "obs"
    directory.mkdir()
    for name in ("trace.csv", "summary.json"):
        (directory / name).write_bytes((OBSERVED / name).read_bytes())
    header = (OBSERVED / "trace.yaml").read_text(encoding="utf-8").replace("metrics_file: metrics.csv\n", "")
    (directory / "trace.yaml").write_text(header, encoding="utf-8")
    assert main(["report", str(directory), "--html", str(tmp_path / "o.html")]) == 0
    text = (tmp_path / "o.html").read_text(encoding="utf-8")
    assert 'id="observe-schedule"' in text and 'id="observe-prometheus"' not in text


def test_rate_curves_overlay_measured_and_predicted_in_rate_order() -> None:
    """With both row sets, TTFT and E2E each get p50 and p99 curves measured and predicted, at
    increasing rate whatever the rows' order."""
    fig = rate_curves_figure(ROWS, ROWS[:1])
    assert [t.name for t in fig.data] == [
        "TTFT p50, measured", "TTFT p99, measured", "TTFT p50, predicted", "TTFT p99, predicted",
        "E2E p50, measured", "E2E p99, measured", "E2E p50, predicted", "E2E p99, predicted",
    ]
    assert list(fig.data[0].x) == [1.0, 4.0] and list(fig.data[5].y) == [3.0, 6.0]
    assert list(fig.data[2].x) == [4.0]


def test_rate_curves_measured_only_has_no_predicted_curve() -> None:
    """Without predicted rows there are four curves, all measured."""
    assert [t.name.split(", ")[1] for t in rate_curves_figure(ROWS).data] == ["measured"] * 4


def test_rate_curves_leave_a_missing_percentile_out() -> None:
    """A latency given as None (no request completed at that rate) is a gap, not a zero."""
    rows = [dict(ROWS[0], ttft_p99_s=None), ROWS[1]]
    y = list(rate_curves_figure(rows).data[1].y)
    assert y[0] == 0.3 and y[1] != y[1]  # NaN: plotly leaves the point out


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"request_rate": 1.0}], "rows_measured[0]: missing key(s) ttft_p50_s, ttft_p99_s, e2e_p50_s, e2e_p99_s"),
        ([dict(ROWS[0], e2e_p99_s="slow")], "rows_measured[0].e2e_p99_s must be a finite number >= 0"),
        ([ROWS[0], dict(ROWS[1], request_rate=-1.0)], "rows_measured[1].request_rate must be a finite number >= 0"),
        ([dict(ROWS[0], request_rate=None)], "rows_measured[0].request_rate must be a finite number >= 0"),
        ([3.0], "rows_measured[0] must be a mapping"),
        ({"request_rate": 1.0}, "rows_measured must be a list of mappings"),
    ],
)
def test_rate_curves_refuse_bad_rows_naming_the_row_and_key(rows: object, message: str) -> None:
    """A bad row is refused with a message naming the row, the key and what is allowed."""
    with pytest.raises((ValueError, TypeError)) as info:
        rate_curves_figure(rows)  # type: ignore[arg-type]
    assert message in str(info.value)


def test_cdf_leaves_out_values_a_request_does_not_have() -> None:
    """NaN latencies (a request without a first token) are left out of the CDF and its count."""
    fig = cdf_figure("ttft_s", {"observed": [0.3, float("nan"), 0.1]})
    assert fig.data[0].name == "observed (2)" and list(fig.data[0].x) == [0.1, 0.3] and list(fig.data[0].y) == [0.5, 1.0]


def test_page_refuses_two_figures_with_one_id() -> None:
    """Two figures sharing a div id would draw into one: the page is refused, naming the id."""
    fig = cdf_figure("ttft_s", {"observed": [0.1]})
    page = Page("t", [Section("s", plots=[Plot("same", fig), Plot("same", fig)])])
    with pytest.raises(ValueError, match="repeated: same"):
        render_page(page)


def test_observe_html_against_the_emulated_server(tmp_path: Path) -> None:
    """``observe --html`` against ``simpy-llm serve`` (127.0.0.1, stopped by PID) writes the observed
    trace's page beside its files, with the schedule and the server's scraped series; the page is
    the one ``report DIR`` makes of the same directory."""
    from tests.observe.serve_process import serve_process

    scenario = ROOT / "scenarios" / "quickstart.yaml"
    out, page = tmp_path / "obs", tmp_path / "obs.html"
    with serve_process(scenario, tmp_path) as server:
        code = main(["observe", str(scenario), "--url", server.url, "--out", str(out), "--set", "workload.num_requests=8",
                     "--scrape-metrics", "--scrape-interval", "0.2", "--html", str(page)])
    assert code == 0 and server.returncode == 0
    text = page.read_text(encoding="utf-8")
    assert all(f'id="{div_id}"' in text for div_id in EXPECTED_PLOTS["observe"])
    assert main(["report", str(out), "--html", str(tmp_path / "again.html")]) == 0
    assert (tmp_path / "again.html").read_bytes() == page.read_bytes()
