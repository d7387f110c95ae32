"""Batching policies of a request-level batch server: which bin, and how big a batch.

A :class:`~simpy_llm.serving.batching.BatchServer` forms whole batches from
per-bin FIFO queues (``docs/batching.md``). With a fixed batch size ``B`` the
mechanism decides alone (a bin that holds ``B`` requests forms a batch). With
dynamic batching two decisions are policies, made each time the server is free:

* a :class:`BinSelector` picks the bin to batch from (``round_robin`` or
  ``longest_queue``; register your own with ``@bin_selectors.register``);
* a :class:`DynamicBatchSizer` sets the batch size ``b_target = min(b_mem, b_SLA)``
  from a memory model (:func:`b_mem`, seed 001 §2.2) and an SLA feedback
  controller, and learns from each finished batch. Two controllers are built in
  (:data:`SLA_CONTROLLERS`): :class:`CorrectedSLAController` (the default), which
  finds the largest batch size whose latency meets the target, and
  :class:`SLAController`, seed 001 §2.3 step for step, kept to reproduce its
  behaviour, including the lock-up above the target that
  :class:`CorrectedSLAController` corrects.

None of them touches SimPy: they are plain objects, testable without an environment.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Protocol

import attrs

from simpy_llm.registry import Registry

__all__ = [
    "SLA_CONTROLLERS",
    "BinSelector",
    "CorrectedSLAController",
    "DynamicBatchSizer",
    "LongestQueue",
    "RecentMean",
    "RoundRobinBins",
    "SLAController",
    "SizeController",
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


class RecentMean:
    """The mean of the last *n* values added (of all of them while fewer than *n* came).

    Computed as the first value kept plus the correctly rounded mean of the differences
    from it, so that *n* equal values have exactly that value as their mean.

    >>> m = RecentMean(2)
    >>> [m.add(v) for v in (1.0, 2.0, 6.0)]
    [1.0, 1.5, 4.0]
    """

    __slots__ = ("_values",)

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"a window holds at least 1 value; got {n}")
        self._values: deque[float] = deque(maxlen=n)

    @property
    def count(self) -> int:
        """Values in the window."""
        return len(self._values)

    def add(self, value: float) -> float:
        """Add *value*; return the mean of the values now in the window."""
        values = self._values
        values.append(value)
        first = values[0]
        return first + math.fsum(v - first for v in values) / len(values)


class SizeController(Protocol):
    """What a :class:`DynamicBatchSizer` needs from an SLA controller."""

    b_min: int
    """Smallest batch size."""
    b_max: int
    """Largest batch size."""

    def update(self, latency_s: float, batch_size: int) -> None:
        """Learn from one finished batch: its latency (s) and size (requests)."""
        ...

    def b_sla(self) -> int:
        """The SLA-constrained batch size for the batch being formed (may move the controller's state)."""
        ...


@attrs.define(kw_only=True)
class SLAController:
    """The SLA feedback controller of seed 001 §2.3, step for step (``sla_controller: seed``).

    ``update`` smooths the latest batch latency and size into exponential moving
    averages (both start at 0); ``b_sla`` moves the search interval ``[b_low, b_high]``
    (shrink when the average latency is above ``d_sla_s + eps_d_s``, grow when below
    ``d_sla_s - eps_d_s``, re-centre on the average batch size inside the band) and
    returns its midpoint. Integer conversions truncate toward zero, as the
    specification's ``int()`` does.

    The rule can lock above the target: its "too slow" branch only ever raises
    ``b_low``, so once the interval has closed on a size whose latency misses the SLA
    (the average batch size approaches it from above, and ``int()`` keeps it there) it
    stays on that size for good. :class:`CorrectedSLAController` is the default for
    that reason (``docs/batching.md``, "The seed's controller locks above its target").

    With ``window_batches`` the two averages are plain means of the last that many
    batches instead (0 before the first batch, as the moving averages start), seed 001
    §2.2's "recent batches"; ``alpha`` is then unused.

    Examples
    --------
    >>> c = SLAController(d_sla_s=2.0, eps_d_s=0.2, b_min=1, b_max=64)
    >>> c.b_sla()  # no latency seen yet: "too fast", the interval is the full range
    32
    >>> c.update(3.0, 32); round(c.tau_avg_s, 6), round(c.b_avg, 6)
    (0.6, 6.4)
    >>> w = SLAController(d_sla_s=2.0, eps_d_s=0.2, b_min=1, b_max=64, window_batches=2)
    >>> for latency_s, size in [(3.0, 32), (1.0, 8), (2.0, 16)]:
    ...     w.update(latency_s, size)
    >>> w.tau_avg_s, w.b_avg  # the last two batches
    (1.5, 12.0)
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
    window_batches: int | None = None
    """Average over the last this many batches instead of the moving averages (None: moving averages)."""
    tau_avg_s: float = 0.0
    """Average batch latency, s."""
    b_avg: float = 0.0
    """Average batch size."""
    b_low: int = attrs.field(default=attrs.Factory(lambda self: self.b_min, takes_self=True))
    """Lower end of the search interval."""
    b_high: int = attrs.field(default=attrs.Factory(lambda self: self.b_max, takes_self=True))
    """Upper end of the search interval."""
    _recent: tuple[RecentMean, RecentMean] | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        if self.window_batches is not None:
            self._recent = (RecentMean(self.window_batches), RecentMean(self.window_batches))

    def update(self, latency_s: float, batch_size: int) -> None:
        """Smooth one finished batch's latency (s) and size into the averages."""
        if self._recent is not None:
            self.tau_avg_s = self._recent[0].add(latency_s)
            self.b_avg = self._recent[1].add(batch_size)
            return
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


@attrs.define(kw_only=True)
class CorrectedSLAController:
    """An SLA controller that finds the largest batch size whose latency meets ``d_sla_s``
    (``sla_controller: corrected``, the default).

    It keeps seed 001 §2.3's search interval ``[b_low, b_high]``, its midpoint answer and
    its 20 % steps, but judges each batch size by the latencies of batches *of that
    size*, remembers which sizes missed, and re-opens the interval when what it
    believed no longer holds (``docs/batching.md``, "The corrected controller").

    **What it learns** (``update``, after each batch). The batch's latency goes into its
    size's average: the plain mean of the size's first ``1 / alpha`` batches, then a
    moving average of weight ``alpha`` (or, with ``window_batches``, the mean of the
    size's last that many batches). How far the batch landed from its size's previous
    average goes into a noise estimate (``noise_var_s2``, averaged the same way), which
    is 0 as long as every batch of a size takes the same time. An average of another
    size that contradicts the new one (a smaller size slower, a larger size faster) by
    more than ``confidence_z`` noise standard errors is out of date and forgotten.

    **What it answers** (``b_sla``, before each batch).

    * The averages are made non-decreasing in the size (weighted isotonic regression,
      pool-adjacent-violators; a size weighs as many batches as its average is worth),
      which leaves averages that already grow with the size exactly as they are.
    * ``fail`` is the smallest size whose fitted latency exceeds ``d_sla_s`` by more than
      ``confidence_z`` standard errors of its average (``b_max + 1`` when none does); with
      no noise, any excess counts. ``good`` is the largest size below ``fail`` whose fitted
      latency is at most ``d_sla_s``.
    * The interval becomes ``[good, min(b_high, fail - 1)]`` and the answer is its upper
      midpoint ``(b_low + b_high + 1) // 2``: above ``good`` every answer tries a size
      not yet known to meet the target (a bisection between ``good`` and ``fail``).
    * Closed on ``good`` with room above it (no failure right above), the interval grows
      by ``max(1, int(0.2 * good))`` (the seed's "increase" step), below ``fail``.
    * When the SLA is missed at ``b_low`` (its size's latency rises above ``d_sla_s``)
      the interval re-opens downward: to the largest smaller size known to meet it, or,
      with none seen, to ``[max(b_min, int(0.8 * fail)), fail - 1]`` (the seed's
      "decrease" step). When every size from ``b_min`` up misses, the answer is ``b_min``.
    * Closed on ``good = fail - 1``, the answer stays ``good``. What is known of the
      larger sizes is forgotten, and the search resumes upward, when the server has
      become faster: ``good``'s fitted latency has fallen more than ``eps_d_s`` below its
      value when the interval closed, or the size below ``fail`` when ``fail`` last
      missed (or the first smaller size measured after) has fallen more than ``eps_d_s``
      below its average then.

    With a latency that is a fixed, non-decreasing function of the batch size and full
    batches, it settles on the largest size whose latency is at most ``d_sla_s`` (or on
    ``b_min`` when none is) from any starting interval and stays there; a property test
    checks it. With variable latencies it aims at the largest size whose *average*
    latency meets the target, so a share of that size's batches still take longer.

    Parameters
    ----------
    d_sla_s
        Target batch latency D_SLA, s.
    eps_d_s
        How much faster (s) a size must become before the controller tries the sizes
        above it again.
    b_min, b_max
        Allowed batch sizes.
    alpha
        Weight of the newest batch in a size's moving average (and in the noise estimate).
    window_batches
        Average a size over its last this many batches instead, and the noise over the
        last this many deviations (None: moving averages).
    b_low, b_high
        The starting interval (default ``[b_min, b_max]``).
    confidence_z
        Standard errors of the noise by which an average must exceed ``d_sla_s`` to count
        as a miss, and by which two averages must contradict each other to make the older
        one out of date.

    Examples
    --------
    Latency 0.5 s per request of the batch, a 2 s target: four requests meet it (exactly),
    five do not. A bisection from the whole range [1, 64] finds 4 in six batches.

    >>> c = CorrectedSLAController(d_sla_s=2.0, eps_d_s=0.2, b_min=1, b_max=64)
    >>> sizes = []
    >>> for _ in range(12):
    ...     size = c.b_sla()
    ...     sizes.append(size)
    ...     c.update(0.5 * size, size)
    >>> sizes
    [33, 17, 9, 5, 3, 4, 4, 4, 4, 4, 4, 4]
    >>> c.b_low, c.b_high, c.noise_var_s2
    (4, 4, 0.0)
    """

    d_sla_s: float
    """Target batch latency D_SLA, s."""
    eps_d_s: float
    """Speed-up of a size that makes what is known of larger sizes out of date, s."""
    b_min: int
    """Smallest batch size."""
    b_max: int
    """Largest batch size."""
    alpha: float = 0.2
    """Weight of the newest batch in a size's moving average."""
    window_batches: int | None = None
    """Average each size over its last this many batches instead (None: moving average)."""
    b_low: int = attrs.field(default=attrs.Factory(lambda self: self.b_min, takes_self=True))
    """Lower end of the search interval."""
    b_high: int = attrs.field(default=attrs.Factory(lambda self: self.b_max, takes_self=True))
    """Upper end of the search interval."""
    confidence_z: float = 2.0
    """Noise standard errors that make an excess over ``d_sla_s`` (or a contradiction) count."""
    latency_by_size_s: dict[int, float] = attrs.field(init=False, factory=dict)
    """Average latency of the batches of each size seen (and not forgotten), s."""
    noise_var_s2: float = attrs.field(init=False, default=0.0)
    """Mean squared deviation of a batch's latency from its size's average before it, s^2."""
    _square_weights: dict[int, float] = attrs.field(init=False, factory=dict)
    """Per size: the sum of its batches' squared weights in its average (its standard error
    is the noise's times the square root of this)."""
    _batches: dict[int, int] = attrs.field(init=False, factory=dict)
    """Per size: batches folded into its average."""
    _windows: dict[int, RecentMean] = attrs.field(init=False, factory=dict)
    _deviations: int = attrs.field(init=False, default=0)
    _noise_window: RecentMean | None = attrs.field(init=False, default=None)
    _below: dict[int, tuple[int, float] | None] = attrs.field(init=False, factory=dict)
    """Per size: a smaller size and its average when this size was last measured (None:
    none measured yet)."""
    _closed: tuple[int, float] | None = attrs.field(init=False, default=None)
    """(good, its fitted latency) when the interval closed on ``good`` below a failure."""

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.b_min <= self.b_low <= self.b_high <= self.b_max:
            raise ValueError(
                f"need 1 <= b_min <= b_low <= b_high <= b_max; got {self.b_min}, {self.b_low}, {self.b_high}, {self.b_max}"
            )
        if self.window_batches is not None:
            self._noise_window = RecentMean(self.window_batches)

    def update(self, latency_s: float, batch_size: int) -> None:
        """Fold one finished batch's latency (s) into the average of its size."""
        lat = self.latency_by_size_s
        old = lat.get(batch_size)
        count = self._batches.get(batch_size, 0) + 1
        self._batches[batch_size] = count
        if old is not None:
            deviation = (latency_s - old) ** 2
            self._deviations += 1
            if self._noise_window is not None:
                self.noise_var_s2 = self._noise_window.add(deviation)
            else:
                self.noise_var_s2 += max(self.alpha, 1.0 / self._deviations) * (deviation - self.noise_var_s2)
        if self.window_batches is not None:
            window = self._windows.get(batch_size)
            if window is None:
                window = self._windows[batch_size] = RecentMean(self.window_batches)
            avg = window.add(latency_s)
            self._square_weights[batch_size] = 1.0 / window.count
        elif old is None:
            avg = latency_s
            self._square_weights[batch_size] = 1.0
        else:
            # The plain mean of a size's first 1 / alpha batches, then the moving average: its
            # first batch does not outweigh the next few. Written old + a * (x - old): a size
            # whose batches all take the same time keeps exactly that average.
            a = max(self.alpha, 1.0 / count)
            avg = old + a * (latency_s - old)
            self._square_weights[batch_size] = (1 - a) ** 2 * self._square_weights[batch_size] + a * a
        lat[batch_size] = avg
        self._forget_contradicted(batch_size)
        below = [n for n in lat if n < batch_size]
        self._below[batch_size] = (max(below), lat[max(below)]) if below else None
        for n, ref in self._below.items():
            if ref is None and n > batch_size:
                self._below[n] = (batch_size, avg)

    def _forget_contradicted(self, size: int) -> None:
        """Forget the sizes whose averages contradict *size*'s new one beyond the noise."""
        lat = self.latency_by_size_s
        avg = lat[size]
        spread = self.confidence_z * math.sqrt(self.noise_var_s2)
        square = self._square_weights
        for n in [n for n in lat if n != size]:
            excess = lat[n] - avg if n < size else avg - lat[n]
            if excess > spread * math.sqrt(square[n] + square[size]):
                self._forget(n)

    def _forget(self, size: int) -> None:
        del self.latency_by_size_s[size]
        del self._square_weights[size]
        del self._batches[size]
        del self._below[size]
        self._windows.pop(size, None)

    def fitted_latency_s(self) -> dict[int, float]:
        """The sizes' average latencies made non-decreasing in the size (weighted
        pool-adjacent-violators), s; sizes whose averages already grow keep them exactly."""
        lat = self.latency_by_size_s
        # Blocks of adjacent sizes: [mean, weighted sum, weight, sizes]. A lone size's mean is
        # its own average, not sum / weight, so that nothing is rounded when nothing pools.
        blocks: list[list] = []
        for n in sorted(lat):
            w = 1.0 / self._square_weights[n]
            block = [lat[n], lat[n] * w, w, [n]]
            while blocks and blocks[-1][0] > block[0]:
                prev = blocks.pop()
                total, w_sum = prev[1] + block[1], prev[2] + block[2]
                block = [total / w_sum, total, w_sum, prev[3] + block[3]]
            blocks.append(block)
        return {n: block[0] for block in blocks for n in block[3]}

    def _failing(self) -> tuple[dict[int, float], int]:
        """The fitted latencies and ``fail``, after forgetting a failure the server has outrun."""
        lat = self.latency_by_size_s
        while True:
            fit = self.fitted_latency_s()
            margin = self.confidence_z * math.sqrt(self.noise_var_s2)
            square = self._square_weights
            fail = min((n for n, v in fit.items() if v - margin * math.sqrt(square[n]) > self.d_sla_s), default=self.b_max + 1)
            ref = self._below.get(fail)
            if ref is None or ref[0] not in lat or lat[ref[0]] >= ref[1] - self.eps_d_s:
                return fit, fail
            for n in [n for n in lat if n >= fail]:  # the size below has become faster
                self._forget(n)

    def b_sla(self) -> int:
        """Move the search interval by what is known of each size and return its upper midpoint."""
        fit, fail = self._failing()
        if fail <= self.b_min:  # every allowed size misses: the smallest is the best there is
            self.b_low = self.b_high = self.b_min
            self._closed = None
            return self.b_min
        good = max((n for n, v in fit.items() if v <= self.d_sla_s and n < fail), default=None)
        if good is None:
            if self.b_low >= fail:  # missed at b_low, nothing smaller seen: re-open downward
                self.b_low = max(self.b_min, int(0.8 * fail))
            self.b_high = min(max(self.b_high, self.b_low), fail - 1)
            return (self.b_low + self.b_high + 1) // 2
        self.b_low = good
        closed = self._closed
        if closed is not None and closed[0] != good:
            closed = self._closed = None
        if closed is not None and fit[good] < closed[1] - self.eps_d_s:
            # Faster than when the interval closed on it: what is known above is out of date.
            for n in [n for n in self.latency_by_size_s if n > good]:
                self._forget(n)
            self._closed = None
            fail = self.b_max + 1
            self.b_high = good
        self.b_high = min(max(self.b_high, good), fail - 1)
        if self.b_high == good < self.b_max:
            if good < fail - 1:  # closed with room above: widen
                self.b_high = min(fail - 1, good + max(1, int(0.2 * good)))
            elif self._closed is None:  # closed by a failure right above
                self._closed = (good, fit[good])
        return (self.b_low + self.b_high + 1) // 2


SLA_CONTROLLERS: dict[str, type] = {"corrected": CorrectedSLAController, "seed": SLAController}
"""The built-in SLA controllers by the name ``dynamic.sla_controller`` gives them (both take
``d_sla_s, eps_d_s, b_min, b_max, alpha, window_batches``)."""


class DynamicBatchSizer:
    """``b_target = min(b_mem, b_SLA)`` (seed 001 §2.4, at least ``b_min``), learning from each finished batch.

    The memory model uses running means of the prompt and output lengths of the
    requests of finished batches: of every finished batch (the default), or of the
    last ``memory_window_batches`` of them (seed 001 §2.2's "recent batches"). Before
    the first batch finishes there is nothing to average, and ``b_mem`` is ``b_min``
    (the cautious start). Without a memory capacity ``b_mem`` is ``b_max``.

    Parameters
    ----------
    controller
        The SLA controller (:class:`CorrectedSLAController`, :class:`SLAController` or
        anything with their ``b_min``, ``b_max``, ``update`` and ``b_sla``).
    capacity_tokens
        KV capacity ``eta`` in tokens (None: no memory limit).
    safety_fraction
        The safety buffer ``L0`` as a share of ``eta``.
    memory_window_batches
        Average the lengths over the requests of the last this many finished batches
        (None: over every finished batch).

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

    def __init__(
        self,
        controller: SizeController,
        capacity_tokens: float | None,
        safety_fraction: float = 0.1,
        memory_window_batches: int | None = None,
    ) -> None:
        self.controller = controller
        self.capacity_tokens = capacity_tokens
        self.safety_fraction = safety_fraction
        self.memory_window_batches = memory_window_batches
        self.requests_seen = 0
        """Requests of the finished batches the means are over."""
        self.prompt_tokens_seen = 0
        self.output_tokens_seen = 0
        self._recent: deque[tuple[int, int, int]] = deque()
        """(size, prompt tokens, output tokens) of the batches in the window."""

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
        window = self.memory_window_batches
        if window is not None:
            # Integer token counts: the sums stay exact as batches leave the window.
            recent = self._recent
            recent.append((size, prompt_tokens, output_tokens))
            if len(recent) > window:
                old_size, old_prompt, old_output = recent.popleft()
                self.requests_seen -= old_size
                self.prompt_tokens_seen -= old_prompt
                self.output_tokens_seen -= old_output
