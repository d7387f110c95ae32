"""Conservation and causality of the batch server's BinQueue, over random workloads and
settings (hypothesis): nothing lost or duplicated, no batch before its requests, one batch
at a time, FIFO within a bin, batch sizes as configured, memory never over the limit."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm.config.schema import BatchServerConfig, BinsConfig, DynamicBatchingConfig, MemoryLimitConfig, PolicySpec
from simpy_llm.policies.predictors import OutputPredictor
from tests.batching_helpers import serve

SPEC = PolicySpec(kind="sampled", params={"distribution": {"type": "constant", "params": {"value": 1.0}}})


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 60))
    gaps = draw(st.lists(st.floats(0.0, 2.0), min_size=n, max_size=n))
    sizes = draw(st.lists(st.floats(0.01, 3.0), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 400), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 400), min_size=n, max_size=n))
    arrivals = []
    t = 0.0
    for g in gaps:
        t += g
        arrivals.append(t)
    return arrivals, sizes, prompts, outputs


@st.composite
def bin_settings(draw):
    count = draw(st.integers(1, 5))
    explicit = draw(st.booleans())
    predictor = draw(st.sampled_from([OutputPredictor(kind="oracle"), OutputPredictor(kind="noisy", sigma=0.5, seed=3)]))
    if explicit:
        cuts = sorted(draw(st.lists(st.floats(0.05, 2.9), min_size=count - 1, max_size=count - 1, unique=True)))
        return BinsConfig(count=count, boundaries=tuple(cuts), predictor=predictor)
    warmup = draw(st.integers(count, count + 20))
    return BinsConfig(count=count, warmup_requests=warmup, predictor=predictor)


@st.composite
def configs(draw):
    bins = draw(bin_settings())
    if draw(st.booleans()):
        wait = draw(st.none() | st.floats(0.1, 5.0))
        return BatchServerConfig(service=SPEC, bins=bins, batch_size=draw(st.integers(1, 8)), max_wait_s=wait)
    b_min = draw(st.integers(1, 4))
    memory = draw(st.none() | st.integers(800, 4000).map(lambda c: MemoryLimitConfig(capacity_tokens=c)))
    dynamic = DynamicBatchingConfig(
        d_sla_s=draw(st.floats(0.2, 4.0)), b_min=b_min, b_max=draw(st.integers(b_min, 12)),
        max_candidates=draw(st.integers(1, 12)), memory=memory,
        bin_selection=PolicySpec(kind=draw(st.sampled_from(["round_robin", "longest_queue"]))),
    )
    return BatchServerConfig(service=SPEC, bins=bins, dynamic=dynamic)


@settings(max_examples=150, deadline=None)
@given(workload=workloads(), config=configs())
def test_every_request_is_served_once_or_still_queued(workload, config):
    """Each request leaves in exactly one batch or is dropped (alone over the memory limit)
    or still waits; the queue's counters agree; batches never overlap and none starts
    before it was formed or was formed before its last request arrived."""
    arrivals, sizes, prompts, outputs = workload
    requests, recorder, server = serve(config, arrivals, sizes, prompt_tokens=prompts, output_tokens=outputs)
    batches = recorder.batches
    served = Counter(r.id for r in requests if not math.isnan(r.completion_s))
    assert all(v == 1 for v in served.values())
    dropped = {r.id for r in requests if r.dropped_reason}
    waiting = {r.id for r in server.in_flight()}
    assert set(served) | dropped | waiting == {r.id for r in requests}
    assert not (set(served) & dropped) and not (set(served) & waiting) and not (dropped & waiting)
    assert sum(b[3] for b in batches) == len(served)
    stats = server.queue.statistics()
    assert stats.puts == len(requests) - len(dropped)
    assert stats.batched == len(served) and stats.queued == len(waiting) and stats.batches == len(batches)
    previous_end = -math.inf
    for _replica, _id, _bin, size, formed, start, end, *_ in batches:
        assert size >= 1 and formed <= start <= end and start >= previous_end
        previous_end = end
    for r in requests:
        if r.id in served:
            assert r.arrival_s <= r.enqueue_s <= r.first_scheduled_s <= r.first_token_s == r.completion_s


@settings(max_examples=150, deadline=None)
@given(workload=workloads(), config=configs())
def test_each_bin_serves_its_requests_in_arrival_order(workload, config):
    """Within a bin (once the boundaries are set), requests start in the order they arrived."""
    arrivals, sizes, prompts, outputs = workload
    requests, _, _ = serve(config, arrivals, sizes, prompt_tokens=prompts, output_tokens=outputs)
    by_bin: dict[int, list[float]] = {}
    for r in requests:
        if not math.isnan(r.first_scheduled_s):
            by_bin.setdefault(r.bin, []).append(r.first_scheduled_s)
    for starts in by_bin.values():
        assert starts == sorted(starts)


@settings(max_examples=150, deadline=None)
@given(workload=workloads(), config=configs())
def test_batch_sizes_are_as_configured(workload, config):
    """A fixed B forms batches of exactly B (smaller only through max_wait_s); dynamic
    batches hold at most b_max and max_candidates requests."""
    arrivals, sizes, prompts, outputs = workload
    _, recorder, _ = serve(config, arrivals, sizes, prompt_tokens=prompts, output_tokens=outputs)
    for _replica, _id, _bin, size, *_rest in recorder.batches:
        if config.batch_size is not None:
            assert size == config.batch_size or (config.max_wait_s is not None and size < config.batch_size)
        else:
            assert size <= min(config.dynamic.b_max, config.dynamic.max_candidates)


@settings(max_examples=150, deadline=None)
@given(workload=workloads(), config=configs().filter(lambda c: c.dynamic is not None and c.dynamic.memory is not None))
def test_dynamic_batches_never_exceed_the_memory_limit_with_an_oracle(workload, config):
    """With exact length predictions, no dynamic batch holds more KV tokens than the limit."""
    import attrs

    config = attrs.evolve(config, bins=attrs.evolve(config.bins, predictor=OutputPredictor(kind="oracle")))
    arrivals, sizes, prompts, outputs = workload
    _, recorder, server = serve(config, arrivals, sizes, prompt_tokens=prompts, output_tokens=outputs)
    limit = config.dynamic.memory.eta_tokens
    assert all(b[10] <= limit for b in recorder.batches)
    assert server.kv.peak_used_blocks <= limit


@settings(max_examples=150, deadline=None)
@given(workload=workloads(), config=configs().filter(lambda c: c.dynamic is not None or c.max_wait_s is not None))
def test_no_request_is_left_waiting_when_partial_batches_may_form(workload, config):
    """With dynamic batching, or a fixed B with max_wait_s, every request that was not dropped
    is served by the time nothing is left to happen (a wait limit that runs out at a timer
    always lets the idle server take the bin)."""
    arrivals, sizes, prompts, outputs = workload
    requests, _, server = serve(config, arrivals, sizes, prompt_tokens=prompts, output_tokens=outputs)
    assert server.in_flight() == []
    assert all(r.dropped_reason or not math.isnan(r.completion_s) for r in requests)
