"""The latency report of an observed run: hand-made records with hand-computed figures, the load
generator's summary, and what `simpy-llm observe` prints and writes."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from simpy_llm.cli import main
from simpy_llm.observe.client import ObservedRequest, OpenAIClient
from simpy_llm.observe.loadgen import LoadGenerator
from simpy_llm.observe.report import latency_report, latency_stats, latency_table
from tests.helpers import tiny_scenario
from tests.observe.fake_server import OK_TOKENS, serve
from tests.observe.fake_thread import fake_server_thread

EXACT = 1e-12
"""Tolerance of the float comparisons below: the figures are sums and interpolations of
binary fractions, exact but for the last bit of a division."""


def _ok(rid: int, sent: float, content: list[float], done: float, tokens: int, streaming: bool = True) -> ObservedRequest:
    return ObservedRequest(
        request_id=rid,
        streaming=streaming,
        status="ok",
        sent_s=sent,
        first_content_s=content[0] if content else None,
        content_times_s=list(content),
        done_s=done,
        completion_tokens=tokens,
        completion_tokens_source="usage",
    )


def _records() -> tuple[list[ObservedRequest], dict[int, str]]:
    """Eight requests; the comments give each one's TTFT, ITL gaps, TPOT and E2E."""
    recs = [
        _ok(0, 0.0, [0.125, 0.25, 0.5], 0.625, 3),  # a: .125, [.125 .25], .1875, .625
        _ok(1, 1.0, [1.5, 1.75], 2.0, 2),  # b: .5, [.25], .25, 1.0
        _ok(2, 2.0, [3.0], 3.0, 4, streaming=False),  # a: not streamed: E2E 1.0 only
        _ok(3, 3.0, [3.25], 3.5, 1),  # b: .25, no gap, no TPOT (one token), .5
        ObservedRequest(  # a: an error: left out of every statistic
            request_id=4, status="error", sent_s=4.0, first_content_s=4.125, content_times_s=[4.125, 4.25], done_s=4.5
        ),
        _ok(5, 5.0, [], 5.25, 0),  # b: streamed without content: E2E .25 only
        ObservedRequest(request_id=6, status="cancelled"),  # b: never sent
        _ok(7, 6.0, [6.25, 6.5, 7.0, 7.75], 7.75, 4),  # no client: .25, [.25 .5 .75], .5, 1.75
    ]
    return recs, {0: "a", 1: "b", 2: "a", 3: "b", 4: "a", 5: "b", 6: "b"}


def _check(stats: dict[str, Any], expected: dict[str, float | int]) -> None:
    assert stats.keys() == {"count", "mean", "p50", "p90", "p95", "p99"} | ({"requests"} if "requests" in expected else set())
    for key, value in expected.items():
        assert stats[key] == pytest.approx(value, abs=EXACT), key


def test_latency_report_over_the_whole_run() -> None:
    """TTFT, TPOT and ITL are over streamed answers with content only, E2E over every answered
    request; failed and never-sent requests count in `requests` only; percentiles interpolate
    linearly (figures computed by hand)."""
    recs, clients = _records()
    overall = latency_report(recs, clients)["latency_s"]
    assert (overall["requests"], overall["ok"]) == (8, 6)
    # TTFT .125 .25 .25 .5: p90 at rank 2.7 = .25 + .7 * .25
    _check(overall["ttft"], {"count": 4, "mean": 1.125 / 4, "p50": 0.25, "p90": 0.425, "p95": 0.4625, "p99": 0.4925})
    # TPOT .1875 .25 .5
    _check(overall["tpot"], {"count": 3, "mean": 0.9375 / 3, "p50": 0.25, "p90": 0.45, "p95": 0.475, "p99": 0.495})
    # ITL .125 .25 .25 .25 .5 .75 from 3 requests
    _check(
        overall["itl"],
        {"count": 6, "requests": 3, "mean": 2.125 / 6, "p50": 0.25, "p90": 0.625, "p95": 0.6875, "p99": 0.7375},
    )
    # E2E .25 .5 .625 1 1 1.75
    _check(overall["e2e"], {"count": 6, "mean": 5.125 / 6, "p50": 0.8125, "p90": 1.375, "p95": 1.5625, "p99": 1.7125})


def test_latency_report_per_client() -> None:
    """Each client's statistics are over its own requests; a request without a client counts
    in the whole run's figures only."""
    recs, clients = _records()
    by_client = latency_report(recs, clients)["latency_s_by_client"]
    assert list(by_client) == ["a", "b"]
    a, b = by_client["a"], by_client["b"]
    assert (a["requests"], a["ok"], b["requests"], b["ok"]) == (3, 2, 4, 3)
    _check(a["ttft"], {"count": 1, "mean": 0.125, "p50": 0.125, "p99": 0.125})
    _check(a["tpot"], {"count": 1, "mean": 0.1875, "p99": 0.1875})
    _check(a["itl"], {"count": 2, "requests": 1, "mean": 0.1875, "p50": 0.1875, "p90": 0.2375})
    _check(a["e2e"], {"count": 2, "mean": 0.8125, "p50": 0.8125, "p90": 0.9625})
    _check(b["ttft"], {"count": 2, "mean": 0.375, "p50": 0.375, "p90": 0.475})
    _check(b["tpot"], {"count": 1, "mean": 0.25})
    _check(b["itl"], {"count": 1, "requests": 1, "mean": 0.25})
    _check(b["e2e"], {"count": 3, "mean": 1.75 / 3, "p50": 0.5, "p90": 0.9})


def test_statistics_of_nothing_are_none() -> None:
    """With no value a statistic has count 0 and None everywhere else (JSON null)."""
    assert latency_stats([]) == {"count": 0, "mean": None, "p50": None, "p90": None, "p95": None, "p99": None}
    report = latency_report([ObservedRequest(request_id=0, status="error", sent_s=0.0, done_s=1.0)])
    assert report["latency_s"]["e2e"]["count"] == 0 and report["latency_s"]["itl"]["requests"] == 0
    assert report["latency_s_by_client"] == {}


def test_latency_table_shows_every_group_and_coverage() -> None:
    """The table lists the whole run, then each client (when there are several) with how many of
    its requests were answered, how many values each row covers, TTFT in milliseconds and E2E in
    seconds, within 80 columns."""
    recs, clients = _records()
    report = latency_report(recs, clients)
    out = io.StringIO()
    Console(file=out, width=80).print(latency_table(report["latency_s"], report["latency_s_by_client"], "observed"))
    lines = out.getvalue().splitlines()
    rows = [line.split() for line in lines]
    assert ["all", "TTFT", "ms", "4", "req", "281.2", "250.0", "425.0", "462.5", "492.5"] in rows  # mean .28125 s
    assert ["6/8", "ok", "TPOT", "ms", "3", "req", "312.5", "250.0", "450.0", "475.0", "495.0"] in rows
    assert ["ITL", "ms", "6", "gaps/3", "req", "354.2", "250.0", "625.0", "687.5", "737.5"] in rows
    assert ["E2E", "s", "6", "req", "0.854", "0.812", "1.375", "1.562", "1.713"] in rows
    assert ["a", "TTFT", "ms", "1", "req", *["125.0"] * 5] in rows and ["2/3", "ok", "TPOT", "ms", "1", "req", *["187.5"] * 5] in rows
    assert ["b", "TTFT", "ms", "2", "req", "375.0", "375.0", "475.0", "487.5", "497.5"] in rows
    assert ["3/4", "ok", "TPOT", "ms", "1", "req", *["250.0"] * 5] in rows
    assert max(map(len, lines)) <= 80


def _summary_of_fake_run() -> Any:
    rows = [
        {"request_id": i, "arrival_time_s": 0.0, "input_tokens": 5, "output_tokens": n, "streaming": s, "client_id": c}
        for i, (n, s, c) in enumerate(
            [(OK_TOKENS, True, "x"), (OK_TOKENS, True, "x"), (OK_TOKENS, True, "y"), (OK_TOKENS, False, "y"), (8, True, "y")]
        )
    ]

    async def go() -> Any:
        async with serve() as fake, OpenAIClient(fake.url, timeout_s=2.0) as client:
            return await LoadGenerator(client, rows, lag_threshold_s=1e9).run()

    return asyncio.run(go())


def test_run_summary_carries_the_latency_report() -> None:
    """The load generator's summary holds the report of its records: against the fake server
    (5 content chunks per streamed answer, a 429 for 8 tokens) TTFT and TPOT cover the three
    streamed answers, ITL their 12 gaps, E2E the four answers, per client too."""
    summary = _summary_of_fake_run()
    lat = summary.latency_s
    assert (lat["requests"], lat["ok"]) == (5, 4)
    assert (lat["ttft"]["count"], lat["tpot"]["count"], lat["e2e"]["count"]) == (3, 3, 4)
    assert (lat["itl"]["count"], lat["itl"]["requests"]) == (3 * (OK_TOKENS - 1), 3)
    x, y = summary.latency_s_by_client["x"], summary.latency_s_by_client["y"]
    assert (x["ttft"]["count"], x["e2e"]["count"], y["ttft"]["count"], y["e2e"]["count"]) == (2, 2, 1, 2)
    assert (y["requests"], y["ok"]) == (3, 2)


def _scenario_file(tmp_path: Path) -> Path:
    data = tiny_scenario()
    constant = {"type": "constant", "params": {"value": OK_TOKENS}}
    data["workload"] = {
        "aggregate_rate": 200.0,
        "num_requests": 6,
        "clients": [
            {"id": cid, "rate_fraction": 0.5, "arrival": {"process": "poisson"}, "streaming": streaming,
             "input_distribution": {"type": "constant", "params": {"value": 12}}, "output_distribution": constant}
            for cid, streaming in (("live", 1.0), ("batch", 0.0))
        ],
    }
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_observe_prints_and_writes_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`simpy-llm observe` prints the latency table and writes the report into summary.json:
    streamed clients have TTFT, the non-streamed one E2E only."""
    scenario = _scenario_file(tmp_path)
    with fake_server_thread() as fake:
        code = main(["observe", str(scenario), "--url", fake.url, "--out", str(tmp_path / "run"), "--timeout", "5"])
    out = capsys.readouterr().out
    assert code == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    lat, by = summary["latency_s"], summary["latency_s_by_client"]
    n_live = sum(1 for b in fake.bodies if b["stream"])
    assert 0 < n_live < 6 and lat["requests"] == lat["ok"] == 6
    assert lat["ttft"]["count"] == by["live"]["ttft"]["count"] == n_live and by["batch"]["ttft"]["count"] == 0
    assert by["batch"]["e2e"]["count"] == 6 - n_live and by["batch"]["ttft"]["p50"] is None
    assert lat["itl"]["count"] == n_live * (OK_TOKENS - 1)
    rows = [line.split() for line in out.splitlines()]
    first = next(i for i, r in enumerate(rows) if r[:1] == ["all"])
    assert "observed latency" in out and rows[first][:5] == ["all", "TTFT", "ms", f"{n_live}", "req"]
    assert rows[first + 1][:6] == ["6/6", "ok", "TPOT", "ms", f"{n_live}", "req"]
    assert rows[first + 2][:5] == ["ITL", "ms", f"{n_live * (OK_TOKENS - 1)}", f"gaps/{n_live}", "req"]
    assert ["live", "TTFT", "ms", f"{n_live}", "req"] in [r[:5] for r in rows]
    assert ["batch", "TTFT", "ms", "0", "req", "-", "-", "-", "-", "-"] in rows
