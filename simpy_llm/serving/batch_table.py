"""A latency model read off a table of decode-step times: ``batch_table``.

Engines whose step time is not linear in the batch size need more than
BLIS's ``beta0 + beta2 * decode_tokens``. On a CPU, llama.cpp runs a lone
decoding request through matrix-vector kernels and two or more through
matrix-matrix ones, so going from one to two decoders costs far more than
going from two to three (``docs/real-server.md``); a GPU's step time bends
where the batch stops being memory-bound. ``batch_table`` takes the pure-decode
step time for each number of decoders as measured (or fitted,
:mod:`simpy_llm.calibrate.fit`) and adds linear terms for prompt work::

    step = D(n) + [P > 0] * (prefill_step + prefill_token * P)
           + [P > 0 and n = 0] * prefill_only_step
           + decode_context * C + prefill_pair * Q

where ``n`` is the step's decoding requests, ``D(n)`` the table entry (``D(0) =
0``; past the table's end, extrapolated along its last two entries), ``P`` the
prompt (prefill) tokens, ``C`` the decoders' context tokens and ``Q`` the
causal-attention pairs of the prefill tokens (see :mod:`simpy_llm.serving.latency_base`).
``prefill_only_step`` is the fixed cost of a step that runs prompts alone: the
part of a step's overhead that ``D(n)`` carries when decoders are present (so
BLIS's ``beta0 + beta1 * P + beta2 * n`` is ``D(n) = beta0 + beta2 * n``,
``prefill_token = beta1``, ``prefill_only_step = beta0``).
All coefficients are in microseconds; BLIS's per-request alpha terms come from
:class:`~simpy_llm.serving.latency_base.RequestOverheads`.

Examples
--------
>>> m = BatchTableLatency(decode_step_us=(13_000.0, 45_000.0, 50_000.0), prefill_step_us=20_000.0, prefill_token_us=3_000.0)
>>> round(m.step_time_s(0, 1), 6), round(m.step_time_s(0, 2), 6), round(m.step_time_s(0, 5), 6)
(0.013, 0.045, 0.06)
>>> round(m.step_time_s(100, 0), 6), round(m.step_time_s(100, 2), 6)
(0.32, 0.365)
>>> blis = BatchTableLatency(decode_step_us=(1010.0, 1020.0), prefill_token_us=5.0, prefill_only_step_us=1000.0)
>>> round(blis.step_time_s(100, 0), 6), round(blis.step_time_s(100, 2), 6)   # beta0 1000, beta1 5, beta2 10
(0.0015, 0.00152)
"""

from __future__ import annotations

import attrs

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.validators import MAX_COEFFICIENT_US, at_least, at_most
from simpy_llm.serving.latency_base import RequestOverheads, latency_models

__all__ = ["BatchTableLatency"]

_coefficient = [at_least(0), at_most(MAX_COEFFICIENT_US)]


def _decode_table(inst: object, attr: attrs.Attribute[tuple[float, ...]], value: tuple[float, ...]) -> None:
    if not value:
        raise FieldValueError(attr.name, "needs at least one entry (the step time of one decoder)")
    for i, v in enumerate(value):
        if not 0 < v <= MAX_COEFFICIENT_US:
            raise FieldValueError(f"{attr.name}[{i}]", f"must be in (0, {MAX_COEFFICIENT_US:g}] µs, got {v!r}")


@latency_models.register("batch_table")
@attrs.frozen(kw_only=True)
class BatchTableLatency(RequestOverheads):
    """Step time from a table of decode-step times plus linear prompt and attention terms
    (module docstring), coefficients in microseconds.

    A pure-decode step with more decoders than the table has entries is extrapolated
    along the last two entries' slope (never below the last entry); with one entry the
    table is flat.
    """

    decode_step_us: tuple[float, ...] = attrs.field(converter=tuple, validator=_decode_table)
    """Time of a pure-decode step with 1, 2, ... decoding requests, µs (entry ``i`` is ``i + 1`` decoders)."""
    prefill_step_us: float = attrs.field(default=0.0, validator=_coefficient)
    """Fixed time a step (or forward pass) with prompt tokens adds, µs."""
    prefill_token_us: float = attrs.field(default=0.0, validator=_coefficient)
    """Time per prompt (prefill) token in the step, µs."""
    prefill_only_step_us: float = attrs.field(default=0.0, validator=_coefficient)
    """Fixed time a step with prompt tokens and no decoders adds on top of ``prefill_step_us``, µs."""
    decode_context_us: float = attrs.field(default=0.0, validator=_coefficient)
    """Time per context token of each decoding request (attention over its KV), µs."""
    prefill_pair_us: float = attrs.field(default=0.0, validator=_coefficient)
    """Time per (query, key) pair of the prefill tokens' causal attention, µs."""
    alpha0_us: float = attrs.field(default=0.0, validator=_coefficient)
    """Fixed arrival-to-queue delay per request (API server, tokenisation), µs."""
    alpha1_us: float = attrs.field(default=0.0, validator=_coefficient)
    """Arrival-to-queue delay per prompt token, µs."""
    alpha2_us: float = attrs.field(default=0.0, validator=_coefficient)
    """Post-processing per output token, µs."""
    cache_restore_us: float = attrs.field(default=0.0, validator=_coefficient)
    """Time a step adds for each request it starts from a cached prefix, µs (llama.cpp restores
    a checkpointed model's context: ~70 ms for Gemma 3 270M on one CPU thread, whatever the
    prefix's length)."""

    def __attrs_post_init__(self) -> None:
        if self.prefill_step_us == 0 and self.prefill_token_us == 0:
            raise FieldValueError("prefill_token_us", "a step with prompt tokens must take time: give prefill_step_us or prefill_token_us > 0")

    @property
    def uses_context(self) -> bool:
        """Whether the engine must pass the attention terms (a context coefficient is set)."""
        return self.decode_context_us > 0 or self.prefill_pair_us > 0

    @property
    def cache_restore_s(self) -> float:
        """Time a step adds for each request it admits with a cached prefix found, s (``cache_restore_us``)."""
        return self.cache_restore_us * 1e-6

    def decode_us(self, decoders: int) -> float:
        """``D(decoders)``, µs: the table entry, 0 for none, extrapolated past the end.

        >>> BatchTableLatency(decode_step_us=(10.0, 30.0), prefill_token_us=1.0).decode_us(4)
        70.0
        """
        table = self.decode_step_us
        if decoders <= 0:
            return 0.0
        if decoders <= len(table):
            return table[decoders - 1]
        last = table[-1]
        slope = last - table[-2] if len(table) > 1 else 0.0
        return last + max(slope, 0.0) * (decoders - len(table))

    @property
    def repeatable_step_times(self) -> bool:
        """True: the step time is a function of the step's token counts."""
        return True

    def step_time_s(
        self, prefill_tokens: int, decode_tokens: int, decode_context_tokens: float = 0, prefill_attention_pairs: float = 0
    ) -> float:
        us = self.decode_us(decode_tokens)
        if prefill_tokens:
            us += self.prefill_step_us + self.prefill_token_us * prefill_tokens
            if not decode_tokens:
                us += self.prefill_only_step_us
        if decode_context_tokens:
            us += self.decode_context_us * decode_context_tokens
        if prefill_attention_pairs:
            us += self.prefill_pair_us * prefill_attention_pairs
        return us * 1e-6
