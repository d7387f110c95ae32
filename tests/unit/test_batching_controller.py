"""The SLA controller and the memory model of dynamic batching, against hand-worked numbers.

``SLAController`` and ``b_mem`` follow seed 001 §2.3 and §2.2 to the letter:
exponential moving averages that start at 0, Python ``int()`` (truncation toward
zero), the three branches in order, then ``b_low = max(B_min, b_low)``,
``b_high = min(B_max, b_high)``, ``b_low > b_high => b_low = b_high`` and the
midpoint ``(b_low + b_high) // 2``.

The batcher's loop per batch is ``b_target = min(b_mem, controller.b_sla())``,
form and serve the batch, then ``controller.update(latency_s, size)``. The
trajectories below drive a controller the same way: one ``b_sla()`` before any
observation, then for each finished batch ``update`` followed by ``b_sla()``.
Every expected value was worked out by hand; the arithmetic is in the comment
of its row. Nothing here re-implements the algorithm.

With ``d_sla_s = 2.0`` and ``eps_d_s = 0.2`` the branches are: *too slow* when
``tau > 2.2``, *too fast* when ``tau < 1.8``, *in the band* otherwise. No row
sits within 0.002 s of a band edge, and no ``int()`` argument is within 0.01
of an integer, so float rounding cannot change a branch or a truncation.
"""

from __future__ import annotations

import pytest

from simpy_llm.policies.batching import SLAController, b_mem

REL = 1e-12


def _state(c: SLAController) -> tuple[float, float, int, int]:
    return (c.tau_avg_s, c.b_avg, c.b_low, c.b_high)


def _assert_row(c: SLAController, got_b_sla: int, row: tuple, step: int) -> None:
    _, _, tau, b_avg, b_low, b_high, b_sla = row
    assert c.tau_avg_s == pytest.approx(tau, rel=REL, abs=0.0), f"tau_avg_s at step {step}"
    assert c.b_avg == pytest.approx(b_avg, rel=REL, abs=0.0), f"b_avg at step {step}"
    assert (c.b_low, c.b_high) == (b_low, b_high), f"interval at step {step}"
    assert got_b_sla == b_sla, f"b_sla at step {step}"


def _drive(c: SLAController, table: list[tuple]) -> None:
    """Replay a table: row 0 has no observation; each later row is update(latency, size), then b_sla()."""
    for step, row in enumerate(table):
        latency_s, size = row[0], row[1]
        if latency_s is not None:
            c.update(latency_s, size)
        _assert_row(c, c.b_sla(), row, step)


# --- trajectory A: d_sla_s=2.0, eps_d_s=0.2, b_min=1, b_max=64, alpha=0.2 ---------------------
# Columns: observed (latency_s, size), then after update + b_sla(): tau_avg_s, b_avg, b_low,
# b_high, returned b_sla. Band: slow if tau > 2.2, fast if tau < 1.8.
TRAJECTORY_A = [
    # 0: no observation. tau = 0 < 1.8 -> fast: b_low = max(1, int(0.0)) = 1,
    #    b_high = min(64 + int(0.2*0.0), 64) = 64; b_sla = (1 + 64)//2 = 32
    (None, None, 0.0, 0.0, 1, 64, 32),
    # 1: tau = 0.2*3.0 + 0.8*0.0 = 0.6; b_avg = 0.2*32 + 0.8*0.0 = 6.4; fast:
    #    b_low = max(1, int(6.4)=6) = 6; b_high = min(64 + int(1.28)=65, 64) = 64 (capped at B_max);
    #    b_sla = (6 + 64)//2 = 35
    (3.0, 32, 0.6, 6.4, 6, 64, 35),
    # 2: tau = 0.2*5.0 + 0.8*0.6 = 1.0 + 0.48 = 1.48; b_avg = 0.2*35 + 0.8*6.4 = 7.0 + 5.12 = 12.12;
    #    fast: b_low = max(6, int(12.12)=12) = 12; b_high = min(64 + int(2.424)=66, 64) = 64 (capped);
    #    b_sla = (12 + 64)//2 = 38
    (5.0, 35, 1.48, 12.12, 12, 64, 38),
    # 3: tau = 0.2*6.0 + 0.8*1.48 = 1.2 + 1.184 = 2.384 > 2.2 -> slow;
    #    b_avg = 0.2*38 + 0.8*12.12 = 7.6 + 9.696 = 17.296;
    #    b_high = min(64, int(17.296)=17) = 17; b_low = max(12, int(0.8*17.296 = 13.8368)=13) = 13;
    #    b_sla = (13 + 17)//2 = 15
    (6.0, 38, 2.384, 17.296, 13, 17, 15),
    # 4: tau = 0.2*2.5 + 0.8*2.384 = 0.5 + 1.9072 = 2.4072 -> slow;
    #    b_avg = 0.2*15 + 0.8*17.296 = 3.0 + 13.8368 = 16.8368;
    #    b_high = min(17, int(16.8368)=16) = 16; b_low = max(13, int(13.46944)=13) = 13;
    #    b_sla = (13 + 16)//2 = 14
    (2.5, 15, 2.4072, 16.8368, 13, 16, 14),
    # 5: a short batch (only 2 requests waiting). tau = 0.2*3.0 + 0.8*2.4072 = 0.6 + 1.92576 = 2.52576
    #    -> slow; b_avg = 0.2*2 + 0.8*16.8368 = 0.4 + 13.46944 = 13.86944;
    #    b_high = min(16, int(13.86944)=13) = 13; b_low = max(13, int(11.095552)=11) = 13;
    #    b_sla = (13 + 13)//2 = 13
    (3.0, 2, 2.52576, 13.86944, 13, 13, 13),
    # 6: tau = 0.2*3.0 + 0.8*2.52576 = 0.6 + 2.020608 = 2.620608 -> slow;
    #    b_avg = 0.2*2 + 0.8*13.86944 = 0.4 + 11.095552 = 11.495552;
    #    b_high = min(13, int(11.495552)=11) = 11; b_low = max(13, int(9.1964416)=9) = 13;
    #    13 > 11 -> b_low = b_high = 11 (the interval collapses); b_sla = (11 + 11)//2 = 11
    (3.0, 2, 2.620608, 11.495552, 11, 11, 11),
    # 7: tau = 0.2*0.5 + 0.8*2.620608 = 0.1 + 2.0964864 = 2.1964864 -> in the band [1.8, 2.2];
    #    b_avg = 0.2*11 + 0.8*11.495552 = 2.2 + 9.1964416 = 11.3964416;
    #    margin = int(0.1*(11 - 11)) = 0; b_low = max(1, 11 - 0) = 11; b_high = min(64, 11 + 0) = 11;
    #    b_sla = 11 (a collapsed interval stays collapsed in the band)
    (0.5, 11, 2.1964864, 11.3964416, 11, 11, 11),
    # 8: tau = 0.2*0.2 + 0.8*2.1964864 = 0.04 + 1.75718912 = 1.79718912 < 1.8 -> fast;
    #    b_avg = 0.2*11 + 0.8*11.3964416 = 2.2 + 9.11715328 = 11.31715328;
    #    b_low = max(11, int(11.31715328)=11) = 11; b_high = min(11 + int(2.263430656)=2, 64) = 13;
    #    b_sla = (11 + 13)//2 = 12 (the fast branch reopens it)
    (0.2, 11, 1.79718912, 11.31715328, 11, 13, 12),
    # 9: tau = 0.2*0.4 + 0.8*1.79718912 = 0.08 + 1.437751296 = 1.517751296 -> fast;
    #    b_avg = 0.2*12 + 0.8*11.31715328 = 2.4 + 9.053722624 = 11.453722624;
    #    b_low = max(11, 11) = 11; b_high = min(13 + int(2.2907445248)=2, 64) = 15;
    #    b_sla = (11 + 15)//2 = 13
    (0.4, 12, 1.517751296, 11.453722624, 11, 15, 13),
    # 10: tau = 0.2*4.0 + 0.8*1.517751296 = 0.8 + 1.2142010368 = 2.0142010368 -> band;
    #     b_avg = 0.2*13 + 0.8*11.453722624 = 2.6 + 9.1629780992 = 11.7629780992;
    #     margin = int(0.1*(15 - 11)) = int(0.4) = 0; b_low = max(1, 11 - 0) = 11;
    #     b_high = min(64, 11 + 0) = 11; b_sla = 11 (re-centred on int(b_avg), width 0)
    (4.0, 13, 2.0142010368, 11.7629780992, 11, 11, 11),
]

# --- trajectory B: d_sla_s=1.0, eps_d_s=0.1, b_min=4, b_max=32, alpha=0.5 ---------------------
# Band: slow if tau > 1.1, fast if tau < 0.9. EMA weights 0.5 / 0.5.
TRAJECTORY_B = [
    # 0: tau = 0 < 0.9 -> fast: b_low = max(4, int(0.0)) = 4; b_high = min(32 + 0, 32) = 32;
    #    b_sla = (4 + 32)//2 = 18
    (None, None, 0.0, 0.0, 4, 32, 18),
    # 1: tau = 0.5*1.6 + 0.5*0.0 = 0.8 -> fast; b_avg = 0.5*18 + 0.5*0.0 = 9.0;
    #    b_low = max(4, 9) = 9; b_high = min(32 + int(0.2*9.0 = 1.8)=1, 32) = 32 (capped);
    #    b_sla = (9 + 32)//2 = 20
    (1.6, 18, 0.8, 9.0, 9, 32, 20),
    # 2: tau = 0.5*1.2 + 0.5*0.8 = 0.6 + 0.4 = 1.0 -> band; b_avg = 0.5*20 + 0.5*9.0 = 14.5;
    #    margin = int(0.1*(32 - 9)) = int(2.3) = 2; b_low = max(4, 14 - 2) = 12;
    #    b_high = min(32, 14 + 2) = 16; b_sla = (12 + 16)//2 = 14
    (1.2, 20, 1.0, 14.5, 12, 16, 14),
    # 3: tau = 0.5*2.0 + 0.5*1.0 = 1.5 -> slow; b_avg = 0.5*14 + 0.5*14.5 = 7.0 + 7.25 = 14.25;
    #    b_high = min(16, int(14.25)=14) = 14; b_low = max(12, int(0.8*14.25 = 11.4)=11) = 12;
    #    b_sla = (12 + 14)//2 = 13
    (2.0, 14, 1.5, 14.25, 12, 14, 13),
    # 4: a short batch. tau = 0.5*0.9 + 0.5*1.5 = 0.45 + 0.75 = 1.2 -> slow;
    #    b_avg = 0.5*3 + 0.5*14.25 = 1.5 + 7.125 = 8.625;
    #    b_high = min(14, int(8.625)=8) = 8; b_low = max(12, int(6.9)=6) = 12;
    #    12 > 8 -> b_low = 8; b_sla = 8
    (0.9, 3, 1.2, 8.625, 8, 8, 8),
    # 5: tau = 0.5*0.3 + 0.5*1.2 = 0.15 + 0.6 = 0.75 -> fast; b_avg = 0.5*8 + 0.5*8.625 = 4.0 + 4.3125 = 8.3125;
    #    b_low = max(8, int(8.3125)=8) = 8; b_high = min(8 + int(1.6625)=1, 32) = 9;
    #    b_sla = (8 + 9)//2 = 8
    (0.3, 8, 0.75, 8.3125, 8, 9, 8),
]


def _controller_a() -> SLAController:
    return SLAController(d_sla_s=2.0, eps_d_s=0.2, b_min=1, b_max=64)


def _controller_b() -> SLAController:
    return SLAController(d_sla_s=1.0, eps_d_s=0.1, b_min=4, b_max=32, alpha=0.5)


def test_initial_state():
    """A new controller has zero averages and the whole range [b_min, b_max] as its interval."""
    c = SLAController(d_sla_s=2.0, eps_d_s=0.2, b_min=3, b_max=48)
    assert _state(c) == (0.0, 0.0, 3, 48)
    assert c.alpha == 0.2


def test_trajectory_a_matches_the_hand_worked_table():
    """Eleven scheduling points (d=2, eps=0.2, [1, 64]) follow the hand-worked table row by row."""
    _drive(_controller_a(), TRAJECTORY_A)


def test_trajectory_b_matches_the_hand_worked_table():
    """Six scheduling points with other parameters (d=1, eps=0.1, [4, 32], alpha=0.5) follow their table."""
    _drive(_controller_b(), TRAJECTORY_B)


def test_trajectory_a_interval_collapses_and_only_the_fast_branch_reopens_it():
    """Once b_low == b_high, the band branch keeps width 0 (margin int(0.1*0) = 0); a fast step widens it."""
    c = _controller_a()
    widths = []
    for row in TRAJECTORY_A:
        if row[0] is not None:
            c.update(row[0], row[1])
        c.b_sla()
        widths.append(c.b_high - c.b_low)
    # rows 5-7: collapsed (slow, slow with fix-up, band); 8-9: fast reopens by int(0.2*b_avg) = 2 each;
    # 10: band with margin int(0.1*4) = 0 collapses it again
    assert widths == [63, 58, 52, 4, 3, 0, 0, 0, 2, 4, 0]


def test_update_moves_only_the_averages():
    """update() smooths latency and size into the averages and leaves the search interval alone."""
    c = _controller_a()
    c.update(3.0, 32)
    # tau = 0.2*3.0 + 0.8*0.0 = 0.6; b_avg = 0.2*32 + 0.8*0.0 = 6.4
    assert c.tau_avg_s == pytest.approx(0.6, rel=REL)
    assert c.b_avg == pytest.approx(6.4, rel=REL)
    assert (c.b_low, c.b_high) == (1, 64)
    c.update(1.0, 10)
    # tau = 0.2*1.0 + 0.8*0.6 = 0.2 + 0.48 = 0.68; b_avg = 0.2*10 + 0.8*6.4 = 2.0 + 5.12 = 7.12
    assert c.tau_avg_s == pytest.approx(0.68, rel=REL)
    assert c.b_avg == pytest.approx(7.12, rel=REL)
    assert (c.b_low, c.b_high) == (1, 64)


def test_too_slow_shrinks_to_eighty_percent_and_all_of_the_average_batch():
    """Above d + eps the interval becomes [max(b_low, int(0.8*b_avg)), min(b_high, int(b_avg))]."""
    c = _controller_a()
    assert c.b_sla() == 32  # (1 + 64)//2
    c.update(12.5, 32)
    # tau = 0.2*12.5 = 2.5 > 2.2; b_avg = 0.2*32 = 6.4
    # b_high = min(64, int(6.4)=6) = 6; b_low = max(1, int(5.12)=5) = 5; (5 + 6)//2 = 5
    assert c.b_sla() == 5
    assert _state(c) == (pytest.approx(2.5, rel=REL), pytest.approx(6.4, rel=REL), 5, 6)


def test_too_fast_raises_the_floor_and_caps_the_ceiling_at_b_max():
    """Below d - eps, b_low rises to int(b_avg) and b_high grows by int(0.2*b_avg) but never above b_max."""
    c = _controller_a()
    c.update(3.0, 32)
    # tau = 0.6 < 1.8; b_avg = 6.4: b_low = max(1, 6) = 6; b_high = min(64 + int(1.28)=65, 64) = 64
    assert c.b_sla() == 35  # (6 + 64)//2
    assert (c.b_low, c.b_high) == (6, 64)


def test_band_recentres_on_the_average_and_clamps_at_b_min():
    """In the band the interval is int(b_avg) -/+ int(0.1*width), and its low end is clamped at b_min."""
    c = _controller_b()
    assert c.b_sla() == 18  # fast from zero averages: [4, 32]
    c.update(2.0, 6)
    # tau = 0.5*2.0 = 1.0 (band [0.9, 1.1]); b_avg = 0.5*6 = 3.0
    # margin = int(0.1*(32 - 4)) = int(2.8) = 2; b_low = max(4, 3 - 2 = 1) = 4 (clamped at B_min);
    # b_high = min(32, 3 + 2) = 5; (4 + 5)//2 = 4
    assert c.b_sla() == 4
    assert (c.b_low, c.b_high) == (4, 5)


def test_crossed_interval_is_fixed_by_lowering_b_low():
    """When a slow step leaves b_low > b_high, b_low is set to b_high and the midpoint is b_high."""
    c = _controller_a()
    c.b_sla()  # [1, 64] -> 32
    c.update(12.5, 32)
    # tau = 2.5, b_avg = 6.4 -> slow: [max(1, 5), min(64, 6)] = [5, 6]
    assert c.b_sla() == 5
    c.update(12.5, 1)
    # tau = 0.2*12.5 + 0.8*2.5 = 2.5 + 2.0 = 4.5; b_avg = 0.2*1 + 0.8*6.4 = 0.2 + 5.12 = 5.32
    # slow: b_high = min(6, int(5.32)=5) = 5; b_low = max(5, int(4.256)=4) = 5; (5 + 5)//2 = 5
    assert c.b_sla() == 5
    assert (c.b_low, c.b_high) == (5, 5)
    c.update(12.5, 1)
    # tau = 2.5 + 0.8*4.5 = 2.5 + 3.6 = 6.1; b_avg = 0.2 + 0.8*5.32 = 0.2 + 4.256 = 4.456
    # slow: b_high = min(5, int(4.456)=4) = 4; b_low = max(5, int(3.5648)=3) = 5; 5 > 4 -> b_low = 4
    assert c.b_sla() == 4
    assert _state(c) == (pytest.approx(6.1, rel=REL), pytest.approx(4.456, rel=REL), 4, 4)


def test_slow_start_with_a_small_batch_drives_b_sla_below_b_min():
    """The seed's clamp order does not protect b_min: int(b_avg) < b_min in the slow branch gives b_SLA < b_min.

    The moving averages start at 0, so after one batch of 4 requests b_avg is
    0.8 and int(b_avg) is 0. The clamps (b_low up to b_min, b_high down to b_max)
    run before the crossed-interval fix, which then pulls b_low down to b_high.
    A batcher that uses b_SLA must therefore not rely on it being >= 1.
    """
    c = _controller_a()
    assert c.b_sla() == 32
    c.update(12.0, 4)
    # tau = 0.2*12.0 = 2.4 > 2.2; b_avg = 0.2*4 = 0.8
    # slow: b_high = min(64, int(0.8)=0) = 0; b_low = max(1, int(0.64)=0) = 1
    # clamps: b_low = max(1, 1) = 1; b_high = min(64, 0) = 0; 1 > 0 -> b_low = 0; (0 + 0)//2 = 0
    assert c.b_sla() == 0
    assert (c.b_low, c.b_high) == (0, 0)


def test_b_sla_moves_the_interval_on_every_call():
    """b_sla() is not a pure read: called again without a new observation, a fast controller keeps widening."""
    c = _controller_a()
    c.b_sla()  # [1, 64] -> 32
    c.update(12.5, 32)
    # tau = 2.5, b_avg = 6.4 -> slow: [5, 6]
    assert c.b_sla() == 5
    c.update(0.05, 5)
    # tau = 0.2*0.05 + 0.8*2.5 = 0.01 + 2.0 = 2.01 (band); b_avg = 0.2*5 + 0.8*6.4 = 1.0 + 5.12 = 6.12
    # margin = int(0.1*(6 - 5)) = 0; [max(1, 6), min(64, 6)] = [6, 6]
    assert c.b_sla() == 6
    c.update(0.05, 6)
    # tau = 0.01 + 0.8*2.01 = 0.01 + 1.608 = 1.618 (fast); b_avg = 1.2 + 0.8*6.12 = 1.2 + 4.896 = 6.096
    # b_low = max(6, 6) = 6; b_high = min(6 + int(1.2192)=1, 64) = 7; (6 + 7)//2 = 6
    assert c.b_sla() == 6
    # no new observation: each call adds int(0.2*6.096) = 1 to b_high again
    assert [c.b_sla() for _ in range(3)] == [7, 7, 8]  # [6, 8], [6, 9], [6, 10]
    assert (c.b_low, c.b_high) == (6, 10)
    assert c.tau_avg_s == pytest.approx(1.618, rel=REL)
    assert c.b_avg == pytest.approx(6.096, rel=REL)


# --- b_mem (seed §2.2): floor((eta - f*eta) / (mean_prompt + mean_output)), clamped -------------


def test_b_mem_normal_case():
    """The usable capacity divided by the mean tokens per request, rounded down."""
    # (50_000 - 0.1*50_000) / (512 + 256) = 45_000 / 768 = 58.59375 -> 58
    assert (
        b_mem(
            capacity_tokens=50_000,
            safety_fraction=0.1,
            mean_prompt_tokens=512,
            mean_output_tokens=256,
            b_min=1,
            b_max=64,
        )
        == 58
    )


def test_b_mem_fractional_means():
    """Running means need not be whole tokens: 19,000 / 249.75 = 76.08 -> 76."""
    # (20_000 - 0.05*20_000) / (187.5 + 62.25) = 19_000 / 249.75 = 76.076... -> 76
    assert (
        b_mem(
            capacity_tokens=20_000,
            safety_fraction=0.05,
            mean_prompt_tokens=187.5,
            mean_output_tokens=62.25,
            b_min=1,
            b_max=128,
        )
        == 76
    )


def test_b_mem_clamps_low():
    """A request larger than the usable memory still gets b_min (the clamp, not 0)."""
    # (1_000 - 100) / (2_000 + 500) = 900 / 2_500 = 0.36 -> 0 -> max(2, 0) = 2
    assert (
        b_mem(
            capacity_tokens=1_000,
            safety_fraction=0.1,
            mean_prompt_tokens=2_000,
            mean_output_tokens=500,
            b_min=2,
            b_max=64,
        )
        == 2
    )


def test_b_mem_clamps_high():
    """Ample memory is capped at b_max."""
    # (1_000_000 - 100_000) / (100 + 100) = 4_500 -> min(64, 4_500) = 64
    assert (
        b_mem(
            capacity_tokens=1_000_000,
            safety_fraction=0.1,
            mean_prompt_tokens=100,
            mean_output_tokens=100,
            b_min=1,
            b_max=64,
        )
        == 64
    )


def test_b_mem_without_safety_buffer_uses_the_whole_capacity():
    """With safety_fraction 0 the whole capacity is usable; the quotient is still rounded down, not to nearest."""
    # 10_000 / (150 + 100) = 40 exactly; with a quarter kept back, 7_500 / 250 = 30
    kwargs = {"capacity_tokens": 10_000, "mean_prompt_tokens": 150, "mean_output_tokens": 100, "b_min": 1, "b_max": 64}
    assert b_mem(safety_fraction=0.0, **kwargs) == 40
    assert b_mem(safety_fraction=0.25, **kwargs) == 30
    # 12_000 / (300 + 101) = 29.925... -> 29 (rounding to nearest would give 30)
    assert (
        b_mem(
            capacity_tokens=12_000,
            safety_fraction=0.0,
            mean_prompt_tokens=300,
            mean_output_tokens=101,
            b_min=1,
            b_max=64,
        )
        == 29
    )
