"""What :func:`~simpy_llm.explore.deploy.deploy` finds: a :class:`Configuration` of the space
(a catalogue row and engine settings, priced), each configuration's :class:`Outcome` (its
fewest replicas, cost, tail latencies and why it won or lost) and the :class:`DeployResult`
that gathers them, with its Pareto front, its table and its files."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from simpy_llm.explore.capacity.criteria import StabilityCriteria
from simpy_llm.explore.capacity.probing import _jsonable

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Configuration", "DeployResult", "Outcome"]

STATUSES = ("cheapest", "costlier", "misses_slo", "pruned", "over_budget", "refused")
"""What became of a configuration (:attr:`Outcome.status`)."""


@attrs.frozen(kw_only=True)
class Configuration:
    """One deployment of the space: a catalogue row and engine settings, without the count."""

    index: int
    """Its place in the space's order (ties in cost go to the smaller)."""
    model: str
    """The model as the catalogue names it (``meta-llama/llama-3.1-8b-instruct``)."""
    gpu: str
    """The GPU (``H100``)."""
    tp: int
    """Tensor-parallel degree: GPUs per replica."""
    scheduler: str
    """The engine's scheduler policy (``fcfs``)."""
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    price_per_gpu_hour: float
    """US dollars per GPU-hour."""
    kv_auto: bool
    """Whether the KV cache is sized from the GPU's memory (``kv_num_blocks: auto``: the
    catalogue row's ``hardware``); else the scenario's own ``kv_num_blocks`` is kept."""

    def cost(self, replicas: int) -> float:
        """US dollars per hour of *replicas* replicas: ``replicas x tp x price``.

        >>> c = Configuration(index=0, model="m", gpu="H100", tp=2, scheduler="fcfs", max_num_seqs=8,
        ...                   max_num_batched_tokens=512, chunked_prefill=True, price_per_gpu_hour=3.5,
        ...                   kv_auto=False)
        >>> c.cost(3)
        21.0
        """
        return replicas * self.tp * self.price_per_gpu_hour

    def overrides(self) -> dict[str, Any]:
        """The scenario keys this configuration sets."""
        out: dict[str, Any] = {
            "serving.latency_model": {"kind": "blis_linear", "params": {"model": self.model, "gpu": self.gpu, "tp": self.tp}},
            "serving.engine.scheduler": {"kind": self.scheduler},
            "serving.engine.max_num_seqs": self.max_num_seqs,
            "serving.engine.max_num_batched_tokens": self.max_num_batched_tokens,
            "serving.engine.chunked_prefill": self.chunked_prefill,
        }
        if self.kv_auto:
            out["serving.engine.kv_num_blocks"] = "auto"
        return out

    def label(self) -> str:
        """The configuration in one line: ``H100 tp2 fcfs seqs=64 tokens=2048 chunked``."""
        chunked = "chunked" if self.chunked_prefill else "whole-prefill"
        return (f"{self.gpu} tp{self.tp} {self.scheduler} seqs={self.max_num_seqs} "
                f"tokens={self.max_num_batched_tokens} {chunked}")


@attrs.frozen(kw_only=True)
class Outcome:
    """What the search found of one configuration."""

    configuration: Configuration
    status: str
    """One of :data:`STATUSES`: ``cheapest`` (the answer), ``costlier`` (meets the SLOs, costs
    more at its fewest replicas, or as much and comes later), ``misses_slo`` (fails even at
    ``max_replicas``), ``pruned`` (the bound showed it costs more than the cheapest:
    skipped, or failing at every count up to the cheapest's cost), ``over_budget`` (the same
    against the budget) or ``refused`` (the scenario's checks refuse the combination)."""
    min_replicas: int | None
    """The fewest replicas meeting the SLOs (None: not found within the search's limit)."""
    failing_replicas: int
    """The largest count known to fail (0: none)."""
    cost_per_hour: float
    """US dollars per hour at :attr:`min_replicas` (NaN without one)."""
    ttft_p99_s: float
    """p99 TTFT at :attr:`min_replicas`, s (the largest over the seeds; NaN without)."""
    tpot_p99_s: float
    """p99 TPOT at :attr:`min_replicas`, s (as :attr:`ttft_p99_s`)."""
    qps_per_usd_hour: float
    """The load carried (requests/s) per US dollar per hour (NaN without a count)."""
    simulations: int
    """Simulations behind this outcome (run now or read from the run directory)."""
    reason: str
    """Why it won or lost, in words."""

    def row(self) -> dict[str, Any]:
        """The outcome as one flat row."""
        c = self.configuration
        return {
            "index": c.index, "gpu": c.gpu, "tp": c.tp, "scheduler": c.scheduler, "max_num_seqs": c.max_num_seqs,
            "max_num_batched_tokens": c.max_num_batched_tokens, "chunked_prefill": c.chunked_prefill,
            "kv_auto": c.kv_auto, "price_per_gpu_hour": c.price_per_gpu_hour, "status": self.status,
            "min_replicas": self.min_replicas, "failing_replicas": self.failing_replicas,
            "cost_per_hour": self.cost_per_hour, "ttft_p99_s": self.ttft_p99_s, "tpot_p99_s": self.tpot_p99_s,
            "qps_per_usd_hour": self.qps_per_usd_hour, "simulations": self.simulations, "reason": self.reason,
        }


PARETO_OBJECTIVES = {"cost_per_hour": "min", "ttft_p99_s": "min", "tpot_p99_s": "min"}


@attrs.frozen(kw_only=True)
class DeployResult:
    """What :func:`deploy` found: the cheapest configuration, every configuration's fate and
    the counts of simulations. ``str()`` gives it as Markdown."""

    scenario: str
    model: str
    load: float
    """The load carried, requests/s."""
    criteria: StabilityCriteria
    budget: float | None
    """US dollars per hour the answer may cost at most (None: no budget)."""
    max_replicas: int
    exhaustive: bool
    """Whether every configuration was searched to ``max_replicas`` (no bound)."""
    outcomes: tuple[Outcome, ...]
    """One per configuration, in the space's order."""
    simulations: int
    """Simulations run by this call."""
    loaded: int
    """Simulations read back from the run directory instead of run."""

    @property
    def best(self) -> Outcome | None:
        """The cheapest configuration meeting the SLOs (None: none fits)."""
        return next((o for o in self.outcomes if o.status == "cheapest"), None)

    @property
    def skipped(self) -> int:
        """Configurations decided without a simulation of their own (skipped by the bound)."""
        return sum(o.simulations == 0 and o.status in ("pruned", "over_budget") for o in self.outcomes)

    def to_frame(self) -> pd.DataFrame:
        """One row per configuration (:meth:`Outcome.row`), with ``pareto``: whether it is on
        the front of (cost, p99 TTFT, p99 TPOT) among those meeting the SLOs."""
        import pandas as pd

        frame = pd.DataFrame([o.row() for o in self.outcomes])
        if frame.empty:
            return frame
        from simpy_llm.explore.pareto import dominated

        feasible = frame["min_replicas"].notna()
        frame["pareto"] = False
        if feasible.any():
            frame.loc[feasible, "pareto"] = ~dominated(frame[feasible], PARETO_OBJECTIVES).to_numpy()
        return frame

    def pareto(self) -> list[Outcome]:
        """The configurations meeting the SLOs that no other one beats on cost, p99 TTFT and
        p99 TPOT at once, in the space's order."""
        frame = self.to_frame()
        if frame.empty:
            return []
        return [o for o, on in zip(self.outcomes, frame["pareto"].tolist(), strict=True) if on]

    def to_dict(self) -> dict[str, Any]:
        """Strict JSON data (NaN as null)."""
        best = self.best
        return _jsonable({
            "scenario": self.scenario, "model": self.model, "load": self.load,
            "criteria": self.criteria.to_dict(), "budget": self.budget, "max_replicas": self.max_replicas,
            "exhaustive": self.exhaustive, "simulations": self.simulations, "loaded": self.loaded,
            "skipped": self.skipped,
            "best": None if best is None else best.row(),
            "pareto": [o.configuration.index for o in self.pareto()],
            "configurations": [o.row() for o in self.outcomes],
        })

    def to_markdown(self) -> str:
        best = self.best
        lines = [f"# Which deployment: {self.scenario}", ""]
        lines.append(f"- **model**: {self.model}; **load**: {self.load:g} requests/s; "
                     f"**criteria**: {self.criteria.describe()}")
        if self.budget is not None:
            lines.append(f"- **budget**: {self.budget:g} USD/h")
        if best is None:
            lines.append("- **answer**: none fits: no configuration meets the criteria within "
                         + (f"the budget and {self.max_replicas} replicas" if self.budget is not None
                            else f"{self.max_replicas} replicas"))
        else:
            c, n = best.configuration, best.min_replicas or 0
            lines.append(f"- **answer**: {n} x {c.label()} = {best.cost_per_hour:.4g} USD/h "
                         f"({n * c.tp} GPUs; p99 TTFT {best.ttft_p99_s:.4g} s, "
                         f"p99 TPOT {best.tpot_p99_s:.4g} s; {best.qps_per_usd_hour:.4g} requests/s per USD/h)")
        total = len(self.outcomes)
        lines.append(f"- **search**: {'exhaustive' if self.exhaustive else 'branch and bound'}; "
                     f"{self.simulations} simulations run, {self.loaded} read from the run directory; "
                     f"{total} configurations, {self.skipped} decided without a simulation")
        lines += ["", "## Configurations", ""]
        lines.append("| # | configuration | status | replicas | USD/h | TTFT p99 (s) | TPOT p99 (s) | "
                     "req/s per USD/h | on front | simulations | why |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
        front = {o.configuration.index for o in self.pareto()}
        for o in sorted(self.outcomes, key=_rank):
            lines.append(
                f"| {o.configuration.index} | {o.configuration.label()} | {o.status} | "
                f"{'-' if o.min_replicas is None else o.min_replicas} | {_num(o.cost_per_hour)} | "
                f"{_num(o.ttft_p99_s)} | {_num(o.tpot_p99_s)} | {_num(o.qps_per_usd_hour)} | "
                f"{'yes' if o.configuration.index in front else ''} | {o.simulations} | {o.reason} |"
            )
        return "\n".join(lines) + "\n"

    def __str__(self) -> str:
        return self.to_markdown()

    def save(self, directory: str | Path) -> list[Path]:
        """Write ``deploy.json``, ``deploy.csv`` and ``deploy.md`` into *directory*."""
        from simpy_llm.explore.sweeps import _atomic_write

        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        written = [path / "deploy.json", path / "deploy.csv", path / "deploy.md"]
        _atomic_write(written[0], json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n")
        _atomic_write(written[1], self.to_frame().to_csv(index=False))
        _atomic_write(written[2], self.to_markdown())
        return written


def _num(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.4g}"


def _rank(o: Outcome) -> tuple[int, float, int]:
    """The table's order: the answer, then those meeting the SLOs by cost, then the rest."""
    feasible = o.min_replicas is not None
    return (0 if o.status == "cheapest" else 1 if feasible else 2, o.cost_per_hour if feasible else 0.0,
            o.configuration.index)
