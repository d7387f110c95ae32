"""Latency models: every built-in kind, registered in :data:`latency_models`.

A replica's engine asks its latency model how long one step takes; the contract
(:class:`LatencyModel`, its optional capabilities and their defaults in
:class:`LatencyModelBase`) is stated in :mod:`simpy_llm.serving.latency_base`. This module
makes :data:`latency_models` complete wherever it is read from here, and is the import path
for every built-in kind: the kinds of other modules are imported when a scenario names one
of them (:meth:`~simpy_llm.registry.Registry.load_from`) or their class is read from here,
so a run pays only for the models it uses.

Built-in models (``docs/latency.md``):

* ``blis_linear`` (here): BLIS's blackbox α/β form; its default coefficients come
  from ``profiles/blis/blackbox_coefficients.csv``;
* ``roofline`` (:mod:`simpy_llm.serving.roofline`): compute and memory
  bounds per layer from the model's shape and the GPU's peaks;
* ``profile`` (:mod:`simpy_llm.serving.profiled`): Vidur's measured
  per-operator times, with an analytic attention term;
* ``batch_table`` (:mod:`simpy_llm.serving.batch_table`): a table of decode-step
  times by batch size plus linear prompt and attention terms (what the calibrator
  fits, e.g. for llama.cpp on a CPU);
* ``lut`` (:mod:`simpy_llm.serving.lut`): step latencies read off a measured lookup table.
"""

from __future__ import annotations

import csv
import functools
from typing import TYPE_CHECKING, Any

import attrs

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.validators import MAX_COEFFICIENT_US, at_least, at_most
from simpy_llm.lazy import lazy_exports
from simpy_llm.serving.batch_table import BatchTableLatency
from simpy_llm.serving.hardware import Hardware, gpu_spec, resolve_hardware
from simpy_llm.serving.latency_base import LatencyModel, LatencyModelBase, RequestOverheads, VerifyTimer, latency_models
from simpy_llm.serving.profiles import profiles_dir

if TYPE_CHECKING:
    from simpy_llm.serving.lut import LutLatency
    from simpy_llm.serving.profiled import ProfiledLatency
    from simpy_llm.serving.roofline import RooflineLatency

_ELSEWHERE = {"LutLatency": "lut", "ProfiledLatency": "profiled", "RooflineLatency": "roofline"}
"""The built-in kinds registered by their own modules, by class name (imported on first need)."""
latency_models.load_from(*(f"simpy_llm.serving.{module}" for module in _ELSEWHERE.values()))


__getattr__, _ = lazy_exports(globals(), _ELSEWHERE, package="simpy_llm.serving")

__all__ = [
    "BatchTableLatency",
    "BlisLinearLatency",
    "LatencyModel",
    "LatencyModelBase",
    "LutLatency",
    "ProfiledLatency",
    "RequestOverheads",
    "RooflineLatency",
    "VerifyTimer",
    "blis_profiles",
    "latency_models",
    "profiles_dir",
]


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
    try:  # a GPU alias or another case (h100, H100-SXM) names the row's GPU, as in roofline
        gpu = gpu_spec(gpu).name
    except FieldValueError:
        pass  # not a shipped GPU: no row has it, reported below
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
    :attr:`cache_restore_s`)."""
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
        profile_keys: dict[str, Any] = {k: params.pop(k) for k in ("model", "gpu", "tp") if k in params}
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

    @property
    def cache_restore_s(self) -> float:
        """Time a step adds for each request it admits with a cached prefix found, s: a server
        that must copy saved state back before computing on a cached prefix (llama.cpp restoring
        a context checkpoint) pays it once per such request."""
        return self.cache_restore_us * 1e-6

    @property
    def repeatable_step_times(self) -> bool:
        """True: the step time is a function of the step's token counts."""
        return True

    def step_time_s(
        self, prefill_tokens: int, decode_tokens: int, decode_context_tokens: float = 0, prefill_attention_pairs: float = 0
    ) -> float:
        """One step, s: ``beta0 + beta1 * prefill_tokens + beta2 * decode_tokens`` µs (attention is
        not a term: ``uses_context`` is False, and the engine passes no attention terms)."""
        return (self.beta0_us + self.beta1_us * prefill_tokens + self.beta2_us * decode_tokens) * 1e-6


if TYPE_CHECKING:
    # Every built-in kind meets the contract its callers rely on (checked by mypy alone).
    _KINDS: tuple[type[LatencyModel], ...] = (BatchTableLatency, BlisLinearLatency, LutLatency, ProfiledLatency, RooflineLatency)
