"""The report's warnings about the observed run itself (seed 000 §11, "Edge Case Handling").

Each function looks at one thing a comparison cannot see in its own numbers
and returns a sentence for the report's ``warnings`` (``None`` when all is
well); :func:`run_warnings` collects them in this order:

* **No usage**: answered requests whose server gave no ``usage`` (the trace's
  ``prompt_tokens_source`` / ``completion_tokens_source`` are not ``usage``):
  their token counts are the workload's requested lengths, not the server's
  (the observer writes those when the server gives none). They are still
  compared (a server that never reports usage would leave nothing to compare);
  the warning says how many.
* **A saturated load generator**: from the header's ``load_generator`` block
  (``simpy-llm observe`` writes it), or, for a trace without one, from the
  rows' targets (``arrival_time_us``) and sends (``send_time_us``): the client
  lagged (its median lag above its threshold), the achieved send rate fell
  more than :data:`RATE_SHORTFALL` below the requested one, or the 99th
  percentile of the schedule delay exceeded :data:`DELAY_SHARE` of the mean
  inter-arrival time (seed 000: "delay > 10 % of inter-arrival time"). The
  replay uses the actual send times, so the comparison itself stands; the run
  did not put the intended load on the server.
* **One prefix group**: every request sent belongs to the same prefix group;
  the prefix cache is then heavily used, and its hit rates after evictions may
  differ between the server and the simulator.
* **Few requests**: fewer than :data:`MIN_REQUESTS` requests compared, the
  seed's "Insufficient requests for statistical significance (N < 30)" (each
  metric's comparison also warns about its own pairs).
* **A busy machine under the emulated server**: the trace comes from the
  emulated server (``server.type: emulated``) and is replayed on the serving
  system it reports about itself, so a replay predicts it up to the emulator's
  timing error; the 90th percentile of ``|simulated - observed|`` of E2E or
  TTFT above :data:`EMULATED_P90_ERROR_S` means the machine was busy while the
  trace was recorded (docs/observe.md: on an idle 2-core machine the 90th
  percentile stayed at or below 5 ms).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "DELAY_SHARE",
    "EMULATED_P90_ERROR_S",
    "MIN_REQUESTS",
    "RATE_SHORTFALL",
    "emulated_replay_warning",
    "few_requests_warning",
    "load_generator_warning",
    "prefix_group_warning",
    "run_warnings",
    "usage_warning",
]

MIN_REQUESTS = 30
"""Fewer requests compared than this and the report warns (seed 000 §11)."""

DELAY_SHARE = 0.10
"""The p99 schedule delay above this share of the mean inter-arrival time is a saturated
load generator (seed 000 §11: "delay > 10 % of inter-arrival time")."""

RATE_SHORTFALL = 0.10
"""An achieved send rate more than this share below the requested one is a saturated load
generator."""

EMULATED_P90_ERROR_S = 0.005
"""The emulated server's documented timing error, s: replayed at its send times, the 90th
percentile of |simulated - observed| E2E stayed at or below 5 ms on an idle 2-core machine
(docs/observe.md, "Replaying an observed trace")."""


def usage_warning(frame: pd.DataFrame) -> str | None:
    """The warning for answered requests of the trace *frame* whose server gave no ``usage``.

    >>> f = pd.DataFrame({"status": ["ok", "ok", "error"], "prompt_tokens_source": ["usage", "none", "none"],
    ...                   "completion_tokens_source": ["usage", "chunks", "none"]})
    >>> usage_warning(f)[:60]
    'Server did not return usage metrics for 1 of 2 answered requ'
    """
    columns = [c for c in ("prompt_tokens_source", "completion_tokens_source") if c in frame]
    if not columns:  # not an observer's trace: where its counts come from is unknown
        return None
    ok = frame[frame["status"].astype(str) == "ok"]
    missing = np.zeros(len(ok), dtype=bool)
    for column in columns:
        missing |= ok[column].astype(str).to_numpy() != "usage"
    n = int(missing.sum())
    if n == 0:
        return None
    return (
        f"Server did not return usage metrics for {n} of {len(ok)} answered requests: their token counts are "
        "the workload's requested lengths, not the server's counts, and the replay uses them (less accurate)."
    )


def _rate(times: np.ndarray) -> float | None:
    """Events per second between the first and last of *times* (None with fewer than two)."""
    if times.size < 2:
        return None
    span = float(times.max() - times.min())
    return (times.size - 1) / span if span > 0 else math.inf


def _load_statistics(header: Mapping[str, Any], frame: pd.DataFrame) -> dict[str, Any] | None:
    """The header's ``load_generator`` block, or the same figures from the rows (no lag)."""
    block = header.get("load_generator")
    if isinstance(block, Mapping):
        return dict(block)
    if "send_time_us" not in frame or "arrival_time_us" not in frame:
        return None
    targets = pd.to_numeric(frame["arrival_time_us"], errors="coerce").to_numpy(dtype=np.float64) / 1e6
    sends = pd.to_numeric(frame["send_time_us"], errors="coerce").to_numpy(dtype=np.float64) / 1e6
    sent = ~np.isnan(sends)
    if not sent.any():
        return None
    delays = sends[sent] - targets[sent]
    load = header.get("load")
    return {
        "requested_rate": _rate(targets[~np.isnan(targets)]),
        "achieved_rate": _rate(sends[sent]),
        # The observer's rule: the ceil(0.99 n)-th smallest delay.
        "schedule_delay_p99_s": float(np.quantile(delays, 0.99, method="inverted_cdf")),
        "concurrency": load.get("concurrency") if isinstance(load, Mapping) else None,
    }


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def load_generator_warning(header: Mapping[str, Any], frame: pd.DataFrame) -> str | None:
    """The warning for a load generator that could not keep its schedule (module docstring).

    >>> header = {"load_generator": {"requested_rate": 100.0, "achieved_rate": 60.0, "schedule_delay_p99_s": 0.0005,
    ...                              "lagging": False, "concurrency": None}}
    >>> load_generator_warning(header, pd.DataFrame()).split(". ")[0]
    'Load generator saturated: the achieved send rate 60/s is 40% below the requested 100/s'
    """
    stats = _load_statistics(header, frame)
    if stats is None:
        return None
    reasons = []
    if stats.get("lagging") is True:
        lag = _number(stats.get("lag_p50_s"))
        threshold = _number(stats.get("lag_threshold_s"))
        if lag is not None and threshold is not None:
            reasons.append(f"the client lagged (median lag {lag * 1e3:.1f} ms above its {threshold * 1e3:.1f} ms threshold)")
        else:
            reasons.append("the client lagged")
    requested = _number(stats.get("requested_rate"))
    achieved = _number(stats.get("achieved_rate"))
    if requested and achieved is not None and math.isfinite(requested) and achieved < (1.0 - RATE_SHORTFALL) * requested:
        reasons.append(
            f"the achieved send rate {achieved:.3g}/s is {(1.0 - achieved / requested) * 100:.0f}% below the "
            f"requested {requested:.3g}/s"
        )
    delay = _number(stats.get("schedule_delay_p99_s"))
    if requested and delay is not None and math.isfinite(requested):
        gap_s = 1.0 / requested
        if delay > DELAY_SHARE * gap_s:
            reasons.append(
                f"the 99th percentile schedule delay {delay * 1e3:.3g} ms exceeds {DELAY_SHARE:.0%} of the mean "
                f"inter-arrival time ({gap_s * 1e3:.3g} ms)"
            )
    if not reasons:
        return None
    limit = stats.get("concurrency")
    note = f" (with a concurrency limit of {limit}, the delays include waiting for a free slot)" if limit else ""
    return (
        f"Load generator saturated: {'; '.join(reasons)}{note}. The server saw a different load than the workload "
        "asked for; the replay uses the actual send times, so the comparison stands for the load that was sent."
    )


def prefix_group_warning(frame: pd.DataFrame) -> str | None:
    """The warning for a trace whose every request sent is in one prefix group.

    >>> prefix_group_warning(pd.DataFrame({"prefix_group": ["sys", "sys"], "send_time_us": [1, 2]}))[:48]
    "All requests are in one prefix group ('sys'): th"
    """
    if "prefix_group" not in frame:
        return None
    sent = frame[frame["send_time_us"].notna()] if "send_time_us" in frame else frame
    groups = set(sent["prefix_group"].fillna("").astype(str))
    if len(groups) != 1 or "" in groups:
        return None
    return (
        f"All requests are in one prefix group ({groups.pop()!r}): the server's prefix cache is heavily used, and "
        "its hit rates may differ from the simulator's where the server evicts at other times."
    )


def few_requests_warning(calibrated: int) -> str | None:
    """The seed's warning when fewer than :data:`MIN_REQUESTS` requests were compared.

    >>> few_requests_warning(12)
    'Insufficient requests for statistical significance (N < 30): 12 requests compared.'
    >>> few_requests_warning(30) is None
    True
    """
    if calibrated >= MIN_REQUESTS:
        return None
    return f"Insufficient requests for statistical significance (N < {MIN_REQUESTS}): {calibrated} requests compared."


def emulated_replay_warning(header: Mapping[str, Any], joined: pd.DataFrame) -> str | None:
    """The warning for a replay of the emulated server's own trace whose error exceeds the
    emulator's timing error (*joined*: :attr:`~simpy_llm.calibrate.compare.Calibration.requests`).
    The caller makes sure the replay runs the serving system the header reports."""
    server = header.get("server")
    if not isinstance(server, Mapping) or server.get("type") != "emulated":
        return None
    kept = joined[joined["excluded"] == ""]
    found = []
    for metric in ("e2e", "ttft"):
        error = (kept[f"{metric}_simulated_s"] - kept[f"{metric}_observed_s"]).abs().dropna().to_numpy()
        if error.size:
            p90 = float(np.quantile(error, 0.9))
            if p90 > EMULATED_P90_ERROR_S:
                found.append(f"{p90 * 1e3:.1f} ms for {metric.upper()}")
    if not found:
        return None
    return (
        "Replay of the emulated server's own trace: the 90th percentile of |simulated - observed| is "
        f"{' and '.join(found)}, above the {EMULATED_P90_ERROR_S * 1e3:g} ms the emulator keeps on an idle machine. "
        "The machine was busy while the trace was recorded: these errors measure that, not the model."
    )


def run_warnings(
    header: Mapping[str, Any], frame: pd.DataFrame, joined: pd.DataFrame, *, own_serving_system: bool
) -> list[str]:
    """Every warning of the module docstring that applies, in its order.

    Parameters
    ----------
    header, frame
        The observed trace's header and rows.
    joined
        The requests as compared (:attr:`~simpy_llm.calibrate.compare.Calibration.requests`).
    own_serving_system
        The replay ran the serving system the header reports (no scenario, profile or
        latency model given): only then is an emulated server's trace held to its timing error.
    """
    calibrated = int((joined["excluded"] == "").sum())
    found = [
        usage_warning(frame),
        load_generator_warning(header, frame),
        prefix_group_warning(frame),
        few_requests_warning(calibrated),
        emulated_replay_warning(header, joined) if own_serving_system else None,
    ]
    return [w for w in found if w is not None]
