"""Hand-checked timelines of the continuous-batching replica."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm.config.schema import EngineConfig
from simpy_llm.entities import Request
from simpy_llm.metrics.recorder import Recorder
from simpy_llm.serving.engine import Replica, kv_growth
from simpy_llm.serving.latency import BlisLinearLatency
from simpy_llm.serving.latency_base import LatencyModelBase
from tests.helpers import run, tiny_scenario


def _replica(engine: EngineConfig, latency: BlisLinearLatency, fast: bool = True):
    env = simpy.Environment()
    inbox = simpy.Store(env)
    recorder = Recorder()
    replica = Replica(env, 0, inbox, engine, latency, recorder, fast=fast)
    return env, inbox, recorder, replica


def _send(env, inbox, recorder, replica, req: Request, at_s: float):
    def go():
        yield env.timeout(at_s)
        req.arrival_s = env.now
        recorder.on_arrival(req, env.now)

        inbox.put(req)

    env.process(go())


ENGINE = EngineConfig(max_num_seqs=4, max_num_batched_tokens=128, kv_block_size=4, kv_num_blocks=256)
LATENCY = BlisLinearLatency(beta0_us=1000.0, beta1_us=10.0, beta2_us=100.0, alpha0_us=500.0, alpha2_us=50.0)


@pytest.mark.parametrize("fast", [True, False])
def test_single_request_timeline(fast):
    """A lone request: enqueue after alpha0, one prefill step emits token 1, then one
    decode step per further token; alpha2 is added once per emitted token."""
    env, inbox, rec, rep = _replica(ENGINE, LATENCY, fast)
    req = Request(id=0, client_id="c", prompt_tokens=100, output_tokens=5, arrival_s=0.0)
    _send(env, inbox, rec, rep, req, 1.0)
    env.run()
    assert req.enqueue_s == pytest.approx(1.0005)
    assert req.first_scheduled_s == pytest.approx(1.0005)
    prefill_end = 1.0005 + (1000 + 10 * 100) * 1e-6
    assert req.first_token_s == pytest.approx(prefill_end + 50e-6)
    assert req.completion_s == pytest.approx(prefill_end + 4 * 1100e-6 + 5 * 50e-6)
    assert req.generated_tokens == 5
    assert rep.kv.used_blocks == 0


@pytest.mark.parametrize("fast", [True, False])
def test_chunked_prefill_splits_prompt_over_the_token_budget(fast):
    """A 300-token prompt with a 128-token budget is prefilled in chunks 128, 128, 44."""
    engine = EngineConfig(max_num_seqs=4, max_num_batched_tokens=128, kv_block_size=4, kv_num_blocks=256)
    latency = BlisLinearLatency(beta0_us=1000.0, beta1_us=10.0, beta2_us=100.0)
    env, inbox, rec, rep = _replica(engine, latency, fast)
    req = Request(id=0, client_id="c", prompt_tokens=300, output_tokens=1, arrival_s=0.0)
    _send(env, inbox, rec, rep, req, 0.0)
    env.run()
    expected = (3 * 1000 + 10 * 300) * 1e-6
    assert req.completion_s == pytest.approx(expected)
    assert rec.steps[0] == 3
    assert rec.prefill_tokens[0] == 300


def test_unchunked_prefill_is_one_step():
    """Without chunked prefill the whole prompt is one step (it must fit the budget)."""
    engine = EngineConfig(max_num_seqs=4, max_num_batched_tokens=512, chunked_prefill=False, kv_block_size=4, kv_num_blocks=256)
    latency = BlisLinearLatency(beta0_us=1000.0, beta1_us=10.0, beta2_us=100.0)
    env, inbox, rec, rep = _replica(engine, latency)
    req = Request(id=0, client_id="c", prompt_tokens=300, output_tokens=1, arrival_s=0.0)
    _send(env, inbox, rec, rep, req, 0.0)
    env.run()
    assert rec.steps[0] == 1
    assert req.completion_s == pytest.approx((1000 + 3000) * 1e-6)


@pytest.mark.parametrize("fast", [True, False])
def test_arrival_mid_stretch_is_admitted_at_the_next_step_boundary(fast):
    """A request arriving inside another's decode stretch is scheduled at the end of the
    step in progress, not at its arrival time nor at the end of the stretch."""
    latency = BlisLinearLatency(beta0_us=1000.0, beta1_us=10.0, beta2_us=100.0)
    env, inbox, rec, rep = _replica(ENGINE, latency, fast)
    a = Request(id=0, client_id="c", prompt_tokens=10, output_tokens=100, arrival_s=0.0)
    b = Request(id=1, client_id="c", prompt_tokens=10, output_tokens=2, arrival_s=0.0)
    _send(env, inbox, rec, rep, a, 0.0)
    prefill = (1000 + 100) * 1e-6
    decode = 1100e-6
    _send(env, inbox, rec, rep, b, prefill + 2.5 * decode)  # inside the third decode step
    env.run()
    boundary = prefill + 3 * decode
    assert b.first_scheduled_s == pytest.approx(boundary)
    # The mixed step: a's decode token plus b's 10-token prefill.
    assert b.first_token_s == pytest.approx(boundary + (1000 + 10 * 10 + 100) * 1e-6)
    assert a.generated_tokens == 100 and b.generated_tokens == 2


@pytest.mark.parametrize("fast", [True, False])
def test_preemption_takes_the_most_recently_admitted_and_both_complete(fast):
    """With too few KV blocks for two growing requests, the later-admitted one is
    preempted, recomputed later, and both finish with all their tokens."""
    engine = EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, kv_block_size=4, kv_num_blocks=16)
    latency = BlisLinearLatency(beta0_us=1000.0, beta1_us=10.0, beta2_us=100.0)
    env, inbox, rec, rep = _replica(engine, latency, fast)
    a = Request(id=0, client_id="c", prompt_tokens=8, output_tokens=40, arrival_s=0.0)
    b = Request(id=1, client_id="c", prompt_tokens=8, output_tokens=40, arrival_s=0.0)
    _send(env, inbox, rec, rep, a, 0.0)
    _send(env, inbox, rec, rep, b, 0.0005)
    env.run()
    assert a.num_preemptions == 0
    assert b.num_preemptions >= 1
    assert a.generated_tokens == 40 and b.generated_tokens == 40
    assert b.completion_s > a.completion_s
    assert rep.kv.used_blocks == 0
    assert rep.kv.peak_used_blocks <= 16


def test_requests_longer_than_max_model_len_are_dropped():
    """A request whose prompt plus output exceeds max_model_len is dropped, not run."""
    data = tiny_scenario()
    data["serving"]["engine"]["max_model_len"] = 50
    data["workload"]["clients"][0]["input_distribution"] = {"type": "constant", "params": {"value": 60}}
    res = run(data)
    assert set(res.columns["status"].tolist()) == {"dropped"}
    assert res.summary()["requests"]["dropped"] == 50


def test_batch_never_exceeds_max_num_seqs():
    """No engine step holds more than max_num_seqs requests."""
    data = tiny_scenario()
    data["workload"]["aggregate_rate"] = 500.0
    data["workload"]["num_requests"] = 300
    res = run(data)
    assert max(int(k) for k in res.summary()["batch_size"]["histogram"]) <= 8


def test_tpot_is_nan_for_single_token_outputs():
    """TPOT is undefined (NaN) for a one-token output and defined otherwise."""
    data = tiny_scenario()
    data["workload"]["clients"][0]["output_distribution"] = {"type": "constant", "params": {"value": 1}}
    res = run(data)
    assert all(math.isnan(v) for v in res.derived()["tpot_s"])


def _tied_clients_scenario(mode: str) -> dict:
    """Two clients on constant arrivals at the same rate: their requests arrive in pairs at
    identical instants, at an idle replica (each pair is done before the next arrives)."""
    data = tiny_scenario()
    client = {
        "rate_fraction": 1.0,
        "arrival": {"process": "constant"},
        "input_distribution": {"type": "constant", "params": {"value": 20}},
        "output_distribution": {"type": "constant", "params": {"value": 3}},
    }
    data["workload"]["clients"] = [{"id": "a", **client}, {"id": "b", **client}]
    data["workload"]["aggregate_rate"] = 20.0
    data["workload"]["num_requests"] = 20
    data["simulation"] = {"mode": mode}
    return data


@pytest.mark.parametrize("mode", ["event_per_change", "event_per_step"])
def test_same_instant_arrivals_at_an_idle_replica_share_the_first_step(mode):
    """Requests arriving at the same instant at an idle replica (no queueing overhead) are
    all planned into the step that starts at that instant: the pair's first scheduling
    times, first-token times and TTFTs are equal."""
    res = run(_tied_clients_scenario(mode))
    c = res.columns
    assert np.array_equal(c["arrival_s"][0::2], c["arrival_s"][1::2])  # they really tie
    assert np.array_equal(c["first_scheduled_s"][0::2], c["first_scheduled_s"][1::2])
    assert np.array_equal(c["first_token_s"][0::2], c["first_token_s"][1::2])
    assert np.array_equal(c["first_scheduled_s"], c["arrival_s"])


@pytest.mark.parametrize("mode", ["event_per_change", "event_per_step"])
def test_run_cut_by_until_records_tokens_emitted_so_far(mode):
    """A request still decoding at until_s is recorded in flight with every token emitted by
    the steps that ended before until_s (one per step), in both engine modes."""
    data = tiny_scenario()
    data["workload"]["num_requests"] = 1
    data["workload"]["clients"][0]["input_distribution"] = {"type": "constant", "params": {"value": 10}}
    data["workload"]["clients"][0]["output_distribution"] = {"type": "constant", "params": {"value": 5000}}
    data["serving"]["engine"]["kv_num_blocks"] = 4096
    data["serving"]["latency_model"]["params"] = {"beta0_us": 1000.0, "beta1_us": 0.0, "beta2_us": 0.0}
    data["simulation"] = {"mode": mode, "until_s": 1.0}
    res = run(data)
    c = res.columns
    assert c["status"].tolist() == ["in_flight"]
    start = c["arrival_s"][0]
    # Every step takes 1 ms; the step ending exactly at until_s has not happened.
    ended = sum(1 for k in range(1, 2000) if start + k * 1e-3 < 1.0)
    assert c["generated_tokens"][0] == ended
    assert res.steps == ended
    assert res.summary()["engine"]["busy_s"][0] == pytest.approx(ended * 1e-3)


@pytest.mark.parametrize("fast", [True, False])
def test_a_fully_cached_prompt_still_computes_its_last_block(fast):
    """A prompt whose every block is cached reuses all but the block holding its last token
    (lookups stop at the first P - 1 tokens), so the step that admits it computes that block
    and emits its first token."""
    engine = EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, kv_block_size=4, kv_num_blocks=64)
    latency = BlisLinearLatency(beta0_us=1000.0, beta1_us=10.0, beta2_us=100.0)
    env, inbox, rec, rep = _replica(engine, latency, fast)
    shared = {"prefix_tokens": 8, "prefix_blocks": (101, 102), "prefix_block_tokens": 4}
    a = Request(id=0, client_id="c", prompt_tokens=8, output_tokens=2, arrival_s=0.0, **shared)
    b = Request(id=1, client_id="c", prompt_tokens=8, output_tokens=2, arrival_s=0.0, **shared)
    _send(env, inbox, rec, rep, a, 0.0)
    _send(env, inbox, rec, rep, b, 1.0)
    env.run()
    assert a.cached_tokens == 0 and b.cached_tokens == 4
    assert b.first_token_s == pytest.approx(1.0 + (1000 + 10 * 4) * 1e-6)
    assert rec.prefill_tokens[0] == 8 + 4


@pytest.mark.parametrize("fast", [True, False])
def test_an_arrival_exactly_at_a_step_end_joins_the_step_planned_there(fast):
    """Steps of 5 ms (4,900 µs + 1 µs per prompt token of a 100-token prompt, or + 100 µs
    per decode token): A enters at 35.448384 s, its prefill ends at 35.453384 s and its
    seventh decode step at 35.488384 s, exactly when B enters. B is planned into the step
    starting there. (In floating point 35.453384 + 7 x 0.005 is 35.488383999999996, a step
    end one ulp before B's entry, which would make B wait a whole step.)"""
    latency = BlisLinearLatency(beta0_us=4900.0, beta1_us=1.0, beta2_us=100.0)
    env, inbox, rec, rep = _replica(ENGINE, latency, fast)
    a = Request(id=0, client_id="c", prompt_tokens=100, output_tokens=20, arrival_s=0.0)
    b = Request(id=1, client_id="c", prompt_tokens=10, output_tokens=1, arrival_s=0.0)
    _send(env, inbox, rec, rep, a, 35.448384)
    _send(env, inbox, rec, rep, b, 35.488384)
    env.run()
    assert 35.453384 + 7 * 0.005 < 35.488384  # the float sum really falls short
    assert a.first_token_s == 35.453384
    assert b.enqueue_s == 35.488384
    assert b.first_scheduled_s == 35.488384
    # The mixed step: A's decode token and B's 10 prompt tokens, 4,900 + 10 + 100 µs.
    assert b.completion_s == 35.493394


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("output", [2, 3, 8, 9, 13])
def test_step_ends_are_whole_step_durations_counted_in_nanoseconds(fast, output):
    """A lone request entering at 0.3 s: a 1.1 ms prefill step, then 1.1 ms decode steps;
    its last token's step ends at 0.3 s + *output* x 1.1 ms exactly as written in decimal
    (for these outputs the floating-point 0.3011 + k x 0.0011 is one ulp off it)."""
    latency = BlisLinearLatency(beta0_us=1000.0, beta1_us=10.0, beta2_us=100.0)
    env, inbox, rec, rep = _replica(ENGINE, latency, fast)
    req = Request(id=0, client_id="c", prompt_tokens=10, output_tokens=output, arrival_s=0.0)
    _send(env, inbox, rec, rep, req, 0.3)
    env.run()
    exact = (300_000 + 1_100 * output) / 1_000_000  # microseconds, divided once
    assert (0.3 + 0.0011) + (output - 1) * 0.0011 != exact  # the float sum is off
    assert req.first_token_s == 0.3011
    assert req.completion_s == exact


def _post_processed(until_s: float, mode: str) -> dict:
    """One request entering at 1 s (P = 10, O = 5), 1 ms steps, 0.1 s of post-processing per
    output token: its last token is computed at 1.005 s, its first reaches the client at
    1.001 + 0.1 s and its whole answer at 1.005 + 5 x 0.1 s; the run stops at *until_s*."""
    data = tiny_scenario()
    data["workload"] = {
        "aggregate_rate": 1.0,
        "num_requests": 1,
        "clients": [{
            "id": "c0", "rate_fraction": 1.0, "arrival": {"process": "constant"},
            "input_distribution": {"type": "constant", "params": {"value": 10}},
            "output_distribution": {"type": "constant", "params": {"value": 5}},
        }],
    }
    data["serving"]["latency_model"]["params"] = {
        "beta0_us": 1000.0, "beta1_us": 0.0, "beta2_us": 0.0, "alpha2_us": 100_000.0,
    }
    data["simulation"] = {"until_s": until_s, "mode": mode}
    return data


@pytest.mark.parametrize("mode", ["event_per_change", "event_per_step"])
def test_a_completion_post_processed_after_until_is_in_flight(mode):
    """With until_s = 1.3 s the request's tokens were all computed (1.005 s) but its answer
    reaches the client at 1.505 s, after the cut: it is recorded in flight with its 5 tokens
    and its first token (1.101 s), without a completion time, and the summary counts it so."""
    res = run(_post_processed(1.3, mode))
    c = res.columns
    assert c["arrival_s"].tolist() == [1.0]
    assert c["status"].tolist() == ["in_flight"]
    assert c["generated_tokens"].tolist() == [5]
    assert c["first_token_s"].tolist() == [1.101]
    assert math.isnan(c["completion_s"][0])
    counts = res.summary()["requests"]
    assert (counts["completed"], counts["in_flight"]) == (0, 1)


@pytest.mark.parametrize("mode", ["event_per_change", "event_per_step"])
def test_a_first_token_post_processed_after_until_is_not_recorded(mode):
    """With until_s = 1.05 s the first token (computed at 1.001 s, seen at 1.101 s) has not
    reached the client: the in-flight record has no first_token_s."""
    c = run(_post_processed(1.05, mode)).columns
    assert c["status"].tolist() == ["in_flight"]
    assert c["generated_tokens"].tolist() == [5]
    assert math.isnan(c["first_token_s"][0]) and math.isnan(c["completion_s"][0])


@pytest.mark.parametrize("mode", ["event_per_change", "event_per_step"])
def test_a_completion_post_processed_before_until_is_completed(mode):
    """With until_s = 1.6 s the answer (1.505 s) arrived before the cut: completed."""
    c = run(_post_processed(1.6, mode)).columns
    assert c["status"].tolist() == ["completed"]
    assert c["completion_s"].tolist() == [1.505]
    assert c["first_token_s"].tolist() == [1.101]


@given(
    residue=st.lists(st.integers(0, 6), min_size=1, max_size=33),
    s0=st.integers(0, 10_000),
    k=st.integers(0, 200),
)
@settings(max_examples=300, deadline=None, derandomize=True)
def test_kv_growth_counts_the_blocks_each_step_of_a_stretch_allocates(residue, s0, k):
    """kv_growth's closed form equals counting, step by step over steps s0+1 .. s0+k-1, the
    decoders whose class needs a new block there and the steps each such block is held."""
    bs = len(residue)
    grown = weighted = 0
    for j in range(1, k):
        for c, a in enumerate(residue):
            if (c + s0 + j) % bs == 0:
                grown += a
                weighted += a * (k - j)
    assert kv_growth(residue, s0, k) == (grown, weighted)


def test_a_batch_limit_raised_during_a_single_step_still_lets_an_idle_engine_wake():
    """set_max_num_seqs during a mixed step with nothing waiting, then the batch empties: the
    next arrival wakes the idle engine and completes (the raise arms no stretch cut)."""
    env, inbox, rec, rep = _replica(ENGINE, LATENCY)
    first = Request(id=0, client_id="c", prompt_tokens=100, output_tokens=1, arrival_s=0.0)
    later = Request(id=1, client_id="c", prompt_tokens=100, output_tokens=3, arrival_s=0.0)
    _send(env, inbox, rec, rep, first, 1.0)
    _send(env, inbox, rec, rep, later, 2.0)

    def raise_limit():
        yield env.timeout(1.001)  # inside the first request's prefill step (1.0005 .. 1.0025)
        assert rep.running and not rep.waiting
        rep.set_max_num_seqs(8)

    env.process(raise_limit())
    env.run(until=10.0)
    assert first.completion_s == pytest.approx(1.0005 + 2000e-6 + 50e-6)
    assert later.completion_s == pytest.approx(2.0005 + 2000e-6 + 2 * 1100e-6 + 3 * 50e-6)


class _CountedLatency(LatencyModelBase):
    """The BLIS-linear step time of ``LATENCY``'s betas, counting the pure-decode steps it is
    asked to time, by batch size; *repeatable* is what it says of its step times."""

    output_token_overhead_s = 0.0

    def __init__(self, repeatable: bool) -> None:
        self.repeatable = repeatable
        self.decode_asks: Counter[int] = Counter()

    @property
    def repeatable_step_times(self) -> bool:
        return self.repeatable

    def step_time_s(self, prefill_tokens, decode_tokens, decode_context_tokens=0, prefill_attention_pairs=0):
        if not prefill_tokens:
            self.decode_asks[decode_tokens] += 1
        return (1000.0 + 10.0 * prefill_tokens + 100.0 * decode_tokens) * 1e-6

    def queueing_time_s(self, prompt_tokens):
        return 0.0


def _staggered_run(latency: _CountedLatency, fast: bool) -> list[tuple[float, float]]:
    env, inbox, rec, _rep = _replica(ENGINE, latency, fast)
    reqs = [Request(id=i, client_id="c", prompt_tokens=5 + 3 * i, output_tokens=4 + 7 * (i % 5), arrival_s=0.0) for i in range(12)]
    for i, req in enumerate(reqs):
        _send(env, inbox, rec, _rep, req, 0.0037 * i)
    env.run()
    return [(r.first_token_s, r.completion_s) for r in reqs]


@pytest.mark.parametrize("fast", [True, False])
def test_a_repeatable_model_times_each_decode_batch_size_once_with_the_same_results(fast):
    """A model whose step times are repeatable is asked for a pure-decode step of each batch
    size once, and the requests' times are those of the same model asked at every
    scheduling decision (which is asked more often than there are sizes)."""
    once, every = _CountedLatency(repeatable=True), _CountedLatency(repeatable=False)
    assert _staggered_run(once, fast) == _staggered_run(every, fast)
    assert set(once.decode_asks) == set(every.decode_asks)
    assert max(once.decode_asks.values()) == 1
    assert sum(every.decode_asks.values()) > len(every.decode_asks)
