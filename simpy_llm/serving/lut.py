"""A latency model read off a lookup table (LUT) of measured step latencies: ``lut``.

Registered as ``lut`` in :data:`~simpy_llm.serving.latency_base.latency_models`. The file
format, its checks and the grid interpolation are :mod:`simpy_llm.serving.lut_files`'s (its
public names are re-exported here); this module is the model that reads a file's prefill and
decode slices (and their energy, KV and attention columns) as step times.
``docs/latency.md`` (section ``lut``) states every rule and assumption.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Mapping
from typing import Any, ClassVar

import attrs
import numpy as np

from simpy_llm.config.errors import FieldValueError, ScenarioError
from simpy_llm.config.paths import resolve_path
from simpy_llm.config.validators import MAX_COEFFICIENT_US, MAX_TOKENS, at_least, at_most
from simpy_llm.serving.hardware import Hardware, gpu_spec, resolve_hardware
from simpy_llm.serving.latency_base import EnergyMeter, RequestOverheads, latency_models
from simpy_llm.serving.lut_drift import DEFAULT_DRIFT_TOLERANCE, LutDriftWarning, describe_drift, lut_drift, shared_rows
from simpy_llm.serving.lut_files import (
    DECODE_PHASES,
    DTYPES,
    GRID_COLUMNS,
    KEY_COLUMNS,
    OPTIONAL_COLUMNS,
    PHASES,
    REQUIRED_COLUMNS,
    SPLIT_TOLERANCE,
    Lut,
    LutSlice,
    load_lut,
    load_lut_cached,
)
from simpy_llm.serving.profiled import operator_table, vidur_models

__all__ = [
    "DTYPES",
    "KEY_COLUMNS",
    "OPTIONAL_COLUMNS",
    "PHASES",
    "REQUIRED_COLUMNS",
    "Lut",
    "LutLatency",
    "LutSlice",
    "load_lut",
    "lognormal_sigma",
]

Z95 = statistics.NormalDist().inv_cdf(0.95)
"""The standard normal's 95th percentile, 1.6448536..."""
MAX_P95_RATIO = math.exp(Z95 * Z95 / 2)
"""Largest p95 / mean a lognormal has (3.8687..., at sigma = Z95)."""

# --------------------------------------------------------------------------- the latency model


def lognormal_sigma(mean: float, p95: float) -> float:
    """The sigma of the lognormal with this *mean* and 95th percentile *p95* (0 when
    ``p95 <= mean``: no spread).

    From ``mean = exp(mu + s**2 / 2)`` and ``p95 = exp(mu + z s)`` (``z`` =
    :data:`Z95`), ``ln(p95 / mean) = z s - s**2 / 2``, whose smaller root is ``s =
    z - sqrt(z**2 - 2 ln(p95 / mean))``; the larger root (``s > z``) is the
    heavy-tailed lognormal whose p95 has fallen back towards its mean, not meant by a
    p95 above the mean. A ratio above :data:`MAX_P95_RATIO` (3.87), which no lognormal
    has, gives ``s = z``, the largest ratio's sigma.

    >>> s = lognormal_sigma(10.0, 13.0)
    >>> round(s, 6)
    0.168095
    >>> mu = math.log(10.0) - s * s / 2      # that lognormal's mean and p95
    >>> round(math.exp(mu + s * s / 2), 9), round(math.exp(mu + Z95 * s), 9)
    (10.0, 13.0)
    >>> lognormal_sigma(10.0, 9.0)
    0.0
    """
    if not (mean > 0.0 and p95 > mean):
        return 0.0
    disc = Z95 * Z95 - 2.0 * math.log(p95 / mean)
    return Z95 - math.sqrt(disc) if disc > 0.0 else Z95


def _text(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    name = attr.alias or attr.name
    if not isinstance(value, str):
        raise FieldValueError(name, f"must be a string, got {value!r}")
    if not value:
        raise FieldValueError(name, "must not be empty")


def _whole(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TOKENS:
        raise FieldValueError(attr.name, f"must be a whole number in [1, {MAX_TOKENS}], got {value!r}")


def _fraction(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise FieldValueError(attr.name, f"must be a number in (0, 1], got {value!r}")


def _choice(allowed: tuple[str, ...]) -> Any:
    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if value not in allowed:
            raise FieldValueError(attr.name, f"must be one of {', '.join(allowed)}; got {value!r}")

    return check


def _numpy_generator(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not isinstance(value, np.random.Generator):
        raise FieldValueError("rng", f"must be a numpy Generator (set by the simulation, not the scenario), got {value!r}")


_coefficient = [at_least(0), at_most(MAX_COEFFICIENT_US)]


@latency_models.register("lut")
@attrs.frozen(kw_only=True)
class LutLatency(RequestOverheads):
    """Step time read off a LUT file's ``prefill`` and ``decode`` slices.

    A step with ``P`` prefill tokens and ``D`` decoding requests whose KV caches hold
    ``C`` tokens in all takes

    ``step = prefill(context_len=P, microbatch=1) + decode(context_len=C / D, microbatch=D)``

    (ms in the table, s returned), each term read from the slice of that phase with
    this model, hardware, TP, PP, dtype and ``fanout_k = 1`` by
    :meth:`LutSlice.latency_ms_at`; a term with no tokens costs 0. The prefill term
    times all of a step's prefill chunks as **one sequence of their total length**
    starting from an empty cache: ``prefill_attention_pairs`` is not read, so the
    attention over a chunk's cached prefix and the split of a step's tokens among
    several prompts are not modelled (the file's prefill rows are whole prompts). The
    decode term reads the decoders' mean context, so it is exact for equal contexts
    and, where the table is linear in ``context_len`` (decode attention is), for
    unequal ones too.

    With ``tail: sampled`` each non-zero term is instead drawn from the lognormal
    whose mean and 95th percentile are the interpolated ``latency_ms`` and
    ``latency_p95_ms`` (:func:`lognormal_sigma`; a term whose p95 is not above its mean
    stays at its mean), independently for the two terms and for every call. The
    engine calls ``step_time_s`` once per scheduling decision and a stretch of
    identical decode steps reuses that one duration, so the draw is per scheduling
    decision, not per forward pass. The draws come from the ``rng`` argument (a
    numpy Generator; ``needs_rng`` on the class asks the simulation to pass one of its
    streams); a sampled model without one raises on its first step.

    **The other columns** (each read only when the slice gives it at every grid point; a
    column on part of a slice is refused):

    * ``cost_nonatt_ms`` and ``cost_attn_ms`` on the prefill rows charge the step's attention
      pairs ``Q`` (``prefill_attention_pairs``): ``prefill = latency(P) + (Q - P (P + 1) / 2)
      x attn(P) / (P (P + 1) / 2)``, never below ``nonatt(P)``. A fresh prompt (its own
      ``P (P + 1) / 2`` pairs, or no pairs passed) costs its row exactly; a chunk after a
      cached prefix pays for the attention over that prefix at the row's cost per pair, and
      several short prompts in one step pay for their own pairs, not one long prompt's. The
      decode term needs no split: it reads the mean context, exact where the table is linear
      in ``context_len``.
    * ``kv_delta_mb`` on the decode rows: MiB of KV a step of ``microbatch`` sequences adds
      (one token each) on each GPU, so ``kv_delta_mb x 2**20 / microbatch`` bytes per token,
      which must agree within 1 % across the grid. :attr:`hardware` carries it
      (``Hardware.measured_kv_bytes_per_token``), so ``kv_num_blocks: auto``, a device's KV
      limit, swap and a disaggregated KV hand-off size KV by the table, not the model's shape.
    * ``energy_mj`` on the prefill and decode rows (both, or neither): a step's energy is the
      two terms' ``energy_mj`` read at the points their latencies are
      (:attr:`step_energy_j`); the engine adds it up per replica, and the run's ``devices``
      section reports it (in place of a device's ``active_w`` x busy time).

    **Drift** (seed 003 §5.3): with ``previous`` (an earlier version of the file) the rows this
    model reads (its model, hardware, TP, PP, dtype) are compared with that version's
    (:func:`~simpy_llm.serving.lut_drift.lut_drift`); a shared row whose ``latency_ms`` or
    ``latency_p95_ms`` moved by more than ``drift_tolerance`` (0.05) is refused (``drift:
    refuse``, the default) or warned of (``drift: warn``).

    ``queueing_time_s`` and ``output_token_overhead_s`` are BLIS's ``alpha``
    overheads (:class:`~simpy_llm.serving.latency_base.RequestOverheads`).

    Examples
    --------
    >>> from simpy_llm.serving.latency import profiles_dir
    >>> m = LutLatency(path=str(profiles_dir() / "luts" / "example_small.csv"),
    ...                model="example-8b", hardware="example-gpu")
    >>> m.step_time_s(512, 0)                                  # the prefill row at 512 tokens
    0.04
    >>> m.step_time_s(0, 4, decode_context_tokens=4 * 512)      # the decode row (512, 4)
    0.0095
    >>> round(m.step_time_s(320, 4, decode_context_tokens=4 * 512), 6)   # both terms
    0.0355
    """

    uses_context: ClassVar[bool] = True
    """The engine passes ``decode_context_tokens`` (and ``prefill_attention_pairs``, not read)."""
    needs_rng: ClassVar[bool] = True
    """The simulation should pass a random stream as ``rng`` (drawn from only with ``tail: sampled``)."""

    path: str = attrs.field(converter=resolve_path, validator=_text)
    """The LUT file (CSV). A relative path is resolved by :func:`~simpy_llm.config.paths.resolve_path`:
    against the scenario file's directory while a scenario file is loaded, else the current directory."""
    model: str = attrs.field(validator=_text)
    """The ``model`` column of the rows to use (matched exactly)."""
    hardware_name: str = attrs.field(alias="hardware", validator=_text)
    """The ``hardware`` column of the rows to use (matched exactly); the YAML key and
    constructor argument are ``hardware``. (The attribute ``hardware`` is the
    :class:`~simpy_llm.serving.hardware.Hardware`, as for the other latency models.)"""
    tensor_parallel: int = attrs.field(default=1, validator=_whole)
    """The ``tensor_parallel`` column of the rows to use."""
    pipeline_parallel: int = attrs.field(default=1, validator=_whole)
    """The ``pipeline_parallel`` column of the rows to use."""
    dtype: str = attrs.field(default="fp16", validator=_choice(DTYPES))
    """The ``dtype`` column of the rows to use: fp16, bf16 or fp8."""
    decode_phase: str = attrs.field(default="decode", validator=_choice(DECODE_PHASES))
    """The rows of the decode term: ``decode`` (plain decoding), or ``draft_decode`` (a draft
    model's steps, for a drafter's ``latency_model``)."""
    tail: str = attrs.field(default="mean", validator=_choice(("mean", "sampled")))
    """``mean``: every step takes the interpolated ``latency_ms``; ``sampled``: lognormal
    draws with that mean and the interpolated ``latency_p95_ms`` (class docstring)."""
    alpha0_us: float = attrs.field(default=0.0, validator=_coefficient)
    """Fixed arrival-to-queue delay per request, µs."""
    alpha1_us: float = attrs.field(default=0.0, validator=_coefficient)
    """Arrival-to-queue delay per prompt token, µs."""
    alpha2_us: float = attrs.field(default=0.0, validator=_coefficient)
    """Post-processing per output token, µs."""
    previous: str | None = attrs.field(default=None, converter=attrs.converters.optional(resolve_path))
    """The previous version of the LUT file: the rows this model reads (its model, hardware,
    TP, PP and dtype) are checked for drift against it (:mod:`~simpy_llm.serving.lut_drift`)."""
    drift: str | None = attrs.field(default=None, validator=attrs.validators.optional(_choice(("refuse", "warn"))))
    """With ``previous``: ``refuse`` (the default) fails the build on drift, ``warn`` issues a
    :class:`~simpy_llm.serving.lut_drift.LutDriftWarning`."""
    drift_tolerance: float | None = attrs.field(default=None, validator=attrs.validators.optional(_fraction))
    """With ``previous``: the largest relative change that is not drift (default 0.05)."""
    rng: np.random.Generator | None = attrs.field(default=None, eq=False, repr=False, validator=_numpy_generator)
    """Random stream of ``tail: sampled`` (set by the simulation, not the scenario); unused with ``tail: mean``."""
    lut: Lut = attrs.field(init=False, repr=False, eq=False)
    """The loaded file."""
    prefill: LutSlice = attrs.field(init=False, repr=False, eq=False)
    """The ``prefill`` slice used."""
    decode: LutSlice = attrs.field(init=False, repr=False, eq=False)
    """The slice of the decode term (``decode_phase``)."""
    split_prefill: bool = attrs.field(init=False, repr=False, eq=False)
    """Whether the prefill slice splits its latency into ``cost_nonatt_ms`` and ``cost_attn_ms``
    (then a step's attention pairs are charged: class docstring)."""
    kv_bytes_per_token: int | None = attrs.field(init=False, repr=False, eq=False)
    """KV bytes one token occupies on each GPU, from the decode slice's ``kv_delta_mb`` (None
    without it); :attr:`hardware` carries it."""
    step_energy_j: EnergyMeter | None = attrs.field(init=False, repr=False, eq=False)
    """A step's energy from the ``energy_mj`` column (None without it): class docstring."""

    def __attrs_post_init__(self) -> None:
        lut = self._load(self.path, "path")
        object.__setattr__(self, "lut", lut)
        object.__setattr__(self, "prefill", self._slice(lut, "prefill"))
        object.__setattr__(self, "decode", self._slice(lut, self.decode_phase))
        for name in GRID_COLUMNS:
            for part in (self.prefill, self.decode):
                grid = part.columns.get(name)
                if grid is not None and np.isfinite(grid).any() and not np.isfinite(grid).all():
                    rows = sorted(part.rows[~np.isfinite(grid)].tolist())
                    raise FieldValueError(
                        "path", f"{self.path}: {name} is given on part of the {part.key[0]} slice; the lut model reads "
                        f"it only from every grid point (blank at row(s) {', '.join(map(str, rows[:10]))})"
                    )
        split = self.prefill.complete("cost_nonatt_ms") and self.prefill.complete("cost_attn_ms")
        object.__setattr__(self, "split_prefill", split)
        object.__setattr__(self, "kv_bytes_per_token", self._kv_bytes_per_token())
        energy = self.prefill.complete("energy_mj") or self.decode.complete("energy_mj")
        if energy and not (self.prefill.complete("energy_mj") and self.decode.complete("energy_mj")):
            raise FieldValueError("path", f"{self.path}: energy_mj must be given on both the prefill and the decode slice, or on neither")
        object.__setattr__(self, "step_energy_j", self._energy_j if energy else None)
        self._check_drift()
        if self.tail == "sampled":
            for part in (self.prefill, self.decode):
                missing = part.rows[~np.isfinite(part.latency_p95_ms)]
                if missing.size:
                    raise FieldValueError(
                        "tail", f"sampled needs latency_p95_ms at every grid point of the {part.key[0]} slice; "
                        f"{self.path} leaves it blank at row(s) {', '.join(map(str, sorted(missing.tolist())[:10]))}"
                    )
                with np.errstate(divide="ignore", invalid="ignore"):
                    ratio = part.latency_p95_ms / part.latency_ms
                over = (ratio > MAX_P95_RATIO) | ((part.latency_ms == 0) & (part.latency_p95_ms > 0))
                if over.any():
                    r = int(part.rows[over][0])
                    raise FieldValueError(
                        "tail", f"sampled: row {r} of {self.path} has latency_p95_ms / latency_ms above "
                        f"{MAX_P95_RATIO:.4f}, more than any lognormal's p95 / mean"
                    )

    @staticmethod
    def _load(path: str, key: str) -> Lut:
        try:
            return load_lut_cached(path)
        except ScenarioError as exc:
            listed = "; ".join(f"{w}: {m}" if w else m for w, m in exc.problems)
            raise FieldValueError(key, f"LUT file {exc.source}: {listed}") from None

    def _kv_bytes_per_token(self) -> int | None:
        """Bytes per token per GPU from the decode rows' ``kv_delta_mb`` (MiB a step of
        ``microbatch`` sequences adds, one token each), checked to agree across the grid."""
        grid = self.decode.columns.get("kv_delta_mb")
        if grid is None or not np.isfinite(grid).all():
            return None
        per_token = grid * 2**20 / self.decode.microbatch[np.newaxis, :]
        low, high = float(per_token.min()), float(per_token.max())
        if not low > 0:
            raise FieldValueError("path", f"{self.path}: kv_delta_mb must be > 0 on every decode row (a decode step adds KV)")
        if high > low * (1 + SPLIT_TOLERANCE):
            raise FieldValueError(
                "path", f"{self.path}: the decode rows' kv_delta_mb / microbatch range from {low:.6g} to {high:.6g} bytes "
                f"per token (more than {SPLIT_TOLERANCE:.0%} apart); a token's KV has one size"
            )
        return round(float(np.median(per_token)))

    def _check_drift(self) -> None:
        if self.previous is None:
            for name in ("drift", "drift_tolerance"):
                if getattr(self, name) is not None:
                    raise FieldValueError(name, "needs previous: the earlier version of the LUT file to compare with")
            return
        old = self._load(self.previous, "previous")
        tolerance = DEFAULT_DRIFT_TOLERANCE if self.drift_tolerance is None else self.drift_tolerance
        where = {"model": self.model, "hardware": self.hardware_name, "tensor_parallel": self.tensor_parallel,
                 "pipeline_parallel": self.pipeline_parallel, "dtype": self.dtype}
        if not shared_rows(self.lut.frame, old.frame, where):
            raise FieldValueError(
                "previous", f"{self.previous} shares no row with {self.path} for {self.model} on {self.hardware_name} "
                f"tp{self.tensor_parallel} pp{self.pipeline_parallel} {self.dtype}: there is nothing to compare for drift"
            )
        found = lut_drift(self.lut.frame, old.frame, tolerance, where)
        if not found:
            return
        message = f"{self.path} against {self.previous}: {describe_drift(found, tolerance)}"
        if self.drift == "warn":
            warnings.warn(message, LutDriftWarning, stacklevel=2)
        else:
            raise FieldValueError("path", message + " (drift: warn accepts it with a warning)")

    def _slice(self, lut: Lut, phase: str) -> LutSlice:
        key = (phase, self.model, self.hardware_name, self.tensor_parallel, self.pipeline_parallel, self.dtype, 1)
        found = lut.slices.get(key)
        if found is not None:
            return found
        # Blame the first parameter no slice of the file matches.
        keys = list(lut.slices)
        checks = (
            ("model", 1, self.model),
            ("hardware", 2, self.hardware_name),
            ("tensor_parallel", 3, self.tensor_parallel),
            ("pipeline_parallel", 4, self.pipeline_parallel),
            ("dtype", 5, self.dtype),
        )
        for param, index, value in checks:
            narrowed = [k for k in keys if k[index] == value]
            if not narrowed:
                raise FieldValueError(
                    param, f"{lut.source} has no rows with {param} {value!r}; its slices: {lut.describe(keys)}"
                )
            keys = narrowed
        raise FieldValueError(
            "path", f"{lut.source} has no {phase} rows with fanout_k 1 for {self.model} on {self.hardware_name} "
            f"tp{self.tensor_parallel} pp{self.pipeline_parallel} {self.dtype} (the lut model needs its prefill "
            f"and decode slices); it has: {lut.describe(keys)}"
        )

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> LutLatency:
        """Build from scenario params (the keys of the class docstring; ``hardware`` for
        the hardware column), rejecting unknown keys and ``rng``."""
        names = [a.alias or a.name for a in attrs.fields(cls) if a.init and a.name != "rng"]
        for key in params:
            if key == "rng":
                raise FieldValueError("rng", "is set by the simulation, not the scenario")
            if key not in names:
                raise FieldValueError(str(key), f"unknown parameter of lut; allowed: {', '.join(names)}")
        for key in ("path", "model", "hardware"):
            if key not in params:
                raise FieldValueError(key, "required key is missing")
        return cls(**params)

    @property
    def hardware(self) -> Hardware | None:
        """The :class:`~simpy_llm.serving.hardware.Hardware` the rows describe, or None.

        The model is found among the shipped model configurations
        (``profiles/models``, by name or alias, case-insensitively) or, failing that,
        among the Vidur profile folders (shape from the profile, as the ``profile``
        model takes it); the GPU among the shipped GPUs (``profiles/gpus.yaml``). None
        when either is unknown, the TP degree does not shard the model, or the rows are
        for pipeline parallelism (``pipeline_parallel > 1``) or ``fp8`` (whose bytes per
        value ``Hardware`` does not take from the LUT).
        """
        if self.pipeline_parallel != 1 or self.dtype == "fp8":
            return None
        found = resolve_hardware(self.model, self.hardware_name, self.tensor_parallel)
        if found is None:
            for vgpu, models in vidur_models().items():
                if self.model in models:
                    try:
                        spec = operator_table(vgpu, self.model, 1).model
                        found = Hardware(model=spec, gpu=gpu_spec(self.hardware_name), tp=self.tensor_parallel)
                    except FieldValueError:
                        return None
                    break
        if found is not None and self.kv_bytes_per_token is not None:
            found = attrs.evolve(found, measured_kv_bytes_per_token=self.kv_bytes_per_token)
        return found

    def _prefill_ms(self, tokens: int, pairs: float) -> float:
        """The prefill term's mean, ms: the row at *tokens*, plus, with the attention split,
        the attention of the *pairs* beyond a fresh prompt's (class docstring)."""
        ms = self.prefill.latency_ms_at(tokens, 1)
        if self.split_prefill and pairs:
            fresh = tokens * (tokens + 1) / 2
            ms += (pairs - fresh) * self.prefill.column_at("cost_attn_ms", tokens, 1) / fresh
            floor = self.prefill.column_at("cost_nonatt_ms", tokens, 1)
            if ms < floor:
                ms = floor
        return ms

    def _energy_j(
        self, prefill_tokens: int, decode_tokens: int, decode_context_tokens: float = 0, prefill_attention_pairs: float = 0
    ) -> float:
        """A step's energy, J: the ``energy_mj`` of its prefill and decode terms, read at the
        points their latencies are."""
        mj = 0.0
        if prefill_tokens > 0:
            mj += self.prefill.column_at("energy_mj", prefill_tokens, 1)
        if decode_tokens > 0:
            mj += self.decode.column_at("energy_mj", decode_context_tokens / decode_tokens, decode_tokens)
        return mj / 1e3

    def _draw_ms(self, part: LutSlice, context_len: float, microbatch: float, mean: float | None = None) -> float:
        """A lognormal draw with the slice's mean and p95 at the point (*mean* in place of
        the slice's, keeping the point's spread, when given)."""
        w = part.weights(context_len, microbatch)
        z = part._blend(part._z, w)  # noqa: SLF001 - the slice's own tables
        if mean is None:
            mean = z
        if not mean > 0.0:
            return 0.0
        sigma = lognormal_sigma(z, part._blend(part._q, w))  # noqa: SLF001
        if sigma == 0.0:
            return mean
        rng = self.rng
        if rng is None:
            raise RuntimeError(
                "LutLatency with tail: sampled has no random stream: build it with rng=<numpy Generator> "
                "(needs_rng on the class asks the simulation for one of its streams)"
            )
        return mean * math.exp(sigma * float(rng.standard_normal()) - 0.5 * sigma * sigma)

    def mean_step_time_s(
        self, prefill_tokens: int, decode_tokens: int, decode_context_tokens: float = 0, prefill_attention_pairs: float = 0
    ) -> float:
        """The expected step time, s: :meth:`step_time_s` with ``tail: mean`` (draws nothing)."""
        ms = 0.0
        if prefill_tokens > 0:
            ms += self._prefill_ms(prefill_tokens, prefill_attention_pairs)
        if decode_tokens > 0:
            ms += self.decode.latency_ms_at(decode_context_tokens / decode_tokens, decode_tokens)
        return ms / 1e3

    def fused_time_s(self, contexts: list[int], gammas: list[int]) -> float | None:
        """A fused speculative step (the target drafting ``γ`` tokens with its own draft model and
        verifying them) read off the file's ``fused_decode`` rows, s; None when the file has no
        ``fused_decode`` slice for this model and hardware with ``fanout_k`` equal to the
        largest γ (the caller then times it as draft steps plus a verify pass).

        The step of ``len(contexts)`` sequences reads the slice at their mean context and
        ``microbatch = len(contexts)`` (drawn, with ``tail: sampled``).
        """
        return self._phase_time_s("fused_decode", contexts, gammas)

    def verify_time_s(self, contexts: list[int], verified: list[int]) -> float | None:
        """A speculative verify pass read off the file's ``verify`` rows, s; None when the file
        has no ``verify`` slice for this model and hardware with ``fanout_k`` equal to the
        pass's largest verified count (the caller then times it as a decode step).

        The pass of ``len(contexts)`` sequences reads the slice at their mean context and
        ``microbatch = len(contexts)`` (drawn, with ``tail: sampled``).
        """
        return self._phase_time_s("verify", contexts, verified)

    def _phase_time_s(self, phase: str, contexts: list[int], fanouts: list[int]) -> float | None:
        """A speculative *phase*'s step over sequences at *contexts*, read at ``fanout_k = max``
        of *fanouts*, the mean context and ``microbatch = len(contexts)``, s (None: no such slice)."""
        fanout = max(fanouts, default=0)
        key = (phase, self.model, self.hardware_name, self.tensor_parallel, self.pipeline_parallel, self.dtype, fanout)
        part = self.lut.slices.get(key)
        if part is None:
            return None
        context = sum(contexts) / len(contexts)
        if self.tail == "mean":
            return part.latency_ms_at(context, len(contexts)) / 1e3
        return self._draw_ms(part, context, len(contexts)) / 1e3

    @property
    def repeatable_step_times(self) -> bool:
        """True with ``tail: mean`` (each step time is the table's mean); False with ``tail:
        sampled``, which draws a step time at every scheduling decision."""
        return self.tail == "mean"

    def step_time_s(
        self, prefill_tokens: int, decode_tokens: int, decode_context_tokens: float = 0, prefill_attention_pairs: float = 0
    ) -> float:
        if self.tail == "mean":
            return self.mean_step_time_s(prefill_tokens, decode_tokens, decode_context_tokens, prefill_attention_pairs)
        ms = 0.0
        if prefill_tokens > 0:
            mean = self._prefill_ms(prefill_tokens, prefill_attention_pairs) if self.split_prefill else None
            ms += self._draw_ms(self.prefill, prefill_tokens, 1, mean)
        if decode_tokens > 0:
            ms += self._draw_ms(self.decode, decode_context_tokens / decode_tokens, decode_tokens)
        return ms / 1e3
