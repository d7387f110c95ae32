"""Closed-form queueing results reproduced by a degenerate replica.

With ``max_num_seqs: 1``, one output token per request and no chunked
prefill, a replica is a single FIFO server: each request is admitted alone,
its whole prompt is one engine step of ``beta0 + beta1 * prompt_tokens``
microseconds, and the token that step emits is its last, so it leaves at the
step's end. With Poisson arrivals that is

* **M/D/1** for a constant prompt:  ``Wq = rho / (2 mu (1 - rho))``;
* **M/M/1** for exponential prompts and ``beta0 = 0`` (service time
  proportional to the prompt):  ``Wq = rho / (mu - lambda)``;

where ``Wq`` is the mean time in the waiting queue, measured as
``first_scheduled_s - enqueue_s`` (``Results.derived()["queue_delay_s"]``),
and the server's busy fraction is ``rho = lambda / mu``.

Set-up details:

* ``beta0_us = 0`` is only accepted with ``beta2_us > 0``; ``beta2`` (per
  decode token) is unused because no request ever decodes.
* Every ``alpha`` is 0: requests enter the waiting queue at arrival and the
  client sees the token when the step ends.
* ``max_num_batched_tokens`` and the KV cache are 2**20 tokens, so any prompt
  is one step and nothing is dropped (an Exp(4000) prompt exceeds 2**20 with
  probability e**-262); the tests assert zero drops.
* Nothing is discarded as warm-up. The run starts empty, which biases the
  mean wait down by about (relaxation time / run length): at rho = 0.8 the
  M/M/1 relaxation time is 1 / (mu (1 - sqrt(rho))**2) ~ 3.6 s ~ 70
  arrivals, a relative bias of order 1e-4 over 600k-1M requests.
* Run lengths were chosen with a numpy Lindley recursion over 60 seeds per
  case: the relative standard deviation of the mean-wait estimator is about
  0.84% (M/M/1, rho 0.5, 400k), 0.89% (M/M/1, rho 0.8, 1M), 0.51% (M/D/1,
  rho 0.5, 400k) and 0.89% (M/D/1, rho 0.8, 600k), so the 3% tolerance is
  >= 3.4 standard deviations; the utilisation estimator's is <= 0.25%
  against a 2% tolerance.
"""

from __future__ import annotations

import functools
import math

import attrs
import numpy as np
import pytest

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.serving.latency import BlisLinearLatency

MEAN_SERVICE_S = 0.04
"""Mean service time of every case, s (so mu = 25 requests/s)."""
MU = 1.0 / MEAN_SERVICE_S

EXP_MEAN_PROMPT = 4000
"""Mean of the exponential prompt (M/M/1), tokens."""
MM1_BETA1_US = MEAN_SERVICE_S * 1e6 / EXP_MEAN_PROMPT
"""10 us per prompt token: 4000 tokens on average -> 0.04 s."""

MD1_PROMPT = 3500
MD1_BETA0_US = 5000.0
MD1_BETA1_US = 10.0
"""5000 us + 3500 tokens x 10 us = 0.04 s, every request."""

BIG = 1 << 20
"""Token budget and KV capacity: far above any sampled prompt."""

REQUESTS = {
    ("mm1", 0.5): 400_000,
    ("mm1", 0.8): 1_000_000,
    ("md1", 0.5): 400_000,
    ("md1", 0.8): 600_000,
}
SEEDS = {
    ("mm1", 0.5): 11,
    ("mm1", 0.8): 12,
    ("md1", 0.5): 13,
    ("md1", 0.8): 14,
}
"""One seed per case. Arrival gaps are standard exponentials scaled by 1 / rate,
so cases sharing a seed would share one arrival sample path and their errors
would be correlated; distinct seeds keep the four checks independent."""

CASES = [
    pytest.param(kind, rho, id=f"{kind}-rho{rho}", marks=pytest.mark.slow) for kind, rho in REQUESTS
]


def single_server(kind: str, rho: float, num_requests: int, seed: int) -> dict:
    """A scenario whose replica is a single FIFO server at utilisation *rho*.

    *kind* is ``"mm1"`` (exponential prompts, service proportional to the
    prompt) or ``"md1"`` (constant prompt, constant service).
    """
    if kind == "mm1":
        prompt = {"type": "exponential", "params": {"mean": EXP_MEAN_PROMPT}}
        beta = {"beta0_us": 0.0, "beta1_us": MM1_BETA1_US, "beta2_us": 1.0}
    elif kind == "md1":
        prompt = {"type": "constant", "params": {"value": MD1_PROMPT}}
        beta = {"beta0_us": MD1_BETA0_US, "beta1_us": MD1_BETA1_US, "beta2_us": 1.0}
    else:
        raise ValueError(kind)
    return {
        "seed": seed,
        "workload": {
            "aggregate_rate": rho * MU,
            "num_requests": num_requests,
            "clients": [
                {
                    "id": "only",
                    "rate_fraction": 1.0,
                    "arrival": {"process": "poisson"},
                    "input_distribution": prompt,
                    "output_distribution": {"type": "constant", "params": {"value": 1}},
                }
            ],
        },
        "serving": {
            "replicas": 1,
            "engine": {
                "max_num_seqs": 1,
                "max_num_batched_tokens": BIG,
                "chunked_prefill": False,
                "kv_block_size": 1024,
                "kv_num_blocks": BIG // 1024,
                "prefix_caching": False,  # every prompt is unique: nothing to find, only cost
            },
            "latency_model": {
                "kind": "blis_linear",
                "params": {**beta, "alpha0_us": 0.0, "alpha1_us": 0.0, "alpha2_us": 0.0},
            },
        },
    }


@attrs.frozen
class Measured:
    """What a single-server run measured (kept small so runs can be cached)."""

    arrived: int
    completed: int
    dropped: int
    mean_wait_s: float
    utilisation: float


@functools.cache
def measure(kind: str, rho: float) -> Measured:
    """Run the single-server case once per session; the mean-wait and
    utilisation tests share it."""
    results = Simulation(scenario_from_dict(single_server(kind, rho, REQUESTS[kind, rho], SEEDS[kind, rho]))).run()
    s = results.summary()
    done = results.columns["status"] == "completed"
    return Measured(
        arrived=s["requests"]["arrived"],
        completed=s["requests"]["completed"],
        dropped=s["requests"]["dropped"],
        mean_wait_s=float(results.derived()["queue_delay_s"][done].mean()),
        utilisation=s["engine"]["busy_s"][0] / s["duration_s"],
    )


def mm1_wait(rho: float) -> float:
    """M/M/1 mean wait in queue: ``Wq = rho / (mu - lambda)``."""
    return rho / (MU - rho * MU)


def md1_wait(rho: float) -> float:
    """M/D/1 mean wait in queue: ``Wq = rho / (2 mu (1 - rho))``."""
    return rho / (2 * MU * (1 - rho))


def discretised_exponential_moments(mean: float) -> tuple[float, float]:
    """E[P] and E[P^2] of ``P = max(rint(X), 1)``, X ~ Exp(mean): the prompt the
    workload actually draws (half-to-even ties have probability zero)."""
    k = np.arange(2, int(mean * 60) + 1, dtype=np.float64)  # tail beyond: e**-60
    p = np.exp(-(k - 0.5) / mean) - np.exp(-(k + 0.5) / mean)
    p1 = -math.expm1(-1.5 / mean)  # P = 1 for X < 1.5
    return p1 + float(np.dot(k, p)), p1 + float(np.dot(k * k, p))


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_mm1_token_rounding_is_negligible(rho: float) -> None:
    """Rounding Exp(4000) prompts to whole tokens (and clamping at 1) leaves the
    service time exponential to within 1e-6: the Pollaczek-Khinchine wait
    ``Wq = lambda E[S^2] / (2 (1 - lambda E[S]))`` from the discretised
    prompt's exact moments equals the M/M/1 ``rho / (mu - lambda)``."""
    m1, m2 = discretised_exponential_moments(EXP_MEAN_PROMPT)
    lam = rho * MU
    es, es2 = m1 * MM1_BETA1_US * 1e-6, m2 * (MM1_BETA1_US * 1e-6) ** 2
    pk = lam * es2 / (2 * (1 - lam * es))
    assert pk == pytest.approx(mm1_wait(rho), rel=1e-6)


@pytest.mark.parametrize(("kind", "rho"), [c for c in CASES if c.values[0] == "mm1"])
def test_mm1_mean_wait_matches_closed_form(kind: str, rho: float) -> None:
    """A single server with Poisson arrivals and exponential service has mean wait
    in queue ``Wq = rho / (mu - lambda)`` (within 3%), and drops nothing."""
    m = measure(kind, rho)
    assert m.dropped == 0
    assert m.completed == m.arrived == REQUESTS[kind, rho]
    assert m.mean_wait_s == pytest.approx(mm1_wait(rho), rel=0.03)


@pytest.mark.parametrize(("kind", "rho"), [c for c in CASES if c.values[0] == "md1"])
def test_md1_mean_wait_matches_closed_form(kind: str, rho: float) -> None:
    """A single server with Poisson arrivals and constant service has mean wait
    in queue ``Wq = rho / (2 mu (1 - rho))`` (within 3%), and drops nothing."""
    m = measure(kind, rho)
    assert m.dropped == 0
    assert m.completed == m.arrived == REQUESTS[kind, rho]
    assert m.mean_wait_s == pytest.approx(md1_wait(rho), rel=0.03)


@pytest.mark.parametrize(("kind", "rho"), CASES)
def test_single_server_utilisation_is_rho(kind: str, rho: float) -> None:
    """The engine's busy time over the run's duration is the utilisation
    ``rho = lambda / mu`` (within 2%)."""
    assert measure(kind, rho).utilisation == pytest.approx(rho, rel=0.02)


def test_single_server_waits_follow_lindley_recursion() -> None:
    """Request by request, the degenerate replica is a FIFO single server: with
    ``start_n = max(arrival_n, end_{n-1})`` and ``end_n = start_n + S(prompt_n)``,
    each request's ``first_scheduled_s`` is ``start_n`` and its
    ``completion_s`` is ``end_n`` (Lindley's recursion, to 1e-9 s)."""
    n = 20_000
    data = single_server("mm1", 0.8, n, seed=3)
    results = Simulation(scenario_from_dict(data)).run()
    c = results.columns
    assert (c["status"] == "completed").all() and len(results) == n
    model = BlisLinearLatency(**data["serving"]["latency_model"]["params"])
    starts = np.empty(n)
    ends = np.empty(n)
    free = 0.0
    for i, (arrival, prompt) in enumerate(zip(c["arrival_s"].tolist(), c["prompt_tokens"].tolist(), strict=True)):
        start = arrival if arrival > free else free
        free = start + model.step_time_s(prompt, 0)
        starts[i] = start
        ends[i] = free
    np.testing.assert_allclose(c["enqueue_s"], c["arrival_s"], rtol=0, atol=0)
    np.testing.assert_allclose(c["first_scheduled_s"], starts, rtol=0, atol=1e-9)
    np.testing.assert_allclose(c["completion_s"], ends, rtol=0, atol=1e-9)
    np.testing.assert_allclose(c["first_token_s"], c["completion_s"], rtol=0, atol=0)
