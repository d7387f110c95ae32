"""The load generator spread over worker processes (``observe(..., workers=N)``) against the
emulated server: the partition of the schedule, the one trace it writes, the concurrency
limit held over the whole run, and the saturation flag of the header's statistics."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pandas as pd
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from simpy_llm import scenario_from_dict
from simpy_llm.cli import main
from simpy_llm.observe.emulate import EmulatedServer
from simpy_llm.observe.loadgen import LoadRequest, saturation
from simpy_llm.observe.run import observe
from simpy_llm.observe.workers import partition, split_limit
from simpy_llm.workload.traces import read_trace_v2
from tests.observe.emulate.conftest import SLOW
from tests.observe.fake_thread import in_thread

TIMING = [
    "send_time_us", "first_chunk_time_us", "last_chunk_time_us", "first_byte_time_us",
    "first_token_time_us", "done_time_us", "itl_us",
]
"""The trace columns measured on the client's clock: the only ones two runs may differ in."""


def _fast() -> dict[str, Any]:
    """:data:`SLOW` with room for every request at once and 1 ms steps (answers at once)."""
    data = copy.deepcopy(SLOW)
    data["serving"]["engine"] = {"max_num_seqs": 512, "max_num_batched_tokens": 65536, "kv_block_size": 16,
                                 "kv_num_blocks": 65536}
    data["serving"]["latency_model"]["params"] = {k: 0.0 for k in data["serving"]["latency_model"]["params"]}
    data["serving"]["latency_model"]["params"]["beta0_us"] = 1000.0
    return data


def _workload(tmp_path: Path, n: int, rate: float, name: str = "workload.yaml") -> Path:
    """A bare workload spec of *n* requests at *rate* per second: a streamed and a non-streamed client."""
    data = {
        "version": "1",
        "seed": 11,
        "aggregate_rate": rate,
        "num_requests": n,
        "clients": [
            {"id": "chat", "arrival": {"process": "poisson"},
             "input_distribution": {"type": "uniform", "params": {"low": 20, "high": 60}},
             "output_distribution": {"type": "uniform", "params": {"low": 3, "high": 8}}},
            {"id": "plain", "arrival": {"process": "poisson"}, "streaming": False,
             "input_distribution": {"type": "constant", "params": {"value": 30}},
             "output_distribution": {"type": "constant", "params": {"value": 4}}},
        ],
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def slow_server() -> Iterator[EmulatedServer]:
    """The emulated server of :data:`SLOW` (2 replicas of 4 sequences) on 127.0.0.1, in a thread."""
    with in_thread(lambda: EmulatedServer(scenario_from_dict(SLOW))) as server:
        yield server


@pytest.fixture(scope="module")
def runs(slow_server: EmulatedServer, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The same workload observed with 1 and with 3 workers."""
    tmp = tmp_path_factory.mktemp("workers")
    spec = _workload(tmp, 30, 60.0)
    out = {}
    for workers in (1, 3):
        out[workers] = tmp / f"w{workers}"
        observe(spec, slow_server.url, out[workers], workers=workers)
    return out


def _rows(run: Path) -> pd.DataFrame:
    return read_trace_v2(run / "trace").frame.sort_values("request_id").reset_index(drop=True)


@given(
    sessions=st.lists(st.one_of(st.none(), st.sampled_from("abcde")), max_size=60),
    workers=st.integers(1, 8),
)
def test_the_partition_places_every_request_exactly_once(sessions: list[str | None], workers: int) -> None:
    """partition() puts every request in exactly one worker's list, keeps the schedule's order
    within each list, and keeps every session's requests in one worker."""
    reqs = [LoadRequest(i, i * 0.01, 8, 2, fields={} if s is None else {"session_id": s}) for i, s in enumerate(sessions)]
    parts = partition(reqs, workers)
    assert len(parts) == workers
    ids = [r.request_id for part in parts for r in part]
    assert sorted(ids) == list(range(len(reqs)))
    for part in parts:
        assert [r.request_id for r in part] == sorted(r.request_id for r in part)
    where = {r.fields["session_id"]: {i for i, p in enumerate(parts) if r in p} for r in reqs if "session_id" in r.fields}
    assert all(len(w) == 1 for w in where.values())


@given(workers=st.integers(1, 16), extra=st.integers(0, 100))
def test_a_concurrency_limit_is_split_into_shares_adding_up_to_it(workers: int, extra: int) -> None:
    """split_limit() gives every worker at least one slot, shares differing by at most one, adding up to the limit."""
    limit = workers + extra
    shares = [s for s in split_limit(limit, workers) if s is not None]
    assert len(shares) == workers and sum(shares) == limit
    assert min(shares) >= 1 and max(shares) - min(shares) <= 1


def test_a_limit_below_the_workers_is_refused() -> None:
    """observe() refuses more workers than concurrency slots, naming both, before anything is sent."""
    with pytest.raises(ValueError, match=r"workers \(4\) must not exceed concurrency \(3\)"):
        observe("unused.yaml", "http://127.0.0.1:9", "unused", workers=4, concurrency=3)


def test_every_request_is_recorded_exactly_once(runs: dict[int, Path]) -> None:
    """With 3 workers the trace has one row per request of the schedule, every id once, all answered."""
    rows = _rows(runs[3])
    assert list(rows.request_id) == list(range(30))
    assert set(rows.status) == {"ok"}


def test_the_trace_is_the_one_worker_trace_up_to_timing(runs: dict[int, Path]) -> None:
    """With 3 workers the trace holds the same rows as with one (ids, targets, identity columns,
    the server's token counts, chunk counts, outcomes): only the client-clock columns differ."""
    one, three = _rows(runs[1]).drop(columns=TIMING), _rows(runs[3]).drop(columns=TIMING)
    pd.testing.assert_frame_equal(one, three)


def test_the_header_records_the_workers(runs: dict[int, Path]) -> None:
    """The header's load settings and load_generator statistics name the workers; the
    statistics count every request as sent."""
    header = read_trace_v2(runs[3] / "trace").header
    assert header["load"]["workers"] == 3
    stats = header["load_generator"]
    assert (stats["workers"], stats["requests"], stats["sent"], stats["stopped"]) == (3, 30, 30, False)


def test_the_concurrency_limit_holds_over_all_workers(slow_server: EmulatedServer, tmp_path: Path) -> None:
    """concurrency=3 over 2 workers (shares 2 and 1): the server never has more than 3 of the
    run's requests between their arrival and their last token."""
    spec = _workload(tmp_path, 24, 200.0)
    before = len(slow_server.served)
    observe(spec, slow_server.url, tmp_path / "run", workers=2, concurrency=3)
    served = slow_server.served[before:]
    assert len(served) == 24
    events = sorted([(s.arrival_s, 1) for s in served] + [(s.completion_s, -1) for s in served])
    in_flight = peak = 0
    for _, step in events:  # at equal times an end (-1) sorts before an arrival
        in_flight += step
        peak = max(peak, in_flight)
    assert peak <= 3


def test_an_impossible_rate_is_flagged_as_saturating_the_generator(tmp_path: Path) -> None:
    """300 requests asked within a millisecond from 2 workers: the header's statistics say the
    generator saturated, with the achieved rate short of the requested one among the reasons."""
    spec = _workload(tmp_path, 300, 1e6)
    with in_thread(lambda: EmulatedServer(scenario_from_dict(_fast()))) as server:
        summary = observe(spec, server.url, tmp_path / "run", workers=2)
    stats = read_trace_v2(tmp_path / "run" / "trace").header["load_generator"]
    assert summary.status_counts == {"ok": 300}
    assert stats["saturated"] is True and summary.saturated
    assert "achieved rate" in stats["saturation_reason"]


def test_under_a_concurrency_limit_slot_waits_do_not_count_as_saturation() -> None:
    """With a concurrency limit the client lag is judged, not the schedule delay (slot waits
    included) nor the rate; open loop judges the schedule delay and the rate."""
    judged = {"delay_p99_s": 0.5, "lag_p99_s": 0.001, "requested_rate": 100.0, "achieved_rate": 10.0, "threshold_s": 0.01}
    assert saturation(**judged, limited=True) is None
    assert saturation(**judged, limited=False) == (
        "schedule delay p99 500.0 ms > 10.0 ms; achieved rate 10.0/s < 95% of the requested 100.0/s"
    )


def test_the_command_refuses_workers_with_sessions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """simpy-llm observe --workers 2 on a workload with multi-turn sessions exits 2 naming the option."""
    spec = _workload(tmp_path, 4, 10.0)
    data = yaml.safe_load(spec.read_text())
    data["clients"][0]["multi_turn"] = {"max_rounds": 2, "think_time": {"type": "constant", "params": {"value": 0.1}}}
    spec.write_text(yaml.safe_dump(data))
    code = main(["observe", str(spec), "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "o"), "--workers", "2"])
    assert code == 2
    assert "--workers 2: the workload's clients open closed-loop sessions" in capsys.readouterr().err


def test_load_requests_pass_through_the_partition_unchanged() -> None:
    """The requests a worker gets are the parent's own objects: same ids, targets and fields."""
    reqs = [LoadRequest(i, i * 0.5, 8, 2, fields={"client_id": "c"}) for i in range(4)]
    assert [attrs.astuple(r) for part in partition(reqs, 3) for r in part] == [
        attrs.astuple(reqs[i]) for i in (0, 3, 1, 2)
    ]
