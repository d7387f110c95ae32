"""A level monitor's replay of a batch of changes is its change() called for each, in order.

The reference here is change() itself, called in a plain loop over the changes sorted by
time with increases first at one instant: the replay (a sharded run's requests in the
system, replayed window by window) must give its level, peak, area and clock to the bit.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm.metrics.monitors import LevelMonitor

_TIMES = st.sampled_from([0.0, 0.1, 0.3, 1.0 / 3.0, 2.5, 7.25]) | st.floats(0.0, 50.0, allow_nan=False)
_CHANGES = st.lists(st.tuples(_TIMES, st.integers(-3, 3)), max_size=60)


def _by_loop(monitor: LevelMonitor, changes: list[tuple[float, int]]) -> None:
    # Sorted by time, increases first at one time, and otherwise in the order given.
    for now_s, delta in sorted(changes, key=lambda c: (c[0], -c[1])):
        monitor.change(now_s, delta)


@settings(max_examples=300, deadline=None)
@given(first=_CHANGES, batches=st.lists(_CHANGES, max_size=4))
def test_a_replay_is_change_called_for_each_change(first, batches):
    """After changes made one by one, batches replayed (each sorted by time, increases first
    at one instant; some earlier than the clock) leave the level, peak, area and clock
    that change() called for each gives, to the bit."""
    replayed, reference = LevelMonitor(), LevelMonitor()
    _by_loop(replayed, first)
    _by_loop(reference, first)
    for batch in batches:
        replayed.replay(np.array([t for t, _ in batch], dtype=np.float64), np.array([d for _, d in batch], dtype=np.int64))
        _by_loop(reference, batch)
        assert (replayed.level, replayed.peak, replayed._last_s) == (reference.level, reference.peak, reference._last_s)
        assert replayed.area(60.0).hex() == reference.area(60.0).hex()
