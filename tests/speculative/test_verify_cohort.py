"""Prefix cohorting of verify passes (``speculation.verify.cohort: prefix``) and fused steps timed
by a LUT's ``fused_decode`` rows, on a verify server driven directly: pass membership and pass
times worked out by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simpy

from simpy_llm import scenario_from_dict
from simpy_llm.entities import Request
from simpy_llm.metrics.recorder import Recorder
from simpy_llm.serving.latency_base import LatencyModelBase
from simpy_llm.speculative.verify import FUSED, VerifyServer
from simpy_llm.wire import Wire
from tests.spec_helpers import flat_curve, spec_scenario
from tests.speculative.test_verify_preemption import SLO, Accepts, Spec

STEP_US, TOKEN_US, CONTEXT_US = 5000.0, 100.0, 1.0


class ContextLinear(LatencyModelBase):
    """A decode step of 5 ms + 100 µs a token + 1 µs per context token its attention reads."""

    output_token_overhead_s = 0.0
    uses_context = True

    def step_time_s(self, prefill_tokens: int, decode_tokens: int, decode_context_tokens: float = 0, prefill_attention_pairs: float = 0) -> float:
        return (STEP_US + TOKEN_US * (prefill_tokens + decode_tokens) + CONTEXT_US * decode_context_tokens) * 1e-6

    def queueing_time_s(self, prompt_tokens: int) -> float:
        return 0.0


def server_with(tmp_path: Path, latency: Any, fused: bool = False, **verify: Any) -> tuple[simpy.Environment, VerifyServer]:
    """An idle verify server on *latency* with *verify* settings (and a fused drafter of 2 ms a token)."""
    curve = flat_curve(tmp_path, [0.8, 0.7, 0.6, 0.5])
    extra: dict[str, Any] = {"verify": verify}
    if fused:
        extra.update(mode="fused", fused={"draft_token_ms": 2.0, "acceptance": curve})
    config = scenario_from_dict(spec_scenario(curve, speculation=extra)).speculation
    assert config is not None
    env = simpy.Environment()
    server = VerifyServer(
        env, 0, Wire(env), latency, Recorder(num_replicas=1), config, kv_capacity_tokens=10**6, max_prefill_tokens=4096,
        rng=np.random.default_rng(0), fused_acceptance=Accepts() if fused else None, slo=SLO, send_verdict=lambda r, t: None,
    )
    return env, server


def request(i: int, log: list[tuple[int, float]], group: str = "", prefix: int = 0, prompt: int = 100) -> Request:
    req = Request(id=i, client_id="c0", prompt_tokens=prompt, output_tokens=10_000, arrival_s=0.0, slo_class="none",
                  generated_tokens=1, prefix_group=group, prefix_tokens=prefix)
    req.spec = Spec(log)  # type: ignore[assignment]  # the members the server reads of a request's state
    return req


def pass_s(jobs: list[tuple[int, int]], shared: int = 0) -> float:
    """A verify pass of jobs ``(context, γ)``: 5 ms + 100 µs x Σ(γ + 1) + 1 µs x attention reads."""
    tokens = sum(g + 1 for _, g in jobs)
    reads = shared + sum((g + 1) * (c - shared) for c, g in jobs)
    return (STEP_US + TOKEN_US * tokens + CONTEXT_US * reads) * 1e-6


def run_three(tmp_path: Path, **verify: Any) -> dict[int, float]:
    """Job 9 starts a pass at 0; at 1 ms jobs 0 (group a), 1 (group b), 2 (group a) queue,
    each with a 64-token prefix of its group in a 101-token context, γ 3. Each job's pass end."""
    env, server = server_with(tmp_path, ContextLinear(), **verify)
    log: list[tuple[int, float]] = []
    first = request(9, log)
    server.submit(first, 3, 0.0)
    others = [request(0, log, "a", 64), request(1, log, "b", 64), request(2, log, "a", 64)]

    def later(_event: object) -> None:
        for req in others:
            server.submit(req, 3, env.now)

    env.timeout(0.001).callbacks.append(later)
    env.run()
    assert sorted(i for i, _ in log) == [0, 1, 2, 9]  # each job verified once
    return dict(log)


def test_a_cohort_pass_takes_one_prefix_group_and_reads_its_prefix_once(tmp_path) -> None:
    """With ``cohort: prefix`` the pass after job 9's takes jobs 0 and 2 (group a) and reads
    their 64-token prefix once; job 1 (group b) runs alone after them."""
    ends = run_three(tmp_path, cohort="prefix")
    first = pass_s([(101, 3)])
    pair = pass_s([(101, 3), (101, 3)], shared=64)
    assert ends[9] == pytest.approx(first, rel=1e-12)
    assert ends[0] == ends[2] == pytest.approx(first + pair, rel=1e-12)
    assert ends[1] == pytest.approx(first + pair + pass_s([(101, 3)], shared=64), rel=1e-12)


def test_without_cohorts_every_queued_job_joins_the_pass(tmp_path) -> None:
    """By default the three queued jobs share one pass, each reading its whole context."""
    ends = run_three(tmp_path)
    first = pass_s([(101, 3)])
    assert ends[0] == ends[1] == ends[2] == pytest.approx(first + pass_s([(101, 3)] * 3), rel=1e-12)


def test_an_overdue_job_joins_a_cohort_pass(tmp_path) -> None:
    """A job past its deadline joins any pass, whatever its group (as with context buckets):
    in arrival order (``fcfs``) job 0 (group a) leads, and job 1 (group b), whose round began a
    second before it was queued (its 8 ms ``tvt_s`` long past), joins it."""
    env, server = server_with(tmp_path, ContextLinear(), cohort="prefix", order="fcfs")
    log: list[tuple[int, float]] = []
    server.submit(request(9, log), 3, 0.0)
    late = request(1, log, "b", 64)
    late.slo_class = "urgent"
    a = request(0, log, "a", 64)

    def later(_event: object) -> None:
        server.submit(a, 3, env.now)
        server.submit(late, 3, env.now - 1.0)  # its round began a second ago: its deadline has passed

    env.timeout(0.001).callbacks.append(later)
    env.run()
    ends = dict(log)
    assert ends[0] == ends[1]


# --------------------------------------------------------------------------- fused rows


class FusedSpec(Spec):
    """A request's state for fused rounds: every next round drafts γ 4 (the run is cut short)."""

    def next_gamma(self, server: VerifyServer, *, fused: bool = False) -> int:
        return 4


def first_ends(log: list[tuple[int, float]]) -> dict[int, float]:
    """Each job's first pass end."""
    ends: dict[int, float] = {}
    for i, t in log:
        ends.setdefault(i, t)
    return ends


def fused_pass(tmp_path: Path, latency: Any) -> dict[int, float]:
    """A distributed round of job 9 at 0, then two fused rounds of γ 4 (jobs 0 and 1) queued at
    0.1 ms, so they share the next pass; run to 50 ms; each job's first pass end."""
    env, server = server_with(tmp_path, latency, fused=True)
    log: list[tuple[int, float]] = []
    server.submit(request(9, log), 1, 0.0)
    reqs = [request(0, log), request(1, log)]
    for req in reqs:
        req.spec = FusedSpec(log)  # type: ignore[assignment]  # the members the server reads of a request's state

    def later(_event: object) -> None:
        for req in reqs:
            server.submit(req, 4, env.now, FUSED)

    env.timeout(0.0001).callbacks.append(later)
    env.run(until=0.05)
    return first_ends(log)


def lut_with_fused_rows(tmp_path: Path) -> Any:
    """The example LUT plus ``fused_decode`` rows at fanout 4: 12 ms + 1 ms per sequence."""
    from tests.unit.test_lut_columns import example, with_speculative_rows

    return example(with_speculative_rows(tmp_path))


def test_a_fused_pass_takes_its_table_row(tmp_path) -> None:
    """Two fused rounds of γ 4 in one pass take the ``fused_decode`` row at microbatch 2, 14 ms,
    in place of 4 draft steps of 2 ms plus a verify pass."""
    ends = fused_pass(tmp_path, lut_with_fused_rows(tmp_path))
    assert ends[0] == ends[1]
    assert ends[0] - ends[9] == pytest.approx(0.014, rel=1e-12)


def test_a_fused_pass_without_a_row_is_drafting_plus_verifying(tmp_path) -> None:
    """Without ``fused_decode`` rows for γ 4 the pass is 4 draft steps of 2 ms plus the verify pass."""
    from simpy_llm.speculative.verify import verify_pass_s
    from tests.unit.test_lut_columns import EXAMPLE, example

    latency = example(EXAMPLE)
    ends = fused_pass(tmp_path, latency)
    assert ends[0] - ends[9] == pytest.approx(4 * 0.002 + verify_pass_s(latency, [101, 101], [4, 4]), rel=1e-12)
