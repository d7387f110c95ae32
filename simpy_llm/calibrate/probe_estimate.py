"""The profile a probe's trace gives: :func:`probe_estimate` (``simpy-llm calibrate probe``).

The probe (:mod:`simpy_llm.calibrate.probe`) names each request's phase in its ``client_id``;
this module reads the trace alone and estimates every ``batch_table`` coefficient the phases
separate, with its 95 % interval:

* ``isolated``: ``TTFT = alpha0 + RTT + (prefill_step + prefill_only_step) x passes +
  prefill_token x P + prefill_pair x pairs(P)``, ordinary least squares with standard errors
  (passes and pairs of the prompt cut as the engine cuts it:
  :func:`~simpy_llm.calibrate.batch_steps.prompt_chunks`, :func:`~simpy_llm.calibrate.batch_steps.chunk_pairs`,
  with the engine the header's server block describes); each request's median decode gap
  against its context (the prompt and the tokens decoded before that gap): ``decode_context``,
  least squares;
* ``decode.N``: the gaps of one request while all ``N`` decode (after the last one's first
  token, before the first one's last), less ``decode_context`` x the decoders' context:
  ``D(N)``, the median, with the order-statistics interval of a median
  (:func:`median_interval`); sizes not measured are interpolated, flat beyond the measured ones;
* ``mixed``: the decoder's gaps holding a joiner's prompt chunks (the steps ending at the
  joiner's first token and just before, one per chunk), less the median of its pure gaps and
  the prompt terms: ``prefill_step``, their mean; ``prefill_only_step`` = the per-pass cost less
  ``prefill_step``;
* ``extension`` / ``restore``: TTFT less the isolated fit's prediction of a fresh start of
  the uncached tokens (``prompt - cached``, as reported) after the cached ones: the cost of a
  start from a cached prefix, ``cache_restore_us`` (the restore's when there is one).

**Conventions.** Tokens of different requests less than a quarter of the median token gap
apart end the same engine step (steps are at least a decode step apart, and a loaded client
reads the tokens of one step several milliseconds apart). The decoders' context of a
pure-decode step is counted as the simulator's engine counts it, at the start of the stretch
of identical steps (when the batch last changed): a real server's grows by one token per
decoder and step, a difference of ``decode_context`` x decoders x steps, well under a
percent of a step on the servers measured. Not every coefficient is identifiable on every
engine: without prompt breaks or passes (a vLLM-like engine computes any probe prompt in one
step) every isolated prompt pays one fixed cost, so ``alpha0`` stays at its default 0 and the
whole fixed cost is ``prefill_only_step``; without the mixed phase ``prefill_step`` is the
fixed cost of a prompt step on an idle server and ``prefill_only_step`` its default 0.
Coefficients are not negative: a least-squares term that comes out below 0 is dropped from
the fit and held at 0 (its interval what the fit allowed above 0), and any other estimate
below 0 is held at 0, each with a warning; intervals are clipped at 0. ``alpha0`` is the
intercept less the trace header's measured round trip (``network.measured_rtt_ms``), which
``calibrate compare`` adds back to every simulated TTFT. A difference of two estimates
(``prefill_only_step``) takes the root sum of their squared standard errors and the smaller
degrees of freedom; a mean of residuals (``prefill_step``, the cached-prefix costs) adds the
variance of what it subtracts.

The result (:class:`ProbeResult`) is a profile (:meth:`ProbeResult.profile`,
:func:`write_probe_profile`): ``latency_model`` with every coefficient, ``server``, and ``fit``
with ``method: probe``, ``trace``, ``intervals`` (95 %, µs; null when not measured),
``sources`` (``probe`` for measured, ``default`` for a documented default), ``ranges`` (what
the probe covered), ``warnings`` and the phases' statistics (``probe``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from simpy_llm.calibrate.batch_steps import (
    DEFAULTS_US,
    PLACEHOLDER_MODEL,
    chunk_pairs,
    profile_document,
    prompt_chunks,
    step_passes,
    write_profile_document,
)
from simpy_llm.calibrate.compare import observed_latencies
from simpy_llm.calibrate.scenario import scenario_from_trace
from simpy_llm.config import EngineConfig
from simpy_llm.serving.batch_table import BatchTableLatency
from simpy_llm.workload.traces import Trace, read_trace_v2, trace_v2_paths

__all__ = [
    "COEFFICIENTS",
    "DEFAULTS_US",
    "LEVEL",
    "ProbeError",
    "ProbeResult",
    "median_interval",
    "probe_estimate",
    "write_probe_profile",
]

COEFFICIENTS = (
    "decode_step_us", "prefill_step_us", "prefill_token_us", "prefill_only_step_us",
    "alpha0_us", "cache_restore_us", "decode_context_us", "prefill_pair_us",
)
"""The ``batch_table`` coefficients a profile's ``fit.intervals`` and ``fit.sources`` name."""


LEVEL = 0.95
"""Confidence level of every interval."""


class ProbeError(ValueError):
    """A probe that cannot run or whose trace gives no profile (the message says why)."""


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
    """The estimate, s (per token, per pair or per context token for those terms)."""
    se: float | None = None
    """Its standard error, same unit (None: unknown)."""
    df: float | None = None
    """Degrees of freedom of its t interval."""
    interval: tuple[float, float] | None = None
    """An interval given directly (a term held at 0: what its fit allowed), same unit."""

    def bounds(self) -> tuple[float, float] | None:
        """The 95 % interval: the one given, else ``value +/- t(df) x se``; None when unknown."""
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
        return profile_document(self.params, self.server, fit)


def write_probe_profile(result: ProbeResult, path: Path | str) -> Path:
    """Write *result* as a profile YAML file; returns its path."""
    return write_profile_document(result.profile(), path, "probe")


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
        return prompt_chunks(int(uncached), self.breaks, self.budget)

    def row(self, prompt: int, cached: int) -> tuple[float, float, float]:
        """(passes of an idle server, uncached tokens, attention pairs) of a prompt."""
        u = max(prompt - cached, 1)
        chunks = self.chunks(u)
        n_passes = sum(step_passes(0, c, self.ubatch, [1.0])[1] for c in chunks)
        return float(n_passes), float(u), float(sum(chunk_pairs(chunks, prompt - u)))


def _engine_of(trace: Trace) -> EngineConfig:
    """The engine the trace header's server block describes (as ``calibrate fit`` builds it)."""
    scenario = scenario_from_trace(trace, profile={"latency_model": PLACEHOLDER_MODEL}, trace_csv="probe-trace.csv")
    return scenario.serving.groups()[0].engine


@attrs.frozen
class _IsolatedFit:
    """The isolated prompts' least squares: the design columns kept (0 intercept, 1 passes,
    2 prefill tokens, 3 attention pairs), their coefficients and covariance, and the
    residual degrees of freedom."""

    keep: list[int]
    beta: np.ndarray
    cov: np.ndarray
    df: int


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
        self.iso = _IsolatedFit(keep, beta, cov, df)
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
        x = x_full[self.iso.keep]
        return float(x @ self.iso.beta), float(x @ self.iso.cov @ x)

    def _decode_context(self, rows: list[dict[str, Any]]) -> None:
        """``decode_context`` from each isolated request's decode gaps, steps of one decoder
        whose context is its prompt and the tokens decoded since: the median of a request's
        gaps (robust to a step the machine delayed) at the median gap's context, against
        which a least-squares line."""
        timed = [r for r in rows if len(r["times"]) > 1]
        ctx = [r["prompt"] + (len(r["times"]) - 2) / 2 for r in timed]  # gap k (t[k-1] -> t[k]): prompt + k - 1
        gap = [float(np.median(np.diff(r["times"]))) for r in timed]
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
        mixed_gaps: dict[int, tuple[int, int]] = {}  # gap index k (t[k-1] -> t[k]) -> (chunk tokens, pairs)
        for b in joiners:
            chunks = self.engine.chunks(max(b["prompt"] - (b["cached"] or 0), 1))
            pairs = chunk_pairs(chunks, b["prompt"] - sum(chunks))
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
        keep = self.iso.keep
        g = np.zeros(len(keep))
        if 2 in keep:
            g[keep.index(2)] = float(np.mean(cs))
        if 3 in keep:
            g[keep.index(3)] = float(np.mean(qs))
        var = (float(np.var(y, ddof=1)) / m if m > 1 else float("nan")) + var_base + float(g @ self.iso.cov @ g)
        self.stats["mixed"] = {"joiners": len(joiners), "mixed_steps": m, "pure_steps": len(pure), "decoder_step_ms": base * 1e3}
        est = _Estimate(value, math.sqrt(var) if m > 1 else None, m - 1)
        if value < 0:
            self.warnings.append(f"mixed phase: a prompt step cost {value * 1e6:.3g} µs less than the decode step: prefill_step held at 0")
            bounds = est.bounds()
            est = _Estimate(0.0, interval=None if bounds is None else (0.0, max(bounds[1], 0.0)))
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
        df = m - 1 if m > 1 else self.iso.df
        se = math.sqrt(sigma2 / m + float(np.mean(variances)))
        self.stats[phase]["extra_us"] = value * 1e6
        return _Estimate(value, se, df)

    def _iso_sigma2(self) -> float:
        rows = self.req.phase("isolated")
        x = np.array([[1.0, *self.engine.row(r["prompt"], r["cached"] or 0)] for r in rows])[:, self.iso.keep]
        resid = np.array([r["ttft"] for r in rows]) - x @ self.iso.beta
        return float(resid @ resid) / max(self.iso.df, 1)

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
