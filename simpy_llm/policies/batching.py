"""Batching policies of a request-level batch server: which bin, and how big a batch.

A :class:`~simpy_llm.serving.batching.BatchServer` forms whole batches from
per-bin FIFO queues (``docs/batching.md``). With a fixed batch size ``B`` the
mechanism decides alone (a bin that holds ``B`` requests forms a batch). With
dynamic batching two decisions are policies, made each time the server is free:

* a :class:`BinSelector` picks the bin to batch from (``round_robin`` or
  ``longest_queue``; register your own with ``@bin_selectors.register``);
* a :class:`DynamicBatchSizer` sets the batch size ``b_target = min(b_mem, b_SLA)``
  from a memory model (:func:`b_mem`, seed 001 §2.2) and an SLA feedback
  controller (:class:`SLAController`, §2.3), and learns from each finished batch.

None of them touches SimPy: they are plain objects, testable without an environment.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import attrs

from simpy_llm.registry import Registry

__all__ = [
    "BinSelector",
    "DynamicBatchSizer",
    "LongestQueue",
    "RoundRobinBins",
    "SLAController",
    "b_mem",
    "bin_selectors",
]


class BinSelector(Protocol):
    """Chooses the bin a dynamic batch is formed from."""

    def select(self, queue_lengths: Sequence[int]) -> int:
        """Index of a non-empty bin, given each bin's queued requests (at least one is non-empty)."""
        ...


bin_selectors: Registry[type] = Registry("bin selector")


@bin_selectors.register("round_robin")
class RoundRobinBins:
    """The next non-empty bin after the one chosen last, cyclically.

    >>> rr = RoundRobinBins()
    >>> [rr.select(q) for q in ([1, 1, 1], [1, 0, 1], [1, 1, 1], [0, 1, 0])]
    [0, 2, 0, 1]
    """

    def __init__(self) -> None:
        self._last = -1

    def select(self, queue_lengths: Sequence[int]) -> int:
        k = len(queue_lengths)
        for step in range(1, k + 1):
            i = (self._last + step) % k
            if queue_lengths[i]:
                self._last = i
                return i
        raise ValueError("every bin is empty")


@bin_selectors.register("longest_queue")
class LongestQueue:
    """The bin with the most queued requests (the lowest index among ties).

    >>> LongestQueue().select([2, 5, 5])
    1
    """

    def select(self, queue_lengths: Sequence[int]) -> int:
        best = max(range(len(queue_lengths)), key=queue_lengths.__getitem__)
        if not queue_lengths[best]:
            raise ValueError("every bin is empty")
        return best


def b_mem(
    *,
    capacity_tokens: float,
    safety_fraction: float,
    mean_prompt_tokens: float,
    mean_output_tokens: float,
    b_min: int,
    b_max: int,
) -> int:
    """The memory-limited batch size of seed 001 §2.2.

    ``floor((eta - L0) / (mean_prompt + mean_output))`` with ``eta`` the KV capacity in
    tokens and ``L0 = safety_fraction * eta``, clamped to ``[b_min, b_max]``.

    >>> b_mem(capacity_tokens=10_000, safety_fraction=0.1, mean_prompt_tokens=200,
    ...       mean_output_tokens=100, b_min=1, b_max=64)
    30
    """
    per_request = mean_prompt_tokens + mean_output_tokens
    usable = capacity_tokens - safety_fraction * capacity_tokens
    size = math.floor(usable / per_request) if per_request > 0 else b_max
    return max(b_min, min(b_max, size))


@attrs.define(kw_only=True)
class SLAController:
    """The SLA feedback controller of seed 001 §2.3, step for step.

    ``update`` smooths the latest batch latency and size into exponential moving
    averages (both start at 0); ``b_sla`` moves the search interval ``[b_low, b_high]``
    (shrink when the average latency is above ``d_sla_s + eps_d_s``, grow when below
    ``d_sla_s - eps_d_s``, re-centre on the average batch size inside the band) and
    returns its midpoint. Integer conversions truncate toward zero, as the
    specification's ``int()`` does.

    Examples
    --------
    >>> c = SLAController(d_sla_s=2.0, eps_d_s=0.2, b_min=1, b_max=64)
    >>> c.b_sla()  # no latency seen yet: "too fast", the interval is the full range
    32
    >>> c.update(3.0, 32); round(c.tau_avg_s, 6), round(c.b_avg, 6)
    (0.6, 6.4)
    """

    d_sla_s: float
    """Target batch latency D_SLA, s."""
    eps_d_s: float
    """Tolerance band around the target, s."""
    b_min: int
    """Smallest batch size."""
    b_max: int
    """Largest batch size."""
    alpha: float = 0.2
    """Smoothing factor of the moving averages (weight of the newest observation)."""
    tau_avg_s: float = 0.0
    """Moving average of the batch latency, s."""
    b_avg: float = 0.0
    """Moving average of the batch size."""
    b_low: int = attrs.field(default=attrs.Factory(lambda self: self.b_min, takes_self=True))
    """Lower end of the search interval."""
    b_high: int = attrs.field(default=attrs.Factory(lambda self: self.b_max, takes_self=True))
    """Upper end of the search interval."""

    def update(self, latency_s: float, batch_size: int) -> None:
        """Smooth one finished batch's latency (s) and size into the moving averages."""
        a = self.alpha
        self.tau_avg_s = a * latency_s + (1 - a) * self.tau_avg_s
        self.b_avg = a * batch_size + (1 - a) * self.b_avg

    def b_sla(self) -> int:
        """Move the search interval by the latest averages and return its midpoint."""
        if self.tau_avg_s > self.d_sla_s + self.eps_d_s:
            self.b_high = min(self.b_high, int(self.b_avg))
            self.b_low = max(self.b_low, int(self.b_avg * 0.8))
        elif self.tau_avg_s < self.d_sla_s - self.eps_d_s:
            self.b_low = max(self.b_low, int(self.b_avg))
            self.b_high = min(self.b_high + int(0.2 * self.b_avg), self.b_max)
        else:
            margin = int(0.1 * (self.b_high - self.b_low))
            self.b_low = max(self.b_min, int(self.b_avg) - margin)
            self.b_high = min(self.b_max, int(self.b_avg) + margin)
        self.b_low = max(self.b_min, self.b_low)
        self.b_high = min(self.b_max, self.b_high)
        if self.b_low > self.b_high:
            self.b_low = self.b_high
        return (self.b_low + self.b_high) // 2


class DynamicBatchSizer:
    """``b_target = min(b_mem, b_SLA)`` (seed 001 §2.4, at least ``b_min``), learning from each finished batch.

    The memory model uses running means of the prompt and output lengths of the
    requests of finished batches; before the first batch finishes there is nothing to
    average, and ``b_mem`` is ``b_min`` (the cautious start). Without a memory
    capacity ``b_mem`` is ``b_max``.

    Parameters
    ----------
    controller
        The SLA controller.
    capacity_tokens
        KV capacity ``eta`` in tokens (None: no memory limit).
    safety_fraction
        The safety buffer ``L0`` as a share of ``eta``.

    Examples
    --------
    >>> sizer = DynamicBatchSizer(SLAController(d_sla_s=2.0, eps_d_s=0.2, b_min=1, b_max=64),
    ...                           capacity_tokens=9_000, safety_fraction=0.1)
    >>> sizer.target()  # (b_target, b_mem, b_sla): no batch finished yet, b_mem = b_min
    (1, 1, 32)
    >>> sizer.observe(latency_s=1.0, size=4, prompt_tokens=800, output_tokens=400)
    >>> sizer.target()[1]  # 8100 usable tokens / 300 per request
    27
    """

    def __init__(self, controller: SLAController, capacity_tokens: float | None, safety_fraction: float = 0.1) -> None:
        self.controller = controller
        self.capacity_tokens = capacity_tokens
        self.safety_fraction = safety_fraction
        self.requests_seen = 0
        self.prompt_tokens_seen = 0
        self.output_tokens_seen = 0

    def b_mem(self) -> int:
        """The memory-limited batch size from the running means."""
        c = self.controller
        if self.capacity_tokens is None:
            return c.b_max
        n = self.requests_seen
        if n == 0:
            return c.b_min
        return b_mem(
            capacity_tokens=self.capacity_tokens,
            safety_fraction=self.safety_fraction,
            mean_prompt_tokens=self.prompt_tokens_seen / n,
            mean_output_tokens=self.output_tokens_seen / n,
            b_min=c.b_min,
            b_max=c.b_max,
        )

    def target(self) -> tuple[int, int, int]:
        """``(b_target, b_mem, b_SLA)`` for the batch being formed (moves the controller's interval).

        ``b_target = max(b_min, min(b_mem, b_SLA))``: the specified controller can return a
        midpoint below ``b_min`` (when the latency is too high while its average batch
        size, an average that starts at 0, is below ``b_min``: the interval's upper end
        drops below ``b_min`` and the lower end is set to it); the batcher does not go
        below ``b_min``, and never to 0.
        """
        memory = self.b_mem()
        sla = self.controller.b_sla()
        return max(self.controller.b_min, min(memory, sla)), memory, sla

    def observe(self, *, latency_s: float, size: int, prompt_tokens: int, output_tokens: int) -> None:
        """A batch of *size* requests (with these token totals) finished after *latency_s*."""
        self.controller.update(latency_s, size)
        self.requests_seen += size
        self.prompt_tokens_seen += prompt_tokens
        self.output_tokens_seen += output_tokens
