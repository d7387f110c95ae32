"""The default SLA controller converges to the largest batch size that meets the SLA, from any
starting interval (hypothesis, derandomized by the suite's profile).

Each example draws a latency that is a fixed, non-decreasing function of the batch size
(affine, seed 001 §5.1's linear model with equal request lengths, or a staircase), a target
D_SLA, a tolerance, the averaging (moving average of some weight, or a window) and a
starting interval inside [b_min, b_max]. The right answer is read off the function
itself: the largest ``b`` in [b_min, b_max] with ``latency(b) <= D_SLA`` (b_min when none
is). The controller is driven as the batcher drives it (full batches of its answer).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm.policies.batching import CorrectedSLAController

SETTLE = 200
"""Batches allowed to find the answer (a bisection over at most 64 sizes plus the 20 % steps
takes well under 60)."""
HOLD = 200
"""Batches it must then keep the answer for."""


@st.composite
def latencies(draw):
    kind = draw(st.sampled_from(["affine", "linear_model", "staircase"]))
    if kind == "affine":
        c0, c1 = draw(st.floats(0.0, 2.0)), draw(st.floats(0.01, 1.0))
        return lambda n: c0 + c1 * n
    if kind == "linear_model":  # base + coeff * L * (1 + beta (n - 1) / n), every request L tokens
        base, scale, beta = draw(st.floats(0.0, 0.5)), draw(st.floats(0.05, 2.0)), draw(st.floats(0.0, 5.0))
        return lambda n: base + scale * (1 + beta * (n - 1) / n)
    cuts = draw(st.lists(st.integers(1, 64), min_size=1, max_size=6))
    step = draw(st.floats(0.05, 1.0))
    return lambda n: 0.5 + step * sum(n >= c for c in cuts)


@st.composite
def cases(draw):
    latency = draw(latencies())
    b_min = draw(st.integers(1, 8))
    b_max = draw(st.integers(b_min, 64))
    values = [latency(n) for n in range(b_min, b_max + 1)]
    # Targets from below the fastest size to above the slowest, and exactly on a size's latency.
    d_sla = draw(st.floats(0.8 * min(values), 1.2 * max(values)) | st.sampled_from(values))
    b_low = draw(st.integers(b_min, b_max))
    b_high = draw(st.integers(b_low, b_max))
    averaging = draw(st.sampled_from([{"alpha": 0.05}, {"alpha": 0.2}, {"alpha": 0.5}, {"alpha": 1.0},
                                      {"window_batches": 1}, {"window_batches": 5}]))
    eps = draw(st.sampled_from([0.0, 0.01, 0.1])) * d_sla
    controller = CorrectedSLAController(d_sla_s=d_sla, eps_d_s=eps, b_min=b_min, b_max=b_max,
                                        b_low=b_low, b_high=b_high, **averaging)
    meeting = [n for n in range(b_min, b_max + 1) if latency(n) <= d_sla]
    return controller, latency, max(meeting) if meeting else b_min


@settings(max_examples=400, deadline=None)
@given(case=cases())
def test_converges_to_the_largest_size_that_meets_the_sla_and_stays(case):
    """From any starting interval the answer is the largest SLA-meeting size within SETTLE
    batches, and stays it for the next HOLD batches."""
    controller, latency, best = case
    sizes = []
    for _ in range(SETTLE + HOLD):
        size = controller.b_sla()
        sizes.append(size)
        controller.update(latency(size), size)
    assert sizes[SETTLE:] == [best] * HOLD, (best, sizes[:40])
