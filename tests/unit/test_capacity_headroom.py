"""Capacity probes: what tells headroom (busy fraction against batch occupancy), and seeds that
reach the workload.

Arrivals are evenly spaced and every step takes the same time, so both figures have closed
forms: a busy fraction from the engine's known busy time, an occupancy from Little's law."""

from __future__ import annotations

import math

import pytest

from simpy_llm.explore import capacity as cap
from simpy_llm.explore.capacity import (
    CapacityCard,
    Probe,
    StabilityCriteria,
    max_stable_load,
)


def engine(slots: int, step_s: float, output_tokens: int, rate: float, prompt_tokens: int = 16) -> dict:
    """One replica of *slots* batch slots and 64 KV blocks of 16 tokens whose every step takes
    *step_s* (no per-token cost), fed evenly spaced requests of *prompt_tokens* prompt and
    *output_tokens* output tokens at *rate*: each request is in service exactly
    ``output_tokens * step_s`` (one step per token)."""
    return {
        "seed": 3,
        "workload": {"aggregate_rate": rate, "num_requests": 100, "clients": [{
            "id": "only", "rate_fraction": 1.0, "arrival": {"process": "constant"},
            "input_distribution": {"type": "constant", "params": {"value": prompt_tokens}},
            "output_distribution": {"type": "constant", "params": {"value": output_tokens}}}]},
        "serving": {
            "replicas": 1,
            "engine": {"max_num_seqs": slots, "max_num_batched_tokens": 256, "chunked_prefill": True,
                       "kv_block_size": 16, "kv_num_blocks": 64},
            "latency_model": {"kind": "blis_linear", "params": {
                "beta0_us": step_s * 1e6, "beta1_us": 0.0, "beta2_us": 0.0,
                "alpha0_us": 0.0, "alpha1_us": 0.0, "alpha2_us": 0.0}},
        },
    }


def probe(data: dict, rate: float, warmup: int, measure: int) -> Probe:
    window = cap._window(warmup, measure, None, None)
    return cap._run_probe(data, {**window.overrides(), "workload.aggregate_rate": rate}, load=rate, replicas=None,
                          window=window, criteria=StabilityCriteria())


def test_one_slot_at_low_load_is_busy_rho_of_the_time():
    """One slot, 30 ms service, a request every 100 ms (rho = 0.3), 220 requests: the engine is
    busy 220 x 30 ms over a run ending at 22.0 + 0.03 s, and in the window (from the 21st to the
    220th arrival) each of the 199 requests inside holds the slot 30 ms of every 100: 0.3. A
    100-token prompt holds ceil(100 / 16) = 7 of the 64 KV blocks while it is served: 220 x 7 x
    30 ms of 64 blocks over the run."""
    rate, service_s, n = 10.0, 0.03, 220
    p = probe(engine(1, service_s, 1, rate, prompt_tokens=100), rate, 20, 200)
    end_s = n / rate + service_s
    assert p.sim_time_s == pytest.approx(end_s, rel=1e-9)
    assert p.busy_fraction == pytest.approx(n * service_s / end_s, rel=1e-9)
    assert p.batch_occupancy == pytest.approx(rate * service_s, rel=1e-9)
    assert p.kv_occupancy == pytest.approx(n * 7 * service_s / (64 * end_s), rel=1e-9)


def test_at_a_third_of_capacity_the_engine_never_idles_but_two_thirds_of_its_slots_are_free():
    """Eight slots, 10 ms steps, 10-token answers: a request is in service T = 0.1 s, so the
    replica's capacity is 8 / T = 80/s. At 80/3 per second a request arrives every 37.5 ms, well
    within T, so from the first arrival on the engine always has one to step: busy 1 - a1 / end
    (about 0.9997). The slots hold lambda x T = 8/3 requests on average (Little): occupancy 1/3.

    Error: the window's integral of requests in service differs from (arrivals in it) x T only
    by the requests straddling its two ends, at most ceil(lambda (T + step)) at each, each
    counting at most T: |occupancy - 1/3| <= ceil(lambda (T + step)) T / (window x slots)."""
    slots, step_s, tokens = 8, 0.01, 10
    service_s = tokens * step_s
    rate = slots / service_s / 3
    p = probe(engine(slots, step_s, tokens, rate), rate, 100, 3000)
    assert p.busy_fraction == pytest.approx(1 - (1 / rate) / p.sim_time_s, rel=1e-9)
    assert p.busy_fraction > 0.999
    window_s = 2999 / rate
    bound = math.ceil(rate * (service_s + step_s)) * service_s / (window_s * slots)
    assert abs(p.batch_occupancy - 1 / 3) <= bound
    assert p.throughput_rps == pytest.approx(rate, rel=1e-3)


def test_the_card_shows_both_figures():
    """The card's table has a busy-fraction and a batch-occupancy column; every probe that ran to
    its end has an occupancy (a pruned one has no figures)."""
    card = max_stable_load(cap._doctest_scenario(), low=10.0, high=40.0, tolerance=0.3,
                           warmup_requests=50, measure_requests=400)
    md = card.to_markdown()
    head = next(line for line in md.splitlines() if line.startswith("| load"))
    assert "busy_fraction" in head and "batch_occupancy" in head and "kv_occupancy" in head
    assert "utilization" not in head
    frame = card.to_frame()
    assert frame.loc[~frame["pruned"], "batch_occupancy"].notna().all()
    assert frame.loc[frame["pruned"], "batch_occupancy"].isna().all()


def test_a_card_written_with_utilization_reads_back_as_busy_fraction():
    """A probe stored before the occupancies existed keeps its ``utilization`` (the same
    figure) as busy_fraction; its occupancies are unknown (NaN)."""
    card = max_stable_load(cap._doctest_scenario(), low=10.0, high=40.0, tolerance=0.5,
                           warmup_requests=50, measure_requests=400)
    data = card.to_dict()
    for stored in data["probes"]:
        stored["utilization"] = stored.pop("busy_fraction")
        stored.pop("batch_occupancy"), stored.pop("kv_occupancy")
    again = CapacityCard.from_dict(data)
    assert [p.busy_fraction for p in again.probes] == [p.busy_fraction for p in card.probes]
    assert all(math.isnan(p.batch_occupancy) and math.isnan(p.kv_occupancy) for p in again.probes)


def test_a_fleet_without_batch_slots_has_no_occupancy():
    """A request-level batch server's batches are not max_num_seqs slots: its occupancy is NaN
    (refused), while its busy fraction is known."""
    data = cap._doctest_scenario()
    del data["serving"]["engine"], data["serving"]["latency_model"]
    data["serving"]["batch_server"] = {"batch_size": 4, "service": {"kind": "sampled", "params": {"distribution": {
        "type": "constant", "params": {"value": 0.04}}}}}
    p = probe(data, 10.0, 20, 300)
    assert math.isnan(p.batch_occupancy)
    assert 0.0 < p.busy_fraction <= 1.0


def test_seeds_reach_a_workload_with_its_own_seed():
    """The doctest server's workload given its own seed 9: each seed of the search is the whole
    run's root seed, so the probes of one load under seeds 1 and 2 see different arrivals."""
    data = cap._doctest_scenario()
    data["workload"]["seed"] = 9
    card = max_stable_load(data, low=10.0, high=12.0, tolerance=0.5, seeds=[1, 2], warmup_requests=20,
                           measure_requests=300)
    first = [p for p in card.probes if p.load == 10.0]
    assert [p.seed for p in first] == [1, 2]
    assert first[0].latency_s["e2e_p99"] != first[1].latency_s["e2e_p99"]
    assert first[0].offered_rps != first[1].offered_rps
