"""The cards a capacity search returns: :class:`CapacityCard` (the max stable and max
SLO-goodput loads of :func:`~simpy_llm.explore.capacity.max_stable_load`) and
:class:`ReplicaCard` (the fewest replicas of :func:`~simpy_llm.explore.capacity.min_replicas`),
with their probes as a frame, Markdown tables, plots, JSON and the files
:func:`_save` writes. Imports :mod:`simpy_llm.explore.capacity.criteria` and
:mod:`simpy_llm.explore.capacity.probing`."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from simpy_llm.explore.capacity.criteria import StabilityCriteria
from simpy_llm.explore.capacity.probing import Probe, _jsonable, _unjson
from simpy_llm.plot_labels import axis_label

if TYPE_CHECKING:
    import pandas as pd


# --- cards --------------------------------------------------------------------
def _probe_frame(probes: Iterable[Probe]) -> pd.DataFrame:
    import pandas as pd

    rows = [p.row() for p in probes]
    frame = pd.DataFrame(rows)
    if not rows:
        frame = pd.DataFrame(columns=[f.name for f in attrs.fields(Probe)])
    return frame


def _probes(probes: Iterable[Probe]) -> tuple[Probe, ...]:
    """The cards' ``probes`` converter: named, since mypy cannot type ``converter=tuple`` (generic)."""
    return tuple(probes)


def _fmt(x: float, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, float) and math.isinf(x):
        return "none found"
    return f"{x:.{digits}g}"


def _table(frame: pd.DataFrame, columns: list[str]) -> str:
    head = "| " + " | ".join(columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    lines = [head, rule]
    for _, row in frame[columns].iterrows():
        cells = []
        for v in row.tolist():
            cells.append(_fmt(v) if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@attrs.frozen(kw_only=True)
class CapacityCard:
    """What :func:`max_stable_load` found: the limits and every probe behind them.

    The limits are the lower ends of their final brackets (the largest load seen to
    pass); the true limit lies between them and the ``upper_*`` loads (up to noise).
    """

    scenario: str
    """The scenario searched (its name, or its path)."""
    load_key: str
    """The dotted key varied (``workload.aggregate_rate``: requests/s)."""
    tolerance: float
    """Relative width the brackets were closed to."""
    criteria: StabilityCriteria
    """What a load had to satisfy."""
    max_stable_load: float
    """Largest load found stable (NaN: none was)."""
    upper_stable_load: float
    """Smallest load found unstable (inf: none was up to the search's limit)."""
    max_goodput_load: float
    """Largest load found stable and meeting every SLO criterion (the max SLO-goodput load;
    equal to :attr:`max_stable_load` when the criteria have no SLO part)."""
    upper_goodput_load: float
    """Smallest load found failing them (inf: none was)."""
    probes: tuple[Probe, ...] = attrs.field(converter=_probes)
    """Every simulation run, in the order run."""

    @property
    def bracketed(self) -> bool:
        """Whether both limits were bracketed (a passing and a failing load found for each)."""
        return all(math.isfinite(x) for x in (self.max_stable_load, self.upper_stable_load,
                                             self.max_goodput_load, self.upper_goodput_load))

    def to_frame(self) -> pd.DataFrame:
        """One row per probe, sorted by load (then seed), with ``tpot_inflation``: TPOT p50
        over TPOT p50 at the lowest load probed (prefill/decode interference: how much
        decode slows as more prefills share its steps; NaN without multi-token outputs)."""
        frame = _probe_frame(self.probes)
        if not len(frame):
            return frame
        frame = frame.sort_values(["load", "seed"], kind="stable").reset_index(drop=True)
        base = frame["tpot_p50_s"].dropna()
        frame["tpot_inflation"] = frame["tpot_p50_s"] / base.iloc[0] if len(base) else math.nan
        return frame

    def to_dict(self) -> dict[str, Any]:
        """Plain, strict-JSON data (NaN as null, infinity as ``"inf"``); :meth:`from_dict` reads it."""
        return {
            "kind": "capacity",
            "scenario": self.scenario,
            "load_key": self.load_key,
            "tolerance": self.tolerance,
            "criteria": self.criteria.to_dict(),
            "max_stable_load": _jsonable(self.max_stable_load),
            "upper_stable_load": _jsonable(self.upper_stable_load),
            "max_goodput_load": _jsonable(self.max_goodput_load),
            "upper_goodput_load": _jsonable(self.upper_goodput_load),
            "probes": [p.to_dict() for p in self.probes],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CapacityCard:
        """The card :meth:`to_dict` wrote."""
        data = dict(data)
        data.pop("kind", None)
        data["criteria"] = StabilityCriteria.from_dict(data["criteria"])
        data["probes"] = [Probe.from_dict(p) for p in data["probes"]]
        for name in ("max_stable_load", "upper_stable_load", "max_goodput_load", "upper_goodput_load"):
            data[name] = _unjson(data[name])
        return cls(**data)

    def to_markdown(self) -> str:
        """The card as Markdown: the limits, the criteria, then the probes' curve."""
        lines = [
            f"# Capacity card: {self.scenario}",
            "",
            f"- **max stable load** ({self.load_key}): {_fmt(self.max_stable_load)} "
            f"(unstable at {_fmt(self.upper_stable_load)})",
            f"- **max SLO-goodput load**: {_fmt(self.max_goodput_load)} (fails at {_fmt(self.upper_goodput_load)})",
            f"- criteria: {self.criteria.describe()}",
            f"- search tolerance: {self.tolerance:g} (relative); {len(self.probes)} probes, "
            f"{sum(p.pruned for p in self.probes)} pruned early",
            "",
        ]
        frame = self.to_frame()
        if len(frame):
            cols = ["load", "seed", "stable", "meets_slo", "throughput_rps", "ttft_p99_s", "e2e_p99_s",
                    "busy_fraction", "batch_occupancy", "kv_occupancy", "tpot_inflation", "reason"]
            lines.append(_table(frame, cols))
        return "\n".join(lines) + "\n"

    def __str__(self) -> str:
        return self.to_markdown()

    def plot(self, ax: Any = None, metric: str | None = None) -> Any:
        """Latency and throughput against load, with the limits marked; returns the axes.

        *metric*: the latency column drawn (default: the first SLO criterion's, else
        ``e2e_p99_s``). Needs matplotlib.
        """
        import matplotlib.pyplot as plt

        if ax is None:
            _fig, ax = plt.subplots(figsize=(7, 4))
        frame = self.to_frame()
        frame = frame[~frame["pruned"]] if len(frame) else frame
        if metric is None:
            metric = f"slo:{self.criteria.slo[0].name}" if self.criteria.slo else "e2e_p99_s"
        if len(frame):
            ax.plot(frame["load"], frame[metric], "o-", color="C0", label=metric)
        ax.set_xlabel(axis_label(self.load_key))
        ax.set_ylabel(_latency_label(metric))
        ax2 = ax.twinx()
        if len(frame):
            ax2.plot(frame["load"], frame["throughput_rps"], "s--", color="C1", label="throughput")
        ax2.set_ylabel("throughput (requests/s)")
        for x, name, style in ((self.max_stable_load, "max stable", ":"), (self.max_goodput_load, "max SLO-goodput", "-.")):
            if math.isfinite(x):
                ax.axvline(x, color="k", linestyle=style, label=f"{name} {x:.4g}")
        for t in self.criteria.slo:
            if metric == f"slo:{t.name}":
                ax.axhline(t.target_s, color="C3", linestyle=":", label=f"target {t.target_s:g} s")
        ax.legend(loc="upper left", fontsize="small")
        ax.set_title(f"capacity: {self.scenario}")
        return ax

    def save(self, directory: str | Path) -> list[Path]:
        """Write ``capacity.json``, ``capacity.csv``, ``capacity.md`` and ``capacity.png``
        into *directory* (created); returns the paths written."""
        return _save(self, Path(directory), "capacity")


@attrs.frozen(kw_only=True)
class ReplicaCard:
    """What :func:`min_replicas` found: the fewest replicas meeting the criteria at a load."""

    scenario: str
    """The scenario searched (its name, or its path)."""
    replicas_key: str
    """The dotted key varied (``serving.replicas``)."""
    load_key: str
    """The dotted key holding the load."""
    load: float
    """The load every probe ran at."""
    criteria: StabilityCriteria
    """What the fleet had to satisfy."""
    min_replicas: int | None
    """Fewest replicas that met every criterion (None: none up to ``max_replicas``)."""
    probes: tuple[Probe, ...] = attrs.field(converter=_probes)
    """Every simulation run, in the order run."""

    def to_frame(self) -> pd.DataFrame:
        """One row per probe, sorted by replica count (then seed)."""
        frame = _probe_frame(self.probes)
        if len(frame):
            frame = frame.sort_values(["replicas", "seed"], kind="stable").reset_index(drop=True)
        return frame

    def to_dict(self) -> dict[str, Any]:
        """Plain, strict-JSON data; :meth:`from_dict` reads it."""
        return {
            "kind": "replicas",
            "scenario": self.scenario,
            "replicas_key": self.replicas_key,
            "load_key": self.load_key,
            "load": _jsonable(self.load),
            "criteria": self.criteria.to_dict(),
            "min_replicas": self.min_replicas,
            "probes": [p.to_dict() for p in self.probes],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplicaCard:
        """The card :meth:`to_dict` wrote."""
        data = dict(data)
        data.pop("kind", None)
        data["criteria"] = StabilityCriteria.from_dict(data["criteria"])
        data["probes"] = [Probe.from_dict(p) for p in data["probes"]]
        return cls(**data)

    def to_markdown(self) -> str:
        """The card as Markdown."""
        answer = str(self.min_replicas) if self.min_replicas is not None else "none found"
        lines = [
            f"# Replicas card: {self.scenario}",
            "",
            f"- **replicas needed** ({self.replicas_key}) at {self.load_key} = {self.load:g}: {answer}",
            f"- criteria: {self.criteria.describe()}",
            f"- {len(self.probes)} probes, {sum(p.pruned for p in self.probes)} pruned early",
            "",
        ]
        frame = self.to_frame()
        if len(frame):
            cols = ["replicas", "seed", "stable", "meets_slo", "throughput_rps", "ttft_p99_s", "e2e_p99_s",
                    "busy_fraction", "batch_occupancy", "kv_occupancy", "reason"]
            lines.append(_table(frame, cols))
        return "\n".join(lines) + "\n"

    def __str__(self) -> str:
        return self.to_markdown()

    def plot(self, ax: Any = None, metric: str | None = None) -> Any:
        """Latency against replica count, the answer marked; returns the axes (needs matplotlib)."""
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator

        if ax is None:
            _fig, ax = plt.subplots(figsize=(7, 4))
        frame = self.to_frame()
        frame = frame[~frame["pruned"]] if len(frame) else frame
        if metric is None:
            metric = f"slo:{self.criteria.slo[0].name}" if self.criteria.slo else "e2e_p99_s"
        if len(frame):
            ax.plot(frame["replicas"], frame[metric], "o-", label=metric)
        if self.min_replicas is not None:
            ax.axvline(self.min_replicas, color="k", linestyle=":", label=f"needed: {self.min_replicas}")
        for t in self.criteria.slo:
            if metric == f"slo:{t.name}":
                ax.axhline(t.target_s, color="C3", linestyle=":", label=f"target {t.target_s:g} s")
        ax.set_xlabel(axis_label(self.replicas_key))
        ax.set_ylabel(_latency_label(metric))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # replica counts: no tick at 1.5
        ax.legend(fontsize="small")
        ax.set_title(f"replicas at {self.load:g}: {self.scenario}")
        return ax

    def save(self, directory: str | Path) -> list[Path]:
        """Write ``replicas.json``, ``replicas.csv``, ``replicas.md`` and ``replicas.png``
        into *directory* (created); returns the paths written."""
        return _save(self, Path(directory), "replicas")


def _latency_label(metric: str) -> str:
    """A card's latency column (``e2e_p99_s``, or ``slo:ttft_p99`` for an SLO criterion's) in
    words with its unit, as :func:`~simpy_llm.plot_labels.axis_label` says a latency.

    >>> _latency_label("e2e_p99_s"), _latency_label("slo:ttft_p99"), _latency_label("slo:my_own")
    ('E2E p99 (s)', 'TTFT p99 (s)', 'slo:my_own (s)')
    """
    name, _, stat = metric.removeprefix("slo:").removesuffix("_s").partition("_")
    label = axis_label(f"latency_s.{name}.{stat}")
    return label if not label.startswith("latency_s.") else f"{metric} (s)"


def _save(card: CapacityCard | ReplicaCard, directory: Path, stem: str) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    path = directory / f"{stem}.json"
    path.write_text(json.dumps(card.to_dict(), indent=2, allow_nan=False) + "\n")
    written.append(path)
    path = directory / f"{stem}.csv"
    card.to_frame().to_csv(path, index=False)
    written.append(path)
    path = directory / f"{stem}.md"
    path.write_text(card.to_markdown())
    written.append(path)
    # matplotlib is a dependency: the plot is part of the card, never skipped
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    ax = card.plot()
    path = directory / f"{stem}.png"
    ax.figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(ax.figure)
    written.append(path)
    return written

