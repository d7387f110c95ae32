"""EAGLE-style tree drafting with load control (seed 003 §6.1 "EAGLE load controls").

A tree drafter drafts, each round, a tree of ``depth`` levels keeping ``width`` candidate
branches per level (a beam), and the target verifies all ``depth x width`` nodes in one
pass. How much of a tree is accepted is modelled with the **independent-candidates
approximation**: with the chain curve's conditional probability ``p_i`` at position ``i``,
each of the ``width`` candidates at depth ``i`` is accepted (given that depth ``i - 1``
was) with probability ``p_i``, independently of the others, so some candidate is with

``q_i = 1 - (1 - p_i) ** width``

and the accepted path is the chain of these ``q_i``: ``E[tokens] = 1 + sum_i prod_{j<=i}
q_j``. At width 1, ``q_i = p_i``: the chain itself.

Each round's shape is chosen at the target as it sends the verdict before the round (where
the γ controller sits): the γ policy's γ caps the depth; load control
(:class:`~simpy_llm.config.speculation.LoadControlConfig`) scales depth and width down with
the tokens queued for verification at that target; pruning stops the tree at the last level
whose cumulative score ``prod_{j<=i} p_j`` is at least ``prune_score_threshold``
(``docs/speculative.md``, "Tree drafting (EAGLE) and load control").
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from simpy_llm.config.speculation import LoadControlConfig, TreeConfig
    from simpy_llm.metrics.recorder import Recorder
    from simpy_llm.speculative.drafter import Drafter

__all__ = [
    "ChainAcceptance",
    "RoundPlan",
    "RoundPlanner",
    "TreeAcceptance",
    "TreeDrafting",
    "TreeRound",
    "load_scaled_shape",
    "pruned_depth",
    "queued_verify_tokens",
    "tree_expected_tokens",
    "tree_position_probabilities",
]

MEMO_LIMIT = 65_536
"""Entries a :class:`TreeAcceptance` memo holds before it is emptied (as the curves' memos)."""


class ChainAcceptance(Protocol):
    """What a tree reads of a drafter's chain acceptance model (a curve or a regressor bundle)."""

    @property
    def k_max(self) -> int:
        """Positions the model covers."""
        ...

    def position_probabilities(self, context_len: float, k: int, temperature: float | None = None) -> tuple[float, ...]:
        """``(p_1, ..., p_k)`` at *context_len*."""
        ...


class RoundPlan(Protocol):
    """A distributed round planned as its verdict is sent: a tree (:class:`TreeRound`) or a
    chained round (:class:`~simpy_llm.speculative.chain.ChainRound`). The device drafts for
    :attr:`draft_s`, the bundle carries :attr:`nodes` tokens, and the target verifies
    :attr:`nodes` positions and draws the accepted path from :attr:`acceptance`."""

    depth: int
    width: int
    nodes: int
    acceptance: Any
    draft_s: float

    def record(self, recorder: Recorder, row: int) -> None:
        """Record its figures for the round at *row* of the recorder's ``spec_rounds``."""
        ...


class RoundPlanner(Protocol):
    """What plans a drafter's distributed rounds (:class:`TreeDrafting`, or a chained group's
    :class:`~simpy_llm.speculative.chain.ChainDrafting`)."""

    @property
    def control(self) -> LoadControlConfig | None:
        """Its load control: when set, :meth:`plan` is given the target's queued verify tokens."""
        ...

    def plan(self, gamma: int, context_len: int, temperature: float | None, queued_tokens: float) -> RoundPlan:
        """The round of *gamma* positions (capped) at *context_len* tokens of context."""
        ...


def tree_position_probabilities(p: Sequence[float], width: int) -> tuple[float, ...]:
    """Per-depth acceptance of a tree of *width* candidates per level: ``1 - (1 - p_i) ** width``
    (independent candidates); at width 1, *p* itself, unchanged.

    >>> tree_position_probabilities((0.5, 0.8), 2)
    (0.75, 0.96)
    >>> tree_position_probabilities((0.1, 0.3), 1)
    (0.1, 0.3)
    """
    if width == 1:
        return tuple(p)
    return tuple(1.0 - (1.0 - pi) ** width for pi in p)


def tree_expected_tokens(p: Sequence[float], width: int) -> float:
    """Expected tokens of one tree round of ``len(p)`` levels: ``1 + sum_i prod_{j<=i} q_j``,
    ``q`` from :func:`tree_position_probabilities` (the accepted path plus the target's token).

    >>> tree_expected_tokens((0.5, 0.5), 1)     # the chain: 1 + 0.5 + 0.25
    1.75
    >>> tree_expected_tokens((0.5, 0.5), 2)     # 1 + 0.75 + 0.75 ** 2
    2.3125
    """
    total, run = 1.0, 1.0
    for qi in tree_position_probabilities(p, width):
        run *= qi
        total += run
    return total


def pruned_depth(p: Sequence[float], threshold: float) -> int:
    """Levels kept by pruning: the leading levels whose cumulative score ``prod_{j<=i} p_j``
    is at least *threshold*, and never fewer than one (the first level is always drafted);
    ``len(p)`` when nothing falls below it.

    >>> pruned_depth((0.9, 0.8, 0.5, 0.9), 0.5)     # scores 0.9, 0.72, 0.36, ...
    2
    >>> pruned_depth((0.3, 0.9), 0.5), pruned_depth((0.9, 0.9), 0.0)
    (1, 2)
    """
    score = 1.0
    for i, pi in enumerate(p):
        score *= pi
        if score < threshold:
            return i if i > 0 else 1
    return len(p)


def load_scaled_shape(control: LoadControlConfig, depth: int, width: int, queued_tokens: float) -> tuple[int, int]:
    """The tree's ``(depth, width)`` under load control at *queued_tokens* tokens waiting for
    verification: with ``s = (queued - tokens_low) / (tokens_high - tokens_low)`` clamped to
    [0, 1], depth ``depth (1 - s (1 - min_depth_scale))`` and width ``width - s (width -
    min_beam_width)``, each rounded half up, depth at least 1. Non-increasing in the load.

    >>> from simpy_llm.config.speculation import LoadControlConfig
    >>> c = LoadControlConfig(tokens_low=100, tokens_high=300, min_depth_scale=0.5, min_beam_width=1)
    >>> [load_scaled_shape(c, 6, 4, q) for q in (0, 100, 200, 300, 10_000)]
    [(6, 4), (6, 4), (5, 3), (3, 1), (3, 1)]
    """
    low, high = control.tokens_low, control.tokens_high
    if queued_tokens <= low:
        return depth, width
    s = 1.0 if queued_tokens >= high else (queued_tokens - low) / (high - low)
    d = math.floor(depth * (1.0 - s * (1.0 - control.min_depth_scale)) + 0.5)
    w = math.floor(width - s * (width - control.min_beam_width) + 0.5)
    return (d if d > 1 else 1), w


def queued_verify_tokens(rounds: Sequence[tuple]) -> int:
    """Tokens the target's waiting rounds will verify: ``sum (v + 1)`` over the jobs of a
    verify server's round queue (``VerifyServer.rounds``, entries ending in the job), ``v``
    the job's drafted positions, or its tree's nodes for a tree round."""
    total = 0
    for entry in rounds:
        job = entry[-1]
        spec = job.req.spec
        plan = spec.plan if spec is not None else None
        total += (job.gamma if plan is None else plan.nodes) + 1
    return total


class TreeAcceptance:
    """A chain acceptance model read as a tree of *width* candidates per level: the
    ``q_i`` of :func:`tree_position_probabilities`, with the chain law on them.

    It answers what a verify server asks of a round's model (:meth:`expected_tokens`,
    :meth:`accepted_at`) and :meth:`position_probabilities`.

    Parameters
    ----------
    chain
        The drafter's chain model (a curve or a regressor bundle).
    width
        Candidates per level, >= 2 (width 1 is the chain model itself).

    Examples
    --------
    >>> from simpy_llm.speculative.curves import acceptance_model
    >>> t = TreeAcceptance(acceptance_model("t5-small_t5-xxl_ende"), 2)    # p = 0.75 at T = 0
    >>> t.position_probabilities(128, 2, 0.0)
    (0.9375, 0.9375)
    >>> t.expected_tokens(128, 2, 0.0)
    2.81640625
    >>> [t.accepted_at(u, 128, 2, 0.0) for u in (0.0, 0.06, 0.07, 0.5)]
    [0, 0, 1, 2]
    """

    __slots__ = ("_cdf", "_memo", "chain", "width")

    def __init__(self, chain: ChainAcceptance, width: int) -> None:
        self.chain = chain
        self.width = width
        self._memo: dict[tuple[float, int, float | None], tuple[float, ...]] = {}
        self._cdf: dict[tuple[float, float | None], tuple[float, ...]] = {}

    @property
    def k_max(self) -> int:
        """Levels the chain model covers."""
        return self.chain.k_max

    def position_probabilities(self, context_len: float, k: int, temperature: float | None = None) -> tuple[float, ...]:
        """``(q_1, ..., q_k)`` at *context_len* (memoised by the exact arguments)."""
        key = (context_len, k, temperature)
        found = self._memo.get(key)
        if found is None:
            if len(self._memo) >= MEMO_LIMIT:
                self._memo.clear()
            found = self._memo[key] = tree_position_probabilities(
                self.chain.position_probabilities(context_len, k, temperature), self.width,
            )
        return found

    def expected_tokens(self, context_len: float, k: int, temperature: float | None = None) -> float:
        """Expected tokens of a round of *k* levels: ``1 + sum_i prod_{j<=i} q_j``."""
        total, run = 1.0, 1.0
        for qi in self.position_probabilities(context_len, k, temperature):
            run *= qi
            total += run
        return total

    def accepted_at(self, u: float, context_len: float, k: int, temperature: float | None = None) -> int:
        """Levels accepted (0..k) for the uniform *u* in [0, 1): the inverse CDF of the
        accepted-path law, ``#{m < k : P(M <= m) <= u}`` (as the chain model's ``accepted_at``)."""
        key = (context_len, temperature)
        cdf = self._cdf.get(key)
        if cdf is None:
            run, cum, out = 1.0, 0.0, []
            for qi in self.position_probabilities(context_len, self.k_max, temperature):
                cum += run * (1.0 - qi)
                run *= qi
                out.append(cum)
            if len(self._cdf) >= MEMO_LIMIT:
                self._cdf.clear()
            cdf = self._cdf[key] = tuple(out)
        if not 0 <= k <= len(cdf):
            raise ValueError(f"k = {k} is outside the tree's model: it covers 0 to {len(cdf)} levels")
        return bisect.bisect_right(cdf, u, 0, k)


class TreeRound:
    """One round's tree, as chosen when the verdict before it was sent.

    Attributes
    ----------
    depth
        Levels drafted (the round's γ in the records).
    width
        Candidates per level.
    nodes
        Tokens drafted, sent and verified: ``depth x width``.
    acceptance
        The model its accepted path is drawn from (the chain's at width 1).
    draft_s
        Time to draft it, s, before throttling.
    """

    __slots__ = ("acceptance", "depth", "draft_s", "nodes", "width")

    def __init__(self, depth: int, width: int, acceptance: Any, draft_s: float) -> None:
        self.depth = depth
        self.width = width
        self.nodes = depth * width
        self.acceptance = acceptance
        self.draft_s = draft_s

    def record(self, recorder: Recorder, row: int) -> None:
        """Record its depth and width for the round at *row* (``Recorder.tree_rounds``)."""
        recorder.on_tree_round((row, self.depth, self.width))


class TreeDrafting:
    """A drafter's tree settings as the simulation runs them: chooses each round's tree.

    Parameters
    ----------
    config
        The drafter's ``tree`` block.
    drafter
        The drafter (its chain curve, its time per token and per batched step).
    batched
        Whether the drafter has a latency model: a level then costs its decode step of
        ``width`` tokens (:meth:`Drafter.step_s`); without one, ``width`` tokens' time (a
        time per token says nothing of how a batch of candidates costs).

    Examples
    --------
    >>> from simpy_llm.config.speculation import LoadControlConfig, TreeConfig
    >>> from simpy_llm.speculative.curves import acceptance_model
    >>> from simpy_llm.speculative.drafter import Drafter
    >>> drafter = Drafter("tiny", 0.002, acceptance_model("t5-small_t5-xxl_ende"))
    >>> control = LoadControlConfig(tokens_low=10, tokens_high=50, min_depth_scale=0.5, min_beam_width=1)
    >>> tree = TreeDrafting(TreeConfig(depth=4, width=3, load_control=control), drafter, batched=False)
    >>> r = tree.plan(4, 512, 0.0, queued_tokens=0)
    >>> r.depth, r.width, r.nodes, round(r.draft_s, 6)
    (4, 3, 12, 0.024)
    >>> r = tree.plan(4, 512, 0.0, queued_tokens=50)
    >>> r.depth, r.width, r.acceptance is drafter.acceptance
    (2, 1, True)
    """

    __slots__ = ("_models", "_token_s", "batched", "control", "depth", "drafter", "threshold", "width")

    def __init__(self, config: TreeConfig, drafter: Drafter, *, batched: bool) -> None:
        self.depth = config.depth
        self.width = config.width
        self.threshold = config.prune_score_threshold
        self.control = config.load_control
        self.drafter = drafter
        self.batched = batched
        self._token_s = drafter.draft_token_s
        self._models: dict[int, Any] = {1: drafter.acceptance}

    def shape(self, queued_tokens: float) -> tuple[int, int]:
        """Depth and width before γ and pruning: the configured tree, scaled by load control."""
        if self.control is None:
            return self.depth, self.width
        return load_scaled_shape(self.control, self.depth, self.width, queued_tokens)

    def plan(self, gamma: int, context_len: int, temperature: float | None, queued_tokens: float) -> TreeRound:
        """The round's tree: depth ``min(gamma, load-scaled depth, pruned depth)`` (0 when
        *gamma* is 0), width the load-scaled width, at *context_len* tokens of context."""
        depth, width = self.shape(queued_tokens)
        if gamma < depth:
            depth = gamma
        if depth and self.threshold > 0.0:
            p = self.drafter.acceptance.position_probabilities(max(context_len, 1), depth, temperature)
            depth = pruned_depth(p, self.threshold)
        model = self._models.get(width)
        if model is None:
            model = self._models[width] = TreeAcceptance(self.drafter.acceptance, width)
        level_s = self.drafter.step_s(width) if self.batched else width * self._token_s
        return TreeRound(depth, width, model, depth * level_s)
