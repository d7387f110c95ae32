"""Fit a latency model's coefficients to an observed trace.

Kept whole (over 800 lines): the direct estimate, the identification of each coefficient and
the optimiser's refinement read the same decomposition of a trace into engine steps.

:func:`fit` estimates the coefficients of a ``batch_table`` latency model
(:mod:`simpy_llm.serving.batch_table`) from what an observed trace shows,
says which of them the trace determines, and takes the others from a prior
or their documented defaults:

1. **Direct estimate**, from the trace's own structure. Streamed requests give
   every token's arrival time; each gap between two tokens of a request is one
   engine step, and the tokens of the other requests place that step among
   them: the requests decoding through the whole gap are the step's decoders,
   and a request whose *first* token ends the gap had its prompt computed in
   that step. So

   * a gap with ``n`` decoders and no prompt is a pure-decode step: ``D(n)`` is
     the median of those gaps (numbers of decoders never seen are interpolated
     along the table, extrapolated from its ends);
   * a gap with decoders and prompts is ``D(n) + prefill_step + prefill_token * P``
     (``P`` the uncached prompt tokens finishing in it, from the server's
     ``cached_tokens`` when it reported them): a robust linear fit of
     ``gap − D(n)`` on ``P`` gives both coefficients;
   * a request sent to an idle server waits ``alpha0`` (API, tokenisation) and
     then one prompt-only step: its TTFT is ``alpha0 + prefill_only_step +
     prefill_step + prefill_token * P``;
   * a request sent while others decode enters the waiting queue ``alpha0``
     after its send and joins the first step starting after that: the step
     boundaries before and after give ``alpha0`` from below and above.

   The estimate can hold any coefficients at given values and re-estimate the
   others from the same steps (what the identification below moves along).
   Prometheus counters, when the trace has them (:func:`server_counters`),
   only check the result's scale: they sum over the run and cannot separate
   the terms. The fit reports the steps the server ran beside the steps the
   fitted model's replay runs, and the server's own seconds per prompt and per
   generated token.

2. **Identification**, around the direct estimate: each coefficient is profiled
   (:mod:`simpy_llm.calibrate.identify`: the replay loss along a ladder of its
   values, the others re-estimated from the steps for each value, a paired test
   per value against the estimate); one the trace does not determine takes the
   prior's value (``priors``) or its documented default (:data:`~simpy_llm.calibrate.batch_steps.DEFAULTS_US`;
   the nearest value the trace allows when it rules that out on one side) and is
   held there from then on, before the next is profiled. The order: the optional
   terms (``prefill_pair_us``, ``decode_context_us``, ``cache_restore_us``,
   ``prefill_only_step_us``, ``alpha0_us``), then the decode table, then
   ``prefill_step_us`` and ``prefill_token_us``. Without data a term is not
   determined, with no replay needed: no request started from a cached prefix
   (``cache_restore_us``); no request found an idle server, an *overloaded*
   trace (``alpha0_us`` and ``prefill_only_step_us``: every request waited
   behind others, so its wait says nothing of the base costs; the fit warns); a
   decode-table entry for a number of decoders the trace never shows.
   ``prefill_step_us`` and ``prefill_token_us`` have no default: undetermined
   and without a prior they stay free, with a warning.

3. **Refinement**: the coefficients not held that minimise the
   simulated-vs-observed loss, replaying the trace through the scenario for each
   candidate (:func:`~simpy_llm.calibrate.compare.simulate_trace`). The loss is
   the mean absolute log ratio of simulated to observed TTFT plus that of E2E
   over the calibrated requests; Nelder–Mead on the log-coefficients from the
   direct estimate (``scipy.optimize.minimize``; deterministic: no random start).
   A table entry left to interpolation follows its neighbours.

4. **Intervals**: every determined coefficient is profiled again around the
   refined values, giving its 95 % interval (an end this profile does not reach
   within the ladder is the first profile's, scaled as the refinement moved the
   coefficient). A coefficient held at its prior's value keeps the prior's interval, so
   a fit chained on this profile (``priors=``) can still warn of a trace that
   contradicts it.

The fit also records the operating ranges its trace covered
(:mod:`~simpy_llm.calibrate.ranges`) and its warnings: an overloaded trace
(first), a decode step fitted shorter for more decoders than its interval and
its neighbour's allow, a coefficient without data nor prior, a prior the trace
contradicts.

**Several traces** of one server (a short synchronous run and a run at one rate, say) make one
fit (:mod:`~simpy_llm.calibrate.fit_traces` reads them and refuses traces of different
servers): the direct estimate pools the steps of every trace, each decomposed with its own
header; every replay replays each trace through its own scenario, and the loss is the mean of
the per-request contributions of all their requests together (so the paired tests pair every
request of every trace); the ranges are those the traces covered together. The profile's
``fit`` block lists the traces under ``traces`` (one trace: ``trace``, a path), its
``requests`` are their sum (``requests_per_trace`` beside) and its server counters and replay
steps are summed over the traces that have them.

The result is a profile (:func:`write_profile`) that any scenario can use
(``latency_model: {profile: FILE}``), with the fit's statistics and the trace(s)
it came from.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pandas as pd

from simpy_llm.calibrate.batch_steps import (
    DEFAULTS_US,
    PLACEHOLDER_MODEL,
    chunk_pairs,
    profile_document,
    prompt_chunks,
    step_passes,
    write_profile_document,
)
from simpy_llm.calibrate.compare import _join, observed_latencies, simulate_trace
from simpy_llm.calibrate.fit_traces import read_fit_traces, summed_counters, trace_list
from simpy_llm.calibrate.identify import Profile, Z, paired_t, profile_coefficient
from simpy_llm.calibrate.ranges import range_limits, trace_range_values
from simpy_llm.calibrate.scenario import (
    apply_profile,
    replay_scenario,
)
from simpy_llm.config import Scenario, ScenarioError
from simpy_llm.config.profile import check_profile, load_profile
from simpy_llm.config.validators import MAX_COEFFICIENT_US
from simpy_llm.serving.batch_table import BatchTableLatency
from simpy_llm.simulation import Simulation
from simpy_llm.workload.traces import read_trace_v2

__all__ = ["FitResult", "direct_estimate", "fit", "server_counters", "write_profile"]

_OPTIONAL = ("prefill_pair_us", "decode_context_us", "cache_restore_us", "prefill_only_step_us", "alpha0_us")
"""The terms identified before the refinement (module docstring, 2), in this order."""

_BASE_COSTS = ("alpha0_us", "prefill_only_step_us")
"""What an overloaded trace (no request found an idle server) cannot determine."""


@attrs.frozen(kw_only=True)
class FitResult:
    """A fitted ``batch_table`` latency model, how it was found, and how well the trace knows it."""

    params: dict[str, Any]
    """The fitted model's parameters (``batch_table``; microseconds)."""
    direct: dict[str, Any]
    """The direct estimate (stage 1), same keys."""
    statistics: dict[str, Any]
    """Samples behind the direct estimate, losses before and after refinement, replays."""
    trace: str | list[str]
    """The trace's CSV file; a list of them for a fit on several traces."""
    server: dict[str, Any] | None
    """The trace header's server block (the first trace's: all agree)."""
    intervals: dict[str, Any] | None = None
    """Per coefficient its 95 % interval ``(low, high)`` (µs): the trace's, or the prior's for a
    coefficient held at its prior's value (``sources`` says which); None when neither gives one
    (``decode_step_us``: a list, one per entry); None when not identified."""
    sources: dict[str, Any] | None = None
    """Per coefficient where its value comes from: ``trace``, ``prior`` or ``default``
    (``decode_step_us``: a list); None when not identified."""
    priors: dict[str, Any] | None = None
    """The priors used: ``{source: path as given (None for data), method: its fit.method}``."""
    ranges: dict[str, list[float]] = attrs.field(factory=dict)
    """What the trace covered, ``{quantity: [min, max]}`` (:mod:`~simpy_llm.calibrate.ranges`)."""
    warnings: list[str] = attrs.field(factory=list)
    """The fit's warnings, the most important first."""

    def model(self) -> BatchTableLatency:
        """The fitted latency model object."""
        return BatchTableLatency(**self.params)

    def profile(self) -> dict[str, Any]:
        """The profile file's content (``docs/calibration.md``)."""
        stats = dict(self.statistics)
        # one trace under ``trace``, several (a joint fit) as a list under ``traces``
        sources_key = "trace" if isinstance(self.trace, str) else "traces"
        block: dict[str, Any] = {sources_key: self.trace, "method": stats.pop("method"), "warnings": list(self.warnings)}
        if self.intervals is not None:
            block["intervals"] = self.intervals
        if self.sources is not None:
            block["sources"] = self.sources
        if self.priors is not None:
            block["priors"] = self.priors
        block["ranges"] = self.ranges
        block["direct"] = self.direct
        block.update(stats)
        return profile_document(self.params, self.server, block)


def write_profile(result: FitResult, path: Path | str) -> Path:
    """Write *result* as a profile YAML file; returns its path."""
    return write_profile_document(result.profile(), path, "fit")


# ----------------------------------------------------------------------------- stage 1


def _token_times(obs: pd.DataFrame, gaps: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Each streamed ok request's token times (first token, then cumulative gaps)."""
    out = {}
    for rid, first in zip(obs["request_id"].to_numpy(), obs["send_s"].to_numpy() + obs["ttft_s"].to_numpy(), strict=True):
        g = gaps.get(int(rid))
        if g is None or not np.isfinite(first):
            continue
        out[int(rid)] = first + np.concatenate([[0.0], np.cumsum(g)])
    return out


def direct_estimate(
    trace: Any,
    *,
    max_decoders: int | None = None,
    ubatch_tokens: int | None = None,
    prefill_breaks: tuple[int, ...] = (),
    budget_tokens: int | None = None,
    tolerance_s: float | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Stage 1 of :func:`fit` (module docstring) on an observed trace (path or
    :class:`~simpy_llm.workload.traces.Trace`), or on a list of traces of one server (their
    steps pooled).

    Parameters
    ----------
    max_decoders
        Entries of the decode table (default: the server block's slots or
        ``max_num_seqs``, else the most decoders seen at once).
    ubatch_tokens, prefill_breaks, budget_tokens
        The recording engine's forward-pass size, prefill breaks and step token budget
        (``EngineConfig``'s ``ubatch_tokens``, ``prefill_breaks``, ``max_num_batched_tokens``):
        how a prompt is cut into steps.
    tolerance_s
        Tokens of different requests less than this apart belong to the same step end
        (default: a tenth of the median gap, at most 5 ms).

    Returns
    -------
    (params, statistics)
        ``batch_table`` parameters in µs, and the sample counts behind them.
    """
    direct = _Direct(trace, max_decoders=max_decoders, ubatch_tokens=ubatch_tokens, prefill_breaks=prefill_breaks,
                     budget_tokens=budget_tokens, tolerance_s=tolerance_s)
    return direct.solve({}), direct.stats


class _Direct:
    """The direct estimate of a trace: its steps reconstructed once, then
    :meth:`solve` for the coefficients with any of them held at given values."""

    def __init__(
        self, trace: Any, *, max_decoders: int | None, ubatch_tokens: int | None, prefill_breaks: tuple[int, ...],
        budget_tokens: int | None, tolerance_s: float | None,
    ) -> None:
        traces = [t if hasattr(t, "frame") else read_trace_v2(t) for t in (trace if isinstance(trace, list) else [trace])]
        # Several traces of one server: each decomposed into its own steps, their samples pooled.
        self.parts = [_Steps(t, prefill_breaks, budget_tokens, tolerance_s) for t in traces]
        self.decode: dict[int, list[tuple[float, float]]] = {}
        self.part_mixed = []
        for steps in self.parts:
            decode, mixed = steps.classify_gaps()
            for n, gaps in decode.items():
                self.decode.setdefault(n, []).extend(gaps)
            self.part_mixed.append(mixed)
        self.mixed = [m for mixed in self.part_mixed for m in mixed]
        server = traces[0].header.get("server") or {}
        self.limit = int(max_decoders or server.get("n_parallel") or server.get("max_num_seqs") or max(self.decode, default=1))
        self.ubatch = ubatch_tokens
        bounds = [steps.alpha0_bounds(self.limit) for steps in self.parts]
        self.bounds = ([b for above, _ in bounds for b in above], [b for _, below in bounds for b in below])
        self.seen = sorted(n for n, v in self.decode.items() if n >= 1 and v)
        """Numbers of decoders with pure-decode steps in the trace."""
        self.decoders = np.array([n for n, v in self.decode.items() for _ in v] + [m[0] for m in self.mixed], dtype=np.float64)
        """The decoders of every step the trace shows (pure-decode and mixed)."""
        self._rows: dict[tuple[Any, ...], tuple[list[float], float, np.ndarray, np.ndarray, np.ndarray]] = {}
        _, _, _, _, idle = self._system({})
        self.stats = {
            "pure_decode_gaps": {int(n): len(v) for n, v in sorted(self.decode.items())},
            "mixed_steps": len(self.mixed),
            "restoring_steps": int(sum(1 for m in self.mixed if m[3])),
            "idle_requests": int(idle.sum()),
            "joining_requests": len(self.bounds[0]),
            "tolerance_s": self.parts[0].eps if len(self.parts) == 1 else [steps.eps for steps in self.parts],
        }

    def _system(self, fixed: Mapping[str, float | None]) -> tuple[list[float], float, np.ndarray, np.ndarray, np.ndarray]:
        """The decode table and context cost, and the prompt terms' linear system, with the
        decode coefficients of *fixed* held (cached: the prompt terms' profiles reuse it)."""
        key = tuple(sorted((k, v) for k, v in fixed.items() if k.startswith("decode_")))
        if key not in self._rows:
            entries = {_entry(k) + 1: (None if v is None else v * 1e-6) for k, v in fixed.items() if k.startswith("decode_step_us[")}
            context = fixed.get("decode_context_us")
            table, ctx = _decode_fit(self.decode, self.limit, context=None if context is None else context * 1e-6, fixed=entries)
            systems = [steps.prompt_rows(mixed, table, ctx, self.ubatch) for steps, mixed in zip(self.parts, self.part_mixed, strict=True)]
            rows, targets, idle = (np.concatenate([s[i] for s in systems]) for i in range(3))
            self._rows[key] = (table, ctx, rows, targets, idle)
        return self._rows[key]

    def solve(self, fixed: Mapping[str, float | None]) -> dict[str, Any]:
        """The coefficients (``batch_table`` parameters, µs) with those of *fixed* (flat names:
        ``decode_step_us[i]``, scalars) held at their values; a decode entry held at None is
        left to interpolation (its steps are not used)."""
        table, ctx, rows, targets, idle = self._system(fixed)
        held = {k: v * 1e-6 for k, v in fixed.items() if v is not None and not k.startswith("decode_")}
        prompt = _prompt_coefficients(rows, targets, idle, self.bounds, held)
        return {
            "decode_step_us": [v * 1e6 for v in table],
            "prefill_step_us": prompt["prefill_step_us"] * 1e6,
            "prefill_token_us": prompt["prefill_token_us"] * 1e6,
            "prefill_only_step_us": prompt["prefill_only_step_us"] * 1e6,
            "decode_context_us": ctx * 1e6,
            "prefill_pair_us": prompt["prefill_pair_us"] * 1e6,
            "alpha0_us": prompt["alpha0_us"] * 1e6,
            "cache_restore_us": prompt["cache_restore_us"] * 1e6,
        }


def _entry(name: str) -> int:
    """The index of a flat decode-table name: ``decode_step_us[2]`` is 2."""
    return int(name[name.index("[") + 1:-1])


class _Steps:
    """The engine steps a trace shows: each streamed request's token times, the step ends
    (tokens of different requests less than ``eps`` apart are one step end), and where each
    request's prompt was computed."""

    def __init__(self, trace: Any, breaks: tuple[int, ...], budget: int | None, tolerance_s: float | None) -> None:
        obs, gaps = observed_latencies(trace)
        obs = obs[(obs["status"] == "ok") & obs["streaming"]].reset_index(drop=True)
        times = _token_times(obs, gaps)
        if not times:
            raise ValueError("the trace has no streamed requests with token times (itl_us): nothing to fit")
        all_gaps = np.concatenate([np.diff(t) for t in times.values() if len(t) > 1] or [np.empty(0)])
        if tolerance_s is None:
            tolerance_s = min(0.1 * float(np.median(all_gaps)), 0.005) if all_gaps.size else 0.001
        self.eps = eps = tolerance_s
        self.times = times
        self.ids = ids = np.array(sorted(times))
        self.token_times = [times[i] for i in ids]
        by_id = obs.set_index("request_id")
        self.first = np.array([times[i][0] for i in ids])
        self.last = np.array([times[i][-1] for i in ids])
        self.prompt = by_id.loc[ids, "input_tokens"].to_numpy()
        cached = by_id.loc[ids, "cached_tokens"].fillna(0).to_numpy()
        self.uncached = np.maximum(self.prompt - cached, 1)
        self.send = by_id.loc[ids, "send_s"].to_numpy()
        flat = np.sort(np.concatenate(list(times.values())))
        self.ends = ends = flat[np.concatenate([[True], np.diff(flat) > eps])]
        # Each prompt, cut as the engine cuts it, lands in the step ending at the request's first
        # token and in the step ends just before it (those the trace shows: after its send).
        self.chunks = [prompt_chunks(int(u), breaks, budget) for u in self.uncached]
        self.pairs = [chunk_pairs(chunks, int(p - u)) for chunks, p, u in zip(self.chunks, self.prompt, self.uncached, strict=True)]
        self.restored = cached > 0
        """Requests the server started from a cached prefix (it reported cached tokens)."""
        self.prompt_in: dict[int, list[tuple[int, int]]] = {}  # step-end index -> (chunk, attention pairs) computed there
        self.restores_in: dict[int, int] = {}  # step-end index -> requests started there from a cached prefix
        for k, chunks in enumerate(self.chunks):
            e = int(np.searchsorted(ends, self.first[k] - eps, side="left"))
            for i in range(len(chunks) - 1, -1, -1):
                if e < 0 or ends[e] < self.send[k] - eps:
                    break
                self.prompt_in.setdefault(e, []).append((chunks[i], self.pairs[k][i]))
                if i == 0 and self.restored[k]:
                    self.restores_in[e] = self.restores_in.get(e, 0) + 1
                e -= 1

    def decoding(self, a: float, b: float) -> np.ndarray:
        """Indices of the requests decoding through the whole interval [a, b]."""
        return np.nonzero((self.first <= a + self.eps) & (self.last >= b - self.eps))[0]

    def context(self, decoders: np.ndarray, a: float) -> float:
        """The decoders' KV tokens in the step starting at *a*: prompt plus the tokens each
        emitted by then, less one (the last one's KV is what the step computes)."""
        return float(sum(self.prompt[d] + np.searchsorted(self.token_times[d], a + self.eps) - 1 for d in decoders))

    def classify_gaps(self) -> tuple[dict[int, list[tuple[float, float]]], list[tuple[int, float, float, int, float, float]]]:
        """Every token gap: pure-decode gaps by number of decoders as ``(gap, decoders'
        context)``, and mixed steps as ``(decoders, context, prompt tokens, cache restores,
        attention pairs, gap)``."""
        decode: dict[int, list[tuple[float, float]]] = {}
        mixed: list[tuple[int, float, float, int, float, float]] = []
        for t in self.token_times:
            for a, b in itertools.pairwise(t):
                decoders = self.decoding(a, b)
                ctx = self.context(decoders, a)
                e = int(np.searchsorted(self.ends, b - self.eps, side="left"))
                chunks = self.prompt_in.get(e)
                if chunks:
                    mixed.append((len(decoders), ctx, float(sum(c for c, _ in chunks)), self.restores_in.get(e, 0),
                                  float(sum(q for _, q in chunks)), b - a))
                else:
                    decode.setdefault(len(decoders), []).append((b - a, ctx))
        return decode, mixed

    def prompt_rows(
        self, mixed: list[tuple[int, float, float, int, float, float]], table: list[float], context: float, ubatch: int | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The linear system of the prompt terms. A step of n decoders and P prompt tokens is
        computed in passes of at most *ubatch* tokens (decode tokens first): its time is the
        sum over passes of D(decoders in the pass), plus prefill_step per pass with prompt
        tokens, plus prefill_only_step per pass with prompt tokens alone, plus prefill_token
        x P, plus cache_restore per request it starts from a cached prefix, plus prefill_pair
        x its attention pairs, plus *context* x the decoders' context. Rows ``(passes with
        prompt, prompt-only passes, P, restores, pairs)``: one per mixed step (target: gap −
        the decode terms) and one per request sent to an idle server (target: its TTFT, which
        adds alpha0; marked in the third array)."""
        rows: list[tuple[int, int, float, float, float]] = []
        targets: list[float] = []
        idle: list[bool] = []
        for n, ctx, p, restores, pairs, gap in mixed:
            d_sum, with_prompt, prompt_only = step_passes(n, int(p), ubatch, table)
            rows.append((with_prompt, prompt_only, p, restores, pairs))
            targets.append(gap - d_sum - context * ctx)
            idle.append(False)
        eps = self.eps
        busy_from = np.minimum(self.send, self.first)  # a request occupies the server from its send to its last token
        for k in range(len(self.ids)):
            others = np.ones(len(self.ids), dtype=bool)
            others[k] = False
            if (others & (busy_from <= self.first[k] + eps) & (self.last >= self.send[k] - eps)).any():
                continue
            with_prompt = prompt_only = 0
            for c in self.chunks[k]:  # one prompt-only step per chunk
                _, w, o = step_passes(0, c, ubatch, table)
                with_prompt += w
                prompt_only += o
            rows.append((with_prompt, prompt_only, float(self.uncached[k]), float(self.restored[k]), float(sum(self.pairs[k]))))
            targets.append(self.first[k] - self.send[k])
            idle.append(True)
        return np.array(rows, dtype=float).reshape(-1, 5), np.array(targets, dtype=float), np.array(idle, dtype=bool)

    def alpha0_bounds(self, slots: int) -> tuple[list[float], list[float]]:
        """Bounds on alpha0 from requests that joined a running engine: such a request entered
        the waiting queue alpha0 after its send and was first computed in the step that began
        at a decoder's token, no earlier than send + alpha0 (upper bounds); if a slot was free
        during the step before, it was not yet waiting when that one began (lower bounds)."""
        eps = self.eps
        decoder_ends = np.sort(np.concatenate([t for t in self.token_times if len(t) > 1] or [np.empty(0)]))
        above, below = [], []
        for k in range(len(self.ids)):
            j = int(np.searchsorted(decoder_ends, self.first[k] - eps, side="left")) - len(self.chunks[k])
            at_end = np.count_nonzero(np.abs(decoder_ends - self.first[k]) <= eps)
            if j < 1 or at_end < 2 or decoder_ends[j] < self.send[k] - eps:
                continue
            above.append(decoder_ends[j] - self.send[k])
            previous = decoder_ends[j - 1]
            if len(self.decoding(previous, decoder_ends[j])) < slots and previous > self.send[k] - eps:
                below.append(previous - self.send[k])
        return above, below


_PROMPT_COLUMNS = ("prefill_step_us", "prefill_only_step_us", "prefill_token_us", "cache_restore_us", "prefill_pair_us")
"""The prompt terms in the order of the columns of :meth:`_Steps.prompt_rows`."""


def _prompt_coefficients(
    rows: np.ndarray, targets: np.ndarray, idle: np.ndarray, bounds: tuple[list[float], list[float]],
    fixed: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """The prompt terms and ``alpha0_us`` (named as the parameters, values in seconds) from
    the rows of :meth:`_Steps.prompt_rows` (a robust bounded least-squares fit on the mixed
    steps) and the alpha0 bounds, those in *fixed* (seconds) held at their values."""
    from scipy import optimize

    fixed = fixed or {}
    mixed = ~idle
    # prefill_only_step shows in the mixed steps only when prompts spill into passes of their
    # own; otherwise the idle requests and the alpha0 bounds tell it apart from alpha0. A
    # restore cost is fitted only when some mixed step started a request from a cached prefix.
    solve_only = bool(rows[mixed, 1].any())
    estimable = [0, 1, 2] if solve_only else [0, 2]
    if rows[mixed, 3].any():
        estimable.append(3)
    estimable.append(4)
    coef = np.array([0.0, 0.0, 1e-4, 0.0, 0.0])
    held = [i for i, name in enumerate(_PROMPT_COLUMNS) if name in fixed]
    for i in held:
        coef[i] = fixed[_PROMPT_COLUMNS[i]]
    cols = [c for c in estimable if c not in held]
    known = rows[:, held] @ coef[held]  # what the held terms take of each row
    if cols and mixed.sum() >= len(cols):
        a, y = rows[mixed][:, cols], targets[mixed] - known[mixed]
        scales = np.maximum(np.abs(a).max(axis=0), 1.0)  # columns of comparable size for the solver
        start = optimize.lsq_linear(a / scales, y, bounds=(0.0, np.inf)).x
        f_scale = max(float(np.median(np.abs(y))) * 0.05, 1e-5)
        res = optimize.least_squares(
            lambda c: (a / scales) @ c - y, x0=np.maximum(start, 1e-9), loss="soft_l1", f_scale=f_scale, bounds=(0.0, np.inf)
        )
        coef[cols] = res.x / scales
    elif 2 in cols and idle.sum() >= 2:  # no mixed steps: the prompt cost from the idle requests alone
        slope, _ = np.polyfit(rows[idle, 2], targets[idle] - known[idle], 1)
        coef[2] = max(float(slope), 1e-6)
    above, below = bounds
    hi = float(np.min(above)) if above else None
    lo = float(np.max(below)) if below else None
    bounded = ((lo + hi) / 2 if lo is not None and lo < hi else hi) if hi is not None else None
    only_held = "prefill_only_step_us" in fixed
    if "alpha0_us" in fixed:
        alpha0 = fixed["alpha0_us"]
        if idle.any() and not solve_only and not only_held:  # the idle requests' TTFT less alpha0
            residual = float(np.median(targets[idle] - rows[idle] @ coef))
            coef[1] = max(residual - alpha0, 0.0) / max(float(np.median(rows[idle, 1])), 1.0)
    elif idle.any():
        residual = float(np.median(targets[idle] - rows[idle] @ coef))  # alpha0 (+ prefill_only_step when unsolved)
        if solve_only or only_held:
            alpha0 = residual
        else:
            alpha0 = min(bounded, residual) if bounded is not None else 0.0
            coef[1] = max(residual - alpha0, 0.0) / max(float(np.median(rows[idle, 1])), 1.0)
    else:
        alpha0 = bounded if bounded is not None else 0.0
    out = {name: float(coef[i]) for i, name in enumerate(_PROMPT_COLUMNS)}
    out["alpha0_us"] = max(float(alpha0), 0.0)
    return out


def _decode_fit(
    samples: dict[int, list[tuple[float, float]]], size: int, *, context: float | None = None,
    fixed: Mapping[int, float | None] | None = None,
) -> tuple[list[float], float]:
    """The decode table ``D(1..size)`` and the per-context-token cost from pure-decode gaps
    ``(gap, decoders' context)`` by number of decoders: a robust fit of ``gap = D(n) +
    decode_context x context`` (one intercept per number of decoders seen, one shared slope),
    then the unseen sizes interpolated linearly between seen ones and extrapolated from the
    nearest two (flat from one) (:func:`_interpolate_table`).

    *context* holds the slope at that value (s per token); *fixed* holds ``D(n)`` at a value
    (s), or leaves it to the interpolation (None: its gaps are not used)."""
    from scipy import optimize

    fixed = dict(fixed or {})
    seen = sorted(n for n, v in samples.items() if n >= 1 and v and n not in fixed)
    pinned = sorted(n for n, v in fixed.items() if v is not None)
    if not seen and not pinned:
        raise ValueError("the trace has no pure-decode steps (two tokens of a request with no prompt between): nothing to fit")
    used = seen + [n for n in pinned if samples.get(n)]  # sizes whose gaps inform the shared slope
    gaps = np.array([g for n in used for g, _ in samples[n]])
    ctx = np.array([c for n in used for _, c in samples[n]])
    which = np.concatenate([np.full(len(samples[n]), i) for i, n in enumerate(used)] or [np.empty(0, dtype=int)]).astype(int)
    known = np.array([fixed[n] for n in used[len(seen):]], dtype=float)
    scale = max(float(ctx.max()), 1.0) if ctx.size else 1.0
    free_slope = context is None and gaps.size > 0

    def unpack(x: np.ndarray) -> tuple[np.ndarray, float]:
        intercepts = np.concatenate([x[:len(seen)], known])
        return intercepts, (float(x[-1]) if free_slope else (context or 0.0) * scale)

    def residuals(x: np.ndarray) -> np.ndarray:
        intercepts, slope = unpack(x)
        return intercepts[which] + slope * ctx / scale - gaps

    x0 = np.array([np.median([g for g, _ in samples[n]]) for n in seen] + ([0.0] if free_slope else []))
    x = x0
    if x0.size:
        x = optimize.least_squares(
            residuals, x0=x0, loss="soft_l1", f_scale=max(float(np.median(gaps)) * 0.05, 1e-5), bounds=(0.0, np.inf),
        ).x
    intercepts, slope = unpack(x)
    anchors = sorted(zip(seen + pinned, [*intercepts[:len(seen)], *(fixed[n] for n in pinned)], strict=True))
    return _interpolate_table([n for n, _ in anchors], [v for _, v in anchors], size), slope / scale


def _interpolate_table(xs: list[int], ys: list[float], size: int) -> list[float]:
    """The table ``D(1..size)`` through the points ``D(xs[i]) = ys[i]`` (*xs* increasing):
    linear between them, extrapolated below along the first two (at least half the first
    value) and above along the last two (never decreasing), flat from a single point.

    >>> _interpolate_table([2, 4], [40.0, 50.0], 5)
    [35.0, 40.0, 45.0, 50.0, 55.0]
    """
    x, y = np.array(xs, dtype=float), np.array(ys, dtype=float)
    out = []
    for n in range(1, size + 1):
        if x.size == 1:
            out.append(float(y[0]))
        elif n < x[0]:
            slope = (y[1] - y[0]) / (x[1] - x[0])
            out.append(float(max(y[0] + slope * (n - x[0]), y[0] * 0.5)))
        elif n > x[-1]:
            slope = (y[-1] - y[-2]) / (x[-1] - x[-2])
            out.append(float(y[-1] + max(slope, 0.0) * (n - x[-1])))
        else:
            out.append(float(np.interp(n, x, y)))
    return out


# ----------------------------------------------------------------------------- stages 2-4


def fit(
    trace: Path | str | Sequence[Path | str],
    scenario: Scenario | None = None,
    *,
    priors: Mapping[str, Any] | Path | str | None = None,
    refine: bool = True,
    max_evaluations: int = 400,
    max_decoders: int | None = None,
    identify: bool = True,
) -> FitResult:
    """Fit a ``batch_table`` latency model to the observed *trace* (module docstring).

    Parameters
    ----------
    trace
        The observed trace v2 (path: CSV, YAML, stem or directory), or several traces of one
        server (a sequence of paths): one fit whose direct estimate pools the steps of all of
        them (each decomposed with its own header) and whose loss covers all their requests
        (module docstring, "Several traces").
    scenario
        The serving system the traces came from (default: from each trace header,
        :func:`~simpy_llm.calibrate.scenario.scenario_from_trace`); its latency model is
        what is fitted and replaced.
    priors
        A profile (its path, or its data as :func:`~simpy_llm.config.profile.load_profile`
        gives it) whose ``batch_table`` parameters give the coefficients this trace does not
        determine: a probe's (``simpy-llm calibrate probe``) or a previous fit's. Without it
        they take their documented defaults (:data:`DEFAULTS_US`).
    refine
        Run the simulation-based refinement after the direct estimate.
    max_evaluations
        At most this many replays in the refinement (the identification adds about six
        per coefficient profiled, twice).
    max_decoders
        Entries of the decode table (default: the server's slots).
    identify
        Say which coefficients the trace determines, with intervals, and hold the others
        at their prior or default (module docstring). Off, every coefficient is fitted
        as the optimiser finds it and the profile has no ``intervals`` or ``sources``.

    Raises
    ------
    ScenarioError
        *priors* is not a readable ``batch_table`` profile.
    ValueError
        Several traces whose headers describe different servers (the message names the traces
        and the key that differs).

    Examples
    --------
    >>> from simpy_llm.calibrate.fit import fit
    >>> result = fit("tests/data/calibration/llamacpp_open_loop", refine=False, identify=False)
    >>> len(result.params["decode_step_us"])
    4
    """
    prior = _Prior.load(priors) if priors is not None else None
    runs = read_fit_traces(trace_list(trace), scenario)
    engine = runs[0].scenario.serving.groups()[0].engine
    direct = _Direct(
        [run.trace for run in runs],
        max_decoders=max_decoders or engine.max_num_seqs,
        ubatch_tokens=engine.ubatch_tokens,
        prefill_breaks=engine.prefill_breaks,
        budget_tokens=engine.max_num_batched_tokens,
        tolerance_s=None,
    )
    bases = [apply_profile(run.scenario, {"latency_model": PLACEHOLDER_MODEL}) for run in runs]
    fitter = _Fitter(direct, [(b, run.csv_path, run.obs, run.trace.header) for b, run in zip(bases, runs, strict=True)], prior)
    statistics: dict[str, Any] = {"method": "direct", "samples": direct.stats, "requests": sum(len(run.trace.frame) for run in runs)}
    if len(runs) > 1:
        statistics["requests_per_trace"] = [len(run.trace.frame) for run in runs]
    overloaded = direct.stats["idle_requests"] == 0
    if identify:
        fitter.classify(overloaded)
    start = fitter.start()
    statistics["loss_direct"] = fitter.loss(start)
    final = start
    if refine:
        final, loss, converged = fitter.refine(start, max_evaluations, statistics["loss_direct"])
        statistics.update(method="direct+nelder-mead", loss_refined=loss, converged=converged)
    if identify:
        fitter.locate_intervals(final)
    warnings = []
    if overloaded:
        warnings.append(_overload_warning(fitter, identify))
    warnings += fitter.warnings
    warnings += _decode_warnings(final, fitter.intervals if identify else {}, direct.limit)
    statistics["evaluations"] = fitter.replays
    statistics["identification_replays"] = fitter.identification_replays
    params = _nested(final, direct.limit)
    counted = [(c, b, run.csv_path) for b, run in zip(bases, runs, strict=True)
               if (c := server_counters(run.trace.header, Path(run.csv_path).parent)) is not None]
    if counted:
        statistics["server_counters"] = counted[0][0] if len(runs) == 1 else summed_counters([c for c, _, _ in counted])
        statistics["replay_steps"] = sum(_replay_steps(b, csv_path, BatchTableLatency(**params)) for _, b, csv_path in counted)
    server = runs[0].trace.header.get("server")
    # the decoders of every step reconstructed (over all the traces), the other quantities per trace
    values = [trace_range_values(run.obs, run.trace.header, decoders=direct.decoders if k == 0 else np.empty(0))
              for k, run in enumerate(runs)]
    ranges = range_limits({q: np.concatenate([v[q] for v in values if q in v]) for q in dict.fromkeys(q for v in values for q in v)})
    return FitResult(
        params=params, direct=direct.solve({}), statistics=statistics,
        trace=runs[0].csv_path if len(runs) == 1 else [run.csv_path for run in runs],
        server=dict(server) if isinstance(server, Mapping) else None,
        intervals=fitter.nested_intervals() if identify else None,
        sources=fitter.nested_sources() if identify else None,
        priors=prior.info if prior is not None else None,
        ranges=ranges,
        warnings=warnings,
    )


def _overload_warning(fitter: _Fitter, identified: bool) -> str:
    held = {fitter.sources.get(name) for name in _BASE_COSTS}
    if not identified:
        where = "identification is off, so they are the direct estimate's, which reads them off queue waits"
    elif held == {"prior"}:
        where = "they come from the priors"
    elif held == {"default"}:
        where = "they are held at their documented defaults (0)"
    else:
        where = "they come from the priors where these give them, else from their documented defaults (0)"
    return ("overloaded trace: no request found an idle server (every request was sent while others were in "
            f"flight), so the base costs alpha0_us and prefill_only_step_us cannot be determined from it; {where}")


def _decode_warnings(flat: Mapping[str, float], intervals: Mapping[str, Any], size: int) -> list[str]:
    """A fitted decode step shorter for more decoders than its interval and its neighbour's allow
    (without intervals: shorter at all)."""
    out = []
    for i in range(1, size):
        prev, this = f"decode_step_us[{i - 1}]", f"decode_step_us[{i}]"
        low_prev = (intervals.get(prev) or (flat[prev], flat[prev]))[0]
        high_this = (intervals.get(this) or (flat[this], flat[this]))[1]
        if high_this < low_prev:
            out.append(
                f"decode step not increasing in the number of decoders: D({i + 1}) = {flat[this] / 1e3:.1f} ms"
                f"{_interval_text(intervals.get(this), 1e3)} is below D({i}) = {flat[prev] / 1e3:.1f} ms"
                f"{_interval_text(intervals.get(prev), 1e3)}: the trace's steps of {i + 1} decoders ran faster "
                f"than those of {i}; check the server (slots, threads) before using the table beyond {i} decoders"
            )
    return out


def _interval_text(interval: tuple[float, float] | None, unit: float) -> str:
    return "" if interval is None else f" [{interval[0] / unit:.1f}, {interval[1] / unit:.1f}]"


@attrs.frozen(kw_only=True)
class _Prior:
    """A priors profile: its coefficients (flat names, µs) and their intervals."""

    values: dict[str, Any]
    """``decode_step_us[i]`` and scalar names -> value, µs."""
    intervals: dict[str, tuple[float, float]]
    """Those with an interval in the profile's ``fit.intervals``."""
    info: dict[str, Any]
    """What the fit records: ``{source, method}``."""

    @classmethod
    def load(cls, priors: Mapping[str, Any] | Path | str) -> _Prior:
        if isinstance(priors, (str, Path)):
            source: str | None = str(priors)
            data = load_profile(priors)
        else:
            source = None
            data = check_profile(priors, "priors")
        where = source or "priors"
        model = data["latency_model"]
        if model.get("kind") != "batch_table":
            raise ScenarioError(where, [("latency_model.kind", f"priors must be a batch_table profile, got {model.get('kind')!r}")],
                                what="profile")
        params = model.get("params") or {}
        values: dict[str, Any] = {}
        problems = []
        if not isinstance(params, Mapping):
            raise ScenarioError(where, [("latency_model.params", f"must be a mapping, got {params!r}")], what="profile")
        for name, value in params.items():
            if name == "decode_step_us":
                if not isinstance(value, list) or not all(_number(v) and v > 0 for v in value):
                    problems.append((f"latency_model.params.{name}", f"must be a list of step times > 0 (µs), got {value!r}"))
                    continue
                values.update({f"decode_step_us[{i}]": float(v) for i, v in enumerate(value)})
            elif name in _SCALARS:
                if not (_number(value) and value >= 0):
                    problems.append((f"latency_model.params.{name}", f"must be a number >= 0 (µs), got {value!r}"))
                    continue
                values[name] = float(value)
        if problems:
            raise ScenarioError(where, problems, what="profile")
        given = data.get("fit")
        fit_block: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
        intervals: dict[str, tuple[float, float]] = {}
        for name, interval in (fit_block.get("intervals") or {}).items():
            if name == "decode_step_us":
                intervals.update({f"decode_step_us[{i}]": tuple(v) for i, v in enumerate(interval) if v is not None})
            elif interval is not None:
                intervals[name] = tuple(interval)
        return cls(values=values, intervals=intervals, info={"source": source, "method": fit_block.get("method")})


def _plausible(profile: Profile | None) -> str:
    """`` (plausible from A to B µs)``: the bounds a profile found, if any."""
    if profile is None or (profile.low is None and profile.high is None):
        return ""
    if profile.high is None:
        return f" (plausible from {profile.low:.6g} µs up)"
    if profile.low is None:
        return f" (plausible up to {profile.high:.6g} µs)"
    return f" (plausible from {profile.low:.6g} to {profile.high:.6g} µs)"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class _Fitter:
    """Replays candidates on the traces and keeps what the identification decided: the held
    coefficients, the intervals, the sources and the warnings."""

    def __init__(self, direct: _Direct, runs: list[tuple[Scenario, str, pd.DataFrame, Mapping[str, Any]]],
                 prior: _Prior | None) -> None:
        self.direct, self.prior = direct, prior
        self.runs = runs
        """Per trace: the scenario it is replayed through (latency model to replace), its CSV,
        its observed requests and its header."""
        self.size = direct.limit
        self.names = _names(self.size)
        self.fixed: dict[str, float | None] = {}
        """Held coefficients: value (µs), or None for a decode entry left to interpolation."""
        self.sources: dict[str, str] = {}
        self.intervals: dict[str, tuple[float, float] | None] = {}
        self.first: dict[str, tuple[tuple[float, float], float]] = {}
        """The determined coefficients: their interval in the first profile, and the value it was around."""
        self.warnings: list[str] = []
        self.replays = 0
        self.identification_replays = 0

    # --- candidates ------------------------------------------------------------------
    def normalised(self, flat: Mapping[str, float]) -> dict[str, float]:
        """*flat* as a valid model: coefficients within their bounds, the held values, the
        entries left to interpolation interpolated along the others."""
        out = {k: min(max(float(v), 0.0), MAX_COEFFICIENT_US) for k, v in flat.items()}
        out.update({k: v for k, v in self.fixed.items() if v is not None})
        table = [max(out[f"decode_step_us[{i}]"], 1.0) for i in range(self.size)]
        loose = {i for i in range(self.size) if f"decode_step_us[{i}]" in self.fixed and self.fixed[f"decode_step_us[{i}]"] is None}
        anchors = [i for i in range(self.size) if i not in loose]
        if loose and anchors:
            table = _interpolate_table([i + 1 for i in anchors], [table[i] for i in anchors], self.size)
        out.update({f"decode_step_us[{i}]": v for i, v in enumerate(table)})
        if out["prefill_step_us"] == 0.0 and out["prefill_token_us"] == 0.0:
            out["prefill_token_us"] = 1.0  # a step with prompt tokens must take time
        return out

    def start(self) -> dict[str, float]:
        """The direct estimate with the held coefficients held."""
        return self.normalised(_flat(self.direct.solve(self.fixed)))

    def candidate(self, name: str, value: float, center: Mapping[str, float]) -> dict[str, float]:
        """*center* with *name* at *value* and the coefficients not held moved as the direct
        estimate moves them when *name* goes from its value in *center* to *value*."""
        anchor = _flat(self.direct.solve({**self.fixed, name: center[name]}))
        moved = _flat(self.direct.solve({**self.fixed, name: value}))
        pinned = {k for k, v in self.fixed.items() if v is not None}
        out = {k: (v if k in pinned else v + moved[k] - anchor[k]) for k, v in center.items()}
        out[name] = value
        return self.normalised(out)

    def replay(self, flat: Mapping[str, float], *, identification: bool = False) -> np.ndarray:
        """Per-request loss contributions of the candidate *flat* (:func:`_contributions`)."""
        self.replays += 1
        self.identification_replays += identification
        model = BatchTableLatency(**_nested(flat, self.size))
        out = []
        for base, csv_path, obs, header in self.runs:  # several traces: one loss over all their requests
            records, _ = simulate_trace(base, csv_path, per_token=False, latency_model=model)
            out.append(_contributions(obs, records, header))
        return out[0] if len(out) == 1 else np.concatenate(out)

    def loss(self, flat: Mapping[str, float]) -> float:
        return float(self.replay(flat).mean())

    # --- identification --------------------------------------------------------------
    def t(self, name: str, value: float, center: Mapping[str, float], u_center: np.ndarray) -> float:
        return paired_t(self.replay(self.candidate(name, value, center), identification=True), u_center)

    def profile(self, name: str, center: Mapping[str, float], u_center: np.ndarray) -> Profile | None:
        """*name*'s profile around *center*, or None when it sits at 0 (not determined)."""
        if center[name] <= _floor(name) * 1.0001:
            return None
        return profile_coefficient(center[name], lambda v: self.t(name, v, center, u_center))

    def hold(self, name: str, center: Mapping[str, float], u_center: np.ndarray | None, profile: Profile | None = None) -> bool:
        """Hold the undetermined *name* at the prior's value (``prior``), else at its documented
        default (``default``). When its *profile* bounds it on one side and that value lies
        beyond, it is held at the bound instead (``trace``: the nearest value the trace
        allows), with a warning; a prior the trace rejects (tested when there is no profile
        but *u_center*, the replay of *center*) gets a warning too. False when there is
        neither prior nor default (``prefill_step_us``, ``prefill_token_us``, a decode entry
        that is the last one determined): it stays free, with a warning."""
        value = self.prior.values.get(name) if self.prior is not None else None
        source = "prior"
        if value is None and name in DEFAULTS_US:
            value, source = DEFAULTS_US[name], "default"
        if value is not None:
            held = profile.clip(value) if profile is not None else value
            if held != value:
                self.warnings.append(
                    f"{name} is not determined by this trace{_plausible(profile)}: held at {held:.6g} µs, the nearest "
                    f"value it allows, rather than the {'prior' if source == 'prior' else 'default'} {value:.6g} µs, "
                    "which it rules out"
                )
                source = "trace"
            elif source == "prior" and u_center is not None and abs(value - center[name]) > 1e-9 * max(abs(value), 1.0) \
                    and profile is None and self.t(name, value, center, u_center) > Z:
                self.warnings.append(
                    f"prior disagrees with the trace: {name} = {value:.6g} µs (the prior's) fits this trace significantly "
                    f"worse than {center[name]:.6g} µs (paired test at 5 %); the prior may describe another server or setting"
                )
            self.fixed[name], self.sources[name] = held, source
            # a value taken from the priors keeps their interval, so that the next fit chained on
            # this profile can still say when its trace contradicts it
            if source == "prior" and self.prior is not None and name in self.prior.intervals:
                self.intervals[name] = self.prior.intervals[name]
                return True
        elif name.startswith("decode_step_us[") and sum(
            1 for i in range(self.size) if self.fixed.get(f"decode_step_us[{i}]", 0.0) is not None
        ) > 1:
            self.fixed[name], self.sources[name] = None, "default"
        else:
            self.sources[name] = "trace"
            self.intervals[name] = None
            self.warnings.append(f"{name} is not determined by this trace{_plausible(profile)} and has neither prior nor "
                                 "default: the refinement fits it; give priors (a probe's profile) to pin it")
            return False
        self.intervals[name] = None
        return True

    def classify(self, overloaded: bool) -> None:
        """Stage 2 (module docstring): the terms without data held first, then every
        coefficient profiled around the direct estimate (the optional terms first, then the
        decode table and the prompt terms), each undetermined one held before the next."""
        no_data = [f"decode_step_us[{n - 1}]" for n in range(1, self.size + 1) if n not in self.direct.seen]
        if self.direct.stats["restoring_steps"] == 0:
            no_data.append("cache_restore_us")
        if overloaded:
            no_data += list(_BASE_COSTS)
        center = self.start()
        for name in no_data:  # nothing in the trace to test a prior against
            self.hold(name, center, None)
        center = self.start()
        u = self.replay(center, identification=True)
        order = [*_OPTIONAL, *(f"decode_step_us[{i}]" for i in range(self.size)), "prefill_step_us", "prefill_token_us"]
        for name in order:
            if name in self.fixed:
                continue
            profile = self.profile(name, center, u)
            if profile is not None and profile.interval is not None:
                self.first[name] = (profile.interval, center[name])
                continue
            before = center[name]
            if self.hold(name, center, u, profile):
                held = self.fixed[name]
                if held is None or abs(held - before) > 1e-9 * max(before, 1.0):
                    center = self.start()
                    u = self.replay(center, identification=True)

    def locate_intervals(self, final: Mapping[str, float]) -> None:
        """Stage 4 (module docstring): the 95 % interval of every determined coefficient,
        profiled around *final*. An end this profile does not reach within the ladder is the
        first profile's, scaled by how much the refinement moved the coefficient."""
        u = self.replay(final, identification=True)
        for name, ((low, high), center) in self.first.items():
            profile = self.profile(name, final, u)
            if profile is None:  # the refinement took it to 0: the first profile's interval, from 0
                self.intervals[name], self.sources[name] = (0.0, high), "trace"
                continue
            scale = final[name] / center
            lo = profile.low if profile is not None and profile.low is not None else min(low * scale, final[name])
            hi = profile.high if profile is not None and profile.high is not None else max(high * scale, final[name])
            self.intervals[name], self.sources[name] = (lo, hi), "trace"
            self._check_prior_interval(name, lo, hi)

    def _check_prior_interval(self, name: str, lo: float, hi: float) -> None:
        """Warn when *name*'s interval ``lo``-``hi`` from the trace misses the prior's."""
        if self.prior is None or name not in self.prior.intervals:
            return
        plo, phi = self.prior.intervals[name]
        if hi < plo or lo > phi:
            self.warnings.append(
                f"prior disagrees with the trace: {name} is {lo:.6g}-{hi:.6g} µs here (95 % interval), "
                f"{plo:.6g}-{phi:.6g} µs in the prior; the prior may describe another server or setting"
            )

    # --- refinement ------------------------------------------------------------------
    def refine(self, start: dict[str, float], max_evaluations: int, start_loss: float | None = None) -> tuple[dict[str, float], float, bool]:
        """Nelder–Mead on the log of the coefficients not held, from *start*; returns the best
        coefficients (*start* unless beaten), their loss and whether the search converged."""
        from scipy import optimize

        free = [name for name in self.names if name not in self.fixed]
        if start_loss is None:
            start_loss = self.loss(start)
        if not free:
            return start, start_loss, True
        like = _nested(start, self.size)
        _, x0 = _vector(like, free)

        def point(x: np.ndarray) -> dict[str, float]:
            return self.normalised(_flat(_params(free, x, like)))

        res = optimize.minimize(
            lambda x: self.loss(point(x)), x0, method="Nelder-Mead",
            options={"maxfev": max_evaluations, "xatol": 1e-3, "fatol": 1e-5, "adaptive": True},
        )
        if res.fun <= start_loss:
            return point(res.x), float(res.fun), bool(res.success)
        return start, start_loss, bool(res.success)

    # --- output ----------------------------------------------------------------------
    def nested_intervals(self) -> dict[str, Any]:
        out: dict[str, Any] = {"decode_step_us": [self.intervals.get(f"decode_step_us[{i}]") for i in range(self.size)]}
        out.update({name: self.intervals.get(name) for name in _SCALARS})
        return {k: ([list(v) if v else None for v in val] if isinstance(val, list) else (list(val) if val else None)) for k, val in out.items()}

    def nested_sources(self) -> dict[str, Any]:
        out: dict[str, Any] = {"decode_step_us": [self.sources.get(f"decode_step_us[{i}]", "trace") for i in range(self.size)]}
        out.update({name: self.sources.get(name, "trace") for name in _SCALARS})
        return out


_COUNTERS = {
    "steps": "llamacpp:n_decode_total",
    "prompt_tokens": "llamacpp:prompt_tokens_total",
    "prompt_seconds": "llamacpp:prompt_seconds_total",
    "predicted_tokens": "llamacpp:tokens_predicted_total",
    "predicted_seconds": "llamacpp:tokens_predicted_seconds_total",
}
"""Prometheus counters (llama.cpp's names) whose growth over a run the fit reports."""


def server_counters(header: Mapping[str, Any], directory: Path) -> dict[str, float] | None:
    """How much each of the server's counters in :data:`_COUNTERS` grew over the run, from the
    trace's scraped Prometheus samples (the header's ``metrics_file``), or None without them.

    They sum over the run, so they cannot separate a latency model's terms; they check its
    scale: the steps the server ran (``llama_decode`` calls) against the steps the fitted
    model's replay runs, and the server's own time per prompt and per generated token.
    """
    name = header.get("metrics_file")
    path = directory / str(name) if name else None
    if path is None or not path.is_file():
        return None
    samples = pd.read_csv(path)
    out: dict[str, float] = {}
    for key, metric in _COUNTERS.items():
        values = pd.to_numeric(samples.loc[samples["metric"] == metric, "value"], errors="coerce").dropna()
        if len(values) >= 2:
            out[key] = float(values.iloc[-1] - values.iloc[0])
    if not out:
        return None
    if out.get("prompt_tokens"):
        out["prompt_seconds_per_token"] = out.get("prompt_seconds", float("nan")) / out["prompt_tokens"]
    if out.get("predicted_tokens"):
        out["predicted_seconds_per_token"] = out.get("predicted_seconds", float("nan")) / out["predicted_tokens"]
    return out


def _replay_steps(scenario: Scenario, csv_path: str, model: BatchTableLatency) -> int:
    """Engine steps the replay of the trace runs with *model*."""

    return int(Simulation(replay_scenario(scenario, csv_path), latency_model=model).run(progress=False).steps)


_SCALARS = ["prefill_step_us", "prefill_token_us", "prefill_only_step_us", "alpha0_us", "cache_restore_us",
            "decode_context_us", "prefill_pair_us"]
"""The ``batch_table`` coefficients besides the decode table that the fit estimates."""

_FLOOR_US = {"decode_context_us": 1e-4, "prefill_pair_us": 1e-5}
"""Smallest value the log-space search reaches, µs: 1 for the per-step and per-token terms, less
for the per-context-token and per-pair ones (which are that much smaller); below it, 0. A
coefficient at its floor is "at 0" for the identification too."""


def _names(size: int) -> list[str]:
    """The flat names of a model's coefficients: ``decode_step_us[0..size-1]``, then the scalars."""
    return [f"decode_step_us[{i}]" for i in range(size)] + _SCALARS


def _floor(name: str) -> float:
    return 1.0 if name.startswith("decode_step_us[") else _FLOOR_US.get(name, 1.0)


def _flat(params: Mapping[str, Any]) -> dict[str, float]:
    """``batch_table`` parameters by flat name (:func:`_names`)."""
    out = {f"decode_step_us[{i}]": float(v) for i, v in enumerate(params["decode_step_us"])}
    out.update({name: float(params[name]) for name in _SCALARS})
    return out


def _nested(flat: Mapping[str, float], size: int) -> dict[str, Any]:
    """The ``batch_table`` parameters of flat coefficients."""
    return {"decode_step_us": [flat[f"decode_step_us[{i}]"] for i in range(size)], **{name: flat[name] for name in _SCALARS}}


def _vector(params: Mapping[str, Any], names: list[str] | None = None) -> tuple[list[str], np.ndarray]:
    """The coefficients *names* (default: all) as the search's vector: their logs (each at
    least its floor)."""
    flat = _flat(params)
    names = names or _names(len(params["decode_step_us"]))
    return names, np.log(np.maximum([flat[n] for n in names], [_floor(n) for n in names]))


def _params(names: list[str], x: np.ndarray, like: Mapping[str, Any]) -> dict[str, Any]:
    """*like* with the coefficients *names* of a search vector (scalars at their floor are 0)."""
    flat = _flat(like)
    values = np.exp(x)
    for name, v in zip(names, values, strict=True):
        flat[name] = float(v) if name.startswith("decode_step_us[") or v > _floor(name) * 1.0001 else 0.0
    if flat["prefill_step_us"] == 0.0 and flat["prefill_token_us"] == 0.0:
        # A step with prompt tokens must take time (a short or loaded run can leave both
        # terms unidentified): the per-token term stays at its floor rather than 0.
        at = names.index("prefill_token_us") if "prefill_token_us" in names else None
        flat["prefill_token_us"] = float(max(values[at], 1.0)) if at is not None else 1.0
    return _nested(flat, len(like["decode_step_us"]))


def _contributions(obs: pd.DataFrame, records: pd.DataFrame, header: Mapping[str, Any]) -> np.ndarray:
    """Each calibrated request's share of the loss, so that their mean is the loss: the mean
    absolute log ratio of simulated to observed TTFT plus that of E2E, each over the requests
    it is defined for. Two candidates' contributions pair request by request
    (:func:`~simpy_llm.calibrate.identify.paired_t`)."""
    joined = _join(obs, records, header, None, 0.0)
    kept = joined[joined["excluded"].isin(("", "not_completed_in_simulation"))]
    total = np.zeros(len(kept))
    for m in ("ttft", "e2e"):
        o = kept[f"{m}_observed_s"].to_numpy()
        s = kept[f"{m}_simulated_s"].to_numpy()
        ok = np.isfinite(o) & np.isfinite(s) & (o > 0) & (s > 0)
        if ok.any():
            term = np.zeros(len(kept))
            term[ok] = np.abs(np.log(s[ok] / o[ok]))
            total += term * (len(kept) / int(ok.sum()))
    return total
