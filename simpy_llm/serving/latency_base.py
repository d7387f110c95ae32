"""What a latency model is: the contract its callers rely on, the defaults of its optional
capabilities, and the registry the built-in kinds join.

A :class:`LatencyModel` turns the composition of one engine step into its duration, and adds
BLIS's two per-request overheads:

* ``step_time_s(prefill_tokens, decode_tokens)``: the GPU time of one step that computes
  *prefill_tokens* uncached prompt tokens and *decode_tokens* decode tokens (one per decoding
  request);
* ``queueing_time_s(prompt_tokens)``: time between a request reaching the replica and entering
  its waiting queue (tokenisation, API overhead); it does not occupy the engine;
* ``output_token_overhead_s``: post-processing per output token, added to the client-visible
  time of every token (so TTFT grows by it once, and every inter-token gap by it once).

Its optional capabilities have defaults in :class:`LatencyModelBase`, which every built-in
model derives from, so that callers read them as plain attributes:

* ``uses_context`` (default False): whether the step time depends on attention. Then the
  engine calls ``step_time_s(prefill_tokens, decode_tokens, decode_context_tokens=...,
  prefill_attention_pairs=...)``, where ``decode_context_tokens`` is the sum over the step's
  decoding requests of the tokens in their KV cache, and ``prefill_attention_pairs`` is the sum
  over the step's prefill chunks of the (query token, key token) pairs of causal attention (a
  chunk of ``c`` new tokens after ``p`` cached ones has ``c * p + c * (c + 1) / 2``). Both
  default to 0, so ``step_time_s(p, d)`` works on every model, and a model whose
  ``uses_context`` is False is never passed them;
* ``cache_restore_s`` (default 0): time a step adds for each request it admits with a cached
  prefix found (a server copying saved state back first);
* ``repeatable_step_times`` (default False): whether ``step_time_s`` without attention terms is a
  function of its two counts alone (no draws, no state), so that the engine may time a batch
  of decoders once and reuse that duration;
* ``mean_step_time_s`` (default: ``step_time_s``): the expected step time of a model that
  draws its step times (routers and capacity estimates read it; it never draws);
* ``hardware`` (default None): the :class:`~simpy_llm.serving.hardware.Hardware` (model, GPU,
  TP degree) the model describes, which ``kv_num_blocks: auto``, swap and the KV hand-off of a
  disaggregated fleet need;
* ``verify_time_s`` (default None): a function timing a speculative verify pass from a table,
  ``verify_time_s(contexts, verified)`` (None when the table has no row for the pass: it is
  then timed as a decode step);
* ``fused_time_s`` (default None): a function timing a fused speculative step (the target drafting
  and verifying its own γ tokens) from a table, ``fused_time_s(contexts, gammas)`` (None when the
  table has no row for the step: it is then timed as γ draft steps plus a verify pass);
* ``step_energy_j`` (default None): a function giving one engine step's energy from a table,
  ``step_energy_j(prefill_tokens, decode_tokens, decode_context_tokens, prefill_attention_pairs)``
  in J; the engine adds it up per replica (a LUT's ``energy_mj``);
* ``needs_rng`` (a class attribute, default False): the simulation passes the model one of its
  random streams as ``rng``.

The kinds register in :data:`latency_models` as their modules are imported; look a kind up
through :mod:`simpy_llm.serving.latency`, which imports every built-in one.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, Protocol

from simpy_llm.registry import Registry

if TYPE_CHECKING:
    from simpy_llm.serving.hardware import Hardware

__all__ = ["EnergyMeter", "LatencyModel", "LatencyModelBase", "RequestOverheads", "VerifyTimer", "latency_models", "missing_members"]

EnergyMeter = Callable[..., float]
"""``step_energy_j(prefill_tokens, decode_tokens[, decode_context_tokens, prefill_attention_pairs])``:
one engine step's energy, J, passed what ``step_time_s`` is (the attention terms only when the
model's ``uses_context`` is True)."""
VerifyTimer = Callable[[list[int], list[int]], float | None]
"""``verify_time_s(contexts, verified)``: the time of a verify pass over sequences with these
contexts verifying these numbers of draft tokens, s, or None when the model has no figure for it."""


class LatencyModel(Protocol):
    """What the engine, the batch server, the verify server and the fleet call on a latency
    model (all times in seconds; module docstring). :class:`LatencyModelBase` gives the
    optional members their defaults."""

    @property
    def output_token_overhead_s(self) -> float:
        """Post-processing per output token."""
        ...

    @property
    def uses_context(self) -> bool:
        """Whether :meth:`step_time_s` is to be passed the attention terms."""
        ...

    @property
    def cache_restore_s(self) -> float:
        """Time a step adds for each request it admits with a cached prefix found."""
        ...

    @property
    def hardware(self) -> Hardware | None:
        """The model, GPU and TP degree described, or None."""
        ...

    @property
    def verify_time_s(self) -> VerifyTimer | None:
        """A verify pass's time from a table, or None (no table)."""
        ...

    @property
    def fused_time_s(self) -> VerifyTimer | None:
        """A fused speculative step's time from a table, or None (no table)."""
        ...

    @property
    def step_energy_j(self) -> EnergyMeter | None:
        """A step's energy from a table, or None (no table: energy from the device's power)."""
        ...

    def step_time_s(
        self, prefill_tokens: int, decode_tokens: int, decode_context_tokens: float = 0, prefill_attention_pairs: float = 0
    ) -> float:
        """One engine step's duration."""
        ...

    def mean_step_time_s(
        self, prefill_tokens: int, decode_tokens: int, decode_context_tokens: float = 0, prefill_attention_pairs: float = 0
    ) -> float:
        """:meth:`step_time_s`'s expectation, without drawing."""
        ...

    def queueing_time_s(self, prompt_tokens: int) -> float:
        """Arrival-to-queue delay of a request with *prompt_tokens* tokens."""
        ...


class LatencyModelBase(abc.ABC):
    """A :class:`LatencyModel` with the optional capabilities at their defaults (module
    docstring): a subclass defines ``step_time_s``, ``queueing_time_s`` and
    ``output_token_overhead_s``, and overrides what it has.

    Examples
    --------
    >>> class Fixed(LatencyModelBase):
    ...     output_token_overhead_s = 0.0
    ...     def step_time_s(self, prefill_tokens, decode_tokens, decode_context_tokens=0, prefill_attention_pairs=0):
    ...         return 0.01
    ...     def queueing_time_s(self, prompt_tokens):
    ...         return 0.0
    >>> m = Fixed()
    >>> m.uses_context, m.cache_restore_s, m.hardware, m.verify_time_s, m.mean_step_time_s(512, 0)
    (False, 0.0, None, None, 0.01)
    """

    __slots__ = ()

    needs_rng: ClassVar[bool] = False
    """Whether the simulation passes the model a random stream as ``rng`` (read on the class)."""
    verify_time_s: VerifyTimer | None = None
    """A verify pass's time from a table (:data:`VerifyTimer`); None: no table, a verify pass is
    timed as a decode step."""
    fused_time_s: VerifyTimer | None = None
    """A fused speculative step's time from a table (:data:`VerifyTimer`, passed the contexts and
    each sequence's γ); None: no table, a fused step is timed as draft steps plus a verify pass."""
    step_energy_j: EnergyMeter | None = None
    """A step's energy from a table (:data:`EnergyMeter`); None: no table (a device profile's
    power gives a replica's energy)."""

    @property
    @abc.abstractmethod
    def output_token_overhead_s(self) -> float:
        """Post-processing per output token, s."""

    @abc.abstractmethod
    def step_time_s(
        self, prefill_tokens: int, decode_tokens: int, decode_context_tokens: float = 0, prefill_attention_pairs: float = 0
    ) -> float:
        """One engine step's duration, s (module docstring)."""

    @abc.abstractmethod
    def queueing_time_s(self, prompt_tokens: int) -> float:
        """Arrival-to-queue delay of a request with *prompt_tokens* tokens, s."""

    @property
    def uses_context(self) -> bool:
        """Whether the engine passes ``decode_context_tokens`` and ``prefill_attention_pairs``
        to :meth:`step_time_s` (False: the step time ignores attention)."""
        return False

    @property
    def cache_restore_s(self) -> float:
        """Time a step adds for each request it admits with a cached prefix found, s (0: none)."""
        return 0.0

    @property
    def repeatable_step_times(self) -> bool:
        """Whether ``step_time_s(prefill_tokens, decode_tokens)`` (no attention terms) gives the
        same duration every time it is asked with the same counts: no draws, no state. The
        engine then times a batch of *n* decoders once and reuses that duration (False, the
        default: it asks at every scheduling decision, as a model drawing its own times needs)."""
        return False

    @property
    def hardware(self) -> Hardware | None:
        """The :class:`~simpy_llm.serving.hardware.Hardware` described (None: not known)."""
        return None

    def mean_step_time_s(
        self, prefill_tokens: int, decode_tokens: int, decode_context_tokens: float = 0, prefill_attention_pairs: float = 0
    ) -> float:
        """The expected step time, s: :meth:`step_time_s` (a model that draws its step times
        overrides it); the attention terms are passed only when given."""
        if decode_context_tokens or prefill_attention_pairs:
            return self.step_time_s(
                prefill_tokens, decode_tokens, decode_context_tokens=decode_context_tokens, prefill_attention_pairs=prefill_attention_pairs
            )
        return self.step_time_s(prefill_tokens, decode_tokens)


latency_models: Registry[type] = Registry("latency model")
"""The latency model kinds by the name scenario YAML gives them (``kind: roofline``). Complete
once :mod:`simpy_llm.serving.latency` is imported (it imports every built-in kind)."""


class RequestOverheads(LatencyModelBase):
    """The per-request overheads every built-in latency model shares, from its
    ``alpha0_us``, ``alpha1_us`` and ``alpha2_us`` fields (BLIS's alpha terms)."""

    __slots__ = ()
    alpha0_us: float
    alpha1_us: float
    alpha2_us: float

    @property
    def output_token_overhead_s(self) -> float:
        """Post-processing per output token, s."""
        return self.alpha2_us * 1e-6

    def queueing_time_s(self, prompt_tokens: int) -> float:
        """Arrival-to-queue delay of a request with *prompt_tokens* tokens, s."""
        return (self.alpha0_us + self.alpha1_us * prompt_tokens) * 1e-6


def missing_members(model: object) -> list[str]:
    """The members of :class:`LatencyModel` that *model* lacks (empty: it keeps the contract).

    A model of one's own derives from :class:`LatencyModelBase` (which gives the optional members
    their defaults) or defines every member; the fleet refuses one that does neither, naming what
    it lacks, before anything runs.

    >>> class OnlyStep:
    ...     def step_time_s(self, prefill_tokens, decode_tokens):
    ...         return 0.01
    >>> missing_members(OnlyStep())[:3]
    ['cache_restore_s', 'fused_time_s', 'hardware']
    """
    members = sorted(name for name in LatencyModel.__dict__ if not name.startswith("_") or name == "__call__")
    return [name for name in members if not hasattr(model, name)]
