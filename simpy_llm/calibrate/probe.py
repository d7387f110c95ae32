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
    Two requests (a 16-token prompt with 8 output tokens, a prompt of 256 tokens with one)
    that also size the design: their TTFTs and token gaps estimate the time per prompt
    token and per decode step, from which the longest isolated prompt, the decode
    phase's output length and the other phases' sizes are chosen to fit the budget
    (:func:`plan_design`). Left out of the estimates (the header's ``warm_up_requests``).
``isolated``
    Prompts across lengths (4 tokens, then 7 lengths log-spaced from 32 to at most 1,600
    tokens, the slot's context and the budget permitting), each twice, one at a time,
    with the prompt cache off (``cache_prompt: false`` for llama.cpp) and 2 output tokens.
    The engine cuts a prompt of ``P`` tokens into steps (``prefill_breaks``) and forward
    passes (``ubatch_tokens``) as :func:`~simpy_llm.calibrate.fit._prompt_chunks` does, so
    on an idle server ``TTFT = alpha0 + RTT + (prefill_step + prefill_only_step) x passes
    + prefill_token x P + prefill_pair x pairs(P)`` (``pairs`` as
    :func:`~simpy_llm.calibrate.fit._chunk_pairs`): an ordinary least-squares fit with
    standard errors. Each one's decode gap, a step of one decoder whose context is its
    prompt (4 to 1,600 tokens), gives ``decode_context`` (the slope of gap on context,
    least squares).
``decode.N``
    For each batch size ``N = 1 .. parallel``, ``N`` requests with 8-token prompts and
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
emulated server records it as the client) and, for llama.cpp, ``cache_prompt``.

**Conventions.** Tokens of different requests less than a quarter of the median token gap
apart end the same engine step. The decoders' context of a pure-decode step is counted
as the simulator's engine counts it, at the start of the stretch of identical steps (when
the batch last changed): a real server's grows by one token per decoder and step, a
difference of ``decode_context`` x decoders x steps, well under a percent of a step on
the servers measured. Not every coefficient is identifiable on every engine: without
prompt breaks or passes (a vLLM-like engine computes any probe prompt in one step) every
isolated prompt pays one fixed cost, so ``alpha0`` stays at its default 0 and the whole
fixed cost is ``prefill_only_step``; without the mixed phase ``prefill_step`` is the
per-pass cost and ``prefill_only_step`` its default 0. Coefficients are not negative: a
least-squares term that comes out below 0 is dropped from the fit and held at 0, and any
other estimate below 0 is held at 0, each with a warning; intervals are clipped at 0.
``alpha0`` is the intercept less the trace header's measured round trip
(``network.measured_rtt_ms``), which ``calibrate compare`` adds back to every simulated
TTFT. A difference of two estimates (``prefill_only_step``) takes the root sum of their
squared standard errors and the smaller degrees of freedom.

Outputs (:func:`run_probe`): ``trace.yaml`` / ``trace.csv`` in *out* (a trace v2 with the
observer's columns, written as requests end, and a header with the server, hardware and
network blocks as ``simpy-llm observe --server-type`` writes them, plus ``probe``: budget,
slots, seed, phases skipped), and ``profile.yaml`` (:meth:`ProbeResult.profile`):
``latency_model`` with every coefficient, ``server``, and ``fit`` with ``method: probe``,
``trace``, ``intervals``, ``sources`` (``probe`` for measured, ``default`` otherwise),
``ranges`` (what the probe covered), ``warnings`` and the phases' statistics (``probe``).
:func:`probe_estimate` recomputes the result from a probe's trace alone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import math
import os
import time
from collections.abc import Awaitable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import numpy as np
import pandas as pd

from simpy_llm.calibrate.compare import observed_latencies
from simpy_llm.calibrate.fit import (
    _PLACEHOLDER,
    _chunk_pairs,
    _passes,
    _plain,
    _prompt_chunks,
)
from simpy_llm.calibrate.scenario import PROFILE_VERSION, scenario_from_trace
from simpy_llm.config import EngineConfig
from simpy_llm.observe.client import OpenAIClient, RequestRecord, RequestSpec
from simpy_llm.observe.loadgen import OBSERVER_COLUMNS, LoadRequest, record_row
from simpy_llm.observe.prompts import synthetic_prompt
from simpy_llm.observe.runner import run as run_loop
from simpy_llm.observe.server_info import (
    describe_server,
    load_server_config,
    resolve_server_type,
)
from simpy_llm.serving.batch_table import BatchTableLatency
from simpy_llm.workload.traces import (
    Trace,
    TraceV2Writer,
    read_trace_v2,
    trace_v2_paths,
)

__all__ = [
    "COEFFICIENTS",
    "DEFAULT_MAX_SECONDS",
    "ProbeDesign",
    "ProbeError",
    "ProbeResult",
    "median_interval",
    "plan_design",
    "probe_estimate",
    "run_probe",
    "run_probe_async",
    "write_probe_profile",
]

DEFAULT_MAX_SECONDS = 75.0
"""The probe's default time budget, s."""

COEFFICIENTS = (
    "decode_step_us", "prefill_step_us", "prefill_token_us", "prefill_only_step_us",
    "alpha0_us", "cache_restore_us", "decode_context_us", "prefill_pair_us",
)
"""The ``batch_table`` coefficients a profile's ``fit.intervals`` and ``fit.sources`` name."""

DEFAULTS_US = {"prefill_pair_us": 0.0, "decode_context_us": 0.0, "cache_restore_us": 0.0, "alpha0_us": 0.0, "prefill_only_step_us": 0.0}
"""The documented defaults of the coefficients no data pins (``docs/calibration.md``)."""

LEVEL = 0.95
"""Confidence level of every interval."""

WARM_UP_REQUESTS = 2
"""Requests sent first and left out of the estimates."""

MAX_PROMPT_TOKENS = 1600
"""Longest isolated prompt (less when the slot's context or the budget is shorter)."""

ISOLATED_OUTPUT_TOKENS = 2
"""Output tokens of an isolated prompt: its decode gap, at a context of its prompt, measures ``decode_context``."""

ALL_SIZES_UP_TO = 8
"""Every batch size up to this many slots is measured; above, doubling sizes."""

_SCALES = (1.0, 0.8, 0.6, 0.45, 0.33, 0.25, 0.18)
"""The design sizes :func:`plan_design` tries, largest first."""

_SAFETY = 1.2
"""Planned durations are the cost model's times this (slower steps, the client's own turns)."""

_POLL_S = 0.005
"""How often the mixed phase looks at the decoding request's tokens, s."""


class ProbeError(ValueError):
    """A probe that cannot run or whose trace gives no profile (the message says why)."""


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
    ``n`` decoders at most ``n x step_s``; the sum is multiplied by :data:`_SAFETY`.

    Examples
    --------
    >>> d = plan_design(short_ttft_s=0.05, token_s=0.004, step_s=0.02, parallel=4, max_prompt_tokens=2000, budget_s=80)
    >>> d.scale, d.isolated_lengths, d.decode_sizes, round(d.planned_s, 1)
    (1.0, (4, 32, 61, 118, 226, 434, 834, 1600), (1, 2, 3, 4), 53.3)
    >>> plan_design(short_ttft_s=0.05, token_s=0.004, step_s=0.02, parallel=4, max_prompt_tokens=2000, budget_s=40).scale
    0.6
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


# ----------------------------------------------------------------------------- statistics


def median_interval(values: Sequence[float] | np.ndarray, level: float = LEVEL) -> tuple[float, float | None, float | None]:
    """The median of *values* and its distribution-free interval at *level*: the order
    statistics ``x(k)`` and ``x(n + 1 - k)`` with the largest ``k`` such that a
    Binomial(n, 1/2) falls below ``k`` with probability at most ``(1 - level) / 2``;
    no interval (``None``) when even the extremes cover less than *level* (fewer than 6
    values at 95 %).

    >>> median_interval([5, 1, 4, 2, 3, 6, 7])
    (4.0, 1.0, 7.0)
    >>> median_interval([1.0, 2.0, 3.0])
    (2.0, None, None)
    """
    from scipy import stats

    x = np.sort(np.asarray(values, dtype=float))
    n = x.size
    if n == 0:
        raise ValueError("no values")
    med = float(np.median(x))
    alpha = (1.0 - level) / 2
    k = 0
    while k + 1 <= n // 2 and stats.binom.cdf(k, n, 0.5) <= alpha:
        k += 1
    if k == 0:
        return med, None, None
    return med, float(x[k - 1]), float(x[n - k])


@attrs.frozen
class _Estimate:
    """A coefficient's value (s, or s per unit) with its standard error and degrees of freedom,
    or an interval given directly."""

    value: float
    se: float | None = None
    df: float | None = None
    interval: tuple[float, float] | None = None

    def bounds(self) -> tuple[float, float] | None:
        if self.interval is not None:
            return self.interval
        if self.se is None or self.df is None or self.df < 1 or not math.isfinite(self.se):
            return None
        from scipy import stats

        half = float(stats.t.ppf(0.5 + LEVEL / 2, self.df)) * self.se
        return self.value - half, self.value + half


def _ols(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Least squares of *y* on the columns of *x*: coefficients, their covariance
    (residual variance x (X'X)^-1) and the residual degrees of freedom."""
    scale = np.maximum(np.abs(x).max(axis=0), 1e-300)
    xs = x / scale
    beta_s, *_ = np.linalg.lstsq(xs, y, rcond=None)
    df = x.shape[0] - x.shape[1]
    resid = y - xs @ beta_s
    sigma2 = float(resid @ resid) / df if df > 0 else float("nan")
    cov_s = sigma2 * np.linalg.pinv(xs.T @ xs)
    return beta_s / scale, cov_s / np.outer(scale, scale), df


# ----------------------------------------------------------------------------- result


@attrs.frozen(kw_only=True)
class ProbeResult:
    """A probe's ``batch_table`` coefficients, their intervals and where they came from."""

    params: dict[str, Any]
    """Every ``batch_table`` coefficient, µs (``decode_step_us`` a list)."""
    intervals: dict[str, Any]
    """Each coefficient's 95 % interval ``[low, high]`` in µs, or None when not measured."""
    sources: dict[str, Any]
    """``probe`` (measured) or ``default`` per coefficient (per entry of ``decode_step_us``)."""
    ranges: dict[str, list[float]]
    """What the probe covered: ``[min, max]`` of prompt, uncached prompt and output tokens,
    decoders, concurrency and cached fraction."""
    warnings: list[str]
    """Why coefficients are at their defaults, phases skipped, estimates held at 0, ..."""
    statistics: dict[str, Any]
    """Samples per phase, the cached-prefix figures, the design, the duration."""
    trace: str
    """The probe's trace (CSV path)."""
    server: dict[str, Any] | None
    """The trace header's server block."""

    def model(self) -> BatchTableLatency:
        """The latency model object."""
        return BatchTableLatency(**self.params)

    def profile(self) -> dict[str, Any]:
        """The profile file's content (module docstring)."""
        fit = {
            "method": "probe",
            "trace": self.trace,
            "intervals": self.intervals,
            "sources": self.sources,
            "ranges": self.ranges,
            "warnings": list(self.warnings),
            "probe": self.statistics,
        }
        return {
            "profile_version": PROFILE_VERSION,
            "latency_model": {"kind": "batch_table", "params": _plain(self.params)},
            "server": _plain(self.server),
            "fit": _plain(fit),
        }


def write_probe_profile(result: ProbeResult, path: Path | str) -> Path:
    """Write *result* as a profile YAML file; returns its path."""
    import yaml

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "# A probed latency profile (simpy-llm calibrate probe); use it as latency_model: {profile: THIS_FILE}\n"
    path.write_text(text + yaml.safe_dump(result.profile(), sort_keys=False), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- estimation


class _Requests:
    """The probe trace's ok streamed requests by phase: prompt, cached and output tokens,
    send and token times (s)."""

    def __init__(self, trace: Trace) -> None:
        obs, gaps = observed_latencies(trace)
        frame = trace.frame
        clients = dict(zip(frame["request_id"].to_numpy(dtype=np.int64), frame["client_id"].astype(str), strict=True))
        warm = int(trace.header.get("warm_up_requests") or 0)
        first_ids = set(sorted(frame["request_id"].to_numpy(dtype=np.int64))[:warm])
        self.rows: list[dict[str, Any]] = []
        for r in obs.itertuples(index=False):
            rid = int(r.request_id)
            phase = clients.get(rid, "")
            if rid in first_ids or phase == "warm_up" or r.status != "ok" or not r.streaming or not np.isfinite(r.ttft_s):
                continue
            g = gaps.get(rid, np.empty(0))
            first = float(r.send_s + r.ttft_s)
            times = first + np.concatenate([[0.0], np.cumsum(g)])
            cached = int(r.cached_tokens) if np.isfinite(r.cached_tokens) else None
            self.rows.append({
                "id": rid, "phase": phase, "prompt": int(r.input_tokens), "cached": cached,
                "output": int(r.output_tokens), "send": float(r.send_s), "ttft": float(r.ttft_s), "times": times,
            })
        self.rows.sort(key=lambda row: row["id"])

    def phase(self, name: str) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["phase"] == name]

    def phases(self, prefix: str) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for r in self.rows:
            if r["phase"].startswith(prefix):
                out.setdefault(r["phase"], []).append(r)
        return out


class _Engine:
    """How the recording engine cuts a prompt: steps (breaks, budget) and passes."""

    def __init__(self, engine: EngineConfig) -> None:
        self.breaks = tuple(engine.prefill_breaks)
        self.budget = engine.max_num_batched_tokens
        self.ubatch = engine.ubatch_tokens

    def chunks(self, uncached: int) -> list[int]:
        return _prompt_chunks(int(uncached), self.breaks, self.budget)

    def row(self, prompt: int, cached: int) -> tuple[float, float, float]:
        """(passes of an idle server, uncached tokens, attention pairs) of a prompt."""
        u = max(prompt - cached, 1)
        chunks = self.chunks(u)
        passes = sum(_passes(0, c, self.ubatch, [1.0])[1] for c in chunks)
        return float(passes), float(u), float(sum(_chunk_pairs(chunks, prompt - u)))


def _engine_of(trace: Trace) -> EngineConfig:
    """The engine the trace header's server block describes (as ``calibrate fit`` builds it)."""
    scenario = scenario_from_trace(trace, profile={"latency_model": _PLACEHOLDER}, trace_csv="probe-trace.csv")
    return scenario.serving.groups()[0].engine


class _Estimator:
    """Every coefficient from a probe trace (module docstring), in seconds."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.req = _Requests(trace)
        self.engine = _Engine(_engine_of(trace))
        network = trace.header.get("network") or {}
        rtt_ms = network.get("measured_rtt_ms") if isinstance(network, Mapping) else None
        self.rtt_s = float(rtt_ms) / 1e3 if isinstance(rtt_ms, (int, float)) else 0.0
        self.warnings: list[str] = []
        self.stats: dict[str, Any] = {}
        self.est: dict[str, _Estimate] = {}
        gaps = np.concatenate([np.diff(r["times"]) for r in self.req.rows if len(r["times"]) > 1] or [np.empty(0)])
        self.eps = 0.25 * float(np.median(gaps)) if gaps.size else 0.001
        """Tokens of different requests less than this apart end the same step (a quarter of the
        median gap: steps are at least a decode step apart, and a loaded client reads the tokens
        of one step several milliseconds apart), s."""

    # --- isolated prompts: alpha0, per-pass cost, prefill_token, prefill_pair; decode_context
    def isolated(self) -> None:
        rows = self.req.phase("isolated")
        if len(rows) < 3:
            raise ProbeError(f"the trace has {len(rows)} answered isolated prompts: at least 3 are needed (more than the terms fitted)")
        design = np.array([[1.0, *self.engine.row(r["prompt"], r["cached"] or 0)] for r in rows])
        y = np.array([r["ttft"] for r in rows])
        names = ["intercept", "passes", "prefill_token", "prefill_pair"]
        keep = [0, 1, 2, 3]
        if np.ptp(design[:, 1]) == 0:
            keep.remove(1)
            self.warnings.append(
                "every isolated prompt took the same number of passes on this engine: alpha0 and the prompt-only "
                "step cost cannot be told apart (alpha0 at its default 0, the whole fixed cost in prefill_only_step)"
            )
        held: dict[int, _Estimate] = {}  # terms that came out negative: 0, with the interval they had
        while True:
            if len(rows) <= len(keep):
                raise ProbeError(f"{len(rows)} isolated prompts cannot fit {len(keep)} terms")
            beta, cov, df = _ols(design[:, keep], y)
            negative = [k for k, b in zip(keep, beta, strict=True) if k in (1, 3) and b < 0]
            if not negative:
                break
            k = negative[-1]
            i = keep.index(k)
            b = _Estimate(float(beta[i]), float(np.sqrt(max(cov[i, i], 0.0))), df).bounds()
            held[k] = _Estimate(0.0, interval=None if b is None else (0.0, max(b[1], 0.0)))
            keep.remove(k)
            self.warnings.append(f"the isolated fit gave a negative {names[k]} term ({beta[i]:.3g} s): held at 0")
        fitted = dict(zip(keep, beta, strict=True))
        se = dict(zip(keep, np.sqrt(np.maximum(np.diag(cov), 0.0)), strict=True))
        self.iso = {"keep": keep, "beta": beta, "cov": cov, "df": df}
        self.est["intercept"] = _Estimate(fitted[0], se[0], df)
        if 1 in fitted or 1 in held:
            self.est["pass"] = _Estimate(fitted[1], se[1], df) if 1 in fitted else held[1]
        self.est["prefill_token"] = _Estimate(fitted[2], se[2], df)
        if 3 in fitted or 3 in held:
            self.est["prefill_pair"] = _Estimate(fitted[3], se[3], df) if 3 in fitted else held[3]
        resid = y - design[:, keep] @ beta
        scatter = float(np.sqrt(np.mean(resid**2)))
        self.stats["isolated"] = {
            "requests": len(rows), "prompt_tokens": [min(r["prompt"] for r in rows), max(r["prompt"] for r in rows)],
            "residual_ms": scatter * 1e3,
        }
        if scatter > 0.1 * float(np.mean(y)):
            self.warnings.append(
                f"the isolated prompts' TTFTs scatter {scatter * 1e3:.3g} ms around the fit ({scatter / np.mean(y):.0%} of their "
                "mean): the server's timing was disturbed (other work on its machine?), the intervals are wide"
            )
        self._decode_context(rows)

    def predict_ttft(self, prompt: int, cached: int) -> tuple[float, float]:
        """The isolated fit's TTFT of a fresh start of the uncached part of a prompt, and its
        variance from the coefficients' covariance."""
        x_full = np.array([1.0, *self.engine.row(prompt, cached)])
        x = x_full[self.iso["keep"]]
        return float(x @ self.iso["beta"]), float(x @ self.iso["cov"] @ x)

    def _decode_context(self, rows: list[dict[str, Any]]) -> None:
        """``decode_context`` from each isolated request's one decode gap: a step of one
        decoder whose context is its prompt."""
        ctx = [r["prompt"] for r in rows if len(r["times"]) > 1]
        gap = [r["times"][1] - r["times"][0] for r in rows if len(r["times"]) > 1]
        self.stats["isolated"]["decode_gaps"] = len(gap)
        if len(gap) < 3 or np.ptp(ctx) == 0:
            self.warnings.append("too few decode gaps at different contexts: decode_context_us at its default 0")
            return
        beta, cov, df = _ols(np.column_stack([np.ones(len(ctx)), ctx]), np.array(gap))
        est = _Estimate(float(beta[1]), float(np.sqrt(max(cov[1, 1], 0.0))), df)
        if est.value < 0:
            self.warnings.append(f"decode gaps did not grow with context ({est.value * 1e6:.3g} µs per token): decode_context_us held at 0")
            b = est.bounds()
            est = _Estimate(0.0, interval=None if b is None else (0.0, max(b[1], 0.0)))
        self.est["decode_context"] = est

    @property
    def dc(self) -> float:
        e = self.est.get("decode_context")
        return e.value if e is not None else 0.0

    def _tokens_before(self, r: dict[str, Any], t: float) -> int:
        return int(np.searchsorted(r["times"], t + self.eps, side="right"))

    # --- decode alone at batch n
    def decode(self) -> None:
        groups = self.req.phases("decode.")
        table: dict[int, tuple[float, float | None, float | None, int]] = {}
        counts: dict[int, int] = {}
        for name, rows in sorted(groups.items(), key=lambda kv: _size(kv[0])):
            streamed = [r for r in rows if len(r["times"]) > 1]
            if not streamed:
                continue
            lo = max(r["times"][0] for r in streamed)
            hi = min(r["times"][-1] for r in streamed)
            n = len(streamed)
            ref = max(streamed, key=lambda r: int(np.count_nonzero((r["times"] >= lo - self.eps) & (r["times"] <= hi + self.eps))))
            # The decoders' context when the batch last changed (the window's start), as the
            # simulator's engine holds it through a stretch of identical decode steps.
            context = sum(r["prompt"] + self._tokens_before(r, lo) - 1 for r in streamed)
            samples = [b - a - self.dc * context for a, b in itertools.pairwise(ref["times"])
                       if a >= lo - self.eps and b <= hi + self.eps]
            counts[n] = counts.get(n, 0) + len(samples)
            if len(samples) < 2:
                self.warnings.append(f"{name}: {len(samples)} pure-decode gaps with {n} decoders: too few to measure D({n})")
                continue
            med, low, high = median_interval(samples)
            if low is None:
                self.warnings.append(f"{name}: {len(samples)} pure-decode gaps give D({n}) but no 95 % interval (6 are needed)")
            table[n] = (med, low, high, len(samples))
            if len(rows) != _size(name):
                self.warnings.append(f"{name}: {len(rows)} of {_size(name)} requests answered: its gaps count as D({n})")
        if not table:
            raise ProbeError("the trace has no pure-decode steps (decode phase): cannot write a decode table")
        self.decode_table = table
        self.stats["decode"] = {"gaps": {int(n): counts[n] for n in sorted(counts)}}

    # --- prompts joining a decoder: prefill_step
    def mixed(self) -> None:
        decoders = self.req.phase("mixed.decoder")
        joiners = self.req.phase("mixed.joiner")
        if not decoders or not joiners:
            return
        a = decoders[0]
        t = a["times"]
        if len(t) < 4:
            self.warnings.append("mixed phase: the decoding request has too few tokens")
            return
        mixed_gaps: dict[int, tuple[int, float]] = {}  # gap index k (t[k-1] -> t[k]) -> (chunk tokens, pairs)
        for b in joiners:
            chunks = self.engine.chunks(max(b["prompt"] - (b["cached"] or 0), 1))
            pairs = _chunk_pairs(chunks, b["prompt"] - sum(chunks))
            f = b["times"][0]
            j = int(np.argmin(np.abs(t - f)))
            first = j - len(chunks) + 1
            if abs(t[j] - f) > self.eps or first < 1 or t[first - 1] < b["send"] - self.eps:
                self.warnings.append(f"mixed phase: joiner {b['id']}'s prompt steps cannot be placed among the decoder's tokens")
                continue
            if self.engine.ubatch is not None and max(chunks) + 1 > self.engine.ubatch:
                self.warnings.append(f"mixed phase: joiner {b['id']}'s prompt needs several passes: left out")
                continue
            for i, (c, q) in enumerate(zip(chunks, pairs, strict=True)):
                mixed_gaps[first + i] = (c, q)
        # The decoder's context of gap k (t[k-1] -> t[k]) is prompt + k - 1 tokens; a mixed step
        # counts it afresh, a pure one as it was when the batch last changed (the engine's rule).
        context, start = [], 1
        for k in range(1, len(t)):
            context.append(a["prompt"] + (k if k in mixed_gaps else start) - 1)
            if k in mixed_gaps:
                start = k + 1
        corrected = np.diff(t) - self.dc * np.array(context)
        pure = [corrected[k - 1] for k in range(1, len(t)) if k not in mixed_gaps]
        if len(pure) < 3 or not mixed_gaps:
            self.warnings.append("mixed phase: too few pure or mixed steps of the decoding request")
            return
        base = float(np.median(pure))
        var_base = float(np.var(pure, ddof=1)) * math.pi / (2 * len(pure))
        tok = self.est["prefill_token"].value
        pair = self.est["prefill_pair"].value if "prefill_pair" in self.est else 0.0
        y, cs, qs = [], [], []
        for k, (c, q) in sorted(mixed_gaps.items()):
            y.append(corrected[k - 1] - base - tok * c - pair * q)
            cs.append(c)
            qs.append(q)
        m = len(y)
        value = float(np.mean(y))
        keep = self.iso["keep"]
        g = np.zeros(len(keep))
        if 2 in keep:
            g[keep.index(2)] = float(np.mean(cs))
        if 3 in keep:
            g[keep.index(3)] = float(np.mean(qs))
        var = (float(np.var(y, ddof=1)) / m if m > 1 else float("nan")) + var_base + float(g @ self.iso["cov"] @ g)
        self.stats["mixed"] = {"joiners": len(joiners), "mixed_steps": m, "pure_steps": len(pure), "decoder_step_ms": base * 1e3}
        est = _Estimate(value, math.sqrt(var) if m > 1 else None, m - 1)
        if value < 0:
            self.warnings.append(f"mixed phase: a prompt step cost {value * 1e6:.3g} µs less than the decode step: prefill_step held at 0")
            b = est.bounds()
            est = _Estimate(0.0, interval=None if b is None else (0.0, max(b[1], 0.0)))
        self.est["prefill_step"] = est

    # --- a cached prefix: in its slot (extension) and restored from host memory (restore)
    def cached_start(self, phase: str) -> _Estimate | None:
        rows = self.req.phase(phase)
        if not rows:
            return None
        residuals, variances = [], []
        for r in rows:
            if r["cached"] is None:
                self.warnings.append(f"{phase}: the server did not report cached tokens: the request is left out")
                continue
            if r["cached"] <= 1:
                self.warnings.append(f"{phase}: request {r['id']} found {r['cached']} cached tokens (its prefix was not kept): left out")
                continue
            pred, var = self.predict_ttft(r["prompt"], r["cached"])
            residuals.append(r["ttft"] - pred)
            variances.append(var)
        self.stats[phase] = {"requests": len(rows), "samples": len(residuals),
                             "cached_tokens": [r["cached"] for r in rows if r["cached"] is not None]}
        if not residuals:
            return None
        m = len(residuals)
        value = float(np.mean(residuals))
        sigma2 = float(np.var(residuals, ddof=1)) if m > 1 else self._iso_sigma2()
        df = m - 1 if m > 1 else self.iso["df"]
        se = math.sqrt(sigma2 / m + float(np.mean(variances)))
        self.stats[phase]["extra_us"] = value * 1e6
        return _Estimate(value, se, df)

    def _iso_sigma2(self) -> float:
        rows = self.req.phase("isolated")
        x = np.array([[1.0, *self.engine.row(r["prompt"], r["cached"] or 0)] for r in rows])[:, self.iso["keep"]]
        resid = np.array([r["ttft"] for r in rows]) - x @ self.iso["beta"]
        return float(resid @ resid) / max(self.iso["df"], 1)

    # --- assembling the profile
    def run(self, parallel: int | None) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        self.isolated()
        self.decode()
        self.mixed()
        ext = self.cached_start("extension")
        res = self.cached_start("restore")
        params: dict[str, Any] = {}
        intervals: dict[str, Any] = {}
        sources: dict[str, Any] = {}

        def put(name: str, est: _Estimate | None) -> None:
            if est is None:
                params[name], intervals[name], sources[name] = DEFAULTS_US[name], None, "default"
                return
            value = est.value
            if value < 0:
                self.warnings.append(f"{name} came out at {value * 1e6:.4g} µs: held at 0")
                value = 0.0
            params[name] = float(value * 1e6)
            b = est.bounds()
            intervals[name] = None if b is None else [float(max(b[0], 0.0) * 1e6), float(max(b[1], 0.0) * 1e6)]
            sources[name] = "probe"

        size = int(parallel or max(self.decode_table))
        table, table_iv, table_src = _decode_table(self.decode_table, size)
        if any(n not in self.decode_table for n in range(1, size + 1)):
            missing = [n for n in range(1, size + 1) if n not in self.decode_table]
            self.warnings.append(f"D(n) for n = {_ranges_text(missing)} interpolated between the measured sizes, flat beyond "
                                 "them (no interval)")
        params["decode_step_us"] = [float(v * 1e6) for v in table]
        intervals["decode_step_us"] = [None if iv is None else [float(iv[0] * 1e6), float(iv[1] * 1e6)] for iv in table_iv]
        sources["decode_step_us"] = table_src

        per_pass = self.est.get("pass")
        intercept = self.est["intercept"]
        step = self.est.get("prefill_step")
        put("prefill_token_us", self.est["prefill_token"])
        put("prefill_pair_us", self.est.get("prefill_pair"))
        put("decode_context_us", self.est.get("decode_context"))
        # With passes that vary, the intercept is alpha0 (less the round trip) and the per-pass
        # cost is prefill_step + prefill_only_step; with one pass per prompt, the intercept is
        # the whole fixed cost and alpha0 keeps its default (module docstring).
        fixed = _Estimate(intercept.value - self.rtt_s, intercept.se, intercept.df)
        if per_pass is not None:
            put("alpha0_us", fixed)
        else:
            put("alpha0_us", None)
            per_pass = fixed
        if step is None:
            put("prefill_step_us", per_pass)
            put("prefill_only_step_us", None)
            self.warnings.append("no prompt joined a decoding request: prefill_step_us is the whole fixed cost of a "
                                 "prompt step on an idle server, prefill_only_step_us at its default 0")
        else:
            put("prefill_step_us", step)
            put("prefill_only_step_us", _difference(per_pass, step))
        restore = res if res is not None else ext
        put("cache_restore_us", restore)
        if restore is None:
            reasons = self.trace.header.get("probe", {}).get("skipped", {}) if isinstance(self.trace.header.get("probe"), Mapping) else {}
            why = "; ".join(f"{k}: {v}" for k, v in reasons.items()) if reasons else "no cached-prefix samples"
            self.warnings.append(f"cache_restore_us at its default 0 ({why})")
        self.stats["cached_prefix_us"] = {
            "extension": None if ext is None else _interval_dict(ext),
            "restore": None if res is None else _interval_dict(res),
            "cache_restore_from": "restore" if res is not None else ("extension" if ext is not None else None),
        }
        if params["prefill_step_us"] == 0 and params["prefill_token_us"] == 0:
            raise ProbeError("the probe measured no time for a prompt step: prefill_step_us and prefill_token_us are both 0")
        return {k: params[k] for k in COEFFICIENTS}, {k: intervals[k] for k in COEFFICIENTS}, {k: sources[k] for k in COEFFICIENTS}

    def ranges(self) -> dict[str, list[float]]:
        rows = self.req.rows
        prompts = [r["prompt"] for r in rows]
        uncached = [r["prompt"] - (r["cached"] or 0) for r in rows]
        outputs = [r["output"] for r in rows]
        cached = [(r["cached"] or 0) / r["prompt"] for r in rows if r["prompt"] > 0]
        decoders = [1, *self.decode_table]
        spans = sorted([(r["send"], 1) for r in rows] + [(r["times"][-1], -1) for r in rows], key=lambda e: (e[0], e[1]))
        busy, most = 0, 0
        for _, step in spans:
            busy += step
            most = max(most, busy)
        return {
            "prompt_tokens": [min(prompts), max(prompts)],
            "uncached_prompt_tokens": [min(uncached), max(uncached)],
            "output_tokens": [min(outputs), max(outputs)],
            "decoders": [min(decoders), max(decoders)],
            "concurrency": [1, max(most, 1)],
            "cached_fraction": [min(cached), max(cached)],
        }


def _native(value: Any) -> Any:
    """*value* with numpy numbers as Python's (mappings and lists recursively).

    >>> _native({"a": [np.int64(2), np.float64(0.5)]})
    {'a': [2, 0.5]}
    """
    if isinstance(value, Mapping):
        return {k: _native(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_native(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _size(name: str) -> int:
    """The batch size a decode group's name gives (``decode.3`` -> 3)."""
    return int(name.split(".", 1)[1])


def _difference(a: _Estimate, b: _Estimate) -> _Estimate:
    """``a - b`` of two independent estimates (the smaller degrees of freedom)."""
    se = math.sqrt(a.se**2 + b.se**2) if a.se is not None and b.se is not None else None
    df = min(x for x in (a.df, b.df) if x is not None) if a.df is not None or b.df is not None else None
    return _Estimate(a.value - b.value, se, df)


def _interval_dict(est: _Estimate) -> dict[str, Any]:
    b = est.bounds()
    return {"value": est.value * 1e6, "interval": None if b is None else [b[0] * 1e6, b[1] * 1e6]}


def _ranges_text(values: list[int]) -> str:
    """Whole numbers in runs.

    >>> _ranges_text([9, 10, 11, 13])
    '9-11, 13'
    """
    out, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            out.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return ", ".join(out)


def _decode_table(
    measured: Mapping[int, tuple[float, float | None, float | None, int]], size: int
) -> tuple[list[float], list[tuple[float, float] | None], list[str]]:
    """``D(1..size)``: the measured medians with their intervals; sizes not measured linearly
    interpolated between the nearest measured ones (flat beyond the ends), without interval."""
    xs = np.array(sorted(measured), dtype=float)
    ys = np.array([measured[int(n)][0] for n in xs])
    table, intervals, sources = [], [], []
    for n in range(1, size + 1):
        if n in measured:
            med, lo, hi, _ = measured[n]
            table.append(float(med))
            intervals.append(None if lo is None or hi is None else (max(lo, 0.0), max(hi, 0.0)))
        else:
            table.append(float(np.interp(n, xs, ys)))
            intervals.append(None)
        sources.append("probe")
    return table, intervals, sources


def probe_estimate(trace: Path | str | Trace, *, parallel: int | None = None) -> ProbeResult:
    """The profile a probe's *trace* gives (module docstring): every ``batch_table``
    coefficient it measured, with its 95 % interval, the rest at their defaults.

    Parameters
    ----------
    trace
        The probe's trace v2 (its directory, CSV or header), or the trace itself.
    parallel
        Entries of the decode table (default: the header's ``probe.parallel``, else the
        largest batch measured).

    Raises
    ------
    ProbeError
        A phase that every profile needs (isolated prompts, pure-decode steps) gave too few samples.
    """
    csv_path = "" if isinstance(trace, Trace) else str(trace_v2_paths(trace)[1])
    if not isinstance(trace, Trace):
        trace = read_trace_v2(trace)
    probe_block = trace.header.get("probe")
    if parallel is None and isinstance(probe_block, Mapping) and isinstance(probe_block.get("parallel"), int):
        parallel = probe_block["parallel"]
    est = _Estimator(trace)
    params, intervals, sources = est.run(parallel)
    server = trace.header.get("server")
    return ProbeResult(
        params=params, intervals=intervals, sources=sources, ranges=_native(est.ranges()), warnings=est.warnings,
        statistics=_native({"rtt_ms": est.rtt_s * 1e3, "tolerance_ms": est.eps * 1e3, **est.stats}),
        trace=csv_path, server=dict(server) if isinstance(server, Mapping) else None,
    )


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
            text = rendered.get("prompt") if isinstance(rendered, Mapping) else None
            if not isinstance(text, str):
                return None
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
        cache_field: bool, max_prompt_tokens: int, ubatch: int | None, unavailable: Mapping[str, str], deadline: float,
    ) -> None:
        self.client = client
        self.writer = writer
        self.prompts = prompts
        self.api = api
        self.model = model
        self.slots = slots
        self.cache_field = cache_field
        self.max_prompt_tokens = max_prompt_tokens
        self.ubatch = ubatch
        self.unavailable = dict(unavailable)
        self.deadline = deadline
        self.warnings: list[str] = []
        self.skipped: dict[str, str] = dict(unavailable)
        self.design: ProbeDesign | None = None
        self.pause_s = 0.02
        self._next_id = 0

    async def send(
        self, phase: str, text: str, tokens: int, max_tokens: int, *, cache: bool | None, record: Any = None
    ) -> Any:
        """Send one streamed request of phase *phase* and write its row, whatever its fate."""
        rid = self._next_id
        self._next_id += 1
        extra: dict[str, Any] = {"ignore_eos": True, "user": f"simpy-llm-probe/{rid}"}
        if cache is not None and self.cache_field:
            extra["cache_prompt"] = cache
        spec = RequestSpec(text, max_tokens, self.api, stream=True, model=self.model, request_id=rid, extra_body=extra)
        rec = record if record is not None else RequestRecord()
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
        text, n = await self.prompts.make(16, "warm_up/0")
        first = await self.send("warm_up", text, n, 8, cache=False)
        if first.status != "ok":
            raise ProbeError(f"the first request failed: {first.error_message}")
        self.prompts.learn(n, first.prompt_tokens)
        await self.pause()
        longer = min(256, self.max_prompt_tokens)
        text, m = await self.prompts.make(longer, "warm_up/1")
        second = await self.send("warm_up", text, m, 1, cache=False)
        if second.status != "ok":
            raise ProbeError(f"a {m}-token prompt failed: {second.error_message}")
        p0 = first.prompt_tokens or n
        p1 = second.prompt_tokens or m
        gaps = first.itl_s
        step = float(np.median(gaps)) if gaps else float(first.ttft_s)
        token = max((second.ttft_s - first.ttft_s) / max(p1 - p0, 1), 1e-6)
        self.pause_s = min(max(step, 0.01), 0.1)
        return {"short_ttft_s": float(first.ttft_s), "token_s": float(token), "step_s": step}

    async def isolated(self, d: ProbeDesign) -> None:
        for rep in range(d.isolated_repeats):
            for length in d.isolated_lengths:
                if rep > 0 and self.left_s() <= 0:  # the first round is what a profile needs
                    self.warnings.append(f"isolated phase cut short by the budget after {rep} round(s) of lengths")
                    return
                text, n = await self.prompts.make(length, f"isolated/{rep}/{length}")
                await self.send("isolated", text, n, ISOLATED_OUTPUT_TOKENS, cache=False)
                await self.pause()

    async def decode(self, d: ProbeDesign) -> None:
        for size in d.decode_sizes:
            if size > 1 and self.left_s() <= 0:  # D(1) is what a profile needs
                self.warnings.append(f"decode phase cut short by the budget: batch sizes from {size} on not measured")
                return
            prompts = [await self.prompts.make(d.decode_prompt_tokens, f"decode/{size}/{i}") for i in range(size)]
            await asyncio.gather(*(self.send(f"decode.{size}", t, n, d.decode_output_tokens, cache=False) for t, n in prompts))
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
        rec = RequestRecord()
        task = asyncio.create_task(self.send("mixed.decoder", text, n, d.mixed_decoder_tokens, cache=False, record=rec))
        try:
            if await self._wait_tokens(rec, task, 3):
                for jt, jn in joiners:
                    await self.send("mixed.joiner", jt, jn, 1, cache=False)
                    if not await self._wait_tokens(rec, task, len(rec.content_times_s) + 3):
                        self.warnings.append("mixed phase: the decoding request ended before every prompt had joined it")
                        break
        finally:
            await task
        await self.pause()

    async def extension(self, d: ProbeDesign) -> None:
        for rep in range(d.extension_repeats):
            base, n = await self.prompts.make(d.base_tokens, f"extension/{rep}")
            await self.send("extension.base", base, n, 1, cache=True)
            await self.pause()
            longer = base + " " + self.prompts.words(d.extension_tokens, f"extension/{rep}/more")
            await self.send("extension", longer, await self.prompts.count(longer), 1, cache=True)
            await self.pause()

    async def restore(self, d: ProbeDesign) -> None:
        for rep in range(d.restore_repeats):
            base, n = await self.prompts.make(d.base_tokens, f"restore/{rep}")
            fills = [await self.prompts.make(d.fill_tokens, f"restore/{rep}/fill/{i}") for i in range(self.slots)]
            longer = base + " " + self.prompts.words(d.extension_tokens, f"restore/{rep}/more")
            longer_n = await self.prompts.count(longer)
            await self.send("restore.base", base, n, 1, cache=True)
            await self.pause()
            await asyncio.gather(*(self.send("restore.fill", t, m, 2, cache=True) for t, m in fills))
            await self.pause()
            await self.send("restore", longer, longer_n, 1, cache=True)
            await self.pause()

    async def run(self, budget_s: float) -> None:
        estimates = await self.warm_up()
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
        prompts = _Prompts(client, api, salt)
        await prompts.setup()
        header.update(
            warm_up_requests=WARM_UP_REQUESTS,
            load={"stream": True, "concurrency": None, "timeout_s": client.timeout_s, "retries": 0, "ignore_eos": True,
                  "closed_loop_sessions": False},
            prompts={"source": "synthetic", "token_rule": "tokenize" if prompts.tokenize else "words"},
            prefix_groups={},
            probe={"budget_s": float(max_seconds), "parallel": slots, "seed": salt, "skipped": unavailable},
            **blocks,
        )
        empty = pd.DataFrame({"arrival_time_us": [], "input_tokens": [], "output_tokens": []})
        engine = _engine_of(Trace(header, empty))
        context = engine.max_model_len if engine.max_model_len is not None else MAX_PROMPT_TOKENS + 64
        with TraceV2Writer(out / "trace", header=header, extra_columns=OBSERVER_COLUMNS) as writer:
            client.run_start = time.perf_counter()
            run = _Run(
                client, writer, prompts, api=api, model=model, slots=slots, cache_field=kind == "llamacpp",
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
        block's ``n_parallel`` or ``max_num_seqs``).
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
        No slot count, a warm-up request failed, or the trace gives no profile.
    ScenarioError
        The server config is bad.
    ValueError
        A bad argument.
    """
    coro: Awaitable[ProbeResult] = run_probe_async(
        url, out, model=model, api=api, api_key=api_key, server_type=server_type, server_config=server_config,
        max_seconds=max_seconds, parallel=parallel, seed=seed, timeout_s=timeout_s,
    )
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run_loop(coro, loop=loop)  # type: ignore[arg-type]
    # Called from a running event loop (a Jupyter kernel's): a thread and a loop of its own.
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="probe") as pool:
        return pool.submit(run_loop, coro, loop=loop).result()
