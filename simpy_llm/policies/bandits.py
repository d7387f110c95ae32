"""UCB1's choice of arm, shared by the policies that learn by it (the γ bandit, the drafter bandit)."""

from __future__ import annotations

import math

__all__ = ["ucb1_arm"]


def ucb1_arm(counts: list[int], sums: list[float], pulls: int, exploration: float) -> int:
    """The arm UCB1 pulls next: the first arm never credited, else the one of largest
    ``sums[j] / counts[j] + exploration x sqrt(2 ln pulls / counts[j])`` (ties: the lower index).
    *pulls* is the credited pulls of all arms; ``exploration = 1`` is UCB1 as published.

    >>> ucb1_arm([1, 0], [0.5, 0.0], 1, 1.0)
    1
    >>> ucb1_arm([10, 2], [9.0, 1.0], 12, 1.0), ucb1_arm([10, 2], [9.0, 1.0], 12, 0.0)
    (1, 0)
    """
    if 0 in counts:
        return counts.index(0)
    scale = 2.0 * math.log(pulls)
    best, best_index = 0, -math.inf
    for j, n in enumerate(counts):
        index = sums[j] / n + exploration * math.sqrt(scale / n)
        if index > best_index:
            best, best_index = j, index
    return best
