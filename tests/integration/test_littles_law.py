"""Little's law and request conservation on the quickstart scenario.

``in_system`` counts requests from arrival until their last token is computed
(or they are dropped). ``e2e_s`` runs from arrival to ``completion_s``, which
is the end of the last step plus ``output_tokens * alpha2`` (BLIS's
client-side post-processing per output token). With ``alpha2_us = 0`` the two
intervals coincide, so Little's law ``L = lambda W`` must hold with
``L`` = time-averaged ``in_system``, ``lambda`` = arrivals / duration and
``W`` = mean E2E. (With ``alpha2_us > 0``, E2E would include time after the
server is done, and ``lambda * mean(e2e)`` would exceed ``L``.)

For a run that ends with the system empty, Little's law is a sample-path
identity: both sides equal ``sum(e2e) / duration``. The 1% tolerance is
therefore generous; a failure means the level monitor and the records
disagree about when requests were in the system.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

from simpy_llm import Results, Simulation, load_scenario

QUICKSTART = Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.yaml"
BASE = ["workload.num_requests=5000", "serving.latency_model.params.alpha2_us=0"]
VARIANTS = {
    "one_replica": [],
    "two_replicas_least_loaded": ["serving.replicas=2", "serving.router.kind=least_loaded"],
}
CUT_S = 100.0
"""``simulation.until_s`` of the truncated run (arrivals continue to ~250 s)."""
TRUNCATED = [
    f"simulation.until_s={CUT_S}",
    # Drops ~4% of requests (prompt + output > 2000), so every term of the
    # conservation law is exercised.
    "serving.engine.max_model_len=2000",
]


@functools.cache
def quickstart(*overrides: str) -> Results:
    """The quickstart scenario with 5000 requests, alpha2 = 0 and *overrides*, run once."""
    return Simulation(load_scenario(QUICKSTART, [*BASE, *overrides])).run()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_littles_law_time_average_in_system(variant: str) -> None:
    """``L = lambda W``: time-averaged requests in system equals
    (arrived / duration_s) * mean(e2e_s) within 1%, for one replica and for two
    replicas behind least_loaded (every request completes, none dropped)."""
    results = quickstart(*VARIANTS[variant])
    s = results.summary()
    assert s["requests"]["completed"] == s["requests"]["arrived"] == 5000
    lam = s["requests"]["arrived"] / s["duration_s"]
    w = float(np.mean(results.derived()["e2e_s"]))
    assert s["in_system"]["time_average"] == pytest.approx(lam * w, rel=0.01)


def test_truncated_run_conserves_requests() -> None:
    """Stopped at ``until_s`` with requests still in the system:
    arrived = completed + dropped + in_flight, each term non-zero, and one
    record per arrival."""
    results = quickstart(*TRUNCATED)
    s = results.summary()
    req = s["requests"]
    assert s["duration_s"] == CUT_S
    assert req["completed"] > 0 and req["dropped"] > 0 and req["in_flight"] > 0
    assert req["arrived"] == req["completed"] + req["dropped"] + req["in_flight"]
    assert len(results) == req["arrived"]
    assert np.array_equal(np.sort(results.columns["request_id"]), np.arange(req["arrived"]))


def test_truncated_run_in_system_area_matches_records() -> None:
    """Finite-horizon Little's law: over [0, T] with T = until_s,
    ``L * T = sum(e2e of completed) + sum(T - arrival of in-flight)``
    (dropped requests leave at arrival and add nothing), to 1e-9."""
    results = quickstart(*TRUNCATED)
    s = results.summary()
    c = results.columns
    t = s["duration_s"]
    done = c["status"] == "completed"
    in_flight = c["status"] == "in_flight"
    area = float(results.derived()["e2e_s"][done].sum() + (t - c["arrival_s"][in_flight]).sum())
    assert s["in_system"]["time_average"] * t == pytest.approx(area, rel=1e-9)
