"""Speculative decoding's figures (seed 003 §8): rounds, acceptance, γ, modes, drafts.

:func:`spec_round_frame` and :func:`drafter_switch_frame` turn the recorder's
per-round and per-switch tuples into DataFrames; :func:`speculation_summary` is
``summary()["speculation"]`` (see :class:`~simpy_llm.metrics.summary.SpeculationStats`).
:class:`SpeculationResults` holds them for a run's
:class:`~simpy_llm.metrics.results.Results`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from simpy_llm.metrics.recorder import SPEC_ROUND_FIELDS

if TYPE_CHECKING:
    import pandas as pd

    from simpy_llm.config.schema import Scenario
    from simpy_llm.metrics.recorder import ColumnLog, Recorder
    from simpy_llm.metrics.summary import DraftGroupStats, SpeculationStats, TvtStats

__all__ = [
    "CONTEXT_BUCKETS",
    "SpeculationResults",
    "SpeculationSection",
    "drafter_switch_frame",
    "gamma_timeline",
    "jain",
    "spec_round_frame",
    "speculation_summary",
]

SWITCH_COLUMNS = (
    ("time_s", "float64"), ("request_id", "int64"), ("draft_group", "string"), ("draft_device", "int64"),
    ("from_drafter", "string"), ("to_drafter", "string"),
)
CONTEXT_BUCKETS = (0, 256, 1024, 4096, 16384)
"""Lower edges of the context buckets of ``acceptance_by_context``, tokens (the last is open)."""


class SpeculationSection(TypedDict, total=False):
    """The summary's ``speculation`` section (absent without a ``speculation`` section)."""

    speculation: SpeculationStats


def _frame(rows: list[tuple], columns: tuple[tuple[str, str], ...]) -> pd.DataFrame:
    import pandas as pd  # pandas is imported where a frame is built: importing the package stays fast

    names = [n for n, _ in columns]
    return pd.DataFrame(rows, columns=names).astype(dict(columns))


def spec_round_frame(log: ColumnLog, trees: ColumnLog | None = None, chains: ColumnLog | None = None) -> pd.DataFrame:
    """One row per verify round (in the order the passes ended): ``time_s`` (its pass
    ended), ``request_id``, ``replica`` (the target), ``draft_group``, ``draft_device``,
    ``mode`` (``distributed`` or ``fused``), ``drafter`` (empty when fused), ``gamma``
    (tokens proposed), ``accepted`` (drafts accepted; fractional with
    ``acceptance_sampling: expected``), ``tokens`` (output tokens the round added),
    ``context_tokens`` (before the round), ``tvt_s`` and ``rollback`` (1 when partial
    verification missed the rejection). When some round drafted a tree (*trees*, the
    recorder's ``tree_rounds``), also ``tree_depth`` and ``tree_width``: a chain round is a
    tree of depth γ and width 1. When some round was chained (*chains*), also
    ``mid_accepted`` (tiny drafts the mid drafter accepted) and ``mid_steps`` (its own
    drafting steps), NaN for other rounds."""
    import pandas as pd  # pandas is imported where a frame is built: importing the package stays fast

    frame = pd.DataFrame(log.columns())
    for name, kind in SPEC_ROUND_FIELDS:
        if kind == "s":
            frame[name] = frame[name].astype("string")
    if trees is not None and len(trees):
        tree = trees.columns()
        depth = frame["gamma"].to_numpy(copy=True)
        width = np.ones(len(frame), dtype=np.int64)
        depth[tree["round"]] = tree["tree_depth"]
        width[tree["round"]] = tree["tree_width"]
        frame["tree_depth"] = depth
        frame["tree_width"] = width
    if chains is not None and len(chains):
        chain = chains.columns()
        for name in ("mid_accepted", "mid_steps"):
            column = np.full(len(frame), np.nan)
            column[chain["round"]] = chain[name]
            frame[name] = column
    return frame


def drafter_switch_frame(rows: list[tuple]) -> pd.DataFrame:
    """One row per mid-decode escalation: ``time_s``, ``request_id``, ``draft_group``,
    ``draft_device``, ``from_drafter``, ``to_drafter``."""
    return _frame(rows, SWITCH_COLUMNS)


def gamma_timeline(log: ColumnLog, bin_s: float) -> pd.DataFrame:
    """Mean γ, rounds and acceptance rate per *bin_s* window of simulated time (the adaptive-γ
    timeline): columns ``start_s``, ``rounds``, ``mean_gamma``, ``acceptance_rate``."""
    import pandas as pd  # pandas is imported where a frame is built: importing the package stays fast

    if not bin_s > 0:
        raise ValueError(f"bin_s must be > 0, got {bin_s!r}")
    frame = spec_round_frame(log)
    if frame.empty:
        return pd.DataFrame({"start_s": [], "rounds": [], "mean_gamma": [], "acceptance_rate": []})
    frame["start_s"] = np.floor(frame["time_s"].to_numpy() / bin_s) * bin_s
    grouped = frame.groupby("start_s", sort=True)
    out = pd.DataFrame({
        "rounds": grouped.size(),
        "mean_gamma": grouped["gamma"].mean(),
        "acceptance_rate": grouped["accepted"].sum() / grouped["gamma"].sum().where(lambda g: g > 0),
    }).reset_index()
    return out


def jain(values: list[float]) -> float | None:
    """Jain's fairness index ``(sum x)^2 / (n sum x^2)`` of the values that are numbers (None
    when there are none, or all are 0).

    >>> jain([1.0, 1.0, 1.0]), round(jain([1.0, 0.0]), 3)
    (1.0, 0.5)
    """
    xs = [v for v in values if v == v]
    sq = sum(v * v for v in xs)
    return (sum(xs) ** 2) / (len(xs) * sq) if xs and sq > 0 else None


def _acceptance_by_context(contexts: np.ndarray, gammas: np.ndarray, accepted: np.ndarray) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    edges = CONTEXT_BUCKETS
    for i, low in enumerate(edges):
        high = edges[i + 1] if i + 1 < len(edges) else math.inf
        mask = (contexts >= low) & (contexts < high)
        proposed = int(gammas[mask].sum())
        if mask.any():
            label = f"{low}-{high - 1}" if high != math.inf else f"{low}+"
            out[label] = float(np.minimum(accepted[mask], gammas[mask]).sum() / proposed) if proposed else None
    return out


def speculation_summary(
    scenario: Scenario,
    rounds: ColumnLog,
    switches: list[tuple],
    columns: dict[str, np.ndarray],
    done: np.ndarray,
    met: np.ndarray,
    draft_busy_s: dict[str, list[float]],
    span_s: float,
) -> SpeculationStats:
    """``summary()["speculation"]`` (:class:`~simpy_llm.metrics.summary.SpeculationStats`).

    *columns* are the record columns, *done* marks the completed measured requests and
    *met* (aligned with ``done``'s true entries) whether each met its SLO; *draft_busy_s*
    is each draft group's devices' drafting time, *span_s* the run's duration.
    """
    spec = scenario.speculation
    if spec is None:
        raise ValueError(f"scenario {scenario.name!r} has no speculation section")
    cols = rounds.columns()
    n = len(rounds)
    gammas, accepted, tokens = cols["gamma"], cols["accepted"], cols["tokens"]
    contexts, rolled = cols["context_tokens"], cols["rollback"]
    proposed = int(gammas.sum())
    hist: dict[str, int] = {}
    for g, k in zip(*np.unique(gammas, return_counts=True), strict=True):
        hist[str(int(g))] = int(k)
    modes = columns["spec_mode"][done]
    by_mode = {m: int((modes == m).sum()) for m in ("distributed", "fused")}
    tvt = columns["tvt_s"][done]
    tvt = tvt[~np.isnan(tvt)]
    groups: dict[str, DraftGroupStats] = {}
    group_col = columns["draft_group"][done]
    out_tokens = columns["output_tokens"][done].astype(np.float64)
    e2e = (columns["completion_s"] - columns["arrival_s"])[done]
    attainment: list[float] = []
    service: list[float] = []
    from simpy_llm.serving.devices import device_profile  # a speculative run's only: a run without one skips the catalogue

    for g in spec.drafts:
        mask = group_col == g.name
        busy = draft_busy_s.get(g.name, [])
        profile = device_profile(g.device) if g.device is not None else None
        energy = None
        if profile is not None and span_s == span_s and span_s > 0:
            energy = sum(profile.energy.active_w * b + profile.energy.idle_w * max(span_s - b, 0.0) for b in busy)
        made = float(out_tokens[mask].sum())
        rate = float(np.mean(out_tokens[mask] / e2e[mask])) if mask.any() else math.nan
        share = float(met[mask].mean()) if mask.any() else math.nan
        attainment.append(share)
        service.append(rate)
        groups[g.name] = {
            "devices": g.count,
            "completed": int(mask.sum()),
            "drafting_s": float(sum(busy)),
            "utilisation": float(sum(busy) / (len(busy) * span_s)) if busy and span_s > 0 else None,
            "energy_j": energy,
            "energy_j_per_output_token": energy / made if energy is not None and made > 0 else None,
            "slo_attainment": None if share != share else share,
            "tokens_per_s_per_request": None if rate != rate else rate,
        }
    penalty_s = spec.verify.rollback_penalty_ms / 1e3
    return {
        "mode": spec.mode,
        "rounds": n,
        "tokens_per_round": float(tokens.mean()) if n else None,
        "acceptance_rate": float(np.minimum(accepted, gammas).sum() / proposed) if proposed else None,
        "mean_gamma": float(gammas.mean()) if n else None,
        "gamma_histogram": hist,
        "acceptance_by_context": _acceptance_by_context(contexts, gammas, accepted),
        "requests_by_mode": by_mode,
        "drafter_switches": len(switches),
        "rollbacks": int(rolled.sum()),
        "rollback_s": float(rolled.sum()) * penalty_s,
        "tvt_s": _tvt_stats(tvt),
        "drafts": groups,
        "fairness": {
            "slo_attainment_jain": jain(attainment) if scenario.slo else None,
            "service_rate_jain": jain(service),
        },
    }


def _tvt_stats(values: np.ndarray) -> TvtStats:
    if values.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p95": None, "p99": None}
    p50, p90, p95, p99 = np.percentile(values, [50, 90, 95, 99])
    return {"mean": float(values.mean()), "p50": float(p50), "p90": float(p90), "p95": float(p95), "p99": float(p99)}


class SpeculationResults:
    """Speculative decoding's side of a run: its verify rounds, drafter escalations and the
    summary's ``speculation`` section.

    Parameters
    ----------
    recorder
        The run's recorder (its rounds and drafter switches).
    scenario
        The scenario run (its ``speculation`` section and SLOs).
    columns
        The record columns.
    draft_busy_s
        Each draft group's devices' drafting time, s, by group name.
    end_s
        The run's simulated duration, s.
    """

    def __init__(
        self, recorder: Recorder, *, scenario: Scenario, columns: dict[str, np.ndarray], draft_busy_s: dict[str, list[float]], end_s: float,
    ) -> None:
        self.recorder = recorder
        self.scenario = scenario
        self.columns = columns
        self.draft_busy_s = draft_busy_s
        self.end_s = end_s

    def to_dataframe(self) -> pd.DataFrame:
        """One row per verify round (:func:`spec_round_frame`)."""
        return spec_round_frame(self.recorder.spec_rounds, self.recorder.tree_rounds, self.recorder.chain_rounds)

    def drafter_switches(self) -> pd.DataFrame:
        """One row per mid-decode drafter escalation (:func:`drafter_switch_frame`)."""
        return drafter_switch_frame(self.recorder.drafter_switches)

    def gamma_timeline(self, bin_s: float) -> pd.DataFrame:
        """Mean γ, rounds and acceptance per *bin_s* of simulated time (:func:`gamma_timeline`)."""
        return gamma_timeline(self.recorder.spec_rounds, bin_s)

    def summary(self, done: np.ndarray, met: np.ndarray) -> SpeculationSection:
        """``{"speculation": ...}`` (:func:`speculation_summary`; *done* and *met* as there);
        empty without a ``speculation`` section."""
        if self.scenario.speculation is None:
            return {}
        rec = self.recorder
        return {"speculation": speculation_summary(
            self.scenario, rec.spec_rounds, rec.drafter_switches, self.columns, done, met, self.draft_busy_s, self.end_s,
        )}
