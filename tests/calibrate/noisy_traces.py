"""Noisy observed traces with known coefficients: a simulated observation whose engine steps
each took a random factor of their modelled time, as a real server's do.

The simulator's steps are exact; a real server's vary from step to step (the committed
llama.cpp traces: a fifth either way at the same batch). :func:`warp_trace` stretches a
simulated observation's timeline: the instants at which some token arrived are the step
ends, and each interval between two consecutive ones is multiplied by an independent
lognormal factor of mean 1 and coefficient of variation *cv*; every other instant (sends)
moves with the interval it falls in. Steps shared by several requests stay shared, the
order of events is kept, and the coefficients that generated the trace stay the truth in
expectation, so a fit has to tell them from noise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from simpy_llm.workload.traces import read_trace_v2, write_trace_v2

TIME_COLUMNS = ("arrival_time_us", "send_time_us", "first_chunk_time_us", "first_token_time_us",
                "last_chunk_time_us", "first_byte_time_us", "done_time_us")
"""The trace columns that hold instants (µs)."""


def warp_trace(source: Path | str, target: Path | str, *, cv: float, seed: int) -> Path:
    """Write the trace v2 at *source* to *target* (a stem) with its step durations scaled by
    independent lognormal factors (mean 1, coefficient of variation *cv*); returns *target*."""
    trace = read_trace_v2(source)
    frame = trace.frame.copy()
    first = pd.to_numeric(frame["first_token_time_us"], errors="coerce").to_numpy(dtype=float)
    tokens: list[np.ndarray | None] = []
    for t0, cell in zip(first, frame["itl_us"], strict=True):
        if np.isnan(t0):
            tokens.append(None)
            continue
        gaps = np.array(cell.split(), dtype=float) if isinstance(cell, str) and cell.strip() else np.empty(0)
        tokens.append(t0 + np.concatenate([[0.0], np.cumsum(gaps)]))
    knots = np.unique(np.concatenate([t for t in tokens if t is not None]))
    sigma = np.sqrt(np.log1p(cv**2))
    factors = np.random.default_rng(seed).lognormal(-sigma**2 / 2, sigma, size=knots.size - 1)
    warped = np.concatenate([[knots[0]], knots[0] + np.cumsum(np.diff(knots) * factors)])

    def warp(t: np.ndarray) -> np.ndarray:
        out = np.interp(t, knots, warped)
        out = np.where(t < knots[0], t - knots[0] + warped[0], out)  # before the first step: shifted
        return np.rint(np.where(t > knots[-1], t - knots[-1] + warped[-1], out))

    for col in TIME_COLUMNS:
        if col in frame:
            v = pd.to_numeric(frame[col], errors="coerce").to_numpy(dtype=float)
            ok = ~np.isnan(v)
            new = np.full(v.shape, np.nan)
            new[ok] = warp(v[ok])
            frame[col] = pd.array([pd.NA if np.isnan(x) else int(x) for x in new], dtype="Int64")
    frame["itl_us"] = ["" if t is None else " ".join(str(int(g)) for g in np.diff(warp(t))) for t in tokens]
    write_trace_v2(frame, target, header=trace.header)
    return Path(target)
