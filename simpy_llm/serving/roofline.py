"""Roofline step-time model: per-layer compute and memory bounds from shapes and peaks.

:class:`Roofline` is the arithmetic on a :class:`~simpy_llm.serving.hardware.Hardware`;
:class:`RooflineLatency` is the latency model registered as ``roofline`` in
:data:`~simpy_llm.serving.latency_base.latency_models`, built from names in
scenario YAML. ``docs/latency.md`` derives every term and compares the model
with BLIS's fitted coefficients.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ClassVar, NamedTuple

import attrs
import yaml

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.validators import MAX_COEFFICIENT_US, at_least, at_most, in_range, optional
from simpy_llm.serving.hardware import Hardware, gpu_spec, model_spec
from simpy_llm.serving.latency_base import RequestOverheads, latency_models
from simpy_llm.serving.profiles import profiles_dir

__all__ = ["Roofline", "RooflineLatency", "calibrated_efficiencies", "pipeline_bubble_fraction"]


def _positive_int(_inst: object, attr: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FieldValueError(attr.name, f"must be a positive integer, got {value!r}")


def _efficiency(inst: object, attr: attrs.Attribute[float], value: object) -> None:
    in_range(0, 1)(inst, attr, value)
    if value == 0:
        raise FieldValueError(attr.name, "must be > 0")


class _Terms(NamedTuple):
    """Per-GPU constants of one :class:`Roofline`, in seconds (per token, pair, call)."""

    token_prefill_s: float  # dense FLOPs of one prefill token in one layer
    token_decode_s: float  # dense FLOPs of one decode token in one layer
    pair_prefill_s: float  # attention FLOPs of one prefill (query, key) pair in one layer
    pair_decode_s: float  # attention FLOPs of one decode (query, key) pair in one layer
    weights_s: float  # reading the weights every step reads, one layer
    expert_s: float  # reading one routed expert, one layer (0 for a dense model)
    kv_token_s: float  # reading or writing one token's K and V, one layer
    num_layers: int
    num_experts: int
    expert_miss: float  # probability that one token does not route to a given expert
    allreduce_token_s: float  # both all-reduces of every layer, per token of the step
    allreduce_fixed_s: float  # the fixed latency of those calls
    lm_row_s: float  # LM-head FLOPs of one sampled row
    lm_weights_s: float  # reading the LM head


class _Stages(NamedTuple):
    """Per-GPU constants of a pipelined :class:`Roofline` (``pp > 1``), in seconds."""

    layers: tuple[int, ...]  # decoder layers of each stage, first to last
    microbatches: int  # micro-batches a step is cut into (fewer when it has fewer tokens)
    allreduce_layer_token_s: float  # both all-reduces of one layer, per token of a micro-batch
    allreduce_layer_fixed_s: float  # the fixed latency of those two calls
    send_token_s: float  # sending one token's activations to the next stage


def pipeline_bubble_fraction(pp: int, microbatches: int) -> float:
    """The share of a synchronous pipeline's step that each of *pp* equal stages idles with
    *microbatches* micro-batches: ``(pp - 1) / (microbatches + pp - 1)``.

    Examples
    --------
    >>> pipeline_bubble_fraction(2, 2), pipeline_bubble_fraction(4, 4), pipeline_bubble_fraction(1, 1)
    (0.3333333333333333, 0.42857142857142855, 0.0)
    """
    return (pp - 1) / (microbatches + pp - 1)


@attrs.frozen(kw_only=True)
class Roofline:
    r"""Step time of a :class:`Hardware` from its compute and memory bounds.

    All quantities are per GPU of the tensor-parallel group (its shard of
    every weight matrix, its query and KV heads). With ``T = P + D`` new
    tokens (``P`` prefill, ``D`` decode), ``C`` = decode context tokens and
    ``A`` = prefill attention pairs, one decoder layer takes

    ``layer = max(compute, memory)``

    * ``compute = (2 N P + 4 h d A) / (F mfu) + (2 N D + 4 h d C) / (F mfu_decode)``:
      ``N`` parameters multiply each new token (q/k/v/o projections, the
      gated MLP or the routed and shared experts a token uses, the router),
      2 FLOPs per multiply-add; each attention pair costs ``4 d`` FLOPs per
      query head (``QK^T`` and ``AV``), ``h`` query heads per GPU of width
      ``d``; ``F`` is the GPU's peak dense bf16 FLOP/s;
    * ``memory = (W(T) + kv (C + T)) / (B mbu)``: the layer's weights ``W``
      (projections, MLP, router, norms) are read once per step (an MoE layer
      reads only the experts its ``T`` tokens touch: ``E (1 - (1 - k/E)^T)`` of
      its ``E`` on average under uniform routing of ``k`` experts per token,
      plus its shared experts); the decoding requests' KV cache is read
      (``kv`` = ``2 x kv_heads x d x dtype_bytes`` bytes per token per layer
      per GPU) and the new tokens' K and V are written; ``B`` is the peak
      memory bandwidth.

    ``step = L x layer + all_reduce + lm_head`` over ``L`` identical layers:

    * ``all_reduce`` (``tp > 1``): two all-reduces per layer (after attention
      and after the MLP) of ``T x hidden_size x dtype_bytes`` bytes, each
      taking ``2 (tp - 1) / tp x bytes / link + allreduce_latency_us`` (a ring
      all-reduce over NVLink, or PCIe on a GPU without it, per direction);
    * ``lm_head = max(2 (V/tp) H S / (F mfu_decode), (V/tp) H dtype_bytes / (B mbu))``
      with ``S = D + (1 if P else 0)`` sampled rows (logits only at each
      sequence's last token; a step with prefill counts one such row, a lower
      bound when it holds the ends of several prompts).

    With ``pp > 1`` pipeline stages (``hardware.pp``) stage ``i`` holds ``L_i`` of
    the layers (:func:`~simpy_llm.serving.hardware.stage_layers`) and the last
    stage the LM head. A step is cut into ``m = min(microbatches, T)``
    micro-batches, each ``1/m`` of its prefill and decode tokens, context and
    attention pairs; on one micro-batch stage ``i`` takes ``s_i = L_i x (layer +
    its two all-reduces)`` (``+ lm_head`` on the last, of ``S/m`` rows), and a
    stage hands the next ``x = hidden_size x T/m x dtype_bytes / link`` of
    activations. The stages run the micro-batches in order (a synchronous
    schedule, GPipe's forward pass), so the step takes

    ``step = sum_i s_i + (pp - 1) x + (m - 1) max(s_1 .. s_pp, x)``

    which for equal stages is ``(m + pp - 1) s + (pp - 1) x``: each stage idles
    ``(pp - 1) / (m + pp - 1)`` of it (:func:`pipeline_bubble_fraction`).

    A step with no tokens takes no time. Not modelled: kernel-launch and
    scheduling overhead (BLIS's ``beta0`` absorbs it; it is why this model is
    below BLIS's fits for small steps, ``docs/latency.md``); activation
    traffic (each kernel's inputs and outputs, about 0.3 MB per token per
    layer for Llama-3.1-8B at tp 1: at most a fifth of the weight bytes for a
    256-request decode batch if none of it stayed in the L2 cache, and prefill
    is compute-bound); the KV reads of a prefill chunk's cached
    prefix (prefill attention is compute-bound); norms, rotary embeddings
    and sampling as separate kernels; the embedding lookup.

    Examples
    --------
    >>> from simpy_llm.serving.hardware import Hardware, gpu_spec, model_spec
    >>> r = Roofline(hardware=Hardware(model=model_spec("llama-3.1-8b-instruct"), gpu=gpu_spec("H100")),
    ...              mfu=0.45, mfu_decode=0.30)
    >>> round(r.step_time_s(0, 1, decode_context_tokens=512) * 1e3, 3)  # one decode: weight reads
    4.501
    """

    hardware: Hardware
    """The model, GPU and TP degree."""
    mfu: float = attrs.field(validator=_efficiency)
    """Fraction of peak FLOP/s that prefill reaches."""
    mfu_decode: float = attrs.field(validator=_efficiency)
    """Fraction of peak FLOP/s that decode (and the LM head) reaches."""
    mbu: float = attrs.field(default=1.0, validator=_efficiency)
    """Fraction of peak memory bandwidth reached."""
    allreduce_latency_us: float = attrs.field(default=0.0, validator=at_least(0))
    """Fixed time per all-reduce call, µs."""
    microbatches: int | None = attrs.field(default=None, validator=optional(_positive_int))
    """Micro-batches a step is cut into with pipeline stages (``hardware.pp > 1``);
    None: as many as stages. Refused with one stage."""
    _t: _Terms = attrs.field(init=False, repr=False, eq=False)
    _stages: _Stages | None = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        m, g, tp = self.hardware.model, self.hardware.gpu, self.hardware.tp
        h, d = m.hidden_size, m.head_dim
        q_heads, kv_heads = m.q_heads_per_gpu(tp), m.kv_heads_per_gpu(tp)
        attn_params = 2 * h * q_heads * d + 2 * h * kv_heads * d
        router = m.router_params_per_layer  # replicated: tiny, and every GPU routes every token
        per_token = attn_params + m.active_ffn_params_per_token / tp + router
        # the projections' and experts' bytes may be fractional (a quantised release)
        weights: float = attn_params * m.attention_weight_bytes + (router + 2 * h) * m.dtype_bytes
        if m.is_moe:
            expert = m.expert_params / tp * m.ffn_weight_bytes
            weights += m.num_shared_experts * expert
            miss = 1 - m.experts_per_token / m.num_experts
        else:
            expert, miss = 0.0, 0.0
            weights += m.ffn_params_per_layer / tp * m.ffn_weight_bytes
        flops_p = g.peak_flops * self.mfu
        flops_d = g.peak_flops * self.mfu_decode
        bandwidth = g.hbm_bandwidth_bytes_per_s * self.mbu
        vocab = m.vocab_size / tp
        ring = 2 * (tp - 1) / tp
        calls = 2 * m.num_layers if tp > 1 else 0
        terms = _Terms(
            token_prefill_s=2 * per_token / flops_p,
            token_decode_s=2 * per_token / flops_d,
            pair_prefill_s=4 * q_heads * d / flops_p,
            pair_decode_s=4 * q_heads * d / flops_d,
            weights_s=weights / bandwidth,
            expert_s=expert / bandwidth,
            kv_token_s=2 * kv_heads * d * m.dtype_bytes / bandwidth,
            num_layers=m.num_layers,
            num_experts=m.num_experts,
            expert_miss=miss,
            allreduce_token_s=calls * ring * h * m.dtype_bytes / g.interconnect_bandwidth_bytes_per_s,
            allreduce_fixed_s=calls * self.allreduce_latency_us * 1e-6,
            lm_row_s=2 * vocab * h / flops_d,
            lm_weights_s=vocab * h * m.dtype_bytes / bandwidth,
        )
        object.__setattr__(self, "_t", terms)
        pp = self.hardware.pp
        stages = None
        if pp > 1:
            stages = _Stages(
                layers=self.hardware.stage_layers,
                microbatches=pp if self.microbatches is None else self.microbatches,
                allreduce_layer_token_s=terms.allreduce_token_s / m.num_layers,
                allreduce_layer_fixed_s=terms.allreduce_fixed_s / m.num_layers,
                send_token_s=h * m.dtype_bytes / g.interconnect_bandwidth_bytes_per_s,
            )
        elif self.microbatches is not None:
            raise FieldValueError("microbatches", "cuts a step between pipeline stages: needs pp > 1")
        object.__setattr__(self, "_stages", stages)

    def layer_time_s(
        self, prefill_tokens: float, decode_tokens: float, decode_context_tokens: float = 0, prefill_attention_pairs: float = 0
    ) -> float:
        """One decoder layer: ``max(compute, memory)`` (class docstring); a micro-batch's
        share of a step may hold a fraction of a token."""
        t = self._t
        tokens = prefill_tokens + decode_tokens
        compute = (
            t.token_prefill_s * prefill_tokens
            + t.pair_prefill_s * prefill_attention_pairs
            + t.token_decode_s * decode_tokens
            + t.pair_decode_s * decode_context_tokens
        )
        memory = t.weights_s + t.kv_token_s * (decode_context_tokens + tokens)
        if t.num_experts:
            memory += t.expert_s * t.num_experts * (1 - t.expert_miss**tokens)
        return max(compute, memory)

    def attention_layer_time_s(
        self, prefill_tokens: int, decode_tokens: int, decode_context_tokens: float = 0, prefill_attention_pairs: float = 0
    ) -> float:
        """The attention core of one layer alone: ``max(score FLOPs time, KV read and write time)``.

        The terms of :meth:`layer_time_s` without the weight matrices: ``4 h d``
        FLOPs per attention pair, the decode context's KV read and the new
        tokens' KV write. The ``profile`` model adds it to a measured table
        that has no attention.
        """
        t = self._t
        compute = t.pair_prefill_s * prefill_attention_pairs + t.pair_decode_s * decode_context_tokens
        memory = t.kv_token_s * (decode_context_tokens + prefill_tokens + decode_tokens)
        return max(compute, memory)

    def all_reduce_time_s(self, tokens: int) -> float:
        """Tensor-parallel communication of a step with *tokens* new tokens (0 when ``tp == 1``)."""
        t = self._t
        return t.allreduce_token_s * tokens + t.allreduce_fixed_s if tokens else 0.0

    def lm_head_time_s(self, prefill_tokens: int, decode_tokens: int) -> float:
        """The LM head of a step: ``max(logit FLOPs time, weight read time)``; 0 with no sampled row."""
        rows = decode_tokens + (1 if prefill_tokens else 0)
        if not rows:
            return 0.0
        t = self._t
        return max(t.lm_row_s * rows, t.lm_weights_s)

    def step_time_s(
        self, prefill_tokens: int, decode_tokens: int, decode_context_tokens: float = 0, prefill_attention_pairs: float = 0
    ) -> float:
        """One engine step (class docstring), seconds: through the pipeline with ``pp > 1``."""
        if self._stages is not None:
            return self._pipeline_step_time_s(prefill_tokens, decode_tokens, decode_context_tokens, prefill_attention_pairs)
        return self._single_stage_step_time_s(prefill_tokens, decode_tokens, decode_context_tokens, prefill_attention_pairs)

    def _single_stage_step_time_s(
        self, prefill_tokens: int, decode_tokens: int, decode_context_tokens: float = 0, prefill_attention_pairs: float = 0
    ) -> float:
        """A step on one stage (``pp == 1``): ``L x layer + all_reduce + lm_head``."""
        tokens = prefill_tokens + decode_tokens
        if not tokens:
            return 0.0
        return (
            self._t.num_layers
            * self.layer_time_s(prefill_tokens, decode_tokens, decode_context_tokens, prefill_attention_pairs)
            + self.all_reduce_time_s(tokens)
            + self.lm_head_time_s(prefill_tokens, decode_tokens)
        )

    def microbatch_count(self, tokens: int) -> int:
        """Micro-batches a step of *tokens* new tokens is cut into: ``min(microbatches, tokens)``
        (1 with one stage; 0 for an empty step)."""
        if self._stages is None:
            return min(1, tokens)
        return min(self._stages.microbatches, tokens)

    def stage_times_s(
        self, prefill_tokens: int, decode_tokens: int, decode_context_tokens: float = 0, prefill_attention_pairs: float = 0
    ) -> tuple[float, ...]:
        """Each stage's time on one micro-batch of the step, first to last (class docstring):
        its layers with their all-reduces, and the LM head on the last. Empty for an empty step."""
        tokens = prefill_tokens + decode_tokens
        if not tokens:
            return ()
        t = self._t
        if self._stages is None:
            return (self._single_stage_step_time_s(prefill_tokens, decode_tokens, decode_context_tokens, prefill_attention_pairs),)
        s = self._stages
        m = min(s.microbatches, tokens)
        layer = (
            self.layer_time_s(prefill_tokens / m, decode_tokens / m, decode_context_tokens / m, prefill_attention_pairs / m)
            + s.allreduce_layer_token_s * tokens / m
            + s.allreduce_layer_fixed_s
        )
        rows = decode_tokens + (1 if prefill_tokens else 0)
        times = [n * layer for n in s.layers]
        times[-1] += max(t.lm_row_s * rows / m, t.lm_weights_s)
        return tuple(times)

    def stage_send_time_s(self, tokens: int) -> float:
        """Sending one micro-batch's activations from a stage to the next, for a step of *tokens*
        new tokens (0 with one stage or no tokens)."""
        if self._stages is None or not tokens:
            return 0.0
        return self._stages.send_token_s * tokens / min(self._stages.microbatches, tokens)

    def _pipeline_step_time_s(
        self, prefill_tokens: int, decode_tokens: int, decode_context_tokens: float = 0, prefill_attention_pairs: float = 0
    ) -> float:
        """A step through ``pp > 1`` stages: ``sum s_i + (pp - 1) x + (m - 1) max(s_i, x)``."""
        tokens = prefill_tokens + decode_tokens
        if not tokens:
            return 0.0
        stages = self.stage_times_s(prefill_tokens, decode_tokens, decode_context_tokens, prefill_attention_pairs)
        send = self.stage_send_time_s(tokens)
        m = self.microbatch_count(tokens)
        return sum(stages) + (len(stages) - 1) * send + (m - 1) * max(*stages, send)


@functools.cache
def calibrated_efficiencies() -> dict[str, tuple[float, float, float]]:
    """GPU name -> its calibrated ``(mfu_prefill, mfu_decode, mbu)`` from ``profiles/gpus.yaml``.

    Fitted to BLIS's measured rows (:mod:`simpy_llm.serving.roofline_fit`); GPUs without a
    ``calibrated`` set are absent.

    Examples
    --------
    >>> calibrated_efficiencies()["H100"]
    (0.754, 0.331, 0.656)
    """
    raw = yaml.safe_load((profiles_dir() / "gpus.yaml").read_text())
    return {
        str(name): (float(c["mfu_prefill"]), float(c["mfu_decode"]), float(c["mbu"]))
        for name, f in raw.items()
        if (c := f.get("calibrated"))
    }


@latency_models.register("roofline")
@attrs.frozen(kw_only=True)
class RooflineLatency(RequestOverheads):
    """The roofline latency model: :class:`Roofline` of a shipped model on a shipped GPU.

    ``step_time_s`` is :meth:`Roofline.step_time_s` (every term in its
    docstring and in ``docs/latency.md``); ``queueing_time_s`` and
    ``output_token_overhead_s`` are BLIS's ``alpha`` overheads, as in
    ``blis_linear``. The engine passes ``decode_context_tokens`` and
    ``prefill_attention_pairs`` (``uses_context = True``); left at 0, prefill
    attention costs nothing and decode reads no KV cache.

    Unknown model or GPU names raise :class:`FieldValueError` naming
    ``model`` or ``gpu`` and listing the known names.

    Examples
    --------
    >>> m = RooflineLatency(model="meta-llama/llama-3.1-8b-instruct", gpu="H100", tp=1)
    >>> m.mfu, m.mfu_decode, m.mbu
    (0.45, 0.3, 1.0)
    >>> round(m.step_time_s(0, 1, decode_context_tokens=512) * 1e3, 3)  # one decode: weight reads
    4.501
    >>> round(m.step_time_s(2048, 0, prefill_attention_pairs=2048 * 2049 // 2) * 1e3, 2)
    66.99
    """

    uses_context: ClassVar[bool] = True
    """The engine passes ``decode_context_tokens`` and ``prefill_attention_pairs``."""

    model: str
    """Model under ``profiles/models`` or an alias (``meta-llama/llama-3.1-8b-instruct``)."""
    gpu: str
    """GPU in ``profiles/gpus.yaml`` (``H100``, ``A100-80``, ``L40S``)."""
    tp: int = attrs.field(default=1, validator=_positive_int)
    """Tensor-parallel degree."""
    pp: int = attrs.field(default=1, validator=_positive_int)
    """Pipeline stages (a replica runs on ``tp x pp`` GPUs); at most the model's layers."""
    microbatches: int | None = attrs.field(default=None, validator=optional(_positive_int))
    """Micro-batches a step is cut into between the stages; None: ``pp``. Needs ``pp > 1``."""
    mfu: float | None = attrs.field(default=None, validator=optional(_efficiency))
    """Fraction of peak FLOP/s that prefill reaches; None takes the GPU's ``mfu_prefill``
    (BLIS's calibration: H100 0.45, A100 0.38, L40S 0.32)."""
    mfu_decode: float | None = attrs.field(default=None, validator=optional(_efficiency))
    """Fraction of peak FLOP/s that decode reaches; None takes the GPU's ``mfu_decode``
    (BLIS: H100 0.30, A100 0.18, L40S 0.08)."""
    mbu: float = attrs.field(default=1.0, validator=_efficiency)
    """Fraction of peak memory bandwidth reached; 1.0 as in BLIS's roofline (no bandwidth haircut)."""
    efficiency: str = attrs.field(default="blis", validator=attrs.validators.in_(("blis", "calibrated")))
    """Where the efficiencies come from: ``blis`` (``mfu``, ``mfu_decode`` as given or the GPU's
    BLIS MFUs, ``mbu`` as given) or ``calibrated`` (all three from the GPU's ``calibrated`` set in
    ``profiles/gpus.yaml``, fitted to BLIS's measured rows; then none of them may be given)."""
    allreduce_latency_us: float = attrs.field(default=0.0, validator=at_least(0))
    """Fixed time per all-reduce call (launch, synchronisation), µs."""
    alpha0_us: float = attrs.field(default=0.0, validator=[at_least(0), at_most(MAX_COEFFICIENT_US)])
    """Fixed arrival-to-queue delay per request, µs."""
    alpha1_us: float = attrs.field(default=0.0, validator=[at_least(0), at_most(MAX_COEFFICIENT_US)])
    """Arrival-to-queue delay per prompt token, µs."""
    alpha2_us: float = attrs.field(default=0.0, validator=[at_least(0), at_most(MAX_COEFFICIENT_US)])
    """Post-processing per output token, µs."""
    roofline: Roofline = attrs.field(init=False, repr=False, eq=False)
    """The arithmetic (built from the fields above)."""
    _step: Callable[[int, int, float, float], float] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        gpu = gpu_spec(self.gpu)
        hardware = Hardware(model=model_spec(self.model), gpu=gpu, tp=self.tp, pp=self.pp)
        mfu = gpu.mfu_prefill if self.mfu is None else self.mfu
        mfu_decode = gpu.mfu_decode if self.mfu_decode is None else self.mfu_decode
        mbu = self.mbu
        if self.efficiency == "calibrated":
            given = [name for name in ("mfu", "mfu_decode") if getattr(self, name) is not None]
            if given or self.mbu != 1.0:
                raise FieldValueError(
                    (given or ["mbu"])[0], "efficiency: calibrated takes mfu, mfu_decode and mbu from the GPU; give none of them"
                )
            table = calibrated_efficiencies()
            if gpu.name not in table:
                raise FieldValueError(
                    "efficiency", f"no calibrated efficiencies for {gpu.name}; calibrated GPUs: {', '.join(sorted(table))}"
                )
            mfu, mfu_decode, mbu = table[gpu.name]
            object.__setattr__(self, "mbu", mbu)
        roofline = Roofline(
            hardware=hardware, mfu=mfu, mfu_decode=mfu_decode, mbu=mbu, allreduce_latency_us=self.allreduce_latency_us,
            microbatches=self.microbatches,
        )
        object.__setattr__(self, "roofline", roofline)
        # bound once: a step on one stage skips the pipeline dispatch (the engine calls it per batch change)
        step = roofline._single_stage_step_time_s if self.pp == 1 else roofline._pipeline_step_time_s
        object.__setattr__(self, "_step", step)
        if self.mfu is None:
            object.__setattr__(self, "mfu", roofline.mfu)
        if self.mfu_decode is None:
            object.__setattr__(self, "mfu_decode", roofline.mfu_decode)

    @property
    def hardware(self) -> Hardware:
        """The model, GPU, TP degree and pipeline stages this model describes."""
        return self.roofline.hardware

    @property
    def repeatable_step_times(self) -> bool:
        """True: the step time is a function of the step's token counts."""
        return True

    def step_time_s(
        self, prefill_tokens: int, decode_tokens: int, decode_context_tokens: float = 0, prefill_attention_pairs: float = 0
    ) -> float:
        return self._step(prefill_tokens, decode_tokens, decode_context_tokens, prefill_attention_pairs)
