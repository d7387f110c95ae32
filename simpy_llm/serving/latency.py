"""Step-time (latency) models for a replica's engine.

A :class:`LatencyModel` turns the composition of one engine step into its
duration, and adds BLIS's two per-request overheads:

* ``step_time_s(prefill_tokens, decode_tokens)``: the GPU time of one step
  that computes *prefill_tokens* uncached prompt tokens and *decode_tokens*
  decode tokens (one per decoding request);
* ``queueing_time_s(prompt_tokens)``: time between a request reaching the
  replica and entering its waiting queue (tokenisation, API overhead); it
  does not occupy the engine;
* ``output_token_overhead_s``: post-processing per output token, added to
  the client-visible time of every token (so TTFT grows by it once, and
  every inter-token gap by it once);
* ``cache_restore_s`` (optional, default 0): time a step adds for each request
  it admits with a cached prefix found (a server copying saved state back first).

A model whose class sets ``uses_context = True`` (absent means False) is
also told what attention costs: the engine calls
``step_time_s(prefill_tokens, decode_tokens, decode_context_tokens=...,
prefill_attention_pairs=...)``, where ``decode_context_tokens`` is the sum
over the step's decoding requests of the tokens in their KV cache, and
``prefill_attention_pairs`` is the sum over the step's prefill chunks of the
(query token, key token) pairs of causal attention (a chunk of ``c`` new
tokens after ``p`` cached ones has ``c * p + c * (c + 1) / 2``). Both default
to 0, so ``step_time_s(p, d)`` works on every model.

Built-in models (``docs/latency.md``):

* ``blis_linear``: BLIS's blackbox α/β form; its default coefficients come
  from ``profiles/blis/blackbox_coefficients.csv``;
* ``roofline`` (:mod:`simpy_llm.serving.roofline`): compute and memory
  bounds per layer from the model's shape and the GPU's peaks;
* ``profile`` (:mod:`simpy_llm.serving.profiled`): Vidur's measured
  per-operator times, with an analytic attention term;
* ``batch_table`` (:mod:`simpy_llm.serving.batch_table`): a table of decode-step
  times by batch size plus linear prompt and attention terms (what the calibrator
  fits, e.g. for llama.cpp on a CPU).
"""

from __future__ import annotations

import csv
import functools
from pathlib import Path
from typing import Any, Protocol

import attrs

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.validators import MAX_COEFFICIENT_US, at_least, at_most
from simpy_llm.registry import Registry

__all__ = [
    "BlisLinearLatency",
    "LatencyModel",
    "RequestOverheads",
    "blis_profiles",
    "latency_models",
    "profiles_dir",
]


class LatencyModel(Protocol):
    """What the engine needs from a latency model (all times in seconds).

    A model with ``uses_context = True`` also accepts the keyword arguments
    ``decode_context_tokens`` and ``prefill_attention_pairs`` of
    ``step_time_s`` (module docstring).
    """

    output_token_overhead_s: float

    def step_time_s(self, prefill_tokens: int, decode_tokens: int) -> float: ...

    def queueing_time_s(self, prompt_tokens: int) -> float: ...


latency_models: Registry[type] = Registry("latency model")


class RequestOverheads:
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

    @property
    def cache_restore_s(self) -> float:
        """Time a step adds for each request it admits with a cached prefix found, s: a server
        that must copy saved state back before computing on a cached prefix (llama.cpp restoring
        a context checkpoint) pays it once per such request. 0 unless the model has a
        ``cache_restore_us`` field."""
        return getattr(self, "cache_restore_us", 0.0) * 1e-6


def profiles_dir() -> Path:
    """The folder of shipped profiles (inside the wheel, or the source tree's ``profiles/``)."""
    here = Path(__file__).resolve().parent.parent
    packaged = here / "_profiles"
    return packaged if packaged.is_dir() else here.parent / "profiles"


@functools.cache
def blis_profiles() -> dict[tuple[str, str, int], dict[str, float]]:
    """BLIS blackbox coefficient rows keyed by (model, gpu, tp); values in microseconds."""
    table: dict[tuple[str, str, int], dict[str, float]] = {}
    with open(profiles_dir() / "blis" / "blackbox_coefficients.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            table[(row["model"].lower(), row["gpu"], int(row["tp"]))] = {
                "beta0_us": float(row["beta0_us"]),
                "beta1_us": float(row["beta1_us_per_prefill_tok"]),
                "beta2_us": float(row["beta2_us_per_decode_tok"]),
                "alpha0_us": float(row["alpha0_us"]),
                "alpha1_us": float(row["alpha1_us_per_input_tok"]),
                "alpha2_us": float(row["alpha2_us_per_output_tok"]),
            }
    return table


def _find_profile(model: str, gpu: str, tp: int) -> dict[str, float]:
    table = blis_profiles()
    model_l = model.lower()
    for (m, g, t), coeffs in table.items():
        if (m == model_l or m.split("/", 1)[-1] == model_l) and g == gpu and t == tp:
            return coeffs
    same_model = [(g, t) for m, g, t in table if model_l in (m, m.split("/", 1)[-1])]
    if same_model:
        has = ", ".join(f"{g} tp{t}" for g, t in sorted(same_model))
        # Blame gpu when no row has that GPU, tp otherwise.
        field = "tp" if any(g == gpu for g, _ in same_model) else "gpu"
        raise FieldValueError(field, f"no BLIS profile for {model!r} on {gpu!r} tp{tp}; it has: {has}")
    models = sorted({m.split("/", 1)[-1] for m, _, _ in table})
    raise FieldValueError("model", f"no BLIS profile for model {model!r}; known models: {', '.join(models)}")


@latency_models.register("blis_linear")
@attrs.frozen(kw_only=True)
class BlisLinearLatency(RequestOverheads):
    """BLIS's blackbox linear model, coefficients in microseconds.

    ``step = beta0 + beta1 * prefill_tokens + beta2 * decode_tokens``;
    ``queueing = alpha0 + alpha1 * prompt_tokens``; ``alpha2`` per output token.

    Give either a profile (``model``, ``gpu``, ``tp``) or the coefficients;
    explicit coefficients override the profile's.

    Examples
    --------
    >>> m = BlisLinearLatency.from_params({"model": "llama-3.1-8b-instruct", "gpu": "A100-80", "tp": 1})
    >>> round(m.step_time_s(prefill_tokens=512, decode_tokens=0), 6)
    0.040934
    >>> m2 = BlisLinearLatency(beta0_us=1000.0, beta2_us=10.0)
    >>> m2.step_time_s(0, 4)
    0.00104
    """

    beta0_us: float = attrs.field(default=0.0, validator=[at_least(0), at_most(MAX_COEFFICIENT_US)])
    """Fixed time per step, µs."""
    beta1_us: float = attrs.field(default=0.0, validator=[at_least(0), at_most(MAX_COEFFICIENT_US)])
    """Time per uncached prefill token in the step, µs."""
    beta2_us: float = attrs.field(default=0.0, validator=[at_least(0), at_most(MAX_COEFFICIENT_US)])
    """Time per decode token in the step, µs."""
    alpha0_us: float = attrs.field(default=0.0, validator=[at_least(0), at_most(MAX_COEFFICIENT_US)])
    """Fixed arrival-to-queue delay per request, µs."""
    alpha1_us: float = attrs.field(default=0.0, validator=[at_least(0), at_most(MAX_COEFFICIENT_US)])
    """Arrival-to-queue delay per prompt token, µs."""
    alpha2_us: float = attrs.field(default=0.0, validator=[at_least(0), at_most(MAX_COEFFICIENT_US)])
    """Post-processing per output token, µs."""
    cache_restore_us: float = attrs.field(default=0.0, validator=[at_least(0), at_most(MAX_COEFFICIENT_US)])
    """Time a step adds for each request it starts from a cached prefix, µs (see
    :attr:`RequestOverheads.cache_restore_s`)."""
    model: str | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.instance_of(str)))
    """Model of the profile the coefficients describe (``from_params`` fills it); used for :attr:`hardware`."""
    gpu: str | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.instance_of(str)))
    """GPU of that profile (``H100``, ``A100-80``, ``L40S``)."""
    tp: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.instance_of(int)))
    """Tensor-parallel degree of that profile."""

    def __attrs_post_init__(self) -> None:
        if self.beta0_us == 0 and (self.beta1_us == 0 or self.beta2_us == 0):
            raise FieldValueError(
                "beta0_us", "every step must take time: give beta0_us > 0, or both beta1_us and beta2_us > 0"
            )

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> BlisLinearLatency:
        """Build from scenario params: an optional profile plus coefficient overrides."""
        params = dict(params)
        profile_keys = {k: params.pop(k) for k in ("model", "gpu", "tp") if k in params}
        base: dict[str, float] = {}
        if profile_keys:
            missing = {"model", "gpu", "tp"} - set(profile_keys)
            if missing:
                raise FieldValueError(sorted(missing)[0], "a profile needs model, gpu and tp")
            for key in ("model", "gpu"):
                if not isinstance(profile_keys[key], str):
                    raise FieldValueError(key, f"must be a string, got {profile_keys[key]!r}")
            tp = profile_keys["tp"]
            if isinstance(tp, bool) or not isinstance(tp, int):
                raise FieldValueError("tp", f"must be an integer, got {tp!r}")
            base = _find_profile(profile_keys["model"], profile_keys["gpu"], tp)
        profile_names = ("model", "gpu", "tp")
        unknown = sorted(map(str, set(params) - set(attrs.fields_dict(cls))))
        if unknown:
            coefficients = [name for name in attrs.fields_dict(cls) if name not in profile_names]
            allowed = ", ".join([*profile_names, *coefficients])
            raise FieldValueError(unknown[0], f"unknown key; allowed: {allowed}")
        return cls(**{**base, **params, **profile_keys})

    @property
    def hardware(self) -> Hardware | None:
        """The :class:`~simpy_llm.serving.hardware.Hardware` of the profile, or None.

        None unless ``model``, ``gpu`` and ``tp`` are all set and the model has
        a configuration under ``profiles/models`` (BLIS names such as
        ``meta-llama/llama-3.1-8b-instruct`` are matched without the prefix).

        Examples
        --------
        >>> m = BlisLinearLatency.from_params({"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": 2})
        >>> m.hardware.model.num_layers, m.hardware.gpu.name, m.hardware.tp
        (32, 'H100', 2)
        >>> BlisLinearLatency(beta0_us=1000.0).hardware is None
        True
        """
        return resolve_hardware(self.model, self.gpu, self.tp)

    def step_time_s(self, prefill_tokens: int, decode_tokens: int) -> float:
        return (self.beta0_us + self.beta1_us * prefill_tokens + self.beta2_us * decode_tokens) * 1e-6


# Imported last: these modules register their models in ``latency_models`` and use ``profiles_dir``.
from simpy_llm.serving import batch_table as _batch_table  # noqa: E402, F401
from simpy_llm.serving import lut as _lut  # noqa: E402, F401
from simpy_llm.serving import profiled as _profiled  # noqa: E402, F401
from simpy_llm.serving import roofline as _roofline  # noqa: E402, F401
from simpy_llm.serving.hardware import Hardware, resolve_hardware  # noqa: E402
