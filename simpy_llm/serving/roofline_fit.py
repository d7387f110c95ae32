"""Calibrate the roofline's efficiencies per GPU against BLIS's measured step-time fits.

The ideal roofline (peak bandwidth, BLIS's MFUs) has no per-step overhead and reads weights
at the datasheet's bandwidth, so it is several times faster than real decode steps. This
module fits, per GPU, the three efficiencies :class:`~simpy_llm.serving.roofline.Roofline`
exposes (``mfu`` for prefill, ``mfu_decode``, ``mbu``) so that its step times land on BLIS's
coefficients (``profiles/blis/blackbox_coefficients.csv``) over a fixed grid:

* prefill: chunks of :data:`PREFILL_TOKENS` fresh tokens (attention pairs ``c (c + 1) / 2``),
  against ``beta1 x c`` (the per-token cost; BLIS's ``beta0`` is a per-step cost the
  roofline has no term for);
* decode: batches of :data:`DECODE_BATCHES` requests at :data:`DECODE_CONTEXTS` context
  tokens each, against the whole step ``beta0 + beta2 x batch``.

Residuals are logarithms of the ratio roofline / BLIS, so every row weighs alike whatever
its size; ``scipy.optimize.least_squares`` minimises their sum of squares within (0.01, 1].
The rows used are those fitted on vLLM 0.8.4 (the version of most rows) whose model has a
shipped configuration, except :data:`HELD_OUT_MODEL`, kept out to test the fit. The fitted
values are written in ``profiles/gpus.yaml`` under ``calibrated`` and used by
``roofline`` with ``efficiency: calibrated``; ``docs/latency.md`` reports each row's error.
The module imports scipy, so only the fit (not a run) loads it.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence

import attrs
import numpy as np

from simpy_llm.serving.hardware import Hardware, gpu_spec, resolve_hardware
from simpy_llm.serving.profiles import profiles_dir
from simpy_llm.serving.roofline import Roofline

__all__ = [
    "DECODE_BATCHES",
    "DECODE_CONTEXTS",
    "HELD_OUT_MODEL",
    "PREFILL_TOKENS",
    "VLLM_VERSION",
    "BlisRow",
    "RowError",
    "fit_efficiencies",
    "fit_rows",
    "row_errors",
]

PREFILL_TOKENS = (256, 512, 1024, 2048)
"""Fresh prompt tokens of the prefill chunks compared."""
DECODE_BATCHES = (1, 4, 16, 64, 256)
"""Decoding requests of the decode steps compared."""
DECODE_CONTEXTS = (256, 1024)
"""Context tokens of each decoding request."""
HELD_OUT_MODEL = "meta-llama/llama-3.1-8b-instruct"
"""The model whose rows the fit leaves out, to test how it carries over to a model it has not seen."""
VLLM_VERSION = "v0.8.4"
"""The vLLM version of the rows used (74 of the 87; the later versions' fits differ in kind)."""


@attrs.frozen(kw_only=True)
class BlisRow:
    """One BLIS coefficient row with the hardware its model resolves to."""

    model: str
    gpu: str
    tp: int
    beta0_us: float
    beta1_us: float
    beta2_us: float
    hardware: Hardware


def fit_rows(gpu: str, *, include_held_out: bool = False) -> tuple[BlisRow, ...]:
    """The BLIS rows of *gpu* the fit uses: vLLM 0.8.4, a shipped model configuration, and
    (unless *include_held_out*) not :data:`HELD_OUT_MODEL`."""
    rows: list[BlisRow] = []
    with open(profiles_dir() / "blis" / "blackbox_coefficients.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            if r["gpu"] != gpu or r["vllm"] != VLLM_VERSION:
                continue
            if r["model"] == HELD_OUT_MODEL and not include_held_out:
                continue
            hardware = resolve_hardware(r["model"], r["gpu"], int(r["tp"]))
            if hardware is None:
                continue
            rows.append(
                BlisRow(
                    model=r["model"],
                    gpu=r["gpu"],
                    tp=int(r["tp"]),
                    beta0_us=float(r["beta0_us"]),
                    beta1_us=float(r["beta1_us_per_prefill_tok"]),
                    beta2_us=float(r["beta2_us_per_decode_tok"]),
                    hardware=hardware,
                )
            )
    return tuple(rows)


def _log_ratios(row: BlisRow, roofline: Roofline) -> tuple[list[float], list[float]]:
    """log(roofline / BLIS) at every prefill point and every decode point of the grid."""
    prefill = [
        math.log(roofline.step_time_s(c, 0, prefill_attention_pairs=c * (c + 1) / 2) / (row.beta1_us * c * 1e-6))
        for c in PREFILL_TOKENS
    ]
    decode = [
        math.log(
            roofline.step_time_s(0, b, decode_context_tokens=b * ctx) / ((row.beta0_us + row.beta2_us * b) * 1e-6)
        )
        for b in DECODE_BATCHES
        for ctx in DECODE_CONTEXTS
    ]
    return prefill, decode


def _roofline(row: BlisRow, x: Sequence[float] | np.ndarray) -> Roofline:
    return Roofline(hardware=row.hardware, mfu=float(x[0]), mfu_decode=float(x[1]), mbu=float(x[2]))


def fit_efficiencies(gpu: str) -> dict[str, float]:
    """Least-squares efficiencies of *gpu* (``mfu_prefill``, ``mfu_decode``, ``mbu``), rounded to 3 places.

    Starts from the GPU's BLIS MFUs and ``mbu = 0.5``; the result depends only on the
    committed rows and the grid above (and scipy's trust-region solver).

    Examples
    --------
    >>> fit_efficiencies("H100")
    {'mfu_prefill': 0.754, 'mfu_decode': 0.331, 'mbu': 0.656}
    """
    from scipy.optimize import least_squares  # heavy; only the fit needs it

    rows = fit_rows(gpu)
    spec = gpu_spec(gpu)

    def residuals(x: np.ndarray) -> np.ndarray:
        out: list[float] = []
        for row in rows:
            prefill, decode = _log_ratios(row, _roofline(row, x))
            out += prefill + decode
        return np.asarray(out)

    start = np.array([spec.mfu_prefill, spec.mfu_decode, 0.5])
    result = least_squares(residuals, start, bounds=([0.01] * 3, [1.0] * 3), method="trf")
    mfu, mfu_decode, mbu = (round(float(v), 3) for v in result.x)
    return {"mfu_prefill": mfu, "mfu_decode": mfu_decode, "mbu": mbu}


@attrs.frozen(kw_only=True)
class RowError:
    """How far a roofline lands from one BLIS row: the ratio roofline / BLIS over the grid."""

    row: BlisRow
    prefill: tuple[float, float]
    """Smallest and largest ratio to ``beta1 x c`` over the prefill chunks."""
    decode: tuple[float, float]
    """Smallest and largest ratio to ``beta0 + beta2 x batch`` over the decode steps."""
    rms_log: float
    """Root mean square of the log ratios, prefill and decode points together."""


def row_errors(gpu: str, efficiencies: dict[str, float], *, include_held_out: bool = True) -> tuple[RowError, ...]:
    """Each row's error (:class:`RowError`) under *efficiencies* (``mfu_prefill``, ``mfu_decode``, ``mbu``)."""
    x = (efficiencies["mfu_prefill"], efficiencies["mfu_decode"], efficiencies["mbu"])
    errors: list[RowError] = []
    for row in fit_rows(gpu, include_held_out=include_held_out):
        prefill, decode = _log_ratios(row, _roofline(row, x))
        both = prefill + decode
        errors.append(
            RowError(
                row=row,
                prefill=(math.exp(min(prefill)), math.exp(max(prefill))),
                decode=(math.exp(min(decode)), math.exp(max(decode))),
                rms_log=math.sqrt(sum(v * v for v in both) / len(both)),
            )
        )
    return tuple(errors)

