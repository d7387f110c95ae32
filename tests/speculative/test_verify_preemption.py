"""Preemption inside a verify pass (``speculation.verify.preemption_slack_ms``) on a verify
server driven directly: hand-worked completion times of a long pass cut by an at-risk
job, the same scenario without preemption, and conservation (every job verified exactly
once to completion) over random arrivals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.entities import Request
from simpy_llm.metrics.recorder import Recorder
from simpy_llm.serving.latency import BlisLinearLatency
from simpy_llm.speculative.verify import VerifyServer
from simpy_llm.wire import Wire
from tests.spec_helpers import flat_curve, spec_scenario

BETA0_US, BETA2_US = 5000.0, 100.0
SLO: dict[str, tuple[float | None, float | None, float | None]] = {
    # class: (ttft_s, tpot_s, tvt_s)
    "none": (None, None, None),
    "urgent": (None, None, 0.008),
    "loose": (None, None, 1.0),
}


def pass_s(gamma: int) -> float:
    """A verify pass of one job of *gamma* drafts on blis_linear: a decode step of γ + 1 tokens."""
    return (BETA0_US + BETA2_US * (gamma + 1)) * 1e-6


class Accepts:
    """An acceptance model that accepts one draft, whatever it is asked."""

    def accepted_at(self, u: float, context: int, gamma: int, temperature: float | None) -> float:
        return 1.0

    def expected_tokens(self, context: int, gamma: int, temperature: float | None) -> float:
        return 2.0


class Drafter:
    acceptance = Accepts()


class Spec:
    """A request's speculative state as the server reads it: its drafter, and the end of
    each of its rounds (``settle_round``) in a shared log."""

    drafter = Drafter()
    plan = None  # plain chains of γ tokens (no tree or chained round)

    def __init__(self, log: list[tuple[int, float]]) -> None:
        self.log = log

    def settle_round(self, req: Request, gamma: int, accepted: float, rolled: bool, now: float, replica: int, fused: bool) -> int:
        self.log.append((req.id, now))
        req.generated_tokens += 1
        return 1


def server_with(tmp_path: Path, **verify: Any) -> tuple[simpy.Environment, VerifyServer, Recorder]:
    """An idle verify server on blis_linear (5 ms + 100 µs a token) with *verify* settings."""
    curve = flat_curve(tmp_path, [0.8, 0.7, 0.6, 0.5])
    data = spec_scenario(curve, speculation={"verify": verify})
    data["slo"] = {"default": {"tvt_s": 0.008}}  # a round deadline, so a preemption threshold loads; the server takes SLO below
    config = scenario_from_dict(data).speculation
    assert config is not None
    env = simpy.Environment()
    recorder = Recorder(num_replicas=1)
    server = VerifyServer(
        env, 0, Wire(env), BlisLinearLatency(beta0_us=BETA0_US, beta2_us=BETA2_US), recorder, config,
        kv_capacity_tokens=10**6, max_prefill_tokens=4096, rng=np.random.default_rng(0),
        fused_acceptance=None, slo=SLO, send_verdict=lambda r, t: None,
    )
    return env, server, recorder


def job(i: int, log: list[tuple[int, float]], slo_class: str) -> Request:
    """Request *i*, prefilled (one token made), with many tokens still to make."""
    req = Request(id=i, client_id="c0", prompt_tokens=100, output_tokens=10_000, arrival_s=0.0, slo_class=slo_class, generated_tokens=1)
    req.spec = Spec(log)  # type: ignore[assignment]  # the two members the server reads of a request's state
    return req


def submit_at(env: simpy.Environment, server: VerifyServer, at_s: float, req: Request, gamma: int) -> None:
    env.timeout(at_s).callbacks.append(lambda _ev: server.submit(req, gamma, env.now))


def long_and_urgent(tmp_path: Path, **verify: Any) -> tuple[dict[int, float], Request, Request, Recorder]:
    """Job 0 (no deadline) starts a 41-token pass at 0; job 1 (``tvt_s`` 8 ms, 5 tokens)
    arrives at 3 ms, its slack 8 - 5.5 = 2.5 ms. Returns each job's pass end."""
    env, server, recorder = server_with(tmp_path, **verify)
    log: list[tuple[int, float]] = []
    slow, urgent = job(0, log, "none"), job(1, log, "urgent")
    submit_at(env, server, 0.0, slow, 40)
    submit_at(env, server, 0.003, urgent, 4)
    env.run()
    assert sorted(i for i, _ in log) == [0, 1]  # each job verified once
    return dict(log), slow, urgent, recorder


def test_an_at_risk_job_cuts_a_long_pass_and_the_cut_pass_runs_again_whole(tmp_path):
    """With a 5 ms threshold the at-risk job's pass starts as it arrives and ends at
    arrival + its own pass time; the cut job's pass then runs again whole, ending at that
    + its full pass time (its 3 ms of work lost)."""
    ends, slow, urgent, recorder = long_and_urgent(tmp_path, preemption_slack_ms=5.0)
    assert ends[1] == 0.003 + pass_s(4)
    assert ends[0] == 0.003 + pass_s(4) + pass_s(40)
    assert slow.num_preemptions == 1 and urgent.num_preemptions == 0
    assert recorder.preemptions == [(0, 0, 0.003, "verify")]


def test_the_cut_work_counts_as_busy_time(tmp_path):
    """The server is busy 3 ms on the cut pass, then the urgent pass and the whole re-run."""
    _ends, _slow, _urgent, recorder = long_and_urgent(tmp_path, preemption_slack_ms=5.0)
    assert recorder.busy_s[0] == pytest.approx(0.003 + pass_s(4) + pass_s(40), rel=1e-12)
    assert recorder.steps[0] == 2  # passes that ended: the urgent one and the re-run


def test_without_preemption_the_pass_completes_first(tmp_path):
    """Off (the default): the long pass ends at its pass time, and the at-risk job's pass
    follows it."""
    ends, slow, _urgent, recorder = long_and_urgent(tmp_path)
    assert ends[0] == pass_s(40)
    assert ends[1] == pass_s(40) + pass_s(4)
    assert slow.num_preemptions == 0 and recorder.preemptions == []


def test_a_job_with_slack_above_the_threshold_waits(tmp_path):
    """A threshold below the arriving job's 2.5 ms slack: no cut, today's times."""
    ends, _slow, _urgent, recorder = long_and_urgent(tmp_path, preemption_slack_ms=2.0)
    assert ends[0] == pass_s(40) and ends[1] == pass_s(40) + pass_s(4)
    assert recorder.preemptions == []


def test_a_pass_holding_an_at_risk_job_is_not_cut(tmp_path):
    """When the running pass's own job is at risk too (slack below the threshold), the
    arriving at-risk job waits for it."""
    env, server, recorder = server_with(tmp_path, preemption_slack_ms=5.0)
    log: list[tuple[int, float]] = []
    submit_at(env, server, 0.0, job(0, log, "urgent"), 4)  # its slack at 3 ms: 8 - 3 - 5.5 < 5
    submit_at(env, server, 0.003, job(1, log, "urgent"), 4)
    env.run()
    assert log == [(0, pass_s(4)), (1, pass_s(4) + pass_s(4))]
    assert recorder.preemptions == []


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    jobs=st.lists(
        st.tuples(st.floats(0.0, 0.05), st.integers(0, 30), st.sampled_from(["none", "urgent", "loose"])),
        min_size=1, max_size=12,
    ),
    threshold_ms=st.sampled_from([-1.0, 0.0, 3.0, 6.0, 50.0]),
    microbatch=st.integers(1, 4),
)
def test_every_job_is_verified_exactly_once(tmp_path, jobs, threshold_ms, microbatch):
    """Whatever the arrivals, deadlines and threshold: every job's round ends exactly once,
    no pass ends before the job arrived, each preemption is of a job still waiting for its
    round's end, and the server is idle and empty at the end."""
    env, server, recorder = server_with(tmp_path, preemption_slack_ms=threshold_ms, max_microbatch=microbatch)
    log: list[tuple[int, float]] = []
    arrivals = {}
    for i, (at_s, gamma, slo_class) in enumerate(jobs):
        submit_at(env, server, at_s, job(i, log, slo_class), gamma)
        arrivals[i] = at_s
    env.run()
    assert sorted(i for i, _ in log) == list(range(len(jobs)))
    ends = dict(log)
    assert all(ends[i] >= arrivals[i] for i in ends)
    for req_id, _replica, at_s, mode in recorder.preemptions:
        assert mode == "verify" and arrivals[req_id] <= at_s < ends[req_id]
    assert not server.rounds and not server._busy  # noqa: SLF001 - idle at the end


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_preemption_in_a_simulation_is_counted_and_deterministic(tmp_path, prefix_caching):
    """A loaded speculative scenario with tight round deadlines and a threshold (with or
    without prefix caching): passes are cut, each cut counted per request
    (``num_preemptions``) and in the summary (``preemptions.by_mode.verify``); every round is
    recorded once; the same seed gives the same records."""
    curve = flat_curve(tmp_path, [0.8, 0.7, 0.6, 0.5])
    data = spec_scenario(
        curve, requests=60, rate=40.0, devices=12, prompt=256, output=48,
        speculation={"verify": {"order": "edf", "max_microbatch": 4, "preemption_slack_ms": 20.0, "prefix_caching": prefix_caching}},
    )
    data["slo"] = {"default": {"tvt_s": 0.06}}
    first = Simulation(scenario_from_dict(data)).run()
    frame = first.to_dataframe()
    by_mode = first.summary()["preemptions"]["by_mode"]
    assert by_mode.get("verify", 0) == frame["num_preemptions"].sum() > 0
    assert len(first.spec_rounds()) == frame["spec_rounds"].sum()
    again = Simulation(scenario_from_dict(data)).run()
    assert again.to_dataframe().equals(frame) and again.spec_rounds().equals(first.spec_rounds())
