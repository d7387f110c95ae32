"""The profile of one coefficient (``simpy_llm.calibrate.identify``), on statistics given in
closed form: no replay, no simulator."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from simpy_llm.calibrate.identify import MAX_RATIO, UP_FACTORS, Z, paired_t, profile_coefficient


def test_paired_t_is_the_paired_t_statistic():
    """paired_t(a, b) is the paired t statistic of a - b, as scipy.stats.ttest_rel computes it."""
    rng = np.random.default_rng(0)
    b = rng.lognormal(0.0, 0.5, 200)
    a = b + rng.normal(0.01, 0.05, 200)
    assert paired_t(a, b) == pytest.approx(stats.ttest_rel(a, b).statistic, rel=1e-12)


def test_a_quadratic_statistic_gives_its_exact_crossings():
    """For t(f) = a (ln f)^2 the plausible factors are exactly |ln f| <= sqrt(Z / a): the ends
    found are those, and the coefficient is determined (they are far less than 4 apart)."""
    a = 25.0
    p = profile_coefficient(3.0, lambda v: a * math.log(v / 3.0) ** 2)
    half = math.sqrt(Z / a)
    assert (p.low, p.high) == pytest.approx((3.0 * math.exp(-half), 3.0 * math.exp(half)), rel=1e-12)
    assert p.determined and p.interval == (p.low, p.high)


def test_a_term_the_loss_cannot_tell_from_absent_is_not_determined():
    """A statistic that stays below Z down to a sixteenth of the value (a term whose absence the
    trace cannot see) leaves the coefficient undetermined, with no lower bound; its upper bound
    is still found, and a value held for it is moved below that bound."""
    p = profile_coefficient(8.0, lambda v: 0.5 if v < 8.0 else 40 * math.log(v / 8.0) ** 2)
    assert not p.determined and p.low is None and p.interval is None
    assert p.high == pytest.approx(8.0 * math.exp(math.sqrt(Z / 40)), rel=1e-12)
    assert p.clip(0.44) == 0.44 and p.clip(100.0) == p.high


def test_a_term_the_loss_cannot_bound_is_not_determined():
    """A statistic that stays below Z up to sixteen times the value leaves it undetermined with
    no upper bound; a default below its lower bound is moved up to that bound."""
    p = profile_coefficient(1.0, lambda v: 0.0 if v >= 1.0 else 40 * math.log(v) ** 2)
    assert not p.determined and p.high is None
    assert p.low == pytest.approx(math.exp(-math.sqrt(Z / 40)), rel=1e-12)
    assert p.clip(0.0) == p.low
    assert p.evaluations == len(UP_FACTORS) + 3  # the whole way up; down: 1/2, then two bisections


def test_bounds_further_apart_than_the_ratio_leave_it_undetermined():
    """Found on both sides but more than MAX_RATIO apart (a statistic flat from 1/4 to 4 times
    the value), the coefficient is not determined: the trace bounds it without pinning it."""
    p = profile_coefficient(10.0, lambda v: 0.0 if 2.5 <= v <= 40.0 else 100.0)
    assert p.low is not None and p.high is not None and p.high > MAX_RATIO * p.low
    assert not p.determined and p.interval is None


def test_a_coefficient_must_be_positive_to_be_profiled():
    """A value at 0 has no ladder of factors: the caller treats it as undetermined."""
    with pytest.raises(ValueError, match="must be > 0"):
        profile_coefficient(0.0, lambda v: 0.0)
