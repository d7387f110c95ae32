"""The recorder's token-gap hook: what the engines tell it lands in the ITL tally."""

from __future__ import annotations

import numpy as np

from simpy_llm.metrics.recorder import Recorder


def test_token_gaps_land_in_the_itl_tally_with_their_counts():
    """``on_token_gaps(gap, count)`` records *count* tokens at *gap* in the recorder's ITL
    tally, and a zero count records nothing."""
    rec = Recorder(num_replicas=1)
    rec.on_token_gaps(0.25, 3)
    rec.on_token_gaps(0.5, 0)
    rec.on_token_gaps(0.125, 1)
    values, weights = rec.itl.arrays()
    assert rec.itl.count == 4
    assert values.tolist() == [0.125, 0.25]
    assert weights.tolist() == [1, 3]
    assert np.isclose(rec.itl.mean(), (0.25 * 3 + 0.125) / 4)
