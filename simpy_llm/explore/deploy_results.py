"""What :func:`~simpy_llm.explore.deploy.deploy` finds: a :class:`Configuration` of the space
(a catalogue row and engine settings, priced), each configuration's :class:`Outcome` (its
fewest replicas, cost, tail latencies and why it won or lost) and the :class:`DeployResult`
that gathers them, with its Pareto front, its table and its files."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from simpy_llm.explore.capacity.criteria import StabilityCriteria
from simpy_llm.explore.capacity.probing import _jsonable

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Configuration", "DeployResult", "Outcome", "Pool"]

STATUSES = ("cheapest", "costlier", "misses_slo", "pruned", "over_budget", "refused")
"""What became of a configuration (:attr:`Outcome.status`)."""


@attrs.frozen(kw_only=True)
class Pool:
    """The decode pool of a disaggregated configuration: its catalogue row, priced."""

    gpu: str
    tp: int
    price_per_gpu_hour: float
    kv_auto: bool
    """Whether its KV cache is sized from the GPU's memory (as :attr:`Configuration.kv_auto`)."""


@attrs.frozen(kw_only=True)
class Configuration:
    """One deployment of the space: a catalogue row and engine settings, without the count.

    With :attr:`decode`, a disaggregated fleet: a prefill pool on this row (:attr:`gpu`,
    :attr:`tp`, :attr:`price_per_gpu_hour`, :attr:`kv_auto`) handing each request's KV to a
    decode pool on the row :attr:`decode` names, both pools with these engine settings.
    """

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
    decode: Pool | None = None
    """The decode pool of a disaggregated fleet (None: co-located replicas)."""
    speculation: bool | None = None
    """With the scenario's speculative decoding (True), without it (False), or as the
    scenario has it when speculation is not an axis of the space (None)."""
    draft_cost_per_hour: float = 0.0
    """US dollars per hour of the draft devices speculation adds, whatever the replica count
    (0: drafts on the target's GPU, or on devices without a price)."""
    profile: str | None = None
    """A calibrated profile standing in for a catalogue row (None: the catalogue's row):
    its name; the replicas' latency model is ``{profile: FILE}`` (:attr:`profile_file`) on
    :attr:`gpu` at :attr:`tp`, priced as that GPU."""
    profile_file: str | None = None
    """The profile's file (absolute)."""
    engine_keys: tuple[str, ...] | None = None
    """The engine settings a profile's configuration sets: those the space gives, not the
    scenario's own (a fitted server's engine, such as llama.cpp's, may take no others;
    None: all four, as a catalogue row's)."""
    pp: int = 1
    """Pipeline stages: a replica runs on ``tp x pp`` GPUs. Above 1 the catalogue has no
    measured row, so the replicas run the calibrated roofline of :attr:`model` on
    :attr:`gpu` at (:attr:`tp`, :attr:`pp`) instead of the row's ``blis_linear``."""

    def cost(self, replicas: int, decode_replicas: int = 0) -> float:
        """US dollars per hour of *replicas* replicas: ``replicas x tp x pp x price``; of a
        disaggregated fleet, *replicas* prefill and *decode_replicas* decode replicas, each
        pool's count times its TP times its GPU's price, summed.

        >>> c = Configuration(index=0, model="m", gpu="H100", tp=2, scheduler="fcfs", max_num_seqs=8,
        ...                   max_num_batched_tokens=512, chunked_prefill=True, price_per_gpu_hour=3.5,
        ...                   kv_auto=False)
        >>> c.cost(3)
        21.0
        >>> pools = attrs.evolve(c, decode=Pool(gpu="A100-80", tp=1, price_per_gpu_hour=2.5, kv_auto=True))
        >>> pools.cost(1, 4)   # 1 x 2 x 3.5 + 4 x 1 x 2.5
        17.0
        >>> attrs.evolve(c, pp=2).cost(3)   # 3 x 2 x 2 x 3.5
        42.0
        """
        if self.decode is None:
            # the integer product first: with pp 1 the figure is the one before pipeline stages were searched
            cost = replicas * self.tp * self.pp * self.price_per_gpu_hour
        else:
            cost = replicas * self.tp * self.price_per_gpu_hour + decode_replicas * self.decode.tp * self.decode.price_per_gpu_hour
        return cost + self.draft_cost_per_hour if self.draft_cost_per_hour else cost

    def overrides(self) -> dict[str, Any]:
        """The scenario keys this configuration sets (a disaggregated one's pools are set by
        :func:`~simpy_llm.explore.deploy_pools.pool_overrides`, which adds the scenario's
        engine and hand-off settings to them)."""
        off = {} if self.speculation is not False else {"speculation": None}
        if self.decode is not None:
            return {"serving.replica_groups": [
                {"name": "prefill", "role": "prefill", "latency_model": _row(self.model, self.gpu, self.tp),
                 "engine": self._engine(self.kv_auto)},
                {"name": "decode", "role": "decode", "latency_model": _row(self.model, self.decode.gpu, self.decode.tp),
                 "engine": self._engine(self.decode.kv_auto)},
            ], **off}
        out: dict[str, Any] = {
            "serving.latency_model": _row(self.model, self.gpu, self.tp) if self.pp == 1 else _pipelined(
                self.model, self.gpu, self.tp, self.pp),
            "serving.engine.scheduler": {"kind": self.scheduler},
            "serving.engine.max_num_seqs": self.max_num_seqs,
            "serving.engine.max_num_batched_tokens": self.max_num_batched_tokens,
            "serving.engine.chunked_prefill": self.chunked_prefill,
        }
        if self.profile is not None:
            keys = self.engine_keys or ()
            out = {"serving.latency_model": {"profile": self.profile_file},
                   **{k: v for k, v in out.items() if k.rsplit(".", 1)[-1] in keys}}
        if self.kv_auto:
            out["serving.engine.kv_num_blocks"] = "auto"
        out.update(off)
        return out

    def _engine(self, kv_auto: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"scheduler": {"kind": self.scheduler}, "max_num_seqs": self.max_num_seqs,
                               "max_num_batched_tokens": self.max_num_batched_tokens,
                               "chunked_prefill": self.chunked_prefill}
        if kv_auto:
            out["kv_num_blocks"] = "auto"
        return out

    def label(self) -> str:
        """The configuration in one line: ``H100 tp2 fcfs seqs=64 tokens=2048 chunked``; a
        disaggregated one ``H100 tp2 prefill + A100-80 tp1 decode fcfs ...``."""
        chunked = "chunked" if self.chunked_prefill else "whole-prefill"
        stages = f" pp{self.pp}" if self.pp > 1 else ""
        rows = f"{self.gpu} tp{self.tp}{stages}" if self.decode is None else (
            f"{self.gpu} tp{self.tp} prefill + {self.decode.gpu} tp{self.decode.tp} decode")
        if self.profile is not None:
            rows = f"profile {self.profile} on {rows}"
        spec = "" if self.speculation is None else " speculative" if self.speculation else " no-speculation"
        return f"{rows} {self.scheduler} seqs={self.max_num_seqs} tokens={self.max_num_batched_tokens} {chunked}{spec}"


def _row(model: str, gpu: str, tp: int) -> dict[str, Any]:
    """A catalogue row as a latency model."""
    return {"kind": "blis_linear", "params": {"model": model, "gpu": gpu, "tp": tp}}


def _pipelined(model: str, gpu: str, tp: int, pp: int) -> dict[str, Any]:
    """The latency model of *pp* pipeline stages of *tp* GPUs: the roofline with the GPU's
    efficiencies fitted to the catalogue's rows (no row measures pipeline stages)."""
    return {"kind": "roofline", "params": {"model": model, "gpu": gpu, "tp": tp, "pp": pp, "efficiency": "calibrated"}}


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
    """The largest count known to fail (0: none; of a disaggregated configuration, the
    largest ``P + D``)."""
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
    prefill_replicas: int | None = None
    """Of a disaggregated configuration's :attr:`min_replicas`, the prefill pool's (the P of
    the P:D split; None for co-located replicas or without a count)."""
    decode_replicas: int | None = None
    """Of a disaggregated configuration's :attr:`min_replicas`, the decode pool's (the D)."""

    def row(self, pools: bool = False, speculation: bool = False, profiles: bool = False, pp: bool = False) -> dict[str, Any]:
        """The outcome as one flat row; with *pools*, the decode pool's row and the P:D split
        too (``gpu``, ``tp``, ``price_per_gpu_hour`` and ``kv_auto`` are then the prefill
        pool's, and the decode ones empty for co-located replicas); with *speculation*,
        whether speculative decoding is on and what its draft devices cost; with *profiles*,
        the calibrated profile standing in for the catalogue row (empty for catalogue rows);
        with *pp*, the pipeline stages (after ``tp``)."""
        c = self.configuration
        out = {
            "index": c.index, "gpu": c.gpu, "tp": c.tp, **({"pp": c.pp} if pp else {}), "scheduler": c.scheduler,
            "max_num_seqs": c.max_num_seqs, "max_num_batched_tokens": c.max_num_batched_tokens, "chunked_prefill": c.chunked_prefill,
            "kv_auto": c.kv_auto, "price_per_gpu_hour": c.price_per_gpu_hour, "status": self.status,
            "min_replicas": self.min_replicas, "failing_replicas": self.failing_replicas,
            "cost_per_hour": self.cost_per_hour, "ttft_p99_s": self.ttft_p99_s, "tpot_p99_s": self.tpot_p99_s,
            "qps_per_usd_hour": self.qps_per_usd_hour, "simulations": self.simulations, "reason": self.reason,
        }
        if pools:
            d = c.decode
            out.update({
                "disaggregated": d is not None, "decode_gpu": None if d is None else d.gpu,
                "decode_tp": None if d is None else d.tp,
                "decode_price_per_gpu_hour": None if d is None else d.price_per_gpu_hour,
                "decode_kv_auto": None if d is None else d.kv_auto,
                "prefill_replicas": self.prefill_replicas, "decode_replicas": self.decode_replicas,
            })
        if speculation:
            out.update({"speculation": c.speculation, "draft_cost_per_hour": c.draft_cost_per_hour})
        if profiles:
            out.update({"profile": c.profile, "profile_file": c.profile_file})
        return out

    def replicas(self) -> str:
        """The count as the table shows it: ``3``, a disaggregated one's split ``2P+5D``, or ``-``."""
        if self.min_replicas is None:
            return "-"
        if self.configuration.decode is None:
            return str(self.min_replicas)
        return f"{self.prefill_replicas}P+{self.decode_replicas}D"


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
    disaggregated: bool = False
    """Whether disaggregated configurations were searched too (their columns are then in
    the rows, :meth:`Outcome.row`)."""
    speculation: bool = False
    """Whether speculative decoding on and off was an axis of the space (its columns are
    then in the rows)."""
    profiles: bool = False
    """Whether calibrated profiles stood in for catalogue rows (their columns are then in
    the rows)."""
    pp: bool = False
    """Whether pipeline stages above 1 were an axis of the space (the ``pp`` column is then
    in the rows)."""

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

        frame = pd.DataFrame([o.row(self.disaggregated, self.speculation, self.profiles, self.pp) for o in self.outcomes])
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
        pools, spec, fits, pp = self.disaggregated, self.speculation, self.profiles, self.pp
        out = {
            "scenario": self.scenario, "model": self.model, "load": self.load,
            "criteria": self.criteria.to_dict(), "budget": self.budget, "max_replicas": self.max_replicas,
            "exhaustive": self.exhaustive, "simulations": self.simulations, "loaded": self.loaded,
            "skipped": self.skipped,
            "best": None if best is None else best.row(pools, spec, fits, pp),
            "pareto": [o.configuration.index for o in self.pareto()],
            "configurations": [o.row(pools, spec, fits, pp) for o in self.outcomes],
        }
        if pools:
            out["disaggregated"] = True
        if spec:
            out["speculation"] = True
        if fits:
            out["profiles"] = True
        if pp:
            out["pp"] = True
        return _jsonable(out)

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
        elif best.configuration.decode is not None:
            c, p, d = best.configuration, best.prefill_replicas or 0, best.decode_replicas or 0
            assert c.decode is not None
            settings = c.label().split(" decode ", 1)[1]
            lines.append(f"- **answer**: {p} x {c.gpu} tp{c.tp} prefill + {d} x {c.decode.gpu} tp{c.decode.tp} decode, "
                         f"{settings} = {best.cost_per_hour:.4g} USD/h (P:D {p}:{d}, {p * c.tp + d * c.decode.tp} GPUs{_drafts(c)}; "
                         f"p99 TTFT {best.ttft_p99_s:.4g} s, p99 TPOT {best.tpot_p99_s:.4g} s; "
                         f"{best.qps_per_usd_hour:.4g} requests/s per USD/h)")
        else:
            c, n = best.configuration, best.min_replicas or 0
            lines.append(f"- **answer**: {n} x {c.label()} = {best.cost_per_hour:.4g} USD/h "
                         f"({n * c.tp * c.pp} GPUs{_drafts(c)}; p99 TTFT {best.ttft_p99_s:.4g} s, "
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
                f"{o.replicas()} | {_num(o.cost_per_hour)} | "
                f"{_num(o.ttft_p99_s)} | {_num(o.tpot_p99_s)} | {_num(o.qps_per_usd_hour)} | "
                f"{'yes' if o.configuration.index in front else ''} | {o.simulations} | {o.reason} |"
            )
        return "\n".join(lines) + "\n"

    def __str__(self) -> str:
        return self.to_markdown()

    def save(self, directory: str | Path) -> list[Path]:
        """Write ``deploy.json``, ``deploy.csv`` and ``deploy.md`` into *directory*."""
        return save_result_files(directory, "deploy", self.to_dict(), self.to_frame(), self.to_markdown())


def save_result_files(directory: str | Path, stem: str, data: Mapping[str, Any], frame: pd.DataFrame, markdown: str) -> list[Path]:
    """Write *data* as ``<stem>.json``, *frame* as ``<stem>.csv`` and *markdown* as ``<stem>.md``
    into *directory* (made if missing), each written whole or not at all; returns the paths."""
    from simpy_llm.explore.sweeps import _atomic_write

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    written = [path / f"{stem}.json", path / f"{stem}.csv", path / f"{stem}.md"]
    _atomic_write(written[0], json.dumps(data, indent=2, allow_nan=False) + "\n")
    _atomic_write(written[1], frame.to_csv(index=False))
    _atomic_write(written[2], markdown)
    return written


def _drafts(c: Configuration) -> str:
    """What the answer's draft devices cost, when they cost anything."""
    return f" and draft devices at {c.draft_cost_per_hour:.4g} USD/h" if c.draft_cost_per_hour else ""


def _num(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.4g}"


def _rank(o: Outcome) -> tuple[int, float, int]:
    """The table's order: the answer, then those meeting the SLOs by cost, then the rest."""
    feasible = o.min_replicas is not None
    return (0 if o.status == "cheapest" else 1 if feasible else 2, o.cost_per_hour if feasible else 0.0,
            o.configuration.index)
