"""The capacity search against closed forms: M/M/1 capacity and the Pollaczek-Khinchine wait.

Both cases use the degenerate single-server replica of ``test_closed_forms``
(``max_num_seqs: 1``, one output token, the whole prompt one step; mean service
40 ms, so mu = 25 requests/s), with the load ``workload.aggregate_rate`` searched in
``[0.5 mu, 1.5 mu]`` to a relative bracket width ``TOL = 0.02``. Each probe runs
``WARMUP`` warm-up requests (starting empty; at rho = 0.8 the relaxation time is ~70
arrivals, at 0.98 ~ 10k) then ``MEASURE`` measured ones, under one fixed seed.

Error analysis
--------------
**M/M/1, max stable load = mu.** The queue-growth criterion flags a load when the
backlog grows by more than ``GROWTH = 0.005`` of the window's arrivals. Above mu the
expected growth share is ``1 - mu / lambda`` (0.0196 at 1.02 mu) and its standard
deviation about ``sqrt(2 / N) = 0.0045`` for N = 100k arrivals (arrivals and
departures both Poisson-like while the server is busy), so loads >= 1.02 mu fail with
z >= 3.2. Below mu the growth is a difference of two stationary queue lengths
(mean rho / (1 - rho) = 49 at 0.98 mu), ~0.0005 of arrivals: loads <= 0.98 mu pass
with a wide margin. Between, the verdict may go either way: at lambda = mu the growth
of a reflected random walk is ~0.8 sqrt(2N) ~ 0.0036 of arrivals. So the criterion
resolves mu to ``RESOLUTION = 1.5%``, and the final bracket ``[lower, upper]`` (at most
TOL wide) widened by it contains mu: ``lower / (1 + RESOLUTION) <= mu <= upper * (1 + RESOLUTION)``.

**M/D/1, max SLO-goodput load with a mean-wait SLO.** The scenario's
``queue_delay`` is the time in the waiting queue (``first_scheduled_s -
enqueue_s``, service excluded), i.e. Pollaczek-Khinchine's ``Wq = rho / (2 mu (1 - rho))``.
For a target ``Wq = 0.08 s`` that gives rho* = 0.8, lambda* = 20/s. The relative standard
deviation of the mean-wait estimator at rho = 0.8 over 100k requests is about 2.2%
(0.89% at 600k, ``test_closed_forms``, scaled by sqrt(6)); since d ln Wq / d ln rho =
1 / (1 - rho) = 5, that is 0.44% in the load. The final bracket widened by three such
standard deviations (1.3%) contains lambda*.
"""

from __future__ import annotations

import functools

import pytest

from simpy_llm.explore.capacity import StabilityCriteria, max_stable_load
from tests.integration.test_closed_forms import MU, single_server

TOL = 0.02
WARMUP = 5_000
MEASURE = 100_000
GROWTH = 0.005
RESOLUTION = 0.015
MD1_TARGET_WQ_S = 0.08
MD1_LOAD = 20.0
MD1_NOISE = 3 * 0.0044


def md1_wait(lam: float) -> float:
    """Pollaczek-Khinchine mean wait in queue of M/D/1: ``rho / (2 mu (1 - rho))``."""
    rho = lam / MU
    return rho / (2 * MU * (1 - rho))


@functools.cache
def card(kind: str):
    """The capacity search of one case, run once per session."""
    slo = {"queue_delay_mean": MD1_TARGET_WQ_S} if kind == "md1" else None
    return max_stable_load(
        single_server(kind, 0.5, 10, seed=21 if kind == "mm1" else 22),
        low=0.5 * MU,
        high=1.5 * MU,
        tolerance=TOL,
        criteria=StabilityCriteria(max_backlog_growth=GROWTH, slo=slo),
        warmup_requests=WARMUP,
        measure_requests=MEASURE,
    )


def test_md1_target_load_solves_pollaczek_khinchine():
    """The load the M/D/1 truth test expects is the one whose PK mean wait is the target."""
    assert md1_wait(MD1_LOAD) == pytest.approx(MD1_TARGET_WQ_S, rel=1e-12)


@pytest.mark.slow
def test_mm1_max_stable_load_is_mu():
    """On an M/M/1 server the max stable load is the service rate mu, to within the
    search tolerance and the criterion's resolution (see the module docstring)."""
    c = card("mm1")
    assert c.upper_stable_load / c.max_stable_load - 1 <= TOL
    assert c.max_stable_load / (1 + RESOLUTION) <= MU <= c.upper_stable_load * (1 + RESOLUTION)
    assert any(p.pruned for p in c.probes)  # the probe at 1.5 mu stopped early


@pytest.mark.slow
def test_md1_mean_wait_slo_load_matches_pollaczek_khinchine():
    """On an M/D/1 server with a mean-wait SLO Wq <= 0.08 s the max SLO-goodput load is
    the PK load lambda* = 20/s, to within the tolerance and the estimator's noise; the
    max stable load is again mu."""
    c = card("md1")
    assert c.upper_goodput_load / c.max_goodput_load - 1 <= TOL
    assert c.max_goodput_load * (1 - MD1_NOISE) <= MD1_LOAD <= c.upper_goodput_load * (1 + MD1_NOISE)
    assert c.max_stable_load / (1 + RESOLUTION) <= MU <= c.upper_stable_load * (1 + RESOLUTION)
