"""``simpy-llm bench run`` against the emulated server (``simpy-llm serve``) and the fake server.

Every check is on what the runs recorded: the server's token counts, the observer's own send
and end stamps (which request was in flight with which), the target times written for each
run, and the figures of bench.json recomputed from the traces; never on how long anything took.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from simpy_llm.cli import main
from simpy_llm.observe.bench.metrics import bench_metrics, read_rows
from simpy_llm.observe.bench.profiles import RunPlan, arrival_times
from simpy_llm.observe.bench.tokens import TokenCountWarning
from tests.observe.fake_thread import fake_server_thread
from tests.observe.serve_process import ServeProcess

pytestmark = pytest.mark.filterwarnings("ignore::simpy_llm.observe.bench.tokens.TokenCountWarning")


def _bench(*args: str) -> int:
    return main(["bench", "run", *args])


def _max_in_flight(trace: pd.DataFrame) -> int:
    """Most requests between their send and their end at once, by the observer's stamps."""
    events = sorted([(t, 1) for t in trace.send_time_us] + [(t, -1) for t in trace.done_time_us], key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def _trace(run_dir: Path) -> pd.DataFrame:
    return read_rows(run_dir)


def test_one_liner_writes_a_trace_summary_and_bench_files(emulated: ServeProcess, tmp_path: Path) -> None:
    """A command line without a YAML writes rate_0/ with the trace v2 and summary.json of an
    observe run, and bench.json / bench.csv whose figures are those of the trace; the server
    counted every prompt and answer as asked, and the header says how tokens were counted."""
    out = tmp_path / "b"
    code = _bench("--url", emulated.url, "--dataset", "synthetic", "--input-len", "40", "--output-len", "6",
                  "--num-prompts", "12", "--request-rate", "50", "--max-concurrency", "4", "--percentiles", "50,90,99",
                  "--goodput", "ttft:60000", "--out", str(out))
    assert code == 0
    run = out / "rate_0"
    assert {p.name for p in run.iterdir()} >= {"trace.yaml", "trace.csv", "summary.json", "workload.yaml", "requests.csv"}
    header = yaml.safe_load((run / "trace.yaml").read_text())
    assert header["token_counting"] == "words" and header["prompts"]["token_rule"] == "words"
    assert header["bench"] == {"profile": "poisson", "run": 0, "strategy": "poisson", "request_rate": 50.0,
                               "max_concurrency": 4, "dataset": "synthetic"}
    assert header["load"]["concurrency"] == 4
    trace = _trace(run)
    assert len(trace) == 12 and set(trace.status) == {"ok"}
    # The emulated server counts words as the benchmark did: its counts are the asked lengths.
    assert list(trace.input_tokens) == [40] * 12 and list(trace.output_tokens) == [6] * 12
    assert _max_in_flight(trace) <= 4
    result = json.loads((out / "bench.json").read_text())
    row = result["runs"][0]
    assert row == {**row, **bench_metrics(trace, percentiles=(50, 90, 99), goodput={"ttft": 60000})}
    assert (row["completed"], row["total_input_tokens"], row["total_output_tokens"]) == (12, 480, 72)
    assert row["request_goodput"] == row["request_throughput"]
    assert {"p50_ttft_ms", "p90_itl_ms", "p99_e2el_ms", "std_tpot_ms"} <= row.keys()
    with (out / "bench.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 and rows[0]["completed"] == "12" and rows[0]["strategy"] == "poisson"


def test_the_connection_cap_and_body_budget_reach_every_run(emulated: ServeProcess, tmp_path: Path) -> None:
    """``--max-connections`` and ``--prepare-bytes`` are the load generator's for each run: the
    trace header records them, and every request is sent and answered within the cap."""
    out = tmp_path / "b"
    code = _bench("--url", emulated.url, "--dataset", "synthetic", "--input-len", "20", "--output-len", "4",
                  "--num-prompts", "8", "--request-rate", "100", "--max-connections", "2", "--prepare-bytes", "0",
                  "--out", str(out))
    assert code == 0
    header = yaml.safe_load((out / "rate_0" / "trace.yaml").read_text())
    assert (header["load"]["max_connections"], header["load"]["prepare_bytes"]) == (2, 0)
    trace = _trace(out / "rate_0")
    assert len(trace) == 8 and set(trace.status) == {"ok"}


def test_synchronous_sends_one_request_at_a_time(emulated: ServeProcess, tmp_path: Path) -> None:
    """Each request of a synchronous run is sent only after the one before it ended."""
    out = tmp_path / "b"
    assert _bench("--url", emulated.url, "--dataset", "synthetic", "--input-len", "20", "--output-len", "4",
                  "--num-prompts", "8", "--profile", "synchronous", "--out", str(out)) == 0
    trace = _trace(out / "rate_0").sort_values("send_time_us")
    assert (trace.send_time_us.to_numpy()[1:] >= trace.done_time_us.to_numpy()[:-1]).all()


def test_concurrency_values_make_one_run_each_within_its_limit(emulated: ServeProcess, tmp_path: Path) -> None:
    """--profile concurrency with two values makes rate_0 and rate_1, each never above its limit,
    and the larger limit does have that many in flight (all are due at once)."""
    out = tmp_path / "b"
    assert _bench("--url", emulated.url, "--dataset", "synthetic", "--input-len", "20", "--output-len", "8",
                  "--num-prompts", "9", "--profile", "concurrency", "--max-concurrency", "1", "3", "--out", str(out)) == 0
    runs = json.loads((out / "bench.json").read_text())["runs"]
    assert [(r["strategy"], r["max_concurrency"], r["completed"]) for r in runs] == [("concurrency", 1, 9), ("concurrency", 3, 9)]
    assert [_max_in_flight(_trace(out / f"rate_{k}")) for k in (0, 1)] == [1, 3]


def test_sweep_runs_synchronous_throughput_then_rates_up_to_saturation(emulated: ServeProcess, tmp_path: Path) -> None:
    """A sweep makes the synchronous run, the throughput run, then --rates constant runs at rates
    evenly spaced from the first's request throughput to the second's, each sending its requests
    1 / rate apart (the targets written for it)."""
    out = tmp_path / "b"
    assert _bench("--url", emulated.url, "--dataset", "synthetic", "--input-len", "20", "--output-len", "4",
                  "--num-prompts", "10", "--profile", "sweep", "--rates", "3", "--max-concurrency", "4", "--out", str(out)) == 0
    runs = json.loads((out / "bench.json").read_text())["runs"]
    assert [r["strategy"] for r in runs] == ["synchronous", "throughput", "constant", "constant", "constant"]
    low, high = runs[0]["request_throughput"], runs[1]["request_throughput"]
    step = (high - low) / 3
    assert [r["request_rate"] for r in runs[2:]] == pytest.approx([low + step, low + 2 * step, high], rel=1e-12)
    for k, r in enumerate(runs):
        targets = pd.read_csv(out / f"rate_{k}" / "requests.csv").arrival_time_us.to_list()
        if k >= 2:
            assert targets == [round(i / r["request_rate"] * 1e6) for i in range(10)]
        else:
            assert targets == [0] * 10
        assert r["completed"] == 10


def test_sweep_with_poisson_arrivals_draws_seeded_gaps(emulated: ServeProcess, tmp_path: Path) -> None:
    """--sweep-arrivals poisson makes the rate runs Poisson: their targets are the seed's exponential gaps at the run's rate."""
    args = ["--url", emulated.url, "--dataset", "synthetic", "--input-len", "10", "--output-len", "2", "--num-prompts", "6",
            "--profile", "sweep", "--rates", "1", "--sweep-arrivals", "poisson", "--seed", "5"]
    assert _bench(*args, "--out", str(tmp_path / "a")) == 0
    runs = json.loads((tmp_path / "a" / "bench.json").read_text())["runs"]
    assert runs[2]["strategy"] == "poisson"
    targets = pd.read_csv(tmp_path / "a" / "rate_2" / "requests.csv").arrival_time_us.to_list()
    expected = arrival_times(RunPlan("poisson", rate=runs[2]["request_rate"]), 6, seed=5)
    assert targets == [round(t * 1e6) for t in expected] and len(set(targets)) == 6


def test_max_error_rate_stops_a_failing_run(tmp_path: Path) -> None:
    """Against a server answering 503 to every request, --max-error-rate stops the run: the
    stop reason is written and the requests not yet sent are cancelled."""
    out = tmp_path / "b"
    with fake_server_thread() as fake, pytest.warns(TokenCountWarning):
        # The fake server answers 503 to max_tokens 9.
        code = _bench("--url", fake.url, "--dataset", "synthetic", "--input-len", "5", "--output-len", "9",
                      "--num-prompts", "40", "--profile", "constant", "--request-rate", "20", "--max-error-rate", "0.5",
                      "--out", str(out))
    assert code == 0
    row = json.loads((out / "bench.json").read_text())["runs"][0]
    assert row["stop_reason"] == "max_error_rate" and row["completed"] == 0
    assert row["failed"] + row["cancelled"] == 40 and row["cancelled"] > 0
    assert row["errors"] == {"http_503": row["failed"]}


def test_max_seconds_stops_a_run_and_cancels_what_is_in_flight(tmp_path: Path) -> None:
    """Against a server that never answers, --max-seconds ends the run: every request is cancelled."""
    out = tmp_path / "b"
    with fake_server_thread() as fake, pytest.warns(TokenCountWarning):
        # The fake server holds max_tokens 10 for a minute before its first byte.
        code = _bench("--url", fake.url, "--dataset", "synthetic", "--input-len", "5", "--output-len", "10",
                      "--num-prompts", "4", "--profile", "throughput", "--max-seconds", "0.3", "--out", str(out))
    assert code == 0
    row = json.loads((out / "bench.json").read_text())["runs"][0]
    assert (row["stop_reason"], row["completed"], row["failed"], row["cancelled"]) == ("max_seconds", 0, 0, 4)


def test_a_prompt_file_is_sent_as_it_is(emulated: ServeProcess, tmp_path: Path) -> None:
    """--dataset FILE (ShareGPT JSON) sends the sampled first human turns unchanged and asks each
    reply's length: the server counts the prompt's words and generates the reply's."""
    sample = Path(__file__).parents[1] / "data" / "bench" / "sharegpt_sample.json"
    out = tmp_path / "b"
    assert _bench("--url", emulated.url, "--dataset", str(sample), "--num-prompts", "5", "--out", str(out)) == 0
    trace = _trace(out / "rate_0")
    assert len(trace) == 5 and set(trace.status) == {"ok"}
    assert (trace.input_tokens == trace.requested_input_tokens).all()
    assert (trace.output_tokens == trace.requested_output_tokens).all()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--profile", "synchronous", "--request-rate", "5"], "--request-rate is for --profile constant or poisson"),
        (["--goodput", "ttft=500"], "--goodput: 'ttft=500': give KEY:MILLISECONDS"),
        (["--percentiles", "50,abc"], "--percentiles: 'abc' is not a number"),
        (["--dataset", "sharegpt"], "--dataset sharegpt: no installable package ships ShareGPT V3 whole"),
        (["--prompt-field", "text"], "--prompt-field is for a prompt file, not --dataset random"),
    ],
)
def test_bad_options_exit_2_naming_the_option(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad or misplaced option exits with status 2 before anything is sent, saying which and why."""
    assert _bench("--url", "http://127.0.0.1:9", "--num-prompts", "2", *args) == 2
    assert message in capsys.readouterr().err
