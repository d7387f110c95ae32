"""The SLA controllers of dynamic batching against hand-worked trajectories.

The driving loop is the batcher's: ``size = controller.b_sla()``, a batch of that size
takes ``latency(size)``, then ``controller.update(latency(size), size)``. The latency
functions are fixed, so the right answer is known by hand: the largest size ``b`` with
``latency(b) <= d_sla_s``. Every trajectory below was worked out from the rules written
in the controllers' docstrings (``docs/batching.md``); the arithmetic is in the comments.
"""

from __future__ import annotations

import pytest

from simpy_llm.policies.batching import (
    CorrectedSLAController,
    DynamicBatchSizer,
    RecentMean,
    SLAController,
)


def _drive(controller, latency, batches: int) -> list[int]:
    sizes = []
    for _ in range(batches):
        size = controller.b_sla()
        sizes.append(size)
        controller.update(latency(size), size)
    return sizes


def _lock_up_latency(n: int) -> float:
    """Seed 001 §5.1's linear model with every request 200 tokens long: base 0.0527 s,
    0.002 s per token, batch penalty 4: ``0.0527 + 0.4 * (1 + 4 (n - 1) / n)``."""
    return 0.0527 + 0.4 * (1 + 4 * (n - 1) / n)


# Hand values: f(2) = 0.0527 + 0.4 * 3 = 1.2527; f(3) = 0.0527 + 0.4 * (1 + 8/3) = 1.519367;
# f(4) = 0.0527 + 0.4 * 4 = 1.6527; f(7) = 0.0527 + 0.4 * (1 + 24/7) = 1.824129;
# f(13) = 0.0527 + 0.4 * (1 + 48/13) = 1.929623; f(22) = 0.0527 + 0.4 * (1 + 84/22) = 1.979973;
# f(25) = 0.0527 + 0.4 * (1 + 96/25) = 1.9887. With D_SLA = 1.55: 3 meets it, 4 does not.
D_LOCK, EPS_LOCK = 1.55, 0.07


def test_the_lock_up_case_by_hand():
    """The latency model of the lock-up case: sizes up to 3 meet D_SLA = 1.55 s, 4 and up miss it."""
    assert _lock_up_latency(3) == pytest.approx(1.519367, abs=1e-6)
    assert _lock_up_latency(4) == pytest.approx(1.6527, abs=1e-12)
    assert _lock_up_latency(22) == pytest.approx(1.979973, abs=1e-6)
    assert max(n for n in range(1, 49) if _lock_up_latency(n) <= D_LOCK) == 3


def test_the_seed_rule_locks_on_22_while_3_meets_the_sla():
    """Seed 001's Algorithm 2 as written (``sla_controller: seed``) settles on 22 requests, whose
    batches take 1.98 s against a 1.55 s target, and never leaves it.

    Why: once the interval is [22, 22] with the average batch size in [22, 23) and the average
    latency above D + eps = 1.62, the too-slow branch sets b_high = min(22, int(b_avg)) = 22
    and b_low = max(22, int(0.8 b_avg)) = 22; batches of 22 keep b_avg in [22, 23) (it decays
    towards 22 from above) and the latency average towards f(22) = 1.98 > 1.62. The branch
    only ever raises b_low, so nothing lowers the interval again."""
    c = SLAController(d_sla_s=D_LOCK, eps_d_s=EPS_LOCK, b_min=1, b_max=48)
    sizes = _drive(c, _lock_up_latency, 30)
    first = sizes.index(22)
    assert (c.b_low, c.b_high) == (22, 22) and 22 <= c.b_avg < 23 and c.tau_avg_s > D_LOCK + EPS_LOCK
    sizes += _drive(c, _lock_up_latency, 1000)
    assert set(sizes[first:]) == {22}
    assert _lock_up_latency(22) > D_LOCK  # every one of those batches misses the SLA


def test_the_corrected_controller_bisects_to_3_on_the_lock_up_case():
    """The default controller finds 3 in six batches and stays there.

    Nothing known: [1, 48] -> (1 + 48 + 1) // 2 = 25, f = 1.99 misses; fail = 25 -> [1, 24]
    -> 13 misses; [1, 12] -> 7 misses; [1, 6] -> 4 misses; [1, 3] -> 2 meets (1.25);
    good = 2, fail = 4 -> [2, 3] -> 3 meets (1.52); good = 3 = fail - 1: closed, 3 for good."""
    c = CorrectedSLAController(d_sla_s=D_LOCK, eps_d_s=EPS_LOCK, b_min=1, b_max=48)
    sizes = _drive(c, _lock_up_latency, 500)
    assert sizes[:7] == [25, 13, 7, 4, 2, 3, 3]
    assert set(sizes[5:]) == {3}
    assert (c.b_low, c.b_high) == (3, 3)


def test_a_latency_of_exactly_d_sla_meets_it():
    """0.5 s per request and D_SLA = 2 s: 4 requests take exactly 2 s, which meets the target.

    [1, 64] -> 33 (16.5 s) misses; [1, 32] -> 17 misses; [1, 16] -> 9 misses; [1, 8] -> 5
    (2.5 s) misses; [1, 4] -> 3 meets (1.5 s); [3, 4] -> 4 meets (2.0 s); closed below 5."""
    c = CorrectedSLAController(d_sla_s=2.0, eps_d_s=0.2, b_min=1, b_max=64)
    assert _drive(c, lambda n: 0.5 * n, 12) == [33, 17, 9, 5, 3, 4, 4, 4, 4, 4, 4, 4]


def test_a_miss_at_b_low_reopens_the_interval_downward():
    """Started on [20, 20] with latency n seconds for n requests and D_SLA = 5.5 s (the answer
    is 5): each miss at b_low re-opens the interval to [int(0.8 * fail), fail - 1].

    20 misses: b_low 20 >= fail -> [16, 19] -> 18; [16, 17] -> 17; [16, 16] -> 16 misses at
    b_low -> [12, 15] -> 14; [12, 13] -> 13; [12, 12] -> 12 -> [9, 11] -> 10; [9, 9] -> 9 ->
    [7, 8] -> 8; [7, 7] -> 7 -> [5, 6] -> 6; [5, 5] -> 5 meets; closed below 6."""
    c = CorrectedSLAController(d_sla_s=5.5, eps_d_s=0.5, b_min=1, b_max=64, b_low=20, b_high=20)
    sizes = _drive(c, float, 40)
    assert sizes[:14] == [20, 18, 17, 16, 14, 13, 12, 10, 9, 8, 7, 6, 5, 5]
    assert set(sizes[12:]) == {5}


def test_all_sizes_missing_gives_b_min():
    """When even b_min misses the target, the answer is b_min (the best there is)."""
    c = CorrectedSLAController(d_sla_s=0.5, eps_d_s=0.05, b_min=3, b_max=20)
    sizes = _drive(c, float, 30)  # n seconds for n requests: 3 s > 0.5 s
    assert set(sizes[-10:]) == {3}


def test_the_controller_follows_a_slower_and_then_a_faster_server():
    """Settled on the answer, it re-opens downward when the server slows down (the SLA is
    missed at b_low) and upward when it speeds up by more than eps_d_s.

    n s per batch of n, D = 5.5: answer 5. Then 2n s: 2 * 2 = 4 <= 5.5 < 6 = 2 * 3, answer 2.
    Then n / 2 s: 11 / 2 = 5.5 <= 5.5 < 6 = 12 / 2, answer 11."""
    c = CorrectedSLAController(d_sla_s=5.5, eps_d_s=0.2, b_min=1, b_max=64)
    assert set(_drive(c, float, 200)[-50:]) == {5}
    assert set(_drive(c, lambda n: 2.0 * n, 300)[-50:]) == {2}
    assert set(_drive(c, lambda n: 0.5 * n, 300)[-50:]) == {11}


def test_noise_makes_one_slow_batch_inconclusive():
    """With batch-to-batch noise measured, one batch above D_SLA does not mark its size as
    missing; without noise it does.

    Size 4 takes 1 s then 3 s: its average is their mean, 2 s, and the noise estimate is the
    squared deviation of the second from the first, (3 - 1)^2 = 4 s^2 (sd 2 s). One batch of
    8 then takes 7 s against D = 5 s: 7 - 2 * 2 s * sqrt(1) = 3 s is within the target, so 8
    is undecided: nothing is known to miss, the interval is [4, 16] and the answer is
    (4 + 16 + 1) // 2 = 10. With size 4 at 2 s twice (no noise) the same batch of 8 misses:
    [4, 7] and the answer is 6."""
    noisy = CorrectedSLAController(d_sla_s=5.0, eps_d_s=0.5, b_min=1, b_max=16, alpha=0.5)
    for latency_s, size in [(1.0, 4), (3.0, 4), (7.0, 8)]:
        noisy.update(latency_s, size)
    assert noisy.latency_by_size_s == {4: 2.0, 8: 7.0}
    assert noisy.noise_var_s2 == 4.0
    assert noisy.b_sla() == 10

    exact = CorrectedSLAController(d_sla_s=5.0, eps_d_s=0.5, b_min=1, b_max=16, alpha=0.5)
    for latency_s, size in [(2.0, 4), (2.0, 4), (7.0, 8)]:
        exact.update(latency_s, size)
    assert exact.noise_var_s2 == 0.0
    assert exact.b_sla() == 6


def test_a_smaller_size_slower_than_a_larger_one_is_pooled_with_it():
    """Averages that fall with the size are pooled (weighted by their batches) so that the
    fitted latency never falls: sizes 5 (one batch, 6 s) and 6 (three batches, 4, 4, 4 s)
    pool to (6 + 3 * 4) / 4 = 4.5 s each, once the noise explains the contradiction."""
    c = CorrectedSLAController(d_sla_s=5.0, eps_d_s=0.5, b_min=1, b_max=16, alpha=0.2)
    for latency_s, size in [(3.0, 2), (5.0, 2)]:  # size 2 averages 4 s; noise (5 - 3)^2 = 4 s^2
        c.update(latency_s, size)
    c.update(6.0, 5)
    for _ in range(3):
        c.update(4.0, 6)
    # Size 6: plain mean of 4, 4, 4 = 4 s, squared weights 1 -> 1/4 + 1/4 = 1/2 -> 1/3 (three
    # batches). Size 5 exceeds 6 by 2 s; the noise allows 2 * sd * sqrt(1 + 1/3) to stay.
    fit = c.fitted_latency_s()
    assert c.latency_by_size_s[5] == 6.0 and c.latency_by_size_s[6] == 4.0
    assert fit[5] == fit[6] == pytest.approx((6.0 + 3 * 4.0) / 4)
    assert fit[2] == 4.0


def test_without_noise_an_older_contradicted_average_is_forgotten():
    """With no noise measured, a larger size's older average below a smaller size's newer one
    cannot both be current: the older is forgotten (the server's speed changed)."""
    c = CorrectedSLAController(d_sla_s=5.0, eps_d_s=0.5, b_min=1, b_max=16)
    c.update(3.0, 8)
    c.update(4.0, 4)  # 4 requests slower than 8 requests: 8's average is out of date
    assert c.latency_by_size_s == {4: 4.0}


def test_window_means_per_size_and_of_the_noise():
    """With window_batches = 2 a size's average is the mean of its last two batches and the
    noise the mean of the last two squared deviations.

    Size 3: 1 s, 2 s, 4 s. Deviations: (2 - 1)^2 = 1 (from the average 1), then (4 - 1.5)^2 =
    6.25 (from the average 1.5). Averages after: 1, 1.5, (2 + 4) / 2 = 3; noise (1 + 6.25) / 2."""
    c = CorrectedSLAController(d_sla_s=5.0, eps_d_s=0.5, b_min=1, b_max=16, window_batches=2)
    for latency_s in (1.0, 2.0, 4.0):
        c.update(latency_s, 3)
    assert c.latency_by_size_s == {3: 3.0}
    assert c.noise_var_s2 == 3.625


def test_the_moving_average_is_the_plain_mean_of_the_first_batches():
    """alpha = 0.25: the first four batches of a size are averaged plainly, then each new one
    weighs 0.25: 2, 4, 6, 8 s -> 5 s; then 13 s -> 5 + 0.25 * (13 - 5) = 7 s."""
    c = CorrectedSLAController(d_sla_s=50.0, eps_d_s=0.5, b_min=1, b_max=16, alpha=0.25)
    for latency_s in (2.0, 4.0, 6.0, 8.0):
        c.update(latency_s, 5)
    assert c.latency_by_size_s[5] == 5.0
    c.update(13.0, 5)
    assert c.latency_by_size_s[5] == 7.0


def test_a_bad_starting_interval_is_refused():
    """The starting interval must lie within [b_min, b_max] with b_low <= b_high."""
    with pytest.raises(ValueError, match="b_low <= b_high"):
        CorrectedSLAController(d_sla_s=1.0, eps_d_s=0.1, b_min=1, b_max=8, b_low=6, b_high=4)


# --- windowed means of the seed's controller and of the memory model -----------------------
def test_the_seed_controller_can_average_the_last_batches():
    """window_batches = 2: tau and b are the means of the last two batches (0 before any)."""
    c = SLAController(d_sla_s=2.0, eps_d_s=0.2, b_min=1, b_max=64, window_batches=2)
    assert (c.tau_avg_s, c.b_avg) == (0.0, 0.0)
    for latency_s, size in [(3.0, 32), (1.0, 8), (2.0, 16)]:
        c.update(latency_s, size)
    assert (c.tau_avg_s, c.b_avg) == (1.5, 12.0)
    # 1.5 < 1.8 (too fast): b_low = max(1, int(12)) = 12, b_high = min(64 + int(2.4), 64) = 64;
    # (12 + 64) // 2 = 38
    assert c.b_sla() == 38


def test_b_mem_can_use_the_last_batches_only():
    """eta = 9000 tokens, 10 % kept: 8100 usable. Batches of 4 requests (800 prompt, 400 output
    tokens) then 2 (1000, 600). Over every batch: 1800 / 6 + 1000 / 6 = 466.7 tokens per
    request -> 17; over the last batch only: 500 + 300 = 800 -> 10."""
    batches = [{"latency_s": 1.0, "size": 4, "prompt_tokens": 800, "output_tokens": 400},
               {"latency_s": 1.0, "size": 2, "prompt_tokens": 1000, "output_tokens": 600}]
    every = DynamicBatchSizer(SLAController(d_sla_s=2.0, eps_d_s=0.2, b_min=1, b_max=64), 9_000, 0.1)
    last = DynamicBatchSizer(SLAController(d_sla_s=2.0, eps_d_s=0.2, b_min=1, b_max=64), 9_000, 0.1, memory_window_batches=1)
    for batch in batches:
        every.observe(**batch)
        last.observe(**batch)
    assert every.b_mem() == 17
    assert last.b_mem() == 10
    assert (last.requests_seen, last.prompt_tokens_seen, last.output_tokens_seen) == (2, 1000, 600)


def test_recent_mean_of_equal_values_is_exact():
    """n equal values have exactly that value as their mean (a naive sum / n does not: three
    times 0.1 sums to 0.30000000000000004)."""
    m = RecentMean(3)
    assert [m.add(0.1) for _ in range(4)] == [0.1] * 4
