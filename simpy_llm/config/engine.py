"""A replica's engine settings: continuous batching limits, KV cache, scheduler and
preemption, chunked prefill, and the llama.cpp preset (its slots and prompt cache).

Part of the config tree (:mod:`simpy_llm.config.schema` gathers it); values and shapes only.
"""

from __future__ import annotations

import attrs

from simpy_llm.config.common import (
    KvBlocks,
    PolicySpec,
    SchedulerSpec,
)
from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.validators import (
    MAX_KV_BLOCK_SIZE,
    MAX_KV_BLOCKS,
    MAX_TOKENS,
    all_of,
    at_least,
    at_most,
    each_item,
    greater_than,
    in_range,
    one_of,
    optional,
    unless,
)

__all__ = [
    "ENGINE_PRESETS",
    "REUSABLE_PROMPT_TAIL",
    "EngineConfig",
    "LlamaCppPreset",
    "SlotCacheConfig",
]


@attrs.frozen(kw_only=True)
class SlotCacheConfig:
    """llama.cpp's prompt cache as its server keeps it: one context per slot, saved to and
    restored from host memory whole (``docs/model.md``, "The prompt cache, slot by slot").

    Set as ``EngineConfig.slot_cache`` (the ``llamacpp`` preset does, with ``cache_model:
    slots``); then a request's cached prefix comes from the slot it is given, not from a
    cache of blocks shared by every request.

    Examples
    --------
    >>> c = SlotCacheConfig()
    >>> c.prompt_similarity, c.host_cache_tokens, c.cache_idle_slots, c.checkpoints, c.max_checkpoints
    (0.1, 262144, True, True, 32)
    """

    prompt_similarity: float = attrs.field(default=0.1, validator=in_range(0.0, 1.0))
    """A prompt goes to the idle slot whose context it shares the largest fraction of itself
    with, if that fraction exceeds this (llama.cpp's ``--slot-prompt-similarity``); otherwise,
    or with 0, to the least recently used idle slot."""
    host_cache_tokens: int = attrs.field(default=262_144, validator=all_of(at_least(0), at_most(MAX_KV_BLOCKS)))
    """Tokens of slot contexts the host-memory cache keeps (llama.cpp's ``--cache-ram``, in MiB
    there: divide by the model's KV bytes per token); the oldest saved context goes first.
    0: no host cache (a slot's context is lost when another conversation takes the slot)."""
    cache_idle_slots: bool = True
    """Save every idle slot's context to the host cache whenever a request starts (llama.cpp's
    ``--cache-idle-slots``, its default; needs ``host_cache_tokens`` > 0)."""
    checkpoints: bool = True
    """The model's context can be restored only at checkpoints (sliding-window attention,
    recurrent or hybrid models): taken where a prompt's computation starts and where its
    ``prefill_breaks`` stop it. False: any common prefix with the slot's context is reused."""
    max_checkpoints: int = attrs.field(default=32, validator=all_of(at_least(1), at_most(MAX_TOKENS)))
    """Checkpoints a slot keeps; the oldest is dropped for a new one (llama.cpp's ``--ctx-checkpoints``)."""

    def __attrs_post_init__(self) -> None:
        if self.cache_idle_slots and self.host_cache_tokens == 0:
            raise FieldValueError("cache_idle_slots", "needs host_cache_tokens > 0 (idle slots are saved to the host cache)")


@attrs.frozen(kw_only=True)
class EngineConfig:
    """A replica's continuous-batching engine (``docs/model.md``, "A replica, precisely")."""

    max_num_seqs: int = attrs.field(default=256, validator=all_of(at_least(1), at_most(MAX_TOKENS)))
    """Most requests in the running batch."""
    max_num_batched_tokens: int = attrs.field(default=8192, validator=all_of(at_least(1), at_most(MAX_TOKENS)))
    """Token budget of one step (prefill chunk tokens + one per decoding request)."""
    chunked_prefill: bool = True
    """Split prompts across steps to fit the token budget. Without it a prompt
    is prefilled whole in one step and must fit the budget alone."""
    kv_block_size: int = attrs.field(default=16, validator=all_of(at_least(1), at_most(MAX_KV_BLOCK_SIZE)))
    """Tokens per KV-cache block."""
    kv_num_blocks: KvBlocks = attrs.field(default=8192, validator=unless("auto", at_most(MAX_KV_BLOCKS)))
    """KV-cache blocks on the replica, or ``auto``: what the GPU memory left after the
    weights and an activation headroom holds (needs a latency model that names its
    model, GPU and TP degree; see ``docs/latency.md``)."""
    gpu_memory_utilization: float | None = attrs.field(default=None, validator=optional(in_range(0.01, 1.0)))
    """With ``kv_num_blocks: auto``: the share of GPU memory the engine may use (vLLM's
    ``--gpu-memory-utilization``; default 0.9). Rejected with a fixed block count."""
    max_model_len: int | None = attrs.field(default=None, validator=optional(all_of(at_least(2), at_most(MAX_TOKENS))))
    """Longest prompt + output a request may have; longer ones are dropped on arrival.
    Default: what the KV cache can hold."""
    prefix_caching: bool = True
    """Automatic prefix caching (on by default, as in vLLM's V1 engine): full blocks are
    cached by content and reused by later requests with the same prefix."""
    scheduler: SchedulerSpec = attrs.field(factory=lambda: PolicySpec(kind="fcfs"))
    """Scheduler policy: ``fcfs``, ``priority``, ``sjf``, ``edf`` or a registered one."""
    preemption_mode: str = attrs.field(default="recompute", validator=one_of(("recompute", "swap")))
    """What happens to a preempted request's KV: dropped and recomputed, or swapped to CPU memory."""
    swap_space_blocks: int = attrs.field(default=0, validator=all_of(at_least(0), at_most(MAX_KV_BLOCKS)))
    """CPU swap space in KV blocks (``swap`` only; must be > 0 then)."""
    swap_kv_bytes_per_token: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(2.0**40))))
    """Bytes of KV per token copied when swapping (``swap`` only; default: from the latency
    model's hardware)."""
    swap_bandwidth_gb_per_s: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(1e-6), at_most(1e6))))
    """GPU <-> CPU copy bandwidth, GB/s (``swap`` only; default: the GPU's PCIe bandwidth)."""
    kv_offload_blocks: int = attrs.field(default=0, validator=all_of(at_least(0), at_most(MAX_KV_BLOCKS)))
    """A CPU tier for the prefix cache, in KV blocks (``docs/model.md``, "A CPU tier for the
    prefix cache"): a findable block evicted from the GPU is copied there, and a later lookup
    that matches it restores it over PCIe. Needs ``prefix_caching`` without ``slot_cache``.
    Default 0: no CPU tier."""
    kv_offload_bytes_per_token: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(2.0**40))))
    """Bytes of KV per token copied when a block is restored from the CPU tier
    (``kv_offload_blocks`` > 0 only; default: from the latency model's hardware)."""
    kv_offload_bandwidth_gb_per_s: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(1e-6), at_most(1e6))))
    """CPU -> GPU copy bandwidth of a restore, GB/s (``kv_offload_blocks`` > 0 only; default:
    the GPU's PCIe bandwidth)."""
    ubatch_tokens: int | None = attrs.field(default=None, validator=optional(all_of(at_least(1), at_most(MAX_TOKENS))))
    """Compute a step as forward passes of at most this many tokens (llama.cpp's
    ``n_ubatch``): decode tokens first, then the prefill chunks in order, cut every
    ``ubatch_tokens``; the step takes the sum of the passes' times, so each pass pays
    the latency model's fixed cost. Default: one pass per step (vLLM)."""
    ubatch_split: str = attrs.field(default="simple", validator=one_of(("simple", "by_slot")))
    """How a step is cut into passes (``simpy_llm.serving.passes``): ``simple``, the step's
    tokens in order every ``ubatch_tokens``; ``by_slot``, llama.cpp's server with a KV stream
    per slot: one pass per run of consecutive slot ids, an equal number of tokens from each
    sequence in it, so a step costs more when its requests sit on scattered slots. A request
    holds slot ``0 .. max_num_seqs - 1`` from admission to its end (the slot cache's, or the
    least recently used idle one). ``by_slot`` needs ``ubatch_tokens``."""
    prefill_breaks: tuple[int, ...] = attrs.field(default=(), validator=each_item(all_of(at_least(1), at_most(MAX_TOKENS))))
    """Prompt positions, counted back from the end of the prompt, that a prefill chunk
    never crosses: with ``(516, 4)`` the last 4 prompt tokens are computed in a step of
    their own, and so are the 512 before them (llama.cpp does this for models whose
    context it checkpoints, e.g. with sliding-window attention, so the first token comes
    one step after the bulk of the prompt). Needs ``chunked_prefill``. Default: none."""
    reusable_prompt_tail: int | None = attrs.field(default=None, validator=optional(all_of(at_least(0), at_most(MAX_TOKENS))))
    """With prefix caching: a finished request leaves findable in the cache only its first
    ``prompt_tokens - reusable_prompt_tail`` tokens (or its shared prefix, if longer), not
    its output. llama.cpp restores a checkpointed model's context only from a checkpoint,
    the last one 4 tokens before the end of the prompt; measured on its server, a later
    prompt starting with the same text finds 5 tokens fewer than the earlier prompt. Default
    (None): the whole content, prompt and output, stays findable (vLLM)."""
    slot_cache: SlotCacheConfig | None = None
    """llama.cpp's prompt cache, slot by slot (:class:`SlotCacheConfig`): each of the
    ``max_num_seqs`` slots keeps the context of the last request it ran, and a request finds
    cached only what the slot it is given (or a context restored from host memory) shares
    with its prompt. Needs ``prefix_caching``, a ``max_model_len`` and KV blocks for every
    slot's whole context (nothing is preempted). Default (None): the block cache above."""

    def __attrs_post_init__(self) -> None:
        if self.prefill_breaks and not self.chunked_prefill:
            raise FieldValueError("prefill_breaks", "needs chunked_prefill: true (a prompt is then computed in pieces)")
        if self.slot_cache is not None:
            self._check_slot_cache()
        if self.ubatch_split == "by_slot" and self.ubatch_tokens is None:
            raise FieldValueError("ubatch_split", "by_slot needs ubatch_tokens (the tokens of one forward pass)")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise FieldValueError(
                "max_num_batched_tokens",
                f"must be >= max_num_seqs ({self.max_num_seqs}) so every running request "
                f"can decode each step; got {self.max_num_batched_tokens}",
            )
        if self.kv_num_blocks == "auto":
            pass
        elif self.kv_num_blocks * self.kv_block_size < self.max_num_batched_tokens:
            raise FieldValueError(
                "kv_num_blocks",
                f"the KV cache ({self.kv_num_blocks} blocks x {self.kv_block_size} tokens) must hold "
                f"at least max_num_batched_tokens ({self.max_num_batched_tokens}) tokens",
            )
        if self.gpu_memory_utilization is not None and self.kv_num_blocks != "auto":
            raise FieldValueError("gpu_memory_utilization", "is used only with kv_num_blocks: auto")
        if self.preemption_mode == "swap":
            if self.swap_space_blocks == 0:
                raise FieldValueError("swap_space_blocks", "must be > 0 with preemption_mode: swap")
        else:
            for name in ("swap_space_blocks", "swap_kv_bytes_per_token", "swap_bandwidth_gb_per_s"):
                if getattr(self, name):
                    raise FieldValueError(name, "is used only with preemption_mode: swap")
        if self.kv_offload_blocks:
            if not self.prefix_caching:
                raise FieldValueError("kv_offload_blocks", "needs prefix_caching: true (it is a tier of the prefix cache)")
            if self.slot_cache is not None:
                raise FieldValueError("kv_offload_blocks", "applies to the block cache, not to slot_cache")
        else:
            for name in ("kv_offload_bytes_per_token", "kv_offload_bandwidth_gb_per_s"):
                if getattr(self, name) is not None:
                    raise FieldValueError(name, "is used only with kv_offload_blocks > 0")

    def _check_slot_cache(self) -> None:
        """A slot cache needs slots that never run out of KV: a model length, and blocks for
        every slot's whole context (so nothing is preempted, as on llama.cpp's server)."""
        if not self.prefix_caching:
            raise FieldValueError("slot_cache", "needs prefix_caching: true (it is the prompt cache)")
        if self.reusable_prompt_tail is not None:
            raise FieldValueError(
                "reusable_prompt_tail",
                "applies to the block cache; with slot_cache the slots' checkpoints decide what is reusable",
            )
        if self.max_model_len is None:
            raise FieldValueError("slot_cache", "needs max_model_len: each slot's context")
        if self.preemption_mode != "recompute":
            raise FieldValueError("preemption_mode", "a slot cache never preempts: each slot owns its context")
        if self.kv_num_blocks == "auto":
            raise FieldValueError(
                "kv_num_blocks",
                "must be a number with slot_cache: every slot's whole context (max_num_seqs x max_model_len tokens)",
            )
        else:
            need = self.max_num_seqs * -(-self.max_model_len // self.kv_block_size)
            if self.kv_num_blocks < need:
                raise FieldValueError(
                    "kv_num_blocks",
                    f"with slot_cache must hold every slot's whole context: max_num_seqs ({self.max_num_seqs}) x "
                    f"max_model_len ({self.max_model_len}) tokens = {need} blocks of {self.kv_block_size}; got {self.kv_num_blocks}",
                )


@attrs.frozen(kw_only=True)
class LlamaCppPreset:
    """llama.cpp's HTTP server (``llama-server``) as engine settings: ``engine: {preset:
    llamacpp, ...}``. The keys are the server's own options; :meth:`engine` maps them onto
    the continuous-batching engine (``docs/model.md``, "The llama.cpp server"):

    * ``n_parallel`` slots are the running batch (``max_num_seqs``); further requests wait
      in arrival order (``fcfs``), as llama.cpp defers tasks while no slot is idle;
    * each slot owns ``ctx_per_slot`` tokens of context (``max_model_len``): a request whose
      prompt plus output does not fit is refused, and a slot never runs out of KV, so
      nothing is ever preempted;
    * a step takes every decoding slot's token first, then prompt tokens up to ``n_batch``
      (``max_num_batched_tokens``; longer prompts continue in the next steps), computed in
      forward passes of ``n_ubatch`` tokens (``ubatch_tokens``); llama.cpp clamps both to the
      context (``n_batch <= n_ctx``, ``n_ubatch <= n_batch``) and so does this mapping;
      with a KV stream per slot (``kv_unified`` off) a pass takes only
      sequences on consecutive slot ids (``ubatch_split: by_slot``, docs/model.md, "Passes
      by slot");
    * ``cache_prompt`` is the prompt cache (``prefix_caching``). With ``cache_model: slots``
      (the default) it is modelled as the server keeps it (``slot_cache``, docs/model.md, "The
      prompt cache, slot by slot"): each slot keeps its last context; a prompt goes to the
      idle slot it shares the largest part of itself with (``slot_prompt_similarity``), else
      to the least recently used one; a slot's context is saved to a host-memory cache of
      ``cache_ram_tokens`` tokens (llama.cpp's ``--cache-ram``, in MiB there: divide by the
      model's KV bytes per token) when another conversation takes the slot, and whenever a
      request starts while it is idle (``cache_idle_slots``), and restored from there for a
      later prompt that continues it (at the latency model's ``cache_restore_us``). With
      ``cache_model: radix`` it is the earlier, simpler model: one radix prefix cache over
      one-token blocks shared by the slots and ``cache_ram_tokens`` of host memory, in which
      every prompt finds its longest cached prefix, at no cost;
    * with ``prompt_checkpoints`` the last ``4`` prompt tokens, and the ``n_ubatch`` before
      them, are computed in steps of their own (``prefill_breaks``), and the model's context
      can be restored only at a checkpoint: those two places and where a prompt's computation
      started (at most ``ctx_checkpoints`` per slot; ``radix``: a finished request's cache is
      reusable only up to its prompt less 5 tokens, ``reusable_prompt_tail``).

    The ``slots`` model's own keys (``slot_prompt_similarity``, ``cache_idle_slots``,
    ``ctx_checkpoints``) default to the server's defaults and are refused where they would
    change nothing (``cache_model: radix``, ``cache_prompt: false``, or for
    ``ctx_checkpoints`` without ``prompt_checkpoints``).

    Examples
    --------
    >>> e = LlamaCppPreset(n_parallel=4, ctx_per_slot=2048).engine()
    >>> e.max_num_seqs, e.max_model_len, e.max_num_batched_tokens, e.ubatch_tokens, e.kv_block_size
    (4, 2048, 2048, 512, 1)
    >>> e.kv_num_blocks, e.prefill_breaks, e.slot_cache.host_cache_tokens
    (8192, (516, 4), 262144)
    >>> r = LlamaCppPreset(n_parallel=4, ctx_per_slot=2048, cache_model="radix").engine()
    >>> r.slot_cache is None, r.kv_num_blocks == 4 * 2048 + LlamaCppPreset().cache_ram_tokens, r.reusable_prompt_tail
    (True, True, 5)
    >>> LlamaCppPreset(n_parallel=1, ctx_per_slot=1024, cache_prompt=False).engine().max_num_batched_tokens
    1024
    """

    n_parallel: int = attrs.field(default=4, validator=all_of(at_least(1), at_most(MAX_TOKENS)))
    """Slots (``--parallel``): requests decoded together."""
    ctx_per_slot: int = attrs.field(default=4096, validator=all_of(at_least(2), at_most(MAX_TOKENS)))
    """Context tokens of one slot (``--ctx-size`` divided by the slots): the longest prompt
    plus output a request may have."""
    n_batch: int = attrs.field(default=2048, validator=all_of(at_least(1), at_most(MAX_TOKENS)))
    """Logical batch (``--batch-size``): tokens one step may compute."""
    n_ubatch: int = attrs.field(default=512, validator=all_of(at_least(1), at_most(MAX_TOKENS)))
    """Physical batch (``--ubatch-size``): tokens of one forward pass."""
    cache_prompt: bool = True
    """Reuse cached prompt prefixes (the server's ``cache_prompt`` default)."""
    cache_ram_tokens: int = attrs.field(default=262_144, validator=all_of(at_least(0), at_most(MAX_KV_BLOCKS)))
    """Tokens the host-memory prompt cache keeps beyond the slots' own context (0: the
    slots only). The default is about what llama.cpp's default 8 GiB holds for a small
    model (Gemma 3 270M: 18 KiB of KV per token)."""

    prompt_checkpoints: bool = True
    """The model's context is checkpointed near the end of each prompt (llama.cpp does so
    for sliding-window attention, e.g. Gemma 3, and for recurrent and hybrid models): the
    prompt stops ``4 + n_ubatch`` and ``4`` tokens before its end, each time finishing the
    step, so the first token comes a step after the bulk of the prompt
    (``prefill_breaks``). False for models without it (most plain transformers)."""
    cache_model: str = attrs.field(default="slots", validator=one_of(("slots", "radix")))
    """How the prompt cache is modelled: ``slots``, the server's own rules (measured, see
    docs/model.md), or ``radix``, the earlier approximation kept for comparison."""
    slot_prompt_similarity: float | None = attrs.field(default=None, validator=optional(in_range(0.0, 1.0)))
    """``--slot-prompt-similarity`` (``slots`` only; default the server's 0.1): a prompt
    goes to an idle slot sharing more than this fraction of it, else to the least recently
    used idle slot (0: always the least recently used)."""
    cache_idle_slots: bool | None = None
    """``--cache-idle-slots`` (``slots`` only; default the server's true): every idle slot's
    context is saved to host memory whenever a request starts (needs ``cache_ram_tokens`` > 0)."""
    kv_unified: bool = True
    """``--kv-unified``: one KV buffer for all slots, so a step's tokens run in passes of
    ``n_ubatch`` in order (``ubatch_split: simple``): the server's setting when it chooses
    the slots itself (4). Off (its default when ``--parallel`` is given, and the project's
    launcher's), each slot has its own KV stream and a step runs one pass per run of
    consecutive slot ids (``ubatch_split: by_slot``; docs/model.md, "Passes by slot"). One
    slot is one stream either way. A replayed trace takes its server block's ``kv_unified``
    (the launcher writes false); a block that does not say it is replayed with this default,
    with a warning (docs/model.md, "Replays follow the trace")."""
    ctx_checkpoints: int | None = attrs.field(default=None, validator=optional(all_of(at_least(1), at_most(MAX_TOKENS))))
    """``--ctx-checkpoints`` (``slots`` with ``prompt_checkpoints`` only; default the
    server's 32): checkpoints a slot keeps, the oldest dropped first."""

    def __attrs_post_init__(self) -> None:
        if self.n_parallel > self.n_batch:
            raise FieldValueError("n_batch", f"must be >= n_parallel ({self.n_parallel}) so every slot can decode each step; got {self.n_batch}")
        slots = self.cache_prompt and self.cache_model == "slots"
        why = "cache_prompt is false" if not self.cache_prompt else "cache_model is radix"
        for key in ("slot_prompt_similarity", "cache_idle_slots", "ctx_checkpoints"):
            if getattr(self, key) is not None and not slots:
                raise FieldValueError(key, f"applies to the slots cache model only; here {why}")
        if self.ctx_checkpoints is not None and not self.prompt_checkpoints:
            raise FieldValueError("ctx_checkpoints", "applies to a checkpointed model only; here prompt_checkpoints is false")
        if self.cache_idle_slots and self.cache_ram_tokens == 0:
            raise FieldValueError("cache_idle_slots", "needs cache_ram_tokens > 0 (idle slots are saved to host memory)")

    def engine(self) -> EngineConfig:
        """The :class:`EngineConfig` these settings amount to."""
        n_ctx = self.n_parallel * self.ctx_per_slot
        n_batch = min(self.n_batch, n_ctx)
        breaks = tuple(min(n_batch, offset) for offset in (4 + min(self.n_ubatch, n_batch), 4)) if self.prompt_checkpoints else ()
        slots = self.cache_prompt and self.cache_model == "slots"
        slot_cache = None
        if slots:
            defaults = SlotCacheConfig()
            similarity = defaults.prompt_similarity if self.slot_prompt_similarity is None else self.slot_prompt_similarity
            idle = self.cache_ram_tokens > 0 if self.cache_idle_slots is None else self.cache_idle_slots
            slot_cache = SlotCacheConfig(
                prompt_similarity=similarity,
                host_cache_tokens=self.cache_ram_tokens,
                cache_idle_slots=idle,
                checkpoints=self.prompt_checkpoints,
                max_checkpoints=defaults.max_checkpoints if self.ctx_checkpoints is None else self.ctx_checkpoints,
            )
        radix = self.cache_prompt and not slots
        return EngineConfig(
            prefill_breaks=tuple(sorted(set(breaks), reverse=True)),
            reusable_prompt_tail=REUSABLE_PROMPT_TAIL if self.prompt_checkpoints and radix else None,
            max_num_seqs=self.n_parallel,
            max_num_batched_tokens=n_batch,
            ubatch_tokens=min(self.n_ubatch, n_batch),
            ubatch_split="simple" if self.kv_unified or self.n_parallel == 1 else "by_slot",
            chunked_prefill=True,
            kv_block_size=1,
            kv_num_blocks=n_ctx + (self.cache_ram_tokens if radix else 0),
            max_model_len=self.ctx_per_slot,
            prefix_caching=self.cache_prompt,
            slot_cache=slot_cache,
        )


REUSABLE_PROMPT_TAIL = 5
"""Tokens at the end of a prompt that llama.cpp's server cannot reuse from a checkpointed
model's cache (its last checkpoint is 4 tokens before the end, and one more is recomputed;
measured: an identical or extended prompt finds ``prompt_tokens - 5`` cached)."""

ENGINE_PRESETS: dict[str, type] = {"vllm": EngineConfig, "llamacpp": LlamaCppPreset}
"""``engine: {preset: NAME, ...}``: the class that reads the other keys. ``vllm`` is
:class:`EngineConfig` itself (also what an engine without ``preset`` is)."""
