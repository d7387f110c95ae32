"""Operating ranges: what a trace covered, and a workload outside what a profile was fitted on.

A fitted profile records the ranges of its trace (``fit.ranges``: the
quantities of :data:`~simpy_llm.config.profile.RANGE_QUANTITIES`, each
``[min, max]``), counted on the calibrated requests (ok, past the warm-up):

* ``prompt_tokens``, ``output_tokens``: the server's counts (``usage``);
* ``uncached_prompt_tokens`` and ``cached_fraction``: the prompt less the tokens
  the server reported cached, and their share of the prompt (left out when the
  trace has no cached counts);
* ``concurrency``: at each request's send, the requests sent and not finished
  (every sent request counts, warm-up and failed ones too; itself included);
* ``decoders``: the fit takes the decoders of every step it reconstructed; a
  trace predicted (``compare``) counts, at each first token of a streamed request
  with two or more tokens, the requests between their first and last token.

:func:`profile_warnings` is what ``compare`` reports about a profile: each
quantity of the predicted trace outside the profile's range (named, with the
fitted range and the trace's), after the profile's own warnings. A run warns
the same way (:func:`~simpy_llm.metrics.diagnostics.outside_fitted_ranges`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simpy_llm.config import Scenario
from simpy_llm.config.profile import FittedLatencySpec, check_ranges, load_profile
from simpy_llm.metrics.diagnostics import in_flight_at, outside_ranges, range_message

__all__ = ["PROFILE_FIT_WARNING", "profile_warnings", "range_limits", "trace_range_values"]

PROFILE_FIT_WARNING = "the profile's fit warns: "
"""What :func:`profile_warnings` puts before each of the profile's own fit warnings."""


def trace_range_values(
    obs: pd.DataFrame,
    header: Mapping[str, Any],
    *,
    warm_up_requests: int | None = None,
    warm_up_s: float = 0.0,
    decoders: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """The values of each range quantity in an observed trace (module docstring), from its
    requests as :func:`~simpy_llm.calibrate.compare.observed_latencies` gives them. The warm-up
    is the header's ``warm_up_requests`` unless given, and/or the first *warm_up_s* seconds;
    *decoders* replaces the count from token times."""
    n_warm = int(header.get("warm_up_requests", 0) or 0) if warm_up_requests is None else warm_up_requests
    send = obs["send_s"].to_numpy(dtype=np.float64)
    first_send = float(send.min()) if send.size else 0.0
    calibrated = ((obs["status"].to_numpy() == "ok") & (obs["request_id"].to_numpy() >= n_warm)
                  & (send - first_send >= warm_up_s))
    prompt = obs["input_tokens"].to_numpy(dtype=np.float64)
    cached = obs["cached_tokens"].to_numpy(dtype=np.float64)
    e2e = obs["e2e_s"].to_numpy(dtype=np.float64)
    ttft = obs["ttft_s"].to_numpy(dtype=np.float64)
    output = obs["output_tokens"].to_numpy(dtype=np.float64)
    end = send + np.where(np.isfinite(e2e), e2e, 0.0)
    values = {
        "prompt_tokens": prompt[calibrated],
        "output_tokens": output[calibrated],
        "concurrency": in_flight_at(send, end, send[calibrated]),
    }
    known = calibrated & np.isfinite(cached)
    if known.any():
        values["uncached_prompt_tokens"] = prompt[known] - cached[known]
        with np.errstate(invalid="ignore", divide="ignore"):
            values["cached_fraction"] = np.where(prompt[known] > 0, cached[known] / prompt[known], np.nan)
    if decoders is None:
        first = send + ttft
        streamed = (obs["status"].to_numpy() == "ok") & np.isfinite(first) & np.isfinite(e2e)
        at = streamed & calibrated & (output >= 2)
        decoders = in_flight_at(first[streamed], np.maximum(end[streamed], first[streamed]), first[at])
    values["decoders"] = np.asarray(decoders, dtype=np.float64)
    return values


def range_limits(values: Mapping[str, np.ndarray]) -> dict[str, list[float]]:
    """``{quantity: [min, max]}`` over the finite values of each quantity that has some.

    >>> range_limits({"prompt_tokens": np.array([20.0, 810.0, 35.0]), "decoders": np.array([])})
    {'prompt_tokens': [20, 810]}
    """
    out: dict[str, list[float]] = {}
    for quantity, v in values.items():
        v = np.asarray(v, dtype=np.float64)
        v = v[np.isfinite(v)]
        if v.size:
            lo, hi = float(v.min()), float(v.max())
            out[quantity] = [int(lo), int(hi)] if lo.is_integer() and hi.is_integer() else [lo, hi]
    return out


def profile_warnings(
    profile: Mapping[str, Any] | Path | str | None,
    scenario: Scenario,
    obs: pd.DataFrame,
    header: Mapping[str, Any],
    *,
    warm_up_requests: int | None = None,
    warm_up_s: float = 0.0,
) -> list[str]:
    """What ``compare`` reports about the profile it predicts with: the profile's own fit
    warnings, then each quantity of the observed trace *obs* outside the ranges the profile
    was fitted on. The profile is *profile* (path or data), else the ranges the scenario's
    latency model carries (``fitted_ranges``, first replica group that has them)."""
    fit: Any = None
    ranges: Mapping[str, Any] | None = None
    if profile is not None:
        data = load_profile(profile) if isinstance(profile, (str, Path)) else profile
        fit = data.get("fit") if isinstance(data.get("fit"), Mapping) else None
        ranges = check_ranges(fit["ranges"])[0] if fit and fit.get("ranges") else None
    else:
        for group in scenario.serving.groups():
            model = group.latency_model
            ranges = (model.fitted_ranges or None) if isinstance(model, FittedLatencySpec) else None
            if ranges:
                break
    out = [PROFILE_FIT_WARNING + str(w) for w in (fit.get("warnings") or [])] if fit else []
    if ranges:
        seen = trace_range_values(obs, header, warm_up_requests=warm_up_requests, warm_up_s=warm_up_s)
        out += [f"workload outside the profile's fitted range: {range_message(f)}" for f in outside_ranges(ranges, seen)]
    return out
