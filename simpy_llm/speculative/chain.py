"""Chained (multi-level) speculation: tiny -> mid -> target (seed 003 Appendix A.3).

A draft group with ``chain: [tiny, mid]`` drafts each distributed round in two levels on
the device: the tiny drafter drafts γ tokens; the mid drafter verifies them in one pass
(accepting a prefix of ``M1`` tokens, drawn from the tiny drafter's curve, which is read as
the tiny-against-mid curve) and its pass gives the next token, then it drafts the rest
itself up to γ; the target verifies the γ tokens with the mid drafter's curve (against the
target), as it would the mid drafter's own chain. So

* tokens per target round: ``E = 1 + sum_{i<=γ} prod_{j<=i} p^mid_j``, the mid drafter's
  chain law (a token the mid level accepted is one it would have drafted);
* the mid level's own drafting steps: ``S = max(γ - M1 - 1, 0)``, with ``P(M1 = m)`` the
  tiny curve's accepted-prefix law;
* the round's drafting time: ``γ t_tiny + V_mid + S t_mid``, ``V_mid`` the mid drafter's
  step of ``γ + 1`` tokens (:meth:`~simpy_llm.speculative.drafter.Drafter.step_s`).

(``docs/speculative.md``, "Chained speculation".)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from simpy_llm.config.speculation import LoadControlConfig
    from simpy_llm.metrics.recorder import Recorder
    from simpy_llm.speculative.drafter import Drafter

__all__ = ["ChainDrafting", "ChainRound", "chain_draft_s", "expected_mid_steps"]


def expected_mid_steps(p_tiny: Sequence[float], gamma: int) -> float:
    """``E[max(γ - M1 - 1, 0)]``: the mid drafter's own steps in a chained round of *gamma*,
    with ``M1`` the tiny drafts it accepts, ``P(M1 = m) = p_1 ... p_m (1 - p_{m+1})`` (``m <
    γ``) on *p_tiny* (its first *gamma* positions).

    >>> expected_mid_steps((0.5, 0.5, 0.5), 3)     # P(M1=0) 2 steps, P(M1=1) 1 step: 0.5 x 2 + 0.25 x 1
    1.25
    >>> expected_mid_steps((1.0, 1.0), 2), expected_mid_steps((), 0)
    (0.0, 0.0)
    """
    total, run = 0.0, 1.0
    for m in range(gamma):
        steps = gamma - m - 1
        total += run * (1.0 - p_tiny[m]) * steps
        run *= p_tiny[m]
    return total


def chain_draft_s(gamma: int, tiny: Drafter, mid: Drafter, mid_steps: float) -> float:
    """Drafting time of a chained round: ``γ t_tiny + V_mid + S t_mid``, ``V_mid`` the mid
    drafter's step of ``γ + 1`` tokens (its verify pass; one token's time without a latency
    model), 0 when *gamma* is 0.

    >>> from simpy_llm.speculative.drafter import Drafter
    >>> round(chain_draft_s(4, Drafter("tiny", 0.001, None), Drafter("mid", 0.004, None), 2), 12)
    0.016
    """
    if gamma == 0:
        return 0.0
    return gamma * tiny.draft_token_s + mid.step_s(gamma + 1) + mid_steps * mid.draft_token_s


class ChainRound:
    """One chained round, as planned when the verdict before it was sent.

    Attributes
    ----------
    depth, nodes
        γ: the tokens the target verifies.
    width
        1.
    acceptance
        The mid drafter's curve (against the target).
    mid_accepted
        Tiny drafts the mid level accepted (its expectation under ``expected`` sampling).
    mid_steps
        The mid drafter's own drafting steps.
    draft_s
        Its drafting time on the device, s, before throttling.
    """

    __slots__ = ("acceptance", "depth", "draft_s", "mid_accepted", "mid_steps", "nodes", "width")

    def __init__(self, gamma: int, acceptance: Any, mid_accepted: float, mid_steps: float, draft_s: float) -> None:
        self.depth = gamma
        self.nodes = gamma
        self.width = 1
        self.acceptance = acceptance
        self.mid_accepted = mid_accepted
        self.mid_steps = mid_steps
        self.draft_s = draft_s

    def record(self, recorder: Recorder, row: int) -> None:
        """Record the mid level's figures for the round at *row* (``Recorder.chain_rounds``)."""
        recorder.on_chain_round((row, self.mid_accepted, self.mid_steps))


class ChainDrafting:
    """A chained group's two drafters as the simulation runs them: plans each round.

    Parameters
    ----------
    tiny
        The first level (its curve: against the mid drafter).
    mid
        The second level (its curve: against the target).
    rng
        The group's stream ``draft/<group>/chain``: one uniform per round with γ >= 1, the
        mid level's accepted prefix through the inverse CDF of the tiny curve.
    expected
        ``acceptance_sampling: expected``: no draw; the mid level's steps are their expectation.

    Examples
    --------
    >>> import numpy as np
    >>> from simpy_llm.speculative.curves import acceptance_model
    >>> from simpy_llm.speculative.drafter import Drafter
    >>> curve = acceptance_model("t5-small_t5-xxl_ende")       # p = 0.75 at T = 0
    >>> chain = ChainDrafting(Drafter("tiny", 0.001, curve), Drafter("mid", 0.004, curve), np.random.default_rng(0), expected=True)
    >>> r = chain.plan(2, 512, 0.0, 0)
    >>> r.mid_steps, round(r.draft_s, 12)                      # P(M1 = 0) = 0.25: one step
    (0.25, 0.007)
    """

    control: LoadControlConfig | None = None
    """No load control: a chained round's γ is the γ policy's."""

    __slots__ = ("_expected", "mid", "rng", "tiny")

    def __init__(self, tiny: Drafter, mid: Drafter, rng: np.random.Generator, *, expected: bool) -> None:
        self.tiny = tiny
        self.mid = mid
        self.rng = rng
        self._expected = expected

    def plan(self, gamma: int, context_len: int, temperature: float | None, queued_tokens: float) -> ChainRound:
        """The round of *gamma* tokens at *context_len* tokens of context (*queued_tokens* unused)."""
        if gamma == 0:
            return ChainRound(0, self.mid.acceptance, 0.0, 0.0, 0.0)
        curve = self.tiny.acceptance
        context = context_len if context_len > 1 else 1
        if self._expected:
            p = curve.position_probabilities(context, gamma, temperature)
            accepted = curve.expected_tokens(context, gamma, temperature) - 1.0
            steps = expected_mid_steps(p, gamma)
        else:
            m = curve.accepted_at(float(self.rng.random()), context, gamma, temperature)
            accepted = float(m)
            steps = float(gamma - m - 1) if m < gamma - 1 else 0.0
        return ChainRound(gamma, self.mid.acceptance, accepted, steps, chain_draft_s(gamma, self.tiny, self.mid, steps))
