"""A designed measurement of a server: ``simpy-llm calibrate probe``.

A trace of real traffic mixes every effect at once, and a fit can only pin the
coefficients that traffic happened to separate. The probe instead sends a short,
designed set of requests, each phase with the server otherwise idle, so that each
coefficient of the ``batch_table`` latency model (:mod:`simpy_llm.serving.batch_table`)
shows on its own; it takes about a minute (``max_seconds``) and writes a profile
whose values and 95 % intervals ``calibrate fit --priors`` combines with an observed
trace (``docs/calibration.md``, "Probe").

Phases, in this order (each request's ``client_id`` in the trace names its phase; every
request is streamed with ``ignore_eos``):

``warm_up``
    Three requests: a 16-token prompt (the first request a server sees is often slow), a
    256-token prompt and a 16-token prompt with 8 output tokens. The last two size the
    design: their TTFTs and token gaps estimate the time per prompt token and per decode
    step, from which the longest isolated prompt, the decode phase's output length and the
    other phases' sizes are chosen to fit the budget (:func:`plan_design`). Left out of
    the estimates (the header's ``warm_up_requests``).
``isolated``
    Prompts across lengths (4 tokens, then 7 lengths log-spaced from 32 to at most 1,600
    tokens, the slot's context and the budget permitting), each twice, one at a time,
    with the prompt cache off (``cache_prompt: false`` for llama.cpp) and 9 output tokens.
    The engine cuts a prompt of ``P`` tokens into steps (``prefill_breaks``) and forward
    passes (``ubatch_tokens``) as :func:`~simpy_llm.calibrate.batch_steps.prompt_chunks` does, so
    on an idle server ``TTFT = alpha0 + RTT + (prefill_step + prefill_only_step) x passes
    + prefill_token x P + prefill_pair x pairs(P)`` (``pairs`` as
    :func:`~simpy_llm.calibrate.batch_steps.chunk_pairs`): an ordinary least-squares fit with
    standard errors. Each one's 8 decode gaps, steps of one decoder whose context is its
    prompt (4 to 1,600 tokens), give ``decode_context`` (the slope of a request's median gap
    on its context, least squares).
``decode.N``
    For each batch size ``N = 1 .. parallel``, ``N`` requests with 8-token prompts (on
    llama.cpp pinned to slots ``0 .. N-1``: "Slots" below) and
    enough output tokens sent together: once all ``N`` decode (after the last one's first
    token, before the first one's last token), every token gap is a pure-decode step of
    ``N`` decoders. ``D(N)`` is the median of one request's gaps in that window, less
    ``decode_context`` x the decoders' context, with the distribution-free 95 % interval of
    a median (order statistics; none below 6 gaps). Above 8 slots, sizes 1-8, then
    doubling sizes and the slot count are measured and the others interpolated (no interval;
    flat beyond the largest size measured, should the budget cut the phase short).
``mixed``
    One request decoding alone (``mixed.decoder``, a 16-token prompt) while prompts of 40
    to 300 tokens (40 to 180 on a small design; each within one forward pass with the
    decoder) join it one after another, each sent once the decoder has emitted 3 tokens
    since the previous one ended (``mixed.joiner``, one output token). The decoder's gaps
    that hold a joiner's prompt chunks (the steps ending at the joiner's first token and
    just before, one per chunk) are ``D(1) + prefill_step + prefill_token x c +
    prefill_pair x q``; against the median of its pure gaps they give ``prefill_step`` (the
    mean), and with the isolated phase's per-pass cost, ``prefill_only_step = per-pass cost
    - prefill_step``. Skipped with one slot (a prompt cannot join a decoding request).
``extension``
    A prompt (``extension.base``, 100 tokens), then the same prompt extended by 60 tokens
    (``extension``), twice, the prompt cache on. The extension computes only its uncached
    tokens (``prompt - cached``, as the server reports them), after the cached prefix: its
    TTFT less what the isolated fit predicts for a fresh start of that many tokens at that
    offset is the cost of starting from a cached prefix still in its slot.
``restore``
    llama.cpp with a host-memory prompt cache (``--cache-ram``: ``cache_ram_mib`` not 0): a
    prompt (``restore.base``), then ``parallel`` other prompts at once (``restore.fill``)
    so that every slot is taken and the first prompt's state is saved to host memory,
    then its extension (``restore``): the same residual measures a restore from host
    memory.

``cache_restore_us`` is the restore's residual when that phase ran, else the extension's
(the latency model has one cost for any start from a cached prefix); both figures are in
the profile (``fit.probe.cached_prefix_us``). A phase the server cannot run (no slot for a
joiner; no prompt cache: the emulated server caches nothing across requests, a vLLM or
SGLang server with ``enable_prefix_caching: false``; no host-memory slot restore: any
server but llama.cpp, or ``cache_ram_mib: 0``) is skipped, with the reason in the header
(``probe.skipped``) and the warnings; a request that finds nothing cached is left out.
With neither, ``cache_restore_us`` keeps its default 0 with a null interval.

**Slots** (llama.cpp only). The server runs a request on the slot its body names
(``id_slot``, on the completions and chat endpoints alike); left to itself it places a prompt
by its similarity to each slot's last one (``--slot-prompt-similarity``), else on the least
recently used slot, so a probe could not say which slots a phase held. With a KV stream per
slot the slots decide a step's forward passes (``docs/model.md``, "Passes by slot"), so the
probe pins each request as below and records it in the header (``probe.pinned_slots``, by
phase; a probe without that key left every choice to the server):

* ``warm_up``, ``isolated``: slot 0. One sequence is one pass on any slot; one slot for all
  keeps the requests alike (with ``cache_prompt: false`` nothing of its last prompt is reused).
* ``decode.N``: slots ``0 .. N-1``, one request on each. Consecutive slots decode in one
  forward pass, which is what ``D(N)`` times in the model (a step of ``N`` decoders on
  scattered slots costs the sum of its passes of consecutive ones).
* ``mixed``: the decoder on slot 0, each joiner on the last slot. With passes by slot no
  joiner shares the decoder's pass whole (one on the next slot gives it only its first token
  and runs the rest in a pass of its own); one on a slot not next to the decoder's runs its
  prompt in a pass of its own, so by the model a mixed gap is ``D(1)`` plus one prompt pass,
  the same on every such slot: the estimator's ``prefill_step`` then reads that pass's fixed
  cost, and ``prefill_only_step`` what the isolated phase's per-pass cost has beyond it (0 by
  the model). With two slots the last slot is the next one; with one KV cache the slot
  changes nothing.
* ``extension``: the base prompt and its extension on slot 0, so that the extension finds the
  base prompt's context in its slot.
* ``restore``: the base prompt on slot 0, the fills on slots ``0 .. parallel-1``, the
  extension on slot 0. The fill on slot 0 surely replaces the base prompt's context (saved to
  host memory), so the extension finds it only in host memory: a restore (measured on the
  server of the tests: 96 tokens of the base prompt's 101 restored into the pinned slot).

Other servers choose their own batches: nothing is pinned, and ``probe.pinned_slots`` is null.

**Budget.** :func:`plan_design` takes the largest of a few design sizes whose planned
duration (a cost model from the warm-up, times :data:`_SAFETY`) fits the time left; an
optional phase (mixed, extension, restore) is skipped when its planned time exceeds the
time left when it is due; the isolated phase's second round and the decode phase's sizes
above 1 stop when the budget is spent. What a profile needs (one round of isolated
prompts, ``D(1)``) is always sent, so a budget too short for the smallest design is
overrun, with a warning.

**Prompts** are synthetic words drawn per request (seeded by ``seed`` and a key of the
phase and request), so no two share a prefix by accident. Their exact token counts come
from the server's ``/tokenize`` (and ``/apply-template`` for chat), llama.cpp's endpoints,
when it answers them, else one token per word; either way corrected by the difference
the first warm-up request's ``usage`` showed; the estimates use the counts ``usage``
reports per request. Each request carries ``user: simpy-llm-probe/<request id>`` (the
emulated server records it as the client) and, for llama.cpp, ``cache_prompt`` and
``id_slot`` (above).

Outputs (:func:`run_probe`): ``trace.yaml`` / ``trace.csv`` in *out* (a trace v2 with the
observer's columns, written as requests end, and a header with the server, hardware and
network blocks as ``simpy-llm observe --server-type`` writes them, plus ``probe``: budget,
slots, seed, phases skipped, slots pinned), and ``profile.yaml`` (:meth:`~simpy_llm.calibrate.probe_estimate.ProbeResult.profile`):
``latency_model`` with every coefficient, ``server``, and ``fit`` with ``method: probe``,
``trace``, ``intervals``, ``sources`` (``probe`` for measured, ``default`` otherwise),
``ranges`` (what the probe covered), ``warnings`` and the phases' statistics (``probe``).
:func:`~simpy_llm.calibrate.probe_estimate.probe_estimate` recomputes the result from a probe's
trace alone; that module states how each coefficient is estimated and the conventions.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import os
import time
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import numpy as np
import pandas as pd

from simpy_llm.calibrate.probe_estimate import (
    ProbeError,
    ProbeResult,
    _engine_of,
    probe_estimate,
    write_probe_profile,
)
from simpy_llm.observe.client import ObservedRequest, OpenAIClient, RequestSpec
from simpy_llm.observe.loadgen import OBSERVER_COLUMNS, LoadRequest, record_row
from simpy_llm.observe.prompts import synthetic_prompt
from simpy_llm.observe.runner import run as run_loop
from simpy_llm.observe.server_info import (
    describe_server,
    load_server_config,
    resolve_server_type,
)
from simpy_llm.workload.traces import Trace, TraceV2Writer

__all__ = ["DEFAULT_MAX_SECONDS", "ProbeDesign", "plan_design", "run_probe", "run_probe_async"]

DEFAULT_MAX_SECONDS = 75.0
"""The probe's default time budget, s."""

WARM_UP_REQUESTS = 3
"""Requests sent first and left out of the estimates."""

MAX_PROMPT_TOKENS = 1600
"""Longest isolated prompt (less when the slot's context or the budget is shorter)."""

ISOLATED_OUTPUT_TOKENS = 9
"""Output tokens of an isolated prompt: its 8 decode gaps, at a context of its prompt, measure
``decode_context`` (their median; with one gap a request's stray slow step decided the slope)."""

ALL_SIZES_UP_TO = 8
"""Every batch size up to this many slots is measured; above, doubling sizes."""

_SCALES = (1.0, 0.8, 0.6, 0.45, 0.33, 0.25, 0.18)
"""The design sizes :func:`plan_design` tries, largest first."""

_SAFETY = 1.2
"""Planned durations are the cost model's times this (slower steps, the client's own turns)."""

_POLL_S = 0.005
"""How often the mixed phase looks at the decoding request's tokens, s."""

PINNED_SLOTS: dict[str, str] = {
    "warm_up": "0",
    "isolated": "0",
    "decode.N": "0..N-1",
    "mixed.decoder": "0",
    "mixed.joiner": "last",
    "extension.base": "0",
    "extension": "0",
    "restore.base": "0",
    "restore.fill": "0..parallel-1",
    "restore": "0",
}
"""Where a llama.cpp probe pins each phase's requests (``id_slot``; module docstring, "Slots"),
as the trace header's ``probe.pinned_slots`` records it: ``last`` is the highest slot measured
(``parallel - 1``)."""


# ----------------------------------------------------------------------------- design


@attrs.frozen(kw_only=True)
class ProbeDesign:
    """What the probe sends after the warm-up (module docstring); token counts are the
    prompts' totals as the server counts them."""

    scale: float
    """The fraction of the full design (1.0) the budget allowed."""
    isolated_lengths: tuple[int, ...]
    """Prompt lengths of the isolated phase, tokens."""
    isolated_repeats: int
    """Times each isolated length is sent."""
    decode_sizes: tuple[int, ...]
    """Batch sizes of the decode phase."""
    decode_prompt_tokens: int
    """Prompt length of the decode phase's requests, tokens."""
    decode_output_tokens: int
    """Output tokens of each decode-phase request."""
    mixed_joiner_lengths: tuple[int, ...]
    """Prompt lengths joining the decoding request (empty: the phase is skipped)."""
    mixed_decoder_tokens: int
    """Output tokens of the mixed phase's decoding request."""
    extension_repeats: int
    """Base-and-extension pairs of the extension phase (0: skipped)."""
    restore_repeats: int
    """Base, fill and extension rounds of the restore phase (0: skipped)."""
    base_tokens: int
    """Prompt length of an extension's or restore's base prompt, tokens."""
    extension_tokens: int
    """Tokens an extension adds to its base prompt."""
    fill_tokens: int
    """Prompt length of each fill request of the restore phase, tokens."""
    planned_s: float
    """The design's planned duration by the warm-up's estimates, s."""
    phase_s: dict[str, float] = attrs.field(factory=dict)
    """Each phase's planned duration, s (with the safety factor)."""


def _decode_sizes(parallel: int) -> tuple[int, ...]:
    """Every size up to :data:`ALL_SIZES_UP_TO`, then doubling sizes and *parallel* itself.

    >>> _decode_sizes(3), _decode_sizes(40)
    ((1, 2, 3), (1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 40))
    """
    sizes = list(range(1, min(parallel, ALL_SIZES_UP_TO) + 1))
    n = ALL_SIZES_UP_TO
    while n * 2 < parallel:
        n *= 2
        sizes.append(n)
    if parallel > ALL_SIZES_UP_TO:
        sizes.append(parallel)
    return tuple(sizes)


def plan_design(
    *,
    short_ttft_s: float,
    token_s: float,
    step_s: float,
    parallel: int,
    max_prompt_tokens: int,
    budget_s: float,
    ubatch_tokens: int | None = None,
    extension: bool = True,
    restore: bool = True,
) -> ProbeDesign:
    """The largest design (of :data:`_SCALES`) whose planned duration fits *budget_s*, else
    the smallest.

    Parameters
    ----------
    short_ttft_s, token_s, step_s
        From the warm-up: the TTFT of a short prompt, the time per prompt token and one
        decode step's time, s.
    parallel
        The server's slots: the largest batch measured.
    max_prompt_tokens
        The longest prompt the server takes with the isolated phase's outputs.
    budget_s
        Seconds left for the design.
    ubatch_tokens
        The engine's forward-pass size: a joining prompt stays within one pass with the decoder.
    extension, restore
        Whether those phases can run on this server.

    The cost model: a prompt of ``L`` tokens takes ``short_ttft + token_s x L``, a step of
    ``n`` decoders at most ``n x step_s``; the sum is multiplied by :data:`_SAFETY`. It is
    conservative (a step of ``n`` decoders takes less than ``n`` single ones on every server
    measured), so a probe usually ends before its budget.

    Examples
    --------
    >>> d = plan_design(short_ttft_s=0.05, token_s=0.004, step_s=0.02, parallel=4, max_prompt_tokens=2000, budget_s=80)
    >>> d.scale, d.isolated_lengths, d.decode_sizes, round(d.planned_s, 1)
    (1.0, (4, 32, 61, 118, 226, 434, 834, 1600), (1, 2, 3, 4), 55.9)
    >>> plan_design(short_ttft_s=0.05, token_s=0.004, step_s=0.02, parallel=4, max_prompt_tokens=2000, budget_s=40).scale
    0.45
    """
    if parallel < 1:
        raise ValueError(f"parallel must be >= 1, got {parallel}")
    cap = max(min(MAX_PROMPT_TOKENS, max_prompt_tokens), 8)
    sizes = _decode_sizes(parallel)
    joiner_cap = (ubatch_tokens + 3) if ubatch_tokens is not None else 300

    def ttft(tokens: float) -> float:  # the cost model's prompt on an idle server
        return short_ttft_s + token_s * tokens

    design = None
    for scale in _SCALES:
        longest = max(round(cap * scale), min(cap, 64))
        lengths = sorted({min(4, cap), *(round(float(x)) for x in np.geomspace(min(32, longest), longest, 7))})
        samples = max(12, round(40 * scale))
        output = samples + max(sizes) + 4
        offered = (40, 100, 180, 300) if scale >= 0.45 else (40, 100, 180)
        joiners = tuple(x for x in offered if x <= min(joiner_cap, cap)) if parallel >= 2 else ()
        base = min(100, cap // 2)
        reps_ext = 2 if extension else 0
        reps_res = 1 if restore else 0
        t_iso = 2 * sum(ttft(L) + (ISOLATED_OUTPUT_TOKENS - 1) * step_s for L in lengths)
        t_dec = sum(ttft(8 * n) + output * n * step_s for n in sizes)
        decoder_tokens = 3 + 8 * len(joiners) + 4
        t_mix = (ttft(16) + decoder_tokens * step_s + sum(ttft(L) for L in joiners)) if joiners else 0.0
        t_ext = reps_ext * (ttft(base) + ttft(60 + 5))
        t_res = reps_res * (ttft(base) + ttft(48 * parallel) + ttft(60 + 5))
        phases = {"isolated": t_iso, "decode": t_dec, "mixed": t_mix, "extension": t_ext, "restore": t_res}
        planned = _SAFETY * sum(phases.values())
        design = ProbeDesign(
            scale=scale, isolated_lengths=tuple(lengths), isolated_repeats=2, decode_sizes=sizes,
            decode_prompt_tokens=8, decode_output_tokens=output, mixed_joiner_lengths=joiners,
            mixed_decoder_tokens=decoder_tokens, extension_repeats=reps_ext, restore_repeats=reps_res,
            base_tokens=base, extension_tokens=60, fill_tokens=48, planned_s=planned,
            phase_s={k: _SAFETY * v for k, v in phases.items()},
        )
        if planned <= budget_s:
            return design
    assert design is not None
    return design


# ----------------------------------------------------------------------------- running


def _slots(server: Mapping[str, Any]) -> int | None:
    """The slots (requests decoded together) the server block gives."""
    for key in ("n_parallel", "max_num_seqs"):
        value = server.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return None


def _unavailable(server: Mapping[str, Any], kind: str, slots: int) -> dict[str, str]:
    """The phases this server cannot run, with the reason."""
    out: dict[str, str] = {}
    if slots < 2:
        out["mixed"] = "one slot: a prompt cannot join a decoding request"
    if kind == "emulated":
        out["extension"] = "the emulated server caches no prompt across requests (docs/emulate.md)"
    elif kind in ("vllm", "sglang") and server.get("enable_prefix_caching") is False:
        out["extension"] = "the server's prefix caching is off (enable_prefix_caching: false)"
    if "extension" in out:
        out["restore"] = out["extension"]
    elif kind != "llamacpp":
        out["restore"] = f"a {kind} server has no host-memory slot save and restore (llama.cpp's --cache-ram)"
    elif server.get("cache_ram_mib") == 0:
        out["restore"] = "the server keeps no prompt cache in host memory (cache_ram_mib: 0)"
    return out


class _Prompts:
    """Prompts of an exact token count: synthetic words, counted by the server's ``/tokenize``
    (and ``/apply-template`` for chat, as llama.cpp has them) when it answers, else one token
    per word; plus the offset that the first warm-up request's ``usage`` showed between the
    count and the server's own."""

    def __init__(self, client: Any, api: str, salt: str) -> None:
        self.client = client
        self.api = api
        self.salt = salt
        self.tokenize = False
        self.offset = 0

    async def setup(self) -> None:
        self.tokenize = await self._server_count("the") is not None

    async def _post(self, path: str, body: Mapping[str, Any]) -> Any:
        try:
            async with self.client.session.post(self.client.base_url + path, json=body, timeout=aiohttp.ClientTimeout(total=10.0)) as resp:
                if resp.status != 200:
                    return None
                return await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return None

    async def _server_count(self, text: str) -> int | None:
        if self.api == "chat":
            rendered = await self._post("/apply-template", {"messages": [{"role": "user", "content": text}]})
            prompt = rendered.get("prompt") if isinstance(rendered, Mapping) else None
            if not isinstance(prompt, str):
                return None
            text = prompt
        answer = await self._post("/tokenize", {"content": text, "add_special": True})
        tokens = answer.get("tokens") if isinstance(answer, Mapping) else None
        return len(tokens) if isinstance(tokens, list) else None

    def words(self, n: int, key: str) -> str:
        """*n* synthetic words, drawn for *key* (the same key gives the same words)."""
        return synthetic_prompt(max(int(n), 1), seed=f"probe/{self.salt}/{key}")

    async def _raw(self, text: str) -> int:
        if self.tokenize:
            n = await self._server_count(text)
            if n is not None:
                return n
        return len(text.split())

    async def count(self, text: str) -> int:
        """*text*'s prompt tokens as the server counts them (best known)."""
        return await self._raw(text) + self.offset

    def learn(self, text_count: int, reported: int | None) -> None:
        """The server reported *reported* prompt tokens for a prompt counted *text_count*."""
        if reported is not None:
            self.offset = reported - (text_count - self.offset)

    async def make(self, tokens: int, key: str) -> tuple[str, int]:
        """A prompt of *tokens* tokens (as near as whole words allow) and its count."""
        words = max(tokens - (await self.count(self.words(1, key)) - 1), 1)
        text = self.words(words, key)
        n = await self.count(text)
        for _ in range(4):
            if n == tokens or (words == 1 and n > tokens):
                break
            words = max(words + tokens - n, 1)
            text = self.words(words, key)
            n = await self.count(text)
        return text, n


class _Run:
    """Sends the probe's phases (module docstring) and writes each request's row."""

    def __init__(
        self, client: Any, writer: Any, prompts: _Prompts, *, api: str, model: str | None, slots: int,
        cache_field: bool, pin_slots: bool, max_prompt_tokens: int, ubatch: int | None, unavailable: Mapping[str, str], deadline: float,
    ) -> None:
        self.client = client
        self.writer = writer
        self.prompts = prompts
        self.api = api
        self.model = model
        self.slots = slots
        self.cache_field = cache_field
        self.pin_slots = pin_slots
        self.max_prompt_tokens = max_prompt_tokens
        self.ubatch = ubatch
        self.unavailable = dict(unavailable)
        self.deadline = deadline
        self.warnings: list[str] = []
        self.skipped: dict[str, str] = dict(unavailable)
        self.design: ProbeDesign | None = None
        self.estimates: dict[str, float] = {}
        """The warm-up's cost model (:func:`plan_design`'s first three arguments)."""
        self.pause_s = 0.02
        self._next_id = 0

    async def send(
        self, phase: str, text: str, tokens: int, max_tokens: int, *, cache: bool | None, slot: int | None,
        record: Any = None,
    ) -> Any:
        """Send one streamed request of phase *phase* and write its row, whatever its fate;
        on slot *slot* when the probe pins slots (``None``: the server's choice)."""
        rid = self._next_id
        self._next_id += 1
        extra: dict[str, Any] = {"ignore_eos": True, "user": f"simpy-llm-probe/{rid}"}
        if cache is not None and self.cache_field:
            extra["cache_prompt"] = cache
        if slot is not None and self.pin_slots:
            extra["id_slot"] = slot
        spec = RequestSpec(text, max_tokens, self.api, stream=True, model=self.model, request_id=rid, extra_body=extra)
        rec = record if record is not None else ObservedRequest()
        rec.approx_prompt_tokens = tokens
        rec.dispatched_s = self.client.now()
        try:
            await self.client.send(spec, rec)
        finally:
            sent = rec.sent_s if rec.sent_s is not None else rec.dispatched_s
            req = LoadRequest(request_id=rid, arrival_s=sent, input_tokens=tokens, output_tokens=max_tokens, fields={"client_id": phase})
            self.writer.write_row(record_row(req, rec, self.writer.columns))
        return rec

    async def pause(self) -> None:
        """Leave the server idle a moment between requests (its own post-processing)."""
        await asyncio.sleep(self.pause_s)

    def left_s(self) -> float:
        return self.deadline - time.perf_counter()

    # --- phases
    async def warm_up(self) -> dict[str, float]:
        """Three requests: a short prompt (the first request a server sees is often slow), a
        longer one and the short one again with 8 output tokens; the cost model of
        :func:`plan_design` from the last two."""
        text, n = await self.prompts.make(16, "warm_up/0")
        first = await self.send("warm_up", text, n, 1, cache=False, slot=0)
        if first.status != "ok":
            raise ProbeError(f"the first request failed: {first.error_message}")
        self.prompts.learn(n, first.prompt_tokens)
        await self.pause()
        longer = min(256, self.max_prompt_tokens)
        text, m = await self.prompts.make(longer, "warm_up/1")
        second = await self.send("warm_up", text, m, 1, cache=False, slot=0)
        if second.status != "ok":
            raise ProbeError(f"a {m}-token prompt failed: {second.error_message}")
        await self.pause()
        text, n = await self.prompts.make(16, "warm_up/2")
        third = await self.send("warm_up", text, n, 8, cache=False, slot=0)
        if third.status != "ok":
            raise ProbeError(f"a {n}-token prompt failed: {third.error_message}")
        p_short = third.prompt_tokens or n
        p_long = second.prompt_tokens or m
        gaps = third.itl_s
        step = float(np.median(gaps)) if gaps else float(third.ttft_s)
        token = max((second.ttft_s - third.ttft_s) / max(p_long - p_short, 1), 1e-6)
        self.pause_s = min(max(step, 0.01), 0.1)
        return {"short_ttft_s": float(third.ttft_s), "token_s": float(token), "step_s": step}

    async def isolated(self, d: ProbeDesign) -> None:
        for rep in range(d.isolated_repeats):
            for length in d.isolated_lengths:
                if rep > 0 and self.left_s() <= 0:  # the first round is what a profile needs
                    self.warnings.append(f"isolated phase cut short by the budget after {rep} round(s) of lengths")
                    return
                text, n = await self.prompts.make(length, f"isolated/{rep}/{length}")
                await self.send("isolated", text, n, ISOLATED_OUTPUT_TOKENS, cache=False, slot=0)
                await self.pause()

    async def decode(self, d: ProbeDesign) -> None:
        for size in d.decode_sizes:
            if size > 1 and self.left_s() <= 0:  # D(1) is what a profile needs
                self.warnings.append(f"decode phase cut short by the budget: batch sizes from {size} on not measured")
                return
            prompts = [await self.prompts.make(d.decode_prompt_tokens, f"decode/{size}/{i}") for i in range(size)]
            await asyncio.gather(*(self.send(f"decode.{size}", t, n, d.decode_output_tokens, cache=False, slot=i)
                                   for i, (t, n) in enumerate(prompts)))
            await self.pause()

    async def _wait_tokens(self, rec: Any, task: asyncio.Task[Any], count: int) -> bool:
        while len(rec.content_times_s) < count:
            if task.done():
                return False
            await asyncio.sleep(_POLL_S)
        return True

    async def mixed(self, d: ProbeDesign) -> None:
        text, n = await self.prompts.make(16, "mixed/decoder")
        joiners = [await self.prompts.make(length, f"mixed/{length}") for length in d.mixed_joiner_lengths]
        rec = ObservedRequest()
        task = asyncio.create_task(self.send("mixed.decoder", text, n, d.mixed_decoder_tokens, cache=False, slot=0, record=rec))
        try:
            if await self._wait_tokens(rec, task, 3):
                for jt, jn in joiners:
                    await self.send("mixed.joiner", jt, jn, 1, cache=False, slot=self.slots - 1)
                    if not await self._wait_tokens(rec, task, len(rec.content_times_s) + 3):
                        self.warnings.append("mixed phase: the decoding request ended before every prompt had joined it")
                        break
        finally:
            await task
        await self.pause()

    async def extension(self, d: ProbeDesign) -> None:
        for rep in range(d.extension_repeats):
            base, n = await self.prompts.make(d.base_tokens, f"extension/{rep}")
            await self.send("extension.base", base, n, 1, cache=True, slot=0)
            await self.pause()
            longer = base + " " + self.prompts.words(d.extension_tokens, f"extension/{rep}/more")
            await self.send("extension", longer, await self.prompts.count(longer), 1, cache=True, slot=0)
            await self.pause()

    async def restore(self, d: ProbeDesign) -> None:
        for rep in range(d.restore_repeats):
            base, n = await self.prompts.make(d.base_tokens, f"restore/{rep}")
            fills = [await self.prompts.make(d.fill_tokens, f"restore/{rep}/fill/{i}") for i in range(self.slots)]
            longer = base + " " + self.prompts.words(d.extension_tokens, f"restore/{rep}/more")
            longer_n = await self.prompts.count(longer)
            await self.send("restore.base", base, n, 1, cache=True, slot=0)
            await self.pause()
            await asyncio.gather(*(self.send("restore.fill", t, m, 2, cache=True, slot=i) for i, (t, m) in enumerate(fills)))
            await self.pause()
            await self.send("restore", longer, longer_n, 1, cache=True, slot=0)
            await self.pause()

    async def run(self, budget_s: float) -> None:
        estimates = self.estimates = await self.warm_up()
        d = self.design = plan_design(
            **estimates, parallel=self.slots, max_prompt_tokens=self.max_prompt_tokens, budget_s=max(self.left_s(), 0.0),
            ubatch_tokens=self.ubatch, extension="extension" not in self.unavailable, restore="restore" not in self.unavailable,
        )
        if d.planned_s > self.left_s():
            self.warnings.append(
                f"the smallest design is planned to take {d.planned_s:.0f} s, more than the {budget_s:.0f} s budget allows"
            )
        if "mixed" in self.unavailable:
            d = self.design = attrs.evolve(d, mixed_joiner_lengths=())
        await self.isolated(d)
        await self.decode(d)
        optional = [("mixed", bool(d.mixed_joiner_lengths), self.mixed), ("extension", d.extension_repeats > 0, self.extension),
                    ("restore", d.restore_repeats > 0, self.restore)]
        for name, planned, phase in optional:
            if not planned:
                continue
            need = d.phase_s.get(name, 0.0)
            if need > self.left_s():
                self.skipped[name] = f"the budget ran out ({need:.1f} s planned, {max(self.left_s(), 0.0):.1f} s left)"
                self.warnings.append(f"{name} phase skipped: {self.skipped[name]}")
                continue
            await phase(d)


async def run_probe_async(
    url: str,
    out: Path | str,
    *,
    model: str | None = None,
    api: str = "completions",
    api_key: str | None = None,
    server_type: str | None = None,
    server_config: Path | str | Mapping[str, Any] | None = None,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    parallel: int | None = None,
    seed: int | None = None,
    timeout_s: float | None = None,
) -> ProbeResult:
    """:func:`run_probe` as a coroutine, on the running event loop."""
    if api not in ("chat", "completions"):
        raise ValueError(f"api must be chat or completions, got {api!r}")
    if not (isinstance(max_seconds, (int, float)) and math.isfinite(max_seconds) and max_seconds > 0):
        raise ValueError(f"max_seconds must be a number > 0, got {max_seconds!r}")
    if parallel is not None and (isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1):
        raise ValueError(f"parallel must be a whole number >= 1, got {parallel!r}")
    server_cfg = load_server_config(server_config)
    kind = resolve_server_type(server_type, server_cfg)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    salt = str(seed) if seed is not None else os.urandom(6).hex()
    started = time.perf_counter()
    deadline = started + float(max_seconds)
    async with OpenAIClient(url, api_key=api_key, model=model, timeout_s=timeout_s or max(float(max_seconds), 60.0)) as client:
        header: dict[str, Any] = {"mode": "real", "server_url": url, "api": api}
        header["model"] = await client.default_model()
        blocks = await describe_server(client, server_type=kind, config=server_cfg, model=header["model"], model_discovered=model is None)
        slots = parallel or _slots(blocks["server"])
        if slots is None:
            raise ProbeError(f"the {kind} server's description gives no slot count (n_parallel, max_num_seqs): give parallel (--parallel N)")
        unavailable = _unavailable(blocks["server"], kind, slots)
        pin = kind == "llamacpp"  # the one server whose request body names a slot (id_slot)
        served = _slots(blocks["server"])
        if pin and served is not None and slots > served:
            raise ProbeError(f"parallel {slots} exceeds the llama.cpp server's {served} slots (n_parallel): "
                             f"the probe pins requests to slots 0..{slots - 1}")
        prompts = _Prompts(client, api, salt)
        await prompts.setup()
        header.update(
            warm_up_requests=WARM_UP_REQUESTS,
            load={"stream": True, "concurrency": None, "timeout_s": client.timeout_s, "retries": 0, "ignore_eos": True,
                  "closed_loop_sessions": False},
            prompts={"source": "synthetic", "token_rule": "tokenize" if prompts.tokenize else "words"},
            prefix_groups={},
            probe={"budget_s": float(max_seconds), "parallel": slots, "seed": salt, "skipped": unavailable,
                   "pinned_slots": dict(PINNED_SLOTS) if pin else None},
            **blocks,
        )
        empty = pd.DataFrame({"arrival_time_us": [], "input_tokens": [], "output_tokens": []})
        engine = _engine_of(Trace(header, empty))
        context = engine.max_model_len if engine.max_model_len is not None else MAX_PROMPT_TOKENS + 64
        with TraceV2Writer(out / "trace", header=header, extra_columns=OBSERVER_COLUMNS) as writer:
            client.run_start = time.perf_counter()
            run = _Run(
                client, writer, prompts, api=api, model=model, slots=slots, cache_field=kind == "llamacpp", pin_slots=pin,
                max_prompt_tokens=context - ISOLATED_OUTPUT_TOKENS - 8, ubatch=engine.ubatch_tokens,
                unavailable=unavailable, deadline=deadline,
            )
            await run.run(float(max_seconds))
            duration = client.now()
    try:
        result = probe_estimate(out / "trace", parallel=slots)
    except ProbeError as exc:
        raise ProbeError(f"{exc} (the probe's requests are in {out / 'trace.csv'})") from None
    statistics = {
        **result.statistics,
        "budget_s": float(max_seconds),
        "duration_s": duration,
        "elapsed_s": time.perf_counter() - started,
        "skipped": run.skipped,
        "warm_up": run.estimates,
        "design": attrs.asdict(run.design) if run.design is not None else None,
    }
    result = attrs.evolve(result, warnings=[*run.warnings, *result.warnings], statistics=statistics)
    write_probe_profile(result, out / "profile.yaml")
    return result


def run_probe(
    url: str,
    out: Path | str,
    *,
    model: str | None = None,
    api: str = "completions",
    api_key: str | None = None,
    server_type: str | None = None,
    server_config: Path | str | Mapping[str, Any] | None = None,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    parallel: int | None = None,
    seed: int | None = None,
    timeout_s: float | None = None,
    loop: str = "auto",
) -> ProbeResult:
    """Probe the server at *url* (module docstring) and write ``trace.yaml``, ``trace.csv``
    and ``profile.yaml`` in *out*.

    Parameters
    ----------
    url
        The server's base URL (``http://host:port``, without ``/v1``).
    out
        The output directory.
    model
        Model name to request (default: the first of the server's ``/v1/models``).
    api
        ``completions`` (``/v1/completions``, the default) or ``chat``.
    api_key
        Sent as a bearer token when given.
    server_type, server_config
        What the server is, as ``simpy-llm observe`` takes them
        (:mod:`simpy_llm.observe.server_info`): the header's ``server`` block, from which the
        engine's prompt steps and passes are known.
    max_seconds
        The time budget: the design is sized to it after the warm-up, and an optional phase
        (mixed, extension, restore) that would overrun it is skipped.
    parallel
        The server's slots: batch sizes ``1 .. parallel`` are measured (default: the server
        block's ``n_parallel`` or ``max_num_seqs``; on llama.cpp at most ``n_parallel``, as the
        requests are pinned to slots ``0 .. parallel - 1``).
    seed
        Seeds the prompts' words (default: drawn afresh, so that a repeated probe finds
        nothing of an earlier one in the server's prompt cache); written to the header.
    timeout_s
        Per-request limit (default: *max_seconds*, at least 60 s).
    loop
        ``auto`` (uvloop when installed), ``uvloop`` or ``asyncio``.

    Raises
    ------
    ProbeError
        No slot count, more slots than a llama.cpp server has, a warm-up request failed, or the
        trace gives no profile.
    ScenarioError
        The server config is bad.
    ValueError
        A bad argument.
    """
    coro: Coroutine[Any, Any, ProbeResult] = run_probe_async(
        url, out, model=model, api=api, api_key=api_key, server_type=server_type, server_config=server_config,
        max_seconds=max_seconds, parallel=parallel, seed=seed, timeout_s=timeout_s,
    )
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run_loop(coro, loop=loop)
    # Called from a running event loop (a Jupyter kernel's): a thread and a loop of its own.
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="probe") as pool:
        return pool.submit(run_loop, coro, loop=loop).result()
