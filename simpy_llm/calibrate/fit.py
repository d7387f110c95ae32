"""Fit a latency model's coefficients to an observed trace.

:func:`fit` estimates the coefficients of a ``batch_table`` latency model
(:mod:`simpy_llm.serving.batch_table`) from what an observed trace shows,
in two stages:

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

   Prometheus counters, when the trace has them (:func:`server_counters`),
   only check the result's scale: they sum over the run and cannot separate
   the terms. The fit reports the steps the server ran beside the steps the
   fitted model's replay runs, and the server's own seconds per prompt and per
   generated token.

2. **Refinement**: the coefficients that minimise the simulated-vs-observed
   loss, replaying the trace through the scenario for each candidate
   (:func:`~simpy_llm.calibrate.compare.simulate_trace`). The loss is the mean
   absolute log ratio of simulated to observed TTFT plus that of E2E over the
   calibrated requests; Nelder–Mead on the log-coefficients from the direct
   estimate (``scipy.optimize.minimize``; deterministic: no random start).

The result is a profile (:func:`write_profile`) that any scenario can use
(``latency_model: {profile: FILE}``), with the fit's statistics and the trace
it came from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pandas as pd

from simpy_llm.calibrate.compare import _join, observed_latencies, simulate_trace
from simpy_llm.calibrate.scenario import PROFILE_VERSION, apply_profile, scenario_from_trace
from simpy_llm.config import Scenario
from simpy_llm.serving.batch_table import BatchTableLatency
from simpy_llm.workload.traces import read_trace_v2, trace_v2_paths

__all__ = ["FitResult", "direct_estimate", "fit", "server_counters", "write_profile"]

_PLACEHOLDER = {"kind": "batch_table", "params": {"decode_step_us": [1000.0], "prefill_token_us": 100.0}}
"""Stands in for the latency model while the scenario is built (the fit supplies the real one)."""


@attrs.frozen(kw_only=True)
class FitResult:
    """A fitted ``batch_table`` latency model and how it was found."""

    params: dict[str, Any]
    """The fitted model's parameters (``batch_table``; microseconds)."""
    direct: dict[str, Any]
    """The direct estimate (stage 1), same keys."""
    statistics: dict[str, Any]
    """Samples behind the direct estimate, losses before and after refinement, evaluations."""
    trace: str
    """The trace's CSV file."""
    server: dict[str, Any] | None
    """The trace header's server block."""

    def model(self) -> BatchTableLatency:
        """The fitted latency model object."""
        return BatchTableLatency(**self.params)

    def profile(self) -> dict[str, Any]:
        """The profile file's content (``docs/calibration.md``)."""
        return {
            "profile_version": PROFILE_VERSION,
            "latency_model": {"kind": "batch_table", "params": _plain(self.params)},
            "server": _plain(self.server),
            "fit": _plain({"trace": self.trace, "direct": self.direct, **self.statistics}),
        }


def _plain(value: Any) -> Any:
    """Plain YAML data: floats rounded to 6 significant digits of µs (stable across platforms)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return float(f"{v:.6g}") if math.isfinite(v) else None
    return value


def write_profile(result: FitResult, path: Path | str) -> Path:
    """Write *result* as a profile YAML file; returns its path."""
    import yaml

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "# A fitted latency profile (simpy-llm calibrate fit); use it as latency_model: {profile: THIS_FILE}\n"
    path.write_text(text + yaml.safe_dump(result.profile(), sort_keys=False), encoding="utf-8")
    return path


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
    :class:`~simpy_llm.workload.traces.Trace`).

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
    if not hasattr(trace, "frame"):
        trace = read_trace_v2(trace)
    steps = _Steps(trace, prefill_breaks, budget_tokens, tolerance_s)
    decode, mixed = steps.classify_gaps()
    server = trace.header.get("server") or {}
    limit = int(max_decoders or server.get("n_parallel") or server.get("max_num_seqs") or max(decode, default=1))
    table, context = _decode_fit(decode, limit)
    rows, targets, idle = steps.prompt_rows(mixed, table, context, ubatch_tokens)
    bounds = steps.alpha0_bounds(limit)
    prefill_step, prefill_only, prefill_token, restore, pair, alpha0 = _prompt_coefficients(rows, targets, idle, bounds)
    params = {
        "decode_step_us": [v * 1e6 for v in table],
        "prefill_step_us": prefill_step * 1e6,
        "prefill_token_us": prefill_token * 1e6,
        "prefill_only_step_us": prefill_only * 1e6,
        "decode_context_us": context * 1e6,
        "prefill_pair_us": pair * 1e6,
        "alpha0_us": alpha0 * 1e6,
        "cache_restore_us": restore * 1e6,
    }
    stats = {
        "pure_decode_gaps": {int(n): len(v) for n, v in sorted(decode.items())},
        "mixed_steps": len(mixed),
        "restoring_steps": int(sum(1 for m in mixed if m[3])),
        "idle_requests": int(idle.sum()),
        "joining_requests": len(bounds[0]),
        "tolerance_s": steps.eps,
    }
    return params, stats


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
        self.chunks = [_prompt_chunks(int(u), breaks, budget) for u in self.uncached]
        self.pairs = [_chunk_pairs(chunks, int(p - u)) for chunks, p, u in zip(self.chunks, self.prompt, self.uncached, strict=True)]
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
            for a, b in zip(t[:-1], t[1:], strict=True):
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
        rows, targets, idle = [], [], []
        for n, ctx, p, restores, pairs, gap in mixed:
            d_sum, with_prompt, prompt_only = _passes(n, int(p), ubatch, table)
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
                _, w, o = _passes(0, c, ubatch, table)
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


def _prompt_coefficients(
    rows: np.ndarray, targets: np.ndarray, idle: np.ndarray, bounds: tuple[list[float], list[float]]
) -> tuple[float, float, float, float, float, float]:
    """``(prefill_step, prefill_only_step, prefill_token, cache_restore, prefill_pair, alpha0)``
    in seconds from the rows of :meth:`_Steps.prompt_rows` (a robust bounded least-squares fit
    on the mixed steps) and the alpha0 bounds."""
    from scipy import optimize

    mixed = ~idle
    # prefill_only_step shows in the mixed steps only when prompts spill into passes of their
    # own; otherwise the idle requests and the alpha0 bounds tell it apart from alpha0. A
    # restore cost is fitted only when some mixed step started a request from a cached prefix.
    solve_only = bool(rows[mixed, 1].any())
    cols = [0, 1, 2] if solve_only else [0, 2]
    if rows[mixed, 3].any():
        cols.append(3)
    cols.append(4)
    coef = np.array([0.0, 0.0, 1e-4, 0.0, 0.0])
    if mixed.sum() >= len(cols):
        a, y = rows[mixed][:, cols], targets[mixed]
        scales = np.maximum(np.abs(a).max(axis=0), 1.0)  # columns of comparable size for the solver
        start = optimize.lsq_linear(a / scales, y, bounds=(0.0, np.inf)).x
        f_scale = max(float(np.median(np.abs(y))) * 0.05, 1e-5)
        res = optimize.least_squares(lambda c: (a / scales) @ c - y, x0=np.maximum(start, 1e-9), loss="soft_l1", f_scale=f_scale, bounds=(0.0, np.inf))
        coef[cols] = res.x / scales
    elif idle.sum() >= 2:  # no mixed steps: the prompt cost from the idle requests alone
        slope, _ = np.polyfit(rows[idle, 2], targets[idle], 1)
        coef[2] = max(float(slope), 1e-6)
    above, below = bounds
    hi = float(np.min(above)) if above else None
    lo = float(np.max(below)) if below else None
    bounded = ((lo + hi) / 2 if lo is not None and lo < hi else hi) if hi is not None else None
    if idle.any():
        residual = float(np.median(targets[idle] - rows[idle] @ coef))  # alpha0 (+ prefill_only_step when unsolved)
        if solve_only:
            alpha0 = residual
        else:
            alpha0 = min(bounded, residual) if bounded is not None else 0.0
            coef[1] = max(residual - alpha0, 0.0) / max(float(np.median(rows[idle, 1])), 1.0)
    else:
        alpha0 = bounded if bounded is not None else 0.0
    return float(coef[0]), float(coef[1]), float(coef[2]), float(coef[3]), float(coef[4]), max(alpha0, 0.0)


def _chunk_pairs(chunks: list[int], cached: int) -> list[int]:
    """Causal-attention (query, key) pairs of each chunk of a prompt computed after *cached*
    tokens: a chunk of ``c`` tokens after ``p`` has ``c p + c (c + 1) / 2``.

    >>> _chunk_pairs([3, 2], 10)
    [36, 29]
    """
    out = []
    done = cached
    for c in chunks:
        out.append(c * done + c * (c + 1) // 2)
        done += c
    return out


def _prompt_chunks(tokens: int, breaks: tuple[int, ...], budget: int | None) -> list[int]:
    """The pieces an engine computes a prompt of *tokens* uncomputed tokens in, step by step,
    when nothing else competes for the step's budget (``EngineConfig.prefill_breaks``).

    >>> _prompt_chunks(1501, (516, 4), 2048), _prompt_chunks(300, (516, 4), 2048), _prompt_chunks(3, (516, 4), 2048)
    ([985, 512, 4], [296, 4], [3])
    """
    out = []
    down = sorted(breaks, reverse=True)
    while tokens > 0:
        c = tokens if budget is None else min(tokens, budget)
        for brk in down:
            if brk < tokens:
                c = min(c, tokens - brk)
                break
        out.append(c)
        tokens -= c
    return out


def _passes(n: int, p: int, ubatch: int | None, table: list[float]) -> tuple[float, int, int]:
    """For a step of *n* decoders and *p* prompt tokens in passes of *ubatch* tokens: the sum
    of D over the passes, the passes with prompt tokens, and those with prompt tokens alone."""
    if ubatch is None or n + p <= ubatch:
        return _d(table, n), int(p > 0), int(p > 0 and n == 0)
    d_sum, with_prompt, prompt_only = 0.0, 0, 0
    left_d, left_p = n, p
    while left_d or left_p:
        d = min(left_d, ubatch)
        q = min(left_p, ubatch - d)
        d_sum += _d(table, d)
        with_prompt += q > 0
        prompt_only += q > 0 and d == 0
        left_d -= d
        left_p -= q
    return d_sum, with_prompt, prompt_only


def _d(table: list[float], n: int) -> float:
    if n <= 0:
        return 0.0
    if n <= len(table):
        return table[n - 1]
    slope = table[-1] - table[-2] if len(table) > 1 else 0.0
    return table[-1] + max(slope, 0.0) * (n - len(table))


def _decode_fit(samples: dict[int, list[tuple[float, float]]], size: int) -> tuple[list[float], float]:
    """The decode table ``D(1..size)`` and the per-context-token cost from pure-decode gaps
    ``(gap, decoders' context)`` by number of decoders: a robust fit of ``gap = D(n) +
    decode_context x context`` (one intercept per number of decoders seen, one shared slope),
    then the unseen sizes interpolated linearly between seen ones and extrapolated from the
    nearest two (flat from one)."""
    from scipy import optimize

    seen = sorted(n for n, v in samples.items() if n >= 1 and v)
    if not seen:
        raise ValueError("the trace has no pure-decode steps (two tokens of a request with no prompt between): nothing to fit")
    gaps = np.array([g for n in seen for g, _ in samples[n]])
    ctx = np.array([c for n in seen for _, c in samples[n]])
    which = np.concatenate([np.full(len(samples[n]), i) for i, n in enumerate(seen)])
    medians = np.array([np.median([g for g, _ in samples[n]]) for n in seen])
    scale = max(float(ctx.max()), 1.0)

    def residuals(x: np.ndarray) -> np.ndarray:
        return x[which] + x[-1] * ctx / scale - gaps

    fit = optimize.least_squares(
        residuals, x0=np.append(medians, 0.0), loss="soft_l1", f_scale=max(float(np.median(gaps)) * 0.05, 1e-5),
        bounds=(0.0, np.inf),
    )
    xs = np.array(seen, dtype=float)
    ys = fit.x[:-1]
    out = []
    for n in range(1, size + 1):
        if xs.size == 1:
            out.append(float(ys[0]))
        elif n < xs[0]:
            slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
            out.append(float(max(ys[0] + slope * (n - xs[0]), ys[0] * 0.5)))
        elif n > xs[-1]:
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            out.append(float(ys[-1] + max(slope, 0.0) * (n - xs[-1])))
        else:
            out.append(float(np.interp(n, xs, ys)))
    return out, float(fit.x[-1] / scale)


# ----------------------------------------------------------------------------- stage 2


def fit(
    trace: Path | str,
    scenario: Scenario | None = None,
    *,
    refine: bool = True,
    max_evaluations: int = 400,
    max_decoders: int | None = None,
) -> FitResult:
    """Fit a ``batch_table`` latency model to the observed *trace* (module docstring).

    Parameters
    ----------
    trace
        The observed trace v2 (path: CSV, YAML, stem or directory).
    scenario
        The serving system the trace came from (default: from the trace header,
        :func:`~simpy_llm.calibrate.scenario.scenario_from_trace`); its latency model is
        what is fitted and replaced.
    refine
        Run stage 2 (simulation-based refinement) after the direct estimate.
    max_evaluations
        At most this many replays in stage 2.
    max_decoders
        Entries of the decode table (default: the server's slots).

    Examples
    --------
    >>> from simpy_llm.calibrate.fit import fit
    >>> result = fit("tests/data/calibration/llamacpp_open_loop", refine=False)
    >>> len(result.params["decode_step_us"])
    4
    """
    from scipy import optimize

    csv_path = str(trace_v2_paths(trace)[1])
    observed = read_trace_v2(trace)
    if scenario is None:
        scenario = scenario_from_trace(observed, profile={"latency_model": _PLACEHOLDER}, trace_csv=csv_path)
    engine = scenario.serving.groups()[0].engine
    direct, stats = direct_estimate(
        observed,
        max_decoders=max_decoders or engine.max_num_seqs,
        ubatch_tokens=engine.ubatch_tokens,
        prefill_breaks=engine.prefill_breaks,
        budget_tokens=engine.max_num_batched_tokens,
    )
    statistics: dict[str, Any] = {"method": "direct", "samples": stats, "requests": int(len(observed.frame))}
    obs, _ = observed_latencies(observed)
    base = apply_profile(scenario, {"latency_model": _PLACEHOLDER})

    names, x0 = _vector(direct)
    evaluations = 0

    def loss(x: np.ndarray) -> float:
        nonlocal evaluations
        evaluations += 1
        params = _params(names, x, direct)
        records, _ = simulate_trace(base, csv_path, per_token=False, latency_model=BatchTableLatency(**params))
        return _loss(obs, records, observed.header)

    statistics["loss_direct"] = loss(x0)
    params = direct
    if refine:
        res = optimize.minimize(
            loss, x0, method="Nelder-Mead",
            options={"maxfev": max_evaluations, "xatol": 1e-3, "fatol": 1e-5, "adaptive": True},
        )
        best = res.x if res.fun <= statistics["loss_direct"] else x0
        params = _params(names, best, direct)
        statistics.update(method="direct+nelder-mead", loss_refined=float(min(res.fun, statistics["loss_direct"])),
                          converged=bool(res.success))
    statistics["evaluations"] = evaluations
    counters = server_counters(observed.header, Path(csv_path).parent)
    if counters is not None:
        statistics["server_counters"] = counters
        statistics["replay_steps"] = _replay_steps(base, csv_path, BatchTableLatency(**params))
    server = observed.header.get("server")
    return FitResult(params=params, direct=direct, statistics=statistics, trace=csv_path,
                     server=dict(server) if isinstance(server, Mapping) else None)


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
    from simpy_llm.calibrate.scenario import replay_scenario
    from simpy_llm.simulation import Simulation

    return int(Simulation(replay_scenario(scenario, csv_path), latency_model=model).run(progress=False).steps)


_SCALARS = ["prefill_step_us", "prefill_token_us", "prefill_only_step_us", "alpha0_us", "cache_restore_us",
            "decode_context_us", "prefill_pair_us"]
"""The ``batch_table`` coefficients besides the decode table that the fit estimates."""

_FLOOR_US = {"decode_context_us": 1e-4, "prefill_pair_us": 1e-5}
"""Smallest value the log-space search reaches, µs: 1 for the per-step and per-token terms, less
for the per-context-token and per-pair ones (which are that much smaller); below it, 0."""


def _floors(n_table: int) -> np.ndarray:
    return np.array([1.0] * n_table + [_FLOOR_US.get(name, 1.0) for name in _SCALARS])


def _vector(params: Mapping[str, Any]) -> tuple[list[str], np.ndarray]:
    """The coefficients as the search's vector: their logs (each at least its floor)."""
    names = [f"decode_step_us[{i}]" for i in range(len(params["decode_step_us"]))] + _SCALARS
    values = np.array([*params["decode_step_us"], *(params[name] for name in _SCALARS)], dtype=float)
    return names, np.log(np.maximum(values, _floors(len(params["decode_step_us"]))))


def _params(names: list[str], x: np.ndarray, like: Mapping[str, Any]) -> dict[str, Any]:
    """The coefficients of a search vector (values at their floor are 0)."""
    n = len(like["decode_step_us"])
    values = np.exp(x)
    floors = _floors(n)
    out: dict[str, Any] = {"decode_step_us": [float(v) for v in values[:n]]}
    for name, v, floor in zip(names[n:], values[n:], floors[n:], strict=True):
        out[name] = float(v) if v > floor * 1.0001 else 0.0
    if out["prefill_step_us"] == 0.0 and out["prefill_token_us"] == 0.0:
        # A step with prompt tokens must take time (a short or loaded run can leave both
        # terms unidentified): the per-token term stays at its floor rather than 0.
        out["prefill_token_us"] = float(max(values[names.index("prefill_token_us")], floors[names.index("prefill_token_us")]))
    return out


def _loss(obs: pd.DataFrame, records: pd.DataFrame, header: Mapping[str, Any]) -> float:
    joined = _join(obs, records, header, None, 0.0)
    kept = joined[joined["excluded"] == ""]
    total = 0.0
    for m in ("ttft", "e2e"):
        o = kept[f"{m}_observed_s"].to_numpy()
        s = kept[f"{m}_simulated_s"].to_numpy()
        ok = np.isfinite(o) & np.isfinite(s) & (o > 0) & (s > 0)
        if ok.any():
            total += float(np.mean(np.abs(np.log(s[ok] / o[ok]))))
    return total
