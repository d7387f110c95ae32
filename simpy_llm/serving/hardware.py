"""Model shapes, GPU facts, and what follows from them: weights and KV cache per GPU.

A :class:`ModelSpec` is the part of a Hugging Face ``config.json`` that a
latency or memory model needs; a :class:`GpuSpec` holds one GPU's peak
compute, memory bandwidth, memory size and links; a :class:`Hardware` is a
model served on ``tp x pp`` GPUs of one kind: ``pp`` pipeline stages, each a
``tp``-way tensor-parallel group.

Shipped data (found through :func:`~simpy_llm.serving.profiles.profiles_dir`):

* ``profiles/models/<name>/config.json``: Hugging Face configurations (from
  BLIS; ``profiles/models/NOTICE.md``), loaded by :func:`model_spec`; names in
  ``profiles/models/aliases.yaml`` map to the model they share a shape with;
* ``profiles/gpus.yaml``: GPU facts with their sources, loaded by :func:`gpu_spec`.

Tensor-parallel sharding follows vLLM: query heads, the MLP width, every
expert, the vocabulary (embedding and LM head) are split ``tp`` ways; a GPU
holds ``num_kv_heads / tp`` KV heads, or one replicated KV head when
``tp > num_kv_heads``; norms are replicated. Pipeline stages split the layers
as vLLM's ``get_pp_indices`` does (:func:`stage_layers`); the first stage holds
the embedding, the last the final norm and the LM head.

Examples
--------
>>> m = model_spec("meta-llama/llama-3.1-8b-instruct")
>>> m.num_layers, m.num_kv_heads, m.head_dim, m.param_count
(32, 8, 128, 8030261248)
>>> kv_bytes_per_token(m, tp=1), kv_bytes_per_token(m, tp=2)
(131072, 65536)
>>> gpu_spec("H100").hbm_bandwidth_bytes_per_s
3350000000000.0
>>> auto_kv_blocks(Hardware(model=m, gpu=gpu_spec("H100"), tp=1), block_size=16)
26389
"""

from __future__ import annotations

import functools
import json
from typing import Any

import attrs
import yaml

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.validators import greater_than, in_range
from simpy_llm.serving.profiles import profiles_dir

__all__ = [
    "DEFAULT_ACTIVATION_HEADROOM_BYTES",
    "GIB",
    "WEIGHT_DTYPE_BYTES",
    "GpuSpec",
    "Hardware",
    "ModelSpec",
    "auto_kv_blocks",
    "canonical_model_name",
    "gpu_names",
    "gpu_spec",
    "kv_bytes_per_token",
    "model_names",
    "model_spec",
    "resolve_hardware",
    "stage_layers",
]

GIB = 2**30
"""Bytes in a GiB."""

DEFAULT_ACTIVATION_HEADROOM_BYTES = int(5.5 * GIB)
"""Memory per GPU kept for activations, CUDA graphs and the runtime: 5.5 GiB.

The dense-model activation allowance of the llm-d capacity planner, which BLIS
also uses for its KV-block estimate. BLIS counts it once per replica; here it
is held back on every GPU, which is conservative for ``tp > 1``.
"""


def _positive_int(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FieldValueError(attr.name, f"must be a positive integer, got {value!r}")


def _count(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FieldValueError(attr.name, f"must be an integer >= 0, got {value!r}")


@attrs.frozen(kw_only=True)
class ModelSpec:
    """The shape of a decoder-only transformer (Llama family, optionally MoE).

    Every layer has grouped-query attention (``q``, ``k``, ``v``, ``o``
    projections, no biases counted), two RMS norms, and either a gated (SwiGLU)
    MLP of width ``intermediate_size`` or, when ``num_experts > 0``, a routed
    mixture of ``num_experts`` gated experts of width ``moe_intermediate_size``
    (``experts_per_token`` active per token) plus ``num_shared_experts``
    always-active experts of the same width, and a router.
    """

    name: str
    """Model name (the profile folder name)."""
    num_layers: int = attrs.field(validator=_positive_int)
    """Decoder layers."""
    hidden_size: int = attrs.field(validator=_positive_int)
    """Width of the residual stream."""
    num_attention_heads: int = attrs.field(validator=_positive_int)
    """Query heads."""
    num_kv_heads: int = attrs.field(validator=_positive_int)
    """Key/value heads (grouped-query attention)."""
    head_dim: int = attrs.field(validator=_positive_int)
    """Width of one attention head."""
    intermediate_size: int = attrs.field(validator=_positive_int)
    """Width of a dense (non-MoE) gated MLP."""
    vocab_size: int = attrs.field(validator=_positive_int)
    """Vocabulary size (rows of the embedding and the LM head)."""
    dtype_bytes: int = attrs.field(default=2, validator=_positive_int)
    """Bytes per value of activations, KV cache and unquantised weights (2 for bf16/fp16)."""
    ffn_weight_bytes: float = attrs.field(
        default=attrs.Factory(lambda self: float(self.dtype_bytes), takes_self=True), validator=greater_than(0)
    )
    """Bytes per MLP/expert weight (1 for an fp8 checkpoint that quantises them)."""
    attention_weight_bytes: float = attrs.field(
        default=attrs.Factory(lambda self: float(self.dtype_bytes), takes_self=True), validator=greater_than(0)
    )
    """Bytes per q/k/v/o projection weight (1 for an fp8 checkpoint that quantises them, 0.5 for int4)."""
    num_experts: int = attrs.field(default=0, validator=_count)
    """Routed experts per layer; 0 for a dense model."""
    experts_per_token: int = attrs.field(default=0, validator=_count)
    """Routed experts each token uses."""
    moe_intermediate_size: int = attrs.field(default=0, validator=_count)
    """Width of one expert's gated MLP."""
    num_shared_experts: int = attrs.field(default=0, validator=_count)
    """Experts every token uses besides the routed ones (width ``moe_intermediate_size``)."""
    tie_word_embeddings: bool = False
    """The LM head shares the embedding's weights (counted once in memory)."""

    def __attrs_post_init__(self) -> None:
        if self.num_experts:
            if not 1 <= self.experts_per_token <= self.num_experts:
                raise FieldValueError(
                    "experts_per_token", f"must be in [1, num_experts={self.num_experts}], got {self.experts_per_token}"
                )
            if self.moe_intermediate_size < 1:
                raise FieldValueError("moe_intermediate_size", "an MoE model needs the width of its experts")
        elif self.experts_per_token or self.num_shared_experts:
            raise FieldValueError("num_experts", "experts_per_token and num_shared_experts need num_experts > 0")

    @property
    def is_moe(self) -> bool:
        """Whether the MLP is a mixture of experts."""
        return self.num_experts > 0

    @property
    def attention_params_per_layer(self) -> int:
        """Parameters of the q, k, v and o projections of one layer."""
        q = self.num_attention_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        return 2 * self.hidden_size * q + 2 * self.hidden_size * kv

    @property
    def expert_params(self) -> int:
        """Parameters of one gated MLP of width ``moe_intermediate_size`` (gate, up, down)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def router_params_per_layer(self) -> int:
        """Parameters of one layer's router (0 for a dense model)."""
        return self.hidden_size * self.num_experts

    @property
    def ffn_params_per_layer(self) -> int:
        """Stored MLP parameters of one layer, router excluded (all experts of an MoE layer)."""
        if self.is_moe:
            return (self.num_experts + self.num_shared_experts) * self.expert_params
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def active_ffn_params_per_token(self) -> int:
        """MLP parameters one token multiplies by in one layer, router excluded."""
        if self.is_moe:
            return (self.experts_per_token + self.num_shared_experts) * self.expert_params
        return self.ffn_params_per_layer

    @property
    def param_count(self) -> int:
        """All parameters: layers (attention, MLP, router, 2 norms), embedding, LM head, final norm."""
        per_layer = (
            self.attention_params_per_layer
            + self.ffn_params_per_layer
            + self.router_params_per_layer
            + 2 * self.hidden_size
        )
        vocab = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + vocab + self.hidden_size

    @property
    def active_param_count(self) -> int:
        """Parameters one token uses (routed experts counted ``experts_per_token`` times, not all)."""
        unused = self.num_layers * (self.ffn_params_per_layer - self.active_ffn_params_per_token)
        return self.param_count - unused

    def q_heads_per_gpu(self, tp: int) -> int:
        """Query heads on each GPU of a ``tp``-way group."""
        self.check_tp(tp)
        return self.num_attention_heads // tp

    def kv_heads_per_gpu(self, tp: int) -> int:
        """KV heads on each GPU: ``num_kv_heads / tp``, or 1 (replicated) when ``tp > num_kv_heads``."""
        self.check_tp(tp)
        return max(self.num_kv_heads // tp, 1)

    def check_tp(self, tp: int) -> None:
        """Raise :class:`FieldValueError` (field ``tp``) unless the model shards ``tp`` ways."""
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise FieldValueError("tp", f"must be a positive integer, got {tp!r}")
        if self.num_attention_heads % tp:
            raise FieldValueError(
                "tp", f"{self.name} has {self.num_attention_heads} attention heads, not divisible by tp={tp}"
            )
        if self.num_kv_heads % tp and tp % self.num_kv_heads:
            raise FieldValueError(
                "tp", f"{self.name} has {self.num_kv_heads} KV heads; tp={tp} neither divides nor is a multiple of it"
            )

    def weight_bytes_per_gpu(self, tp: int) -> float:
        """Weight bytes each GPU of a ``tp``-way group holds (sharding as in the module docstring)."""
        h, d = self.hidden_size, self.head_dim
        attn = 2 * h * self.q_heads_per_gpu(tp) * d + 2 * h * self.kv_heads_per_gpu(tp) * d
        vocab = self.vocab_size * h * (1 if self.tie_word_embeddings else 2) / tp
        norms = 2 * h * self.num_layers + h
        ffn = self.num_layers * self.ffn_params_per_layer / tp
        return (
            (self.num_layers * self.router_params_per_layer + vocab + norms) * self.dtype_bytes
            + self.num_layers * attn * self.attention_weight_bytes
            + ffn * self.ffn_weight_bytes
        )

    def stage_weight_bytes_per_gpu(self, tp: int, layers: int, first: bool, last: bool) -> float:
        """Weight bytes each GPU of one pipeline stage holds: *layers* decoder layers, the
        embedding when *first*, the final norm and the LM head when *last*.

        Sharded ``tp`` ways as :meth:`weight_bytes_per_gpu`. A model with tied embeddings
        keeps a copy on each end when the two ends are different stages (vLLM loads the
        LM head's weights on the last stage as well), so only a single stage that is both
        ends counts them once.
        """
        h, d = self.hidden_size, self.head_dim
        attn = 2 * h * self.q_heads_per_gpu(tp) * d + 2 * h * self.kv_heads_per_gpu(tp) * d
        ends = int(first) + int(last)
        if first and last and self.tie_word_embeddings:
            ends = 1
        vocab = self.vocab_size * h * ends / tp
        norms = 2 * h * layers + (h if last else 0)
        ffn = layers * self.ffn_params_per_layer / tp
        return (
            (layers * self.router_params_per_layer + vocab + norms) * self.dtype_bytes
            + layers * attn * self.attention_weight_bytes
            + ffn * self.ffn_weight_bytes
        )


@attrs.frozen(kw_only=True)
class GpuSpec:
    """One GPU's peak figures (datasheet or BLIS; ``profiles/gpus.yaml`` states which)."""

    name: str
    """GPU name as in ``profiles/gpus.yaml``."""
    peak_flops: float = attrs.field(validator=greater_than(0))
    """Peak dense bf16 tensor throughput, FLOP/s."""
    hbm_bandwidth_bytes_per_s: float = attrs.field(validator=greater_than(0))
    """Peak device-memory bandwidth (HBM; GDDR6 on the L40S), bytes/s."""
    memory_bytes: float = attrs.field(validator=greater_than(0))
    """Device memory, bytes."""
    pcie_bandwidth_bytes_per_s: float = attrs.field(validator=greater_than(0))
    """Host link bandwidth per direction, bytes/s."""
    interconnect_bandwidth_bytes_per_s: float = attrs.field(validator=greater_than(0))
    """GPU-to-GPU bandwidth per direction used by a tensor-parallel all-reduce, bytes/s
    (NVLink, or PCIe on a GPU without NVLink)."""
    nvlink: bool = True
    """Whether ``interconnect_bandwidth_bytes_per_s`` is NVLink (else PCIe)."""
    mfu_prefill: float = attrs.field(default=0.5, validator=in_range(0, 1))
    """Default fraction of ``peak_flops`` reached by prefill (BLIS's calibration for the shipped GPUs)."""
    mfu_decode: float = attrs.field(default=0.3, validator=in_range(0, 1))
    """Default fraction of ``peak_flops`` reached by decode (BLIS's calibration for the shipped GPUs)."""


@attrs.frozen(kw_only=True)
class Hardware:
    """A model served on ``tp x pp`` GPUs of one kind: ``pp`` pipeline stages of ``tp``
    tensor-parallel GPUs each.

    Raises :class:`FieldValueError` (field ``tp``) when the model's heads do not
    shard ``tp`` ways, and (field ``pp``) when it has fewer layers than stages.

    Examples
    --------
    >>> hw = Hardware(model=model_spec("llama-3.1-8b-instruct"), gpu=gpu_spec("H100"), tp=2, pp=3)
    >>> hw.gpus, hw.stage_layers, hw.kv_bytes_per_token  # the first two stages hold 11 layers
    (6, (11, 11, 10), 22528)
    """

    model: ModelSpec
    """The model served."""
    gpu: GpuSpec
    """The kind of GPU."""
    tp: int = attrs.field(default=1, validator=_positive_int)
    """Tensor-parallel degree (GPUs in each stage's group)."""
    pp: int = attrs.field(default=1, validator=_positive_int)
    """Pipeline stages, each holding a contiguous run of layers (:func:`stage_layers`)."""
    measured_kv_bytes_per_token: int | None = attrs.field(default=None, validator=attrs.validators.optional(_positive_int))
    """KV bytes per token per GPU as measured (a LUT's ``kv_delta_mb``), in place of the
    figure the model's shape gives; None: from the shape."""

    def __attrs_post_init__(self) -> None:
        self.model.check_tp(self.tp)
        if self.pp > self.model.num_layers:
            raise FieldValueError(
                "pp", f"{self.model.name} has {self.model.num_layers} layers, fewer than pp={self.pp} stages"
            )

    @property
    def gpus(self) -> int:
        """GPUs one replica occupies: ``tp x pp``."""
        return self.tp * self.pp

    @property
    def stage_layers(self) -> tuple[int, ...]:
        """Decoder layers of each pipeline stage, first to last (:func:`stage_layers`)."""
        return stage_layers(self.model.num_layers, self.pp)

    @property
    def stage_weight_bytes_per_gpu(self) -> tuple[float, ...]:
        """Weight bytes on each GPU of each stage, first to last."""
        if self.pp == 1:
            return (self.model.weight_bytes_per_gpu(self.tp),)
        last = self.pp - 1
        return tuple(
            self.model.stage_weight_bytes_per_gpu(self.tp, n, first=i == 0, last=i == last)
            for i, n in enumerate(self.stage_layers)
        )

    @property
    def stage_kv_bytes_per_token(self) -> tuple[int, ...]:
        """KV-cache bytes one token occupies on each GPU of each stage, first to last (measured, when given)."""
        if self.measured_kv_bytes_per_token is not None or self.pp == 1:
            return (self.kv_bytes_per_token,) * self.pp
        per_layer = kv_bytes_per_token(self.model, self.tp) // self.model.num_layers
        return tuple(n * per_layer for n in self.stage_layers)

    @property
    def weight_bytes_per_gpu(self) -> float:
        """Weight bytes on each GPU of the group: the most any stage's GPU holds."""
        if self.pp == 1:
            return self.model.weight_bytes_per_gpu(self.tp)
        return max(self.stage_weight_bytes_per_gpu)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies on each GPU (measured, when given): the most any
        stage's GPU holds, its layers' share."""
        if self.measured_kv_bytes_per_token is not None:
            return self.measured_kv_bytes_per_token
        if self.pp == 1:
            return kv_bytes_per_token(self.model, self.tp)
        return max(self.stage_kv_bytes_per_token)

    @property
    def replica_kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies on all the replica's GPUs together (what a
        disaggregated fleet hands off): each stage's GPUs' shares, summed."""
        return sum(self.stage_kv_bytes_per_token) * self.tp


def stage_layers(num_layers: int, pp: int) -> tuple[int, ...]:
    """Decoder layers of each of *pp* pipeline stages, first to last.

    Each stage gets ``num_layers // pp``; the ``r = num_layers % pp`` left over go one
    each to the ``r`` stages before the last, from the second-to-last backwards (the
    last stage holds the LM head, so it is not given one), as vLLM's ``get_pp_indices``
    splits them (``vllm/distributed/utils.py``, without its ``VLLM_PP_LAYER_PARTITION``
    override).

    Examples
    --------
    >>> stage_layers(32, 2), stage_layers(32, 3), stage_layers(80, 6)
    ((16, 16), (11, 11, 10), (13, 13, 13, 14, 14, 13))
    """
    base, extra = divmod(num_layers, pp)
    return tuple(base + (1 if pp - 1 - extra <= i < pp - 1 else 0) for i in range(pp))


def kv_bytes_per_token(model: ModelSpec, tp: int = 1) -> int:
    """KV-cache bytes one token occupies on EACH GPU of a ``tp``-way group.

    ``2 (K and V) x num_layers x kv_heads_per_gpu x head_dim x dtype_bytes``,
    where a GPU holds ``num_kv_heads / tp`` heads, or one replicated head when
    ``tp > num_kv_heads`` (so the group as a whole stores more than one copy).

    Examples
    --------
    >>> m = model_spec("llama-3.1-8b-instruct")
    >>> kv_bytes_per_token(m, 1), kv_bytes_per_token(m, 8), kv_bytes_per_token(m, 16)
    (131072, 16384, 16384)
    """
    return 2 * model.num_layers * model.kv_heads_per_gpu(tp) * model.head_dim * model.dtype_bytes


def auto_kv_blocks(
    hardware: Hardware,
    block_size: int,
    gpu_memory_utilization: float = 0.9,
    activation_headroom_bytes: float = DEFAULT_ACTIVATION_HEADROOM_BYTES,
) -> int:
    """KV-cache blocks that fit on each GPU once weights and headroom are placed.

    ``floor((memory x gpu_memory_utilization - weights per GPU - activation_headroom_bytes)
    / (block_size x kv bytes per token per GPU))``. Every GPU of the group holds
    its shard of every block, so this is also the replica's block count. With
    pipeline stages each stage's GPUs hold their own weights and their layers' KV;
    the replica has the fewest blocks any stage fits (as vLLM takes the minimum
    over its workers).

    Raises :class:`FieldValueError` (field ``gpu_memory_utilization``) when the
    weights and headroom leave no room for one block, and (field ``block_size``)
    for a block size below 1.

    Examples
    --------
    >>> hw = Hardware(model=model_spec("llama-3.1-70b-instruct"), gpu=gpu_spec("H100"), tp=1)
    >>> auto_kv_blocks(hw, block_size=16)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    simpy_llm.config.errors.FieldValueError: gpu_memory_utilization: llama-3.1-70b-instruct does not fit ...
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise FieldValueError("block_size", f"must be a positive integer, got {block_size!r}")
    if not 0 < gpu_memory_utilization <= 1:
        raise FieldValueError("gpu_memory_utilization", f"must be in (0, 1], got {gpu_memory_utilization!r}")
    if not activation_headroom_bytes >= 0:
        raise FieldValueError("activation_headroom_bytes", f"must be >= 0, got {activation_headroom_bytes!r}")
    budget = hardware.gpu.memory_bytes * gpu_memory_utilization
    fewest: int | None = None
    pp = hardware.pp
    for i, (weights, kv) in enumerate(zip(hardware.stage_weight_bytes_per_gpu, hardware.stage_kv_bytes_per_token, strict=True)):
        free = budget - weights - activation_headroom_bytes
        block_bytes = block_size * kv
        if free < block_bytes:
            where = f"tp{hardware.tp}" if pp == 1 else f"tp{hardware.tp} pp{pp} (stage {i})"
            raise FieldValueError(
                "gpu_memory_utilization",
                f"{hardware.model.name} does not fit on {hardware.gpu.name} {where}: "
                f"{budget / GIB:.2f} GiB usable, {weights / GIB:.2f} GiB weights per GPU and "
                f"{activation_headroom_bytes / GIB:.2f} GiB headroom leave no room for one "
                f"{block_bytes / 2**20:.2f} MiB KV block",
            )
        blocks = int(free // block_bytes)
        fewest = blocks if fewest is None else min(fewest, blocks)
    assert fewest is not None  # a Hardware has at least one stage
    return fewest


# --- shipped data -------------------------------------------------------------------------


WEIGHT_DTYPE_BYTES: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
"""Bytes per weight of each weight dtype an alias in ``profiles/models/aliases.yaml`` may state
(``int4``: the 4-bit values alone; a group-quantised checkpoint's scales, one bf16 value per
group of 128, add 3%, not counted)."""


@attrs.frozen
class _Alias:
    """An alias's target model and, for a quantised release, the bytes of its linear weights."""

    model: str
    weight_bytes: float | None = None


def _parse_aliases(raw: object, source: str) -> dict[str, _Alias]:
    """The entries of an aliases file: ``name: model`` or ``name: {model: M, weights: DTYPE}``."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"{source}: must be a mapping of release name to model, got {type(raw).__name__}")
    table: dict[str, _Alias] = {}
    for key, value in raw.items():
        if isinstance(value, str):
            table[str(key).lower()] = _Alias(value.lower())
            continue
        if not isinstance(value, dict) or not isinstance(value.get("model"), str) or set(value) - {"model", "weights"}:
            raise ValueError(
                f"{source}: {key}: must be a model name or a mapping with 'model' (a name) and optionally "
                f"'weights' (one of {', '.join(WEIGHT_DTYPE_BYTES)}), got {value!r}"
            )
        weights = value.get("weights")
        if weights is not None and weights not in WEIGHT_DTYPE_BYTES:
            raise ValueError(f"{source}: {key}.weights: must be one of {', '.join(WEIGHT_DTYPE_BYTES)}, got {weights!r}")
        table[str(key).lower()] = _Alias(value["model"].lower(), None if weights is None else WEIGHT_DTYPE_BYTES[weights])
    return table


@functools.cache
def _model_aliases() -> dict[str, _Alias]:
    path = profiles_dir() / "models" / "aliases.yaml"
    return _parse_aliases(yaml.safe_load(path.read_text()), str(path))


@functools.cache
def model_names() -> tuple[str, ...]:
    """Names of the shipped model configurations (aliases not included)."""
    root = profiles_dir() / "models"
    return tuple(sorted(p.parent.name for p in root.glob("*/config.json")))


def _resolve_model(name: str) -> tuple[str, float | None] | None:
    key = name.lower().split("/", 1)[-1]
    alias = _model_aliases().get(key)
    if alias is not None:
        key = alias.model
    if key not in model_names():
        return None
    return key, None if alias is None else alias.weight_bytes


def canonical_model_name(name: str) -> str | None:
    """The shipped configuration a model name resolves to (folder name or alias), or None.

    Examples
    --------
    >>> canonical_model_name("meta-llama/llama-3.3-70b-instruct")
    'llama-3.1-70b-instruct'
    >>> canonical_model_name("redhatai/phi-4-quantized.w4a16")
    'phi-4'
    >>> canonical_model_name("openai/gpt-oss-20b") is None
    True
    """
    found = _resolve_model(name) if isinstance(name, str) else None
    return None if found is None else found[0]


@functools.cache
def model_spec(name: str) -> ModelSpec:
    """The :class:`ModelSpec` of a shipped model, by folder name or alias.

    The name is matched case-insensitively and without an organisation
    prefix (``meta-llama/Llama-3.1-8B-Instruct`` finds ``llama-3.1-8b-instruct``).
    An alias of a quantised release (``profiles/models/aliases.yaml``, an entry
    with ``weights``) gives its base model's shape with every attention
    projection and MLP/expert weight at that dtype's bytes; the embedding, LM
    head, norms, router and KV cache stay at the base model's dtype.
    An unknown name raises :class:`FieldValueError` (field ``model``) listing
    the known names.

    Examples
    --------
    >>> m = model_spec("redhatai/qwen2.5-7b-instruct-quantized.w4a16")
    >>> m.name, m.attention_weight_bytes, m.ffn_weight_bytes, m.dtype_bytes
    ('qwen2.5-7b-instruct', 0.5, 0.5, 2)
    """
    found = _resolve_model(name) if isinstance(name, str) else None
    if found is None:
        known = ", ".join([*model_names(), *sorted(_model_aliases())])
        raise FieldValueError("model", f"unknown model {name!r}; known models: {known}")
    key, weight_bytes = found
    config = json.loads((profiles_dir() / "models" / key / "config.json").read_text())
    spec = spec_from_hf_config(key, config)
    if weight_bytes is not None:
        spec = attrs.evolve(spec, attention_weight_bytes=weight_bytes, ffn_weight_bytes=weight_bytes)
    return spec


_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def spec_from_hf_config(name: str, config: dict[str, Any]) -> ModelSpec:
    """Build a :class:`ModelSpec` from a Hugging Face ``config.json`` mapping.

    Reads the text model (``text_config`` when present). Raises
    :class:`FieldValueError` (field ``model``) for architectures the spec does
    not describe: multi-head latent attention (``kv_lora_rank``), models mixing
    dense and MoE layers, and quantisation layouts other than one that
    quantises only the MLP/expert weights.
    """
    top = config
    c = config.get("text_config", config)

    def refuse(why: str) -> FieldValueError:
        return FieldValueError("model", f"{name}: {why} is not modelled")

    if "kv_lora_rank" in c:
        raise refuse("multi-head latent attention (kv_lora_rank)")
    if c.get("first_k_dense_replace") or c.get("mlp_only_layers") or c.get("decoder_sparse_step", 1) != 1:
        raise refuse("a mix of dense and MoE layers")
    if c.get("interleave_moe_layer_step", 1) != 1:
        raise refuse("a mix of dense and MoE layers")
    heads = int(c["num_attention_heads"])
    hidden = int(c["hidden_size"])
    dtype = c.get("torch_dtype") or top.get("torch_dtype") or "bfloat16"
    if dtype not in _DTYPE_BYTES:
        raise refuse(f"dtype {dtype!r}")
    dtype_bytes = _DTYPE_BYTES[dtype]
    num_experts = int(c.get("num_local_experts") or c.get("num_experts") or 0)
    moe: dict[str, Any] = {}
    intermediate = int(c["intermediate_size"])
    if num_experts > 1:
        is_llama4 = str(c.get("model_type", "")).startswith("llama4")
        moe = {
            "num_experts": num_experts,
            "experts_per_token": int(c["num_experts_per_tok"]),
            "moe_intermediate_size": int(c.get("moe_intermediate_size") or intermediate),
            # Llama 4 adds one always-active shared expert of the expert width to every MoE layer.
            "num_shared_experts": 1 if is_llama4 else int(c.get("n_shared_experts") or 0),
        }
        if is_llama4:
            intermediate = int(c.get("intermediate_size_mlp", intermediate))
    ffn_bytes: float = float(dtype_bytes)
    quant = top.get("quantization_config")
    if quant:
        groups = quant.get("config_groups") or {}
        bits = {g.get("weights", {}).get("num_bits") for g in groups.values()}
        ignored = " ".join(quant.get("ignore") or [])
        if len(bits) != 1 or None in bits or "self_attn" not in ignored or "lm_head" not in ignored:
            raise refuse("this quantisation layout")
        ffn_bytes = bits.pop() / 8
    return ModelSpec(
        name=name,
        num_layers=int(c["num_hidden_layers"]),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=int(c.get("num_key_value_heads") or heads),
        head_dim=int(c.get("head_dim") or hidden // heads),
        intermediate_size=intermediate,
        vocab_size=int(c["vocab_size"]),
        dtype_bytes=dtype_bytes,
        ffn_weight_bytes=ffn_bytes,
        tie_word_embeddings=bool(c.get("tie_word_embeddings", top.get("tie_word_embeddings", False))),
        **moe,
    )


@functools.cache
def _gpu_table() -> dict[str, GpuSpec]:
    raw = yaml.safe_load((profiles_dir() / "gpus.yaml").read_text())
    table: dict[str, GpuSpec] = {}
    for name, f in raw.items():
        nvlink = f["nvlink_gb_per_s"]
        pcie = float(f["pcie_gb_per_s"]) * 1e9
        spec = GpuSpec(
            name=name,
            peak_flops=float(f["peak_bf16_tflops"]) * 1e12,
            hbm_bandwidth_bytes_per_s=float(f["hbm_tb_per_s"]) * 1e12,
            memory_bytes=float(f["memory_gib"]) * GIB,
            pcie_bandwidth_bytes_per_s=pcie,
            interconnect_bandwidth_bytes_per_s=pcie if nvlink is None else float(nvlink) * 1e9,
            nvlink=nvlink is not None,
            mfu_prefill=float(f["mfu_prefill"]),
            mfu_decode=float(f["mfu_decode"]),
        )
        for key in (name, *f.get("aliases", ())):
            table[str(key).lower()] = spec
    return table


def gpu_names() -> tuple[str, ...]:
    """Names of the shipped GPUs (aliases not included)."""
    return tuple(sorted({spec.name for spec in _gpu_table().values()}))


def gpu_spec(name: str) -> GpuSpec:
    """The :class:`GpuSpec` of a shipped GPU, by name or alias (case-insensitive).

    An unknown name raises :class:`FieldValueError` (field ``gpu``) listing the
    known names.
    """
    spec = _gpu_table().get(name.lower()) if isinstance(name, str) else None
    if spec is None:
        raise FieldValueError("gpu", f"unknown GPU {name!r}; known GPUs: {', '.join(gpu_names())}")
    return spec


def resolve_hardware(model: str | None, gpu: str | None, tp: int | None) -> Hardware | None:
    """The :class:`Hardware` these names describe, or None when any is missing or unknown.

    Examples
    --------
    >>> round(resolve_hardware("meta-llama/llama-3.1-8b-instruct", "H100", 2).weight_bytes_per_gpu / 2**30, 3)
    7.479
    >>> resolve_hardware("openai/gpt-oss-20b", "H100", 1) is None
    True
    """
    if model is None or gpu is None or tp is None:
        return None
    try:
        return Hardware(model=model_spec(model), gpu=gpu_spec(gpu), tp=tp)
    except FieldValueError:
        return None
