"""The verify server's job ordering and microbatching, read off ``_take_round_batch`` without
running a simulation (the server's process is created but never started), and the cost of a
verify pass (:func:`~simpy_llm.speculative.verify.verify_pass_s`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simpy

from simpy_llm import scenario_from_dict
from simpy_llm.entities import Request
from simpy_llm.metrics.recorder import Recorder
from simpy_llm.serving.latency import BlisLinearLatency, LatencyModelBase
from simpy_llm.speculative.verify import VerifyServer, _pass_timer, verify_pass_s
from simpy_llm.wire import Wire
from tests.spec_helpers import flat_curve, spec_scenario

SLO: dict[str, tuple[float | None, float | None, float | None]] = {
    # class: (ttft_s, tpot_s, tvt_s)
    "tight": (None, None, 0.5),
    "loose": (None, None, 2.0),
    "tpot": (None, 0.1, None),
    "both": (None, 0.001, 1.0),
    "second": (None, None, 1.0),
    "none": (None, None, None),
}


def blis() -> BlisLinearLatency:
    return BlisLinearLatency(beta0_us=5000.0, beta2_us=100.0)


class ContextLatency(LatencyModelBase):
    """A latency model reading attention context: records each call's arguments."""

    uses_context = True
    output_token_overhead_s = 0.0

    def queueing_time_s(self, prompt_tokens: int) -> float:
        return 0.0

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def step_time_s(self, prefill_tokens: int, decode_tokens: int, **kwargs: Any) -> float:
        self.calls.append(((prefill_tokens, decode_tokens), kwargs))
        return 1e-3 + 1e-5 * decode_tokens + 1e-7 * kwargs.get("decode_context_tokens", 0)


def make_server(tmp_path: Path, latency: Any = None, **verify: Any) -> VerifyServer:
    """A verify server over a loaded scenario's speculation section with *verify* settings,
    busy with a pass (so submitted jobs wait in its queue instead of starting one)."""
    curve = flat_curve(tmp_path, [0.8, 0.7, 0.6, 0.5])
    config = scenario_from_dict(spec_scenario(curve, speculation={"verify": verify})).speculation
    env = simpy.Environment()
    server = VerifyServer(
        env, 0, Wire(env), latency if latency is not None else blis(), Recorder(num_replicas=1), config,
        kv_capacity_tokens=10**6, max_prefill_tokens=4096, rng=np.random.default_rng(0),
        fused_acceptance=None, slo=SLO, send_verdict=lambda r, t: None,
    )
    server._busy = True  # noqa: SLF001 - a pass in progress: the jobs queue
    return server


def request(i: int, slo_class: str = "none", context: int = 128, prompt: int = 100) -> Request:
    """Request *i* whose context (prompt plus generated tokens) is *context*."""
    assert context >= prompt
    return Request(
        id=i, client_id="c0", prompt_tokens=prompt, output_tokens=64, arrival_s=0.0,
        slo_class=slo_class, generated_tokens=context - prompt,
    )


def ids(jobs: list[Any]) -> list[int]:
    return [job.req.id for job in jobs]


def queued_ids(server: VerifyServer) -> list[int]:
    """Ids of the jobs still waiting, in the order they would be taken."""
    return [entry[-1].req.id for entry in sorted(server.rounds, key=lambda e: e[:2])]


# --- order ----------------------------------------------------------------------------
def test_fcfs_takes_submission_order(tmp_path):
    """fcfs ignores deadlines: the microbatch is the jobs in the order they were submitted."""
    server = make_server(tmp_path, order="fcfs")
    assert server.env.now == 0
    for i, cls in enumerate(["none", "loose", "tight", "tpot", "second"]):
        server.submit(request(i, cls), 2, 0.0)
    assert ids(server._take_round_batch()) == [0, 1, 2, 3, 4]
    assert server.rounds == []


def test_edf_takes_earliest_deadline_first(tmp_path):
    """edf orders by deadline: round start + tvt_s; else round start + tpot_s x (γ + 1); else
    infinity (last). tvt_s wins over tpot_s when a class has both."""
    server = make_server(tmp_path, order="edf")
    server.submit(request(0, "none"), 4, 0.0)      # inf
    server.submit(request(1, "loose"), 4, 0.0)     # 2.0
    server.submit(request(2, "tpot"), 3, 0.0)      # 0.1 x 4 = 0.4
    server.submit(request(3, "tight"), 4, 0.0)     # 0.5
    server.submit(request(4, "tpot"), 1, 0.25)     # 0.25 + 0.1 x 2 = 0.45
    server.submit(request(5, "both"), 4, 0.1)      # 0.1 + 1.0 (not 0.1 + 0.005)
    server.submit(request(6, "tight"), 4, -0.2)    # 0.3
    deadlines = {entry[-1].req.id: entry[-1].deadline_s for entry in server.rounds}
    assert deadlines[0] == math.inf
    assert deadlines[2] == pytest.approx(0.4)
    assert deadlines[4] == pytest.approx(0.45)
    assert deadlines[5] == pytest.approx(1.1)
    assert deadlines[6] == pytest.approx(0.3)
    assert ids(server._take_round_batch()) == [6, 2, 4, 3, 5, 1, 0]


def test_edf_ties_go_in_submission_order(tmp_path):
    """Jobs with equal deadlines (including no deadline) keep their submission order under edf."""
    server = make_server(tmp_path, order="edf")
    for i in range(3):
        server.submit(request(i, "none"), 2, 0.0)
    for i in range(3, 6):
        server.submit(request(i, "second"), 2, 0.0)
    assert ids(server._take_round_batch()) == [3, 4, 5, 0, 1, 2]


def test_least_slack_orders_by_deadline_minus_own_verify_time(tmp_path):
    """least_slack orders by deadline minus the job's own verify pass time: a job with a slightly
    later deadline but a longer verify (larger γ) goes before the one EDF would take first."""
    latency = blis()
    jobs = [  # (id, γ, round start): class "second" (tvt 1 s)
        (0, 1, 0.0),      # deadline 1.0,    own 5.2 ms -> slack 0.9948
        (1, 4, 0.0001),   # deadline 1.0001, own 5.5 ms -> slack 0.9946
        (2, 2, 0.001),    # deadline 1.001,  own 5.3 ms -> slack 0.9957
    ]
    slack = {i: 1.0 + start - verify_pass_s(latency, [128], [g]) for i, g, start in jobs}
    assert sorted(slack, key=slack.get) == [1, 0, 2]

    orders = {}
    for order in ("edf", "least_slack"):
        server = make_server(tmp_path, latency=latency, order=order)
        for i, gamma, start in jobs:
            server.submit(request(i, "second", context=128), gamma, start)
        orders[order] = ids(server._take_round_batch())
    assert orders["edf"] == [0, 1, 2]
    assert orders["least_slack"] == [1, 0, 2]


def test_least_slack_reads_the_context_of_each_job(tmp_path):
    """With a context-aware latency model the own verify time grows with the job's context
    (prompt plus generated tokens): the long-context job goes first despite a later deadline."""
    latency = ContextLatency()
    short = request(0, "second", context=200)
    long = request(1, "second", context=20_000, prompt=10_000)
    own_short = verify_pass_s(latency, [200], [3])
    own_long = verify_pass_s(latency, [20_000], [3])
    assert own_long - own_short > 0.005
    server = make_server(tmp_path, latency=latency, order="least_slack")
    server.submit(short, 3, 0.0)
    server.submit(long, 3, 0.005)  # deadline 5 ms later, but ~7 ms more verify work
    assert ids(server._take_round_batch()) == [1, 0]
    server = make_server(tmp_path, latency=ContextLatency(), order="edf")
    server.submit(request(0, "second", context=200), 3, 0.0)
    server.submit(request(1, "second", context=20_000, prompt=10_000), 3, 0.005)
    assert ids(server._take_round_batch()) == [0, 1]


# --- microbatch -----------------------------------------------------------------------
def test_max_microbatch_caps_the_batch(tmp_path):
    """A pass takes at most max_microbatch jobs; the rest stay queued for the next passes, in order."""
    server = make_server(tmp_path, order="fcfs", max_microbatch=2)
    for i in range(5):
        server.submit(request(i), 2, 0.0)
    assert ids(server._take_round_batch()) == [0, 1]
    assert len(server.rounds) == 3
    assert ids(server._take_round_batch()) == [2, 3]
    assert ids(server._take_round_batch()) == [4]
    assert server.rounds == []


def test_context_buckets_take_only_the_heads_bucket(tmp_path):
    """With context_bucket_tokens, a pass takes only jobs in the head's bucket (context // bucket);
    the others stay queued, in their order, for a later pass."""
    server = make_server(tmp_path, order="fcfs", context_bucket_tokens=100)
    contexts = [150, 250, 199, 120, 260, 100]  # buckets 1, 2, 1, 1, 2, 1
    for i, c in enumerate(contexts):
        server.submit(request(i, context=c), 2, 0.0)
    assert ids(server._take_round_batch()) == [0, 2, 3, 5]
    assert len(server.rounds) == 2
    assert queued_ids(server) == [1, 4]
    assert ids(server._take_round_batch()) == [1, 4]
    assert server.rounds == []


def test_context_buckets_respect_max_microbatch(tmp_path):
    """Selective batching still stops at max_microbatch jobs; unexamined jobs stay queued too."""
    server = make_server(tmp_path, order="fcfs", context_bucket_tokens=100, max_microbatch=2)
    for i, c in enumerate([150, 250, 160, 170, 180]):  # buckets 1, 2, 1, 1, 1
        server.submit(request(i, context=c), 2, 0.0)
    assert ids(server._take_round_batch()) == [0, 2]
    assert len(server.rounds) == 3
    assert queued_ids(server) == [1, 3, 4]


def test_overdue_job_joins_any_bucket(tmp_path):
    """A job already past its deadline (round started at -10 s with a 1 s tvt, now 0) joins the
    head's pass whatever its context; an on-time job of that other bucket waits."""
    server = make_server(tmp_path, order="fcfs", context_bucket_tokens=100)
    assert server.env.now == 0
    server.submit(request(0, "second", context=150), 2, 0.0)     # head, bucket 1, deadline 1.0
    server.submit(request(1, "second", context=350), 2, -10.0)   # bucket 3, deadline -9: overdue
    server.submit(request(2, "second", context=360), 2, 0.0)     # bucket 3, on time
    server.submit(request(3, "none", context=170), 2, 0.0)       # bucket 1, no deadline
    assert ids(server._take_round_batch()) == [0, 1, 3]
    assert len(server.rounds) == 1
    assert queued_ids(server) == [2]


def test_overdue_head_sets_the_bucket_under_edf(tmp_path):
    """Under edf the overdue job leads; its bucket is the pass's, and another overdue job of any
    bucket joins, while on-time jobs outside the head's bucket wait."""
    server = make_server(tmp_path, order="edf", context_bucket_tokens=100)
    server.submit(request(0, "second", context=150), 2, 0.0)     # bucket 1, on time
    server.submit(request(1, "second", context=350), 2, -10.0)   # bucket 3, overdue (deadline -9)
    server.submit(request(2, "second", context=160), 2, -5.0)    # bucket 1, overdue (deadline -4)
    server.submit(request(3, "second", context=380), 2, 0.0)     # bucket 3, on time
    assert ids(server._take_round_batch()) == [1, 2, 3]
    assert queued_ids(server) == [0]


# --- verify pass cost -----------------------------------------------------------------
def test_verify_pass_closed_form_on_blis_linear():
    """On BlisLinearLatency a verify pass is one decode step of sum(v + 1) tokens:
    beta0 + beta2 x sum(v + 1), whatever the contexts."""
    latency = blis()
    contexts, verified = [512, 100, 2000], [4, 0, 2]
    expected = (5000.0 + 100.0 * sum(v + 1 for v in verified)) * 1e-6
    assert verify_pass_s(latency, contexts, verified) == pytest.approx(expected)
    assert verify_pass_s(latency, [512, 512], [4, 3]) == pytest.approx(0.0059)
    assert verify_pass_s(latency, [10], [0]) == pytest.approx((5000.0 + 100.0) * 1e-6)


def test_verify_pass_tells_a_context_model_the_attention_context():
    """A latency model with uses_context = True gets a decode step of sum(v + 1) tokens with
    decode_context_tokens = sum((v + 1) x c)."""
    latency = ContextLatency()
    contexts, verified = [512, 100, 2000], [4, 0, 2]
    seconds = verify_pass_s(latency, contexts, verified)
    assert len(latency.calls) == 1
    (prefill, decode), kwargs = latency.calls[0]
    assert prefill == 0
    assert decode == sum(v + 1 for v in verified) == 9
    assert kwargs == {"decode_context_tokens": sum((v + 1) * c for c, v in zip(contexts, verified, strict=True))}
    assert kwargs["decode_context_tokens"] == 5 * 512 + 1 * 100 + 3 * 2000
    assert seconds == pytest.approx(1e-3 + 1e-5 * 9 + 1e-7 * (5 * 512 + 100 + 3 * 2000))


def test_verify_pass_prefers_a_table_that_answers():
    """A latency model's verify_time_s is used when it answers, and the decode-step formula when
    it returns None."""

    class Table(ContextLatency):
        def __init__(self, answer: float | None) -> None:
            super().__init__()
            self.answer = answer
            self.asked: list[tuple[list[int], list[int]]] = []

        def verify_time_s(self, contexts: list[int], verified: list[int]) -> float | None:
            self.asked.append((contexts, verified))
            return self.answer

    table = Table(0.042)
    assert verify_pass_s(table, [300, 400], [2, 3]) == 0.042
    assert table.asked == [([300, 400], [2, 3])] and table.calls == []
    none = Table(None)
    assert verify_pass_s(none, [300, 400], [2, 3]) == pytest.approx(1e-3 + 1e-5 * 7 + 1e-7 * (3 * 300 + 4 * 400))
    assert len(none.calls) == 1


def test_a_server_times_its_passes_as_verify_pass_s_does():
    """The pass timer a server builds once (a shortcut for a model without a verify table
    that ignores the context) gives verify_pass_s's figure exactly, for every kind of model."""

    class Table(ContextLatency):
        def __init__(self, answer: float | None) -> None:
            super().__init__()
            self.answer = answer

        def verify_time_s(self, contexts: list[int], verified: list[int]) -> float | None:
            return self.answer

    for latency in (blis(), ContextLatency(), Table(0.042), Table(None)):
        timer = _pass_timer(latency)
        for contexts, verified in (([512], [4]), ([512, 100, 2000], [4, 0, 2]), ([7, 9], [0, 0])):
            assert timer(contexts, verified) == verify_pass_s(latency, contexts, verified), (latency, verified)
