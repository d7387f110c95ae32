"""Planner choice policies: which evaluated candidate configuration the planner applies.

A choice policy implements ``choose(evaluations, current) -> int``: *evaluations* are
the tick's :class:`Evaluation` records (one per candidate, in candidate order) and
*current* the position of the configuration in force; it returns a position. It never
yields and never touches the environment. Register one with
``@planner_choices.register("name")`` and pass it as ``Simulation(planner_policy=...)``.

Built-in: ``best_feasible`` (:class:`BestFeasible`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import attrs

from simpy_llm.registry import Registry

__all__ = ["BestFeasible", "Evaluation", "PlannerChoice", "planner_choices"]

planner_choices: Registry = Registry("planner choice")
"""Registered planner choice policies."""


@attrs.frozen(kw_only=True)
class Evaluation:
    """One candidate configuration as a what-if simulation judged it."""

    config: dict[str, float]
    """The knobs' values."""
    gpus: int
    """GPUs the candidate keeps serving (its active replicas' tensor-parallel degrees, summed)."""
    score: float
    """The objective (higher is better; NaN when undefined, e.g. nothing completed)."""
    feasible: bool
    """Whether every constraint held (and every replayed request finished)."""
    violation: float
    """Largest relative excess over a constraint's bound, ``value / bound - 1`` (0 when
    feasible, ``inf`` for an undefined metric or requests left unfinished)."""


class PlannerChoice(Protocol):
    """Chooses the configuration to apply among a tick's evaluations."""

    def choose(self, evaluations: Sequence[Evaluation], current: int) -> int:
        """Position in *evaluations* of the configuration to apply."""


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


@planner_choices.register("best_feasible")
@attrs.define
class BestFeasible:
    """The feasible candidate with the highest score; ties (within 1e-9 relative) go to
    fewer GPUs, then to the configuration in force (no flapping), then to the first listed.
    With no feasible candidate: the smallest violation, then the highest score.

    >>> ev = [Evaluation(config={"n": n}, gpus=n, score=s, feasible=f, violation=0.0 if f else 1.0)
    ...       for n, s, f in [(1, 9.0, False), (2, 5.0, True), (3, 5.0, True)]]
    >>> BestFeasible().choose(ev, current=2)
    1
    """

    def choose(self, evaluations: Sequence[Evaluation], current: int) -> int:
        feasible = [i for i, e in enumerate(evaluations) if e.feasible and not math.isnan(e.score)]
        if not feasible:
            def key(i: int) -> tuple[float, float]:
                e = evaluations[i]
                return (e.violation, -e.score if not math.isnan(e.score) else math.inf)

            return min(range(len(evaluations)), key=key)
        best = max(evaluations[i].score for i in feasible)
        tied = [i for i in feasible if _close(evaluations[i].score, best)]
        fewest = min(evaluations[i].gpus for i in tied)
        tied = [i for i in tied if evaluations[i].gpus == fewest]
        return current if current in tied else tied[0]
