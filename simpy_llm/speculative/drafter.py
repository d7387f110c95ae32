"""A draft model as a draft device group runs it: its time per token, the time of a draft step
shared by several requests (draft-side batching, :mod:`simpy_llm.speculative.draft_batching`),
and its acceptance curve against the target."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simpy_llm.serving.latency_base import LatencyModel

__all__ = ["Drafter"]


class Drafter:
    """A draft model as run on one device group: its speed and acceptance curve.

    Parameters
    ----------
    name
        Its name (records, drafter switches).
    draft_token_s
        Time to draft one token for one request, s (ignored with *latency*).
    acceptance
        Its :class:`~simpy_llm.speculative.acceptance.AcceptanceModel` against the target.
    latency
        Its latency model on the device (a draft step for ``n`` requests is then the model's
        decode step of ``n`` tokens), or None.

    Examples
    --------
    Without a latency model a step costs one token's time whatever its batch (memory-bound:
    the step reads the weights once for every request in it); with one, it is a decode step:

    >>> from simpy_llm.serving.latency import BlisLinearLatency
    >>> Drafter("tiny", 0.004, None).step_s(8)
    0.004
    >>> d = Drafter("tiny", 0.0, None, BlisLinearLatency(beta0_us=3000.0, beta2_us=500.0))
    >>> round(d.draft_token_s, 9), round(d.step_s(8), 9)
    (0.0035, 0.007)
    """

    __slots__ = ("_latency", "_step_s", "acceptance", "draft_token_s", "name")

    def __init__(self, name: str, draft_token_s: float, acceptance: Any, latency: LatencyModel | None = None) -> None:
        self.name = name
        self._latency = latency
        self._step_s: dict[int, float] = {}
        self.draft_token_s = self.step_s(1) if latency is not None else draft_token_s
        """Time to draft one token for one request, s (before throttling)."""
        self.acceptance = acceptance
        """The :class:`~simpy_llm.speculative.acceptance.AcceptanceModel` against the target."""

    def step_s(self, n: int) -> float:
        """Time of one draft step that drafts a token for each of *n* requests, s (before
        throttling): the latency model's decode step of *n* tokens, ``mean_step_time_s(0, n)``
        (no attention term: drafting costs the same at any context), or without a model
        :attr:`draft_token_s` whatever *n*."""
        latency = self._latency
        if latency is None:
            return self.draft_token_s
        s = self._step_s.get(n)
        if s is None:
            s = self._step_s[n] = latency.mean_step_time_s(0, n)
        return s
