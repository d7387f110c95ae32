"""The ``batch_table`` model's steps as :mod:`~simpy_llm.calibrate.fit` and
:mod:`~simpy_llm.calibrate.probe_estimate` reconstruct them from a trace: how an engine cuts
a prompt into chunks (``prefill_breaks``) and forward passes (``ubatch_tokens``), the
causal-attention pairs of each chunk, the decode table's value at any batch size, the
coefficients' documented defaults, and a profile's numbers as plain YAML data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from simpy_llm.config.profile import PROFILE_VERSION

__all__ = [
    "DEFAULTS_US",
    "PLACEHOLDER_MODEL",
    "chunk_pairs",
    "plain_profile_data",
    "profile_document",
    "prompt_chunks",
    "step_passes",
    "table_step",
    "write_profile_document",
]

PLACEHOLDER_MODEL = {"kind": "batch_table", "params": {"decode_step_us": [1000.0], "prefill_token_us": 100.0}}
"""Stands in for the latency model while the scenario is built (the fit supplies the real one)."""

DEFAULTS_US = {
    "prefill_pair_us": 0.0,
    "decode_context_us": 0.0,
    "cache_restore_us": 0.0,
    "alpha0_us": 0.0,
    "prefill_only_step_us": 0.0,
}
"""The documented defaults of the coefficients a trace may leave undetermined (no prior): the
term is left out. A decode-table entry's default is the table interpolated between the
determined entries (extrapolated from its ends); ``prefill_step_us`` and ``prefill_token_us``
have none."""


def plain_profile_data(value: Any) -> Any:
    """Plain YAML data: floats rounded to 6 significant digits of µs (stable across platforms)."""
    if isinstance(value, Mapping):
        return {str(k): plain_profile_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_profile_data(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return float(f"{v:.6g}") if math.isfinite(v) else None
    return value



def profile_document(params: Mapping[str, Any], server: Any, fit_block: Mapping[str, Any]) -> dict[str, Any]:
    """A profile file's content: a ``batch_table`` model of *params*, the *server* block and
    the *fit_block* (``fit``), as plain data (``docs/calibration.md``)."""
    return {
        "profile_version": PROFILE_VERSION,
        "latency_model": {"kind": "batch_table", "params": plain_profile_data(params)},
        "server": plain_profile_data(server),
        "fit": plain_profile_data(fit_block),
    }


def write_profile_document(document: Mapping[str, Any], path: Path | str, made_by: str) -> Path:
    """Write a profile *document* as YAML at *path* under a comment naming the command that
    made it (*made_by*: ``fit`` or ``probe``); returns the path."""
    import yaml

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    adjective = {"fit": "fitted", "probe": "probed"}[made_by]
    text = f"# A {adjective} latency profile (simpy-llm calibrate {made_by}); use it as latency_model: {{profile: THIS_FILE}}\n"
    path.write_text(text + yaml.safe_dump(dict(document), sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path

def chunk_pairs(chunks: list[int], cached: int) -> list[int]:
    """Causal-attention (query, key) pairs of each chunk of a prompt computed after *cached*
    tokens: a chunk of ``c`` tokens after ``p`` has ``c p + c (c + 1) / 2``.

    >>> chunk_pairs([3, 2], 10)
    [36, 29]
    """
    out = []
    done = cached
    for c in chunks:
        out.append(c * done + c * (c + 1) // 2)
        done += c
    return out


def prompt_chunks(tokens: int, breaks: tuple[int, ...], budget: int | None) -> list[int]:
    """The pieces an engine computes a prompt of *tokens* uncomputed tokens in, step by step,
    when nothing else competes for the step's budget (``EngineConfig.prefill_breaks``).

    >>> prompt_chunks(1501, (516, 4), 2048), prompt_chunks(300, (516, 4), 2048), prompt_chunks(3, (516, 4), 2048)
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


def step_passes(n: int, p: int, ubatch: int | None, table: list[float]) -> tuple[float, int, int]:
    """For a step of *n* decoders and *p* prompt tokens in passes of *ubatch* tokens: the sum
    of D over the passes, the passes with prompt tokens, and those with prompt tokens alone."""
    if ubatch is None or n + p <= ubatch:
        return table_step(table, n), int(p > 0), int(p > 0 and n == 0)
    d_sum, with_prompt, prompt_only = 0.0, 0, 0
    left_d, left_p = n, p
    while left_d or left_p:
        d = min(left_d, ubatch)
        q = min(left_p, ubatch - d)
        d_sum += table_step(table, d)
        with_prompt += q > 0
        prompt_only += q > 0 and d == 0
        left_d -= d
        left_p -= q
    return d_sum, with_prompt, prompt_only


def table_step(table: list[float], n: int) -> float:
    if n <= 0:
        return 0.0
    if n <= len(table):
        return table[n - 1]
    slope = table[-1] - table[-2] if len(table) > 1 else 0.0
    return table[-1] + max(slope, 0.0) * (n - len(table))
