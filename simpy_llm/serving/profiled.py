"""Table-driven step-time model from Vidur's measured operator profiles.

Registered as ``profile`` in :data:`~simpy_llm.serving.latency_base.latency_models`.
Vidur (Agrawal et al., MLSys 2024) measured, per GPU, model and
tensor-parallel degree, the median time of every non-attention operator of
one decoder layer over a grid of token counts (``mlp.csv``). The shipped cut
(``profiles/vidur/``, with Vidur's NOTICE and MIT licence) keeps those
medians; Vidur's attention profiles were not available, so attention,
tensor-parallel communication and the LM head come from the analytic
:class:`~simpy_llm.serving.roofline.Roofline` terms. ``docs/latency.md``
states the provenance and every term.
"""

from __future__ import annotations

import bisect
import csv
import functools
from pathlib import Path
from typing import ClassVar

import attrs
import yaml

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.validators import MAX_COEFFICIENT_US, at_least, at_most
from simpy_llm.serving.hardware import Hardware, ModelSpec, gpu_spec
from simpy_llm.serving.latency_base import RequestOverheads, latency_models
from simpy_llm.serving.profiles import profiles_dir
from simpy_llm.serving.roofline import Roofline

__all__ = ["OPERATORS", "ProfiledLatency", "operator_table", "vidur_models"]

OPERATORS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
"""The ``mlp.csv`` operators summed into one layer's non-attention time (each
``time_stats.<op>.median``, ms): the pre-attention RMS norm, the fused QKV
projection, rotary embedding, the output projection, the pre-MLP RMS norm, the
fused gate/up projection, the SiLU-and-multiply, the down projection and the
residual add; the same set, once per layer, that Vidur's own predictor sums
(its ``emb`` column, the embedding lookup, is left out as Vidur leaves it out)."""

_VIDUR_GPUS = {"a100": "A100-80", "h100": "H100"}
"""Vidur's device names and the shipped GPU each denotes (both 80 GB SXM parts)."""


def _vidur_root() -> Path:
    return profiles_dir() / "vidur"


@functools.cache
def vidur_models() -> dict[str, tuple[str, ...]]:
    """Vidur GPU name -> the model folders profiled on it."""
    root = _vidur_root() / "compute"
    return {
        gpu: tuple(sorted(p.parent.name for p in (root / gpu).glob("*/*/mlp.csv")))
        for gpu in sorted(_VIDUR_GPUS)
    }


@functools.cache
def _model_facts() -> dict[str, dict[str, int]]:
    """Layer count and vocabulary of each profiled model (``profiles/vidur/models.yaml``)."""
    raw = yaml.safe_load((_vidur_root() / "models.yaml").read_text())
    return {name: {"num_layers": int(e["num_layers"]), "vocab_size": int(e["vocab_size"])} for name, e in raw.items()}


@functools.cache
def _read_profile(gpu: str, model: str) -> tuple[tuple[str, ...], list[dict[str, str]]]:
    if not isinstance(gpu, str) or gpu.lower() not in _VIDUR_GPUS:
        raise FieldValueError("gpu", f"no Vidur profiles for GPU {gpu!r}; known GPUs: {', '.join(sorted(_VIDUR_GPUS))}")
    gpu = gpu.lower()
    if model not in vidur_models()[gpu]:
        raise FieldValueError(
            "model", f"no Vidur profile of {model!r} on {gpu}; {gpu} has: {', '.join(vidur_models()[gpu])}"
        )
    (path,) = (_vidur_root() / "compute" / gpu).glob(f"*/{model}/mlp.csv")
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    return tuple(sorted({r["num_tensor_parallel_workers"] for r in rows}, key=int)), rows


@attrs.frozen(kw_only=True)
class OperatorTable:
    """One (GPU, model, TP) profile: non-attention time of ONE layer against token count.

    ``tokens`` are the measured token counts, ascending; ``layer_s`` the sum of
    the :data:`OPERATORS` medians at each, in seconds (the mean of the sums
    where a token count was measured more than once).
    """

    tokens: tuple[int, ...]
    """Measured token counts, ascending."""
    layer_s: tuple[float, ...]
    """Non-attention time of one layer at each, s."""
    model: ModelSpec
    """The model's shape: heads, widths from the table's columns; layers and vocabulary from
    ``profiles/vidur/models.yaml``."""

    def layer_time_s(self, tokens: int) -> float:
        """Non-attention time of one layer for *tokens* tokens (0 for none).

        Exact at a measured count; linear between the two measured counts
        around *tokens*; beyond the last measured count, extrapolated linearly
        from the last two (the operators are then GEMMs and element-wise
        kernels whose time grows in proportion to the tokens).
        """
        if tokens <= 0:
            return 0.0
        xs, ys = self.tokens, self.layer_s
        i = bisect.bisect_right(xs, tokens) - 1
        if i >= 0 and xs[i] == tokens:
            return ys[i]
        if i < 0:  # below the first measured count (only when it exceeds 1)
            i = 0
        elif i >= len(xs) - 1:
            i = len(xs) - 2
        x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
        return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)


@functools.cache
def operator_table(gpu: str, model: str, tp: int) -> OperatorTable:
    """The :class:`OperatorTable` of a shipped Vidur profile.

    Raises :class:`FieldValueError` naming ``gpu``, ``model`` or ``tp`` (with
    what exists) for a profile that is not shipped.

    Examples
    --------
    >>> t = operator_table("h100", "Llama-2-7b-hf", 1)
    >>> t.tokens[:4], t.model.num_layers
    ((1, 2, 4, 8), 32)
    """
    tps, rows = _read_profile(gpu, model)
    if isinstance(tp, bool) or not isinstance(tp, int) or str(tp) not in tps:
        raise FieldValueError("tp", f"{model} on {gpu.lower()} was profiled at tp {', '.join(tps)}; got {tp!r}")
    sums: dict[int, list[float]] = {}
    for r in rows:
        if r["num_tensor_parallel_workers"] == str(tp):
            sums.setdefault(int(r["num_tokens"]), []).append(
                sum(float(r[f"time_stats.{op}.median"]) for op in OPERATORS)
            )
    tokens = tuple(sorted(sums))
    first = rows[0]
    heads, hidden = int(first["n_head"]), int(first["n_embd"])
    facts = _model_facts()[model]
    spec = ModelSpec(
        name=model,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=int(first["n_kv_head"]),
        head_dim=hidden // heads,
        intermediate_size=int(first["n_expanded_embd"]),
        dtype_bytes=2,
        num_layers=facts["num_layers"],
        vocab_size=facts["vocab_size"],
    )
    layer_s = tuple(sum(sums[n]) / len(sums[n]) * 1e-3 for n in tokens)
    return OperatorTable(tokens=tokens, layer_s=layer_s, model=spec)


@latency_models.register("profile")
@attrs.frozen(kw_only=True)
class ProfiledLatency(RequestOverheads):
    """Vidur-style table model: measured non-attention operators plus analytic attention.

    With ``T = P + D`` new tokens in the step and ``L`` layers,

    ``step = L x (table(T) + attention) + all_reduce + lm_head``

    * ``table(T)``: one layer's non-attention time, the sum of the
      :data:`OPERATORS` medians measured by Vidur at ``T`` tokens on this GPU
      and TP degree (linear between measured counts, linear extrapolation
      beyond the last one: :meth:`OperatorTable.layer_time_s`);
    * ``attention``: :meth:`Roofline.attention_layer_time_s` (analytic, since
      Vidur's attention profiles are not shipped): ``max`` of the score FLOPs
      (``4 d`` per query head per attention pair) at the GPU's BLIS MFU and
      the KV-cache read of the decode context plus the new tokens' KV write at
      peak bandwidth;
    * ``all_reduce`` and ``lm_head``: :class:`Roofline`'s terms (not in
      Vidur's compute table either; Vidur leaves the LM head out).

    ``queueing_time_s`` and ``output_token_overhead_s`` are BLIS's ``alpha``
    overheads, as in ``blis_linear``.

    Examples
    --------
    >>> m = ProfiledLatency(model="Meta-Llama-3-8B", gpu="a100", tp=1)
    >>> round(m.step_time_s(512, 0, prefill_attention_pairs=512 * 513 // 2) * 1e3, 2)
    35.74
    >>> m.hardware.gpu.name, m.hardware.model.num_kv_heads
    ('A100-80', 8)
    """

    uses_context: ClassVar[bool] = True
    """The engine passes ``decode_context_tokens`` and ``prefill_attention_pairs``."""

    model: str
    """Vidur model folder: ``Meta-Llama-3-8B``, ``Meta-Llama-3-70B``, ``Llama-2-7b-hf``,
    ``Llama-2-70b-hf`` (the Llama 3 models on ``a100`` only)."""
    gpu: str
    """Vidur GPU: ``a100`` (A100 80 GB SXM) or ``h100`` (H100 80 GB SXM)."""
    tp: int = 1
    """Tensor-parallel degree: one of the degrees profiled (1, 2, 4, 8)."""
    alpha0_us: float = attrs.field(default=0.0, validator=[at_least(0), at_most(MAX_COEFFICIENT_US)])
    """Fixed arrival-to-queue delay per request, µs."""
    alpha1_us: float = attrs.field(default=0.0, validator=[at_least(0), at_most(MAX_COEFFICIENT_US)])
    """Arrival-to-queue delay per prompt token, µs."""
    alpha2_us: float = attrs.field(default=0.0, validator=[at_least(0), at_most(MAX_COEFFICIENT_US)])
    """Post-processing per output token, µs."""
    table: OperatorTable = attrs.field(init=False, repr=False, eq=False)
    """The measured non-attention times."""
    roofline: Roofline = attrs.field(init=False, repr=False, eq=False)
    """The analytic terms (attention, all-reduce, LM head) at the GPU's BLIS MFU, full bandwidth."""

    def __attrs_post_init__(self) -> None:
        table = operator_table(self.gpu, self.model, self.tp)
        gpu = gpu_spec(_VIDUR_GPUS[self.gpu.lower()])
        roofline = Roofline(
            hardware=Hardware(model=table.model, gpu=gpu, tp=self.tp),
            mfu=gpu.mfu_prefill,
            mfu_decode=gpu.mfu_decode,
        )
        object.__setattr__(self, "table", table)
        object.__setattr__(self, "roofline", roofline)

    @property
    def hardware(self) -> Hardware:
        """The model (shape from the profile), GPU and TP degree."""
        return self.roofline.hardware

    def non_attention_time_s(self, tokens: int) -> float:
        """All layers' measured (non-attention) time for *tokens* tokens: ``L x table(T)``."""
        return self.table.model.num_layers * self.table.layer_time_s(tokens)

    @property
    def repeatable_step_times(self) -> bool:
        """True: the step time is a function of the step's token counts."""
        return True

    def step_time_s(
        self, prefill_tokens: int, decode_tokens: int, decode_context_tokens: float = 0, prefill_attention_pairs: float = 0
    ) -> float:
        tokens = prefill_tokens + decode_tokens
        if not tokens:
            return 0.0
        r = self.roofline
        layers = self.table.model.num_layers
        return (
            layers
            * (
                self.table.layer_time_s(tokens)
                + r.attention_layer_time_s(prefill_tokens, decode_tokens, decode_context_tokens, prefill_attention_pairs)
            )
            + r.all_reduce_time_s(tokens)
            + r.lm_head_time_s(prefill_tokens, decode_tokens)
        )
