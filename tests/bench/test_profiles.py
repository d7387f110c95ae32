"""Benchmark profiles: the runs each makes and the target times of their requests."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from simpy_llm.observe.bench.profiles import RunPlan, SweepRangeWarning, arrival_times, fixed_plans, sweep_rates
from simpy_llm.observe.bench.run import bench, run_profile


def test_constant_arrivals_are_evenly_spaced_at_the_rate() -> None:
    """``constant`` sends request i at i / rate."""
    assert arrival_times(RunPlan("constant", rate=8.0), 5) == [0.0, 0.125, 0.25, 0.375, 0.5]


def test_poisson_gaps_are_seeded_exponential_draws() -> None:
    """``poisson`` starts at 0 and adds the seed's exponential gaps of mean 1 / rate."""
    times = arrival_times(RunPlan("poisson", rate=4.0), 4, seed=7)
    gaps = np.random.default_rng(7).exponential(0.25, size=3)
    assert times == pytest.approx([0.0, *np.cumsum(gaps)], rel=0, abs=0)
    assert times != arrival_times(RunPlan("poisson", rate=4.0), 4, seed=8)


@pytest.mark.parametrize("plan", [RunPlan("synchronous", concurrency=1), RunPlan("throughput"), RunPlan("poisson")])
def test_closed_profiles_and_an_infinite_rate_send_everything_at_once(plan: RunPlan) -> None:
    """Synchronous, throughput and an infinite rate make every request due at 0 (slots pace them)."""
    assert arrival_times(plan, 3) == [0.0, 0.0, 0.0]


def test_each_profile_makes_its_runs() -> None:
    """Synchronous is one request at a time; throughput and the rates take the first
    --max-concurrency as their limit; concurrency makes a run per value."""
    assert fixed_plans("synchronous", [], []) == [RunPlan("synchronous", concurrency=1)]
    assert fixed_plans("throughput", [], [6]) == [RunPlan("throughput", concurrency=6)]
    assert fixed_plans("constant", [2.0, 4.0], [3]) == [RunPlan("constant", 2.0, 3), RunPlan("constant", 4.0, 3)]
    assert [p.concurrency for p in fixed_plans("concurrency", [], [1, 4, 16])] == [1, 4, 16]


def test_sweep_rates_rise_evenly_to_the_saturated_rate() -> None:
    """N rates evenly spaced after the synchronous rate, the last the throughput run's."""
    assert sweep_rates(2.0, 12.0, 5) == [4.0, 6.0, 8.0, 10.0, 12.0]


def _sweep(sync_rate: float, throughput_rate: float) -> list[RunPlan]:
    """The plans a sweep makes when its synchronous and throughput runs reach these rates."""
    plans: list[RunPlan] = []

    def one(plan: RunPlan) -> dict[str, float]:
        plans.append(plan)
        return {"request_throughput": {"synchronous": sync_rate, "throughput": throughput_rate}.get(plan.strategy, 1.0)}

    run_profile("sweep", (), (), 2, None, one)
    return plans


def test_a_sweep_whose_throughput_run_is_no_faster_warns_and_still_runs_its_rates() -> None:
    """Throughput no faster than one at a time (a server without a batching gain): the sweep says
    that no rate lies between the synchronous and the saturation rate, then runs its rates."""
    with pytest.warns(SweepRangeWarning, match=r"throughput run \(1\.19 requests/s\) was no faster than the synchronous run \(1\.26/s\)"):
        plans = _sweep(1.26, 1.19)
    assert [p.rate for p in plans[2:]] == pytest.approx([1.225, 1.19])


def test_a_sweep_with_a_batching_gain_does_not_warn() -> None:
    """Throughput above the synchronous rate: rates in between, no warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", SweepRangeWarning)
        plans = _sweep(1.0, 3.0)
    assert [p.rate for p in plans[2:]] == [2.0, 3.0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"profile": "synchronous", "request_rates": (4.0,)}, "--request-rate is for --profile constant or poisson"),
        ({"profile": "synchronous", "max_concurrency": (2,)}, "does not apply to --profile synchronous"),
        ({"profile": "concurrency"}, "--profile concurrency needs --max-concurrency"),
        ({"profile": "throughput", "max_concurrency": (2, 4)}, "make a sweep of --profile concurrency"),
        ({"profile": "poisson", "rates": 3}, "--rates and --sweep-arrivals are for --profile sweep"),
        ({"profile": "sweep", "rates": 0}, "--rates must be at least 1"),
        ({"profile": "poisson", "max_seconds": 0.0}, "--max-seconds must be > 0"),
        ({"profile": "poisson", "max_error_rate": 1.0}, r"--max-error-rate must be in \[0, 1\)"),
        ({"profile": "poisson", "num_prompts": 0}, "--num-prompts must be at least 1"),
        ({"profile": "poisson", "request_rates": (0.0,)}, "--request-rate values must be > 0"),
        ({"profile": "ramp"}, "--profile must be one of"),
    ],
)
def test_options_that_do_not_fit_the_profile_are_refused_before_sending(kwargs: dict[str, object], message: str) -> None:
    """An option the profile would not use, or out of its range, is refused naming it (the URL
    is never contacted: nothing listens there)."""
    with pytest.raises(ValueError, match=message):
        bench("http://127.0.0.1:9", "unused", **kwargs)  # type: ignore[arg-type]


def test_infinite_rate_is_the_default_of_the_rate_profiles() -> None:
    """A rate profile without --request-rate sends everything at once, as vLLM's default."""
    assert fixed_plans("poisson", [math.inf], []) == [RunPlan("poisson", math.inf, None)]
