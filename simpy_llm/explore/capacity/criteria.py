"""The criteria of a capacity search: the latency metrics an SLO criterion may name
(:data:`SLO_METRICS`), one SLO criterion (:class:`SloCriterion`) and its parsing,
what a load must satisfy (:class:`StabilityCriteria`: backlog growth, drops, pruning,
the SLO criteria and goodput), and the checks run before the first probe
(:func:`check_slo_classes`). The lowest layer of :mod:`simpy_llm.explore.capacity`: it
imports none of the package's other modules."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from simpy_llm.workload.checks import check_spec_files, request_slo_classes

if TYPE_CHECKING:
    from simpy_llm.config.schema import Scenario


SLO_METRICS = ("ttft", "tpot", "e2e", "queue_delay", "client_ttft", "client_e2e")
"""Latency metrics an SLO criterion may name (``Results.derived()`` without ``_s``)."""

_SLO_RE = re.compile(r"^(?P<metric>[a-z0-9_]+?)_(?P<stat>mean|p\d+(?:\.\d+)?)(?:\[(?P<cls>[^\]]+)\])?$")


# --- criteria ---------------------------------------------------------------
@attrs.frozen(kw_only=True)
class SloCriterion:
    """One SLO criterion of a capacity search: a statistic of a latency metric, over the
    measured requests, at most a bound.

    A criterion judges a load (a population of requests), not a request: the per-request
    targets of a scenario's SLO classes, which decide goodput, are
    :class:`~simpy_llm.config.schema.SLOTarget` (``min_goodput_fraction`` of
    :class:`StabilityCriteria` asks for a share of requests meeting those).

    Written ``METRIC_STAT[CLASS]=TARGET``: ``ttft_p99=0.5`` (the 99th percentile of
    TTFT at most 0.5 s), ``queue_delay_mean=0.08``, ``e2e_p95[interactive]=10``.

    Examples
    --------
    >>> t = SloCriterion.parse("ttft_p99[interactive]=0.5")
    >>> t.metric, t.statistic, t.slo_class, t.target_s, t.name
    ('ttft', 'p99', 'interactive', 0.5, 'ttft_p99[interactive]')
    >>> t.value(np.array([0.1, 0.2, 0.3]))
    0.298
    >>> SloCriterion.parse("latency_p99=1")
    Traceback (most recent call last):
    ...
    ValueError: SLO 'latency_p99=1': unknown metric 'latency'; allowed: ttft, tpot, e2e, queue_delay, client_ttft, client_e2e
    """

    metric: str = attrs.field()
    """A latency metric: one of :data:`SLO_METRICS`."""
    statistic: str = attrs.field()
    """``mean`` or a percentile ``pNN`` (``p50``, ``p99``, ``p99.9``; numpy's linear interpolation)."""
    target_s: float = attrs.field(converter=float)
    """The bound, s: the target is met when the statistic is at most this."""
    slo_class: str | None = None
    """Only requests of this SLO class count (None: every request)."""

    @metric.validator
    def _check_metric(self, _attribute: Any, value: str) -> None:
        if value not in SLO_METRICS:
            raise ValueError(f"unknown metric {value!r}; allowed: {', '.join(SLO_METRICS)}")

    @statistic.validator
    def _check_statistic(self, _attribute: Any, value: str) -> None:
        if value != "mean" and not (re.fullmatch(r"p\d+(\.\d+)?", value) and 0 <= float(value[1:]) <= 100):
            raise ValueError(f"unknown statistic {value!r}; allowed: mean or a percentile p0..p100 (p99, p99.9)")

    @target_s.validator
    def _check_target(self, _attribute: Any, value: float) -> None:
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"an SLO criterion's bound must be a finite number of seconds > 0, got {value!r}")

    @property
    def name(self) -> str:
        """``metric_statistic`` with ``[class]`` when it has one."""
        base = f"{self.metric}_{self.statistic}"
        return f"{base}[{self.slo_class}]" if self.slo_class else base

    @classmethod
    def parse(cls, text: str, target: float | None = None) -> SloCriterion:
        """``"ttft_p99=0.5"``, or a name ``"ttft_p99[cls]"`` and its *target* in seconds."""
        where = f"SLO {text!r}"
        if target is None:
            name, sep, raw = str(text).partition("=")
            if not sep:
                raise ValueError(f"{where}: write METRIC_STAT=SECONDS, e.g. ttft_p99=0.5 or queue_delay_mean[interactive]=0.1")
            try:
                target = float(raw)
            except ValueError:
                raise ValueError(f"{where}: the target {raw!r} is not a number of seconds") from None
        else:
            name = str(text)
        m = _SLO_RE.match(name.strip())
        if not m:
            raise ValueError(
                f"{where}: write METRIC_STAT[CLASS], e.g. ttft_p99, e2e_p95[interactive] or queue_delay_mean "
                f"(metrics: {', '.join(SLO_METRICS)}; statistics: mean, pNN)"
            )
        try:
            return cls(metric=m["metric"], statistic=m["stat"], target_s=target, slo_class=m["cls"])
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None

    def value(self, values: np.ndarray) -> float:
        """The statistic over *values* (NaNs left out; NaN when none is left)."""
        values = values[~np.isnan(values)]
        if not values.size:
            return math.nan
        if self.statistic == "mean":
            return float(values.mean())
        return float(np.percentile(values, float(self.statistic[1:])))


def _slo_criteria(value: Any) -> tuple[SloCriterion, ...]:
    """The ``slo`` of :class:`StabilityCriteria` from a mapping, strings or criteria."""
    if value is None:
        return ()
    if isinstance(value, Mapping):
        return tuple(SloCriterion.parse(str(k), v) for k, v in value.items())
    if isinstance(value, (str, SloCriterion)):
        value = [value]
    out = []
    for item in value:
        out.append(item if isinstance(item, SloCriterion) else SloCriterion.parse(item))
    return tuple(out)


def check_slo_classes(criteria: StabilityCriteria, scenario: Scenario) -> None:
    """Each SLO criterion that names a class (``ttft_p99[interactive]``) names one that
    *scenario*'s requests can carry (:func:`~simpy_llm.workload.checks.request_slo_classes`):
    a class no request has would judge no request, and pass every load.

    Raises
    ------
    ValueError
        Naming the target, the unknown class and the scenario's classes.

    Examples
    --------
    >>> from simpy_llm.loading import load_scenario
    >>> check_slo_classes(StabilityCriteria(slo="ttft_p99[interactve]=0.5"), load_scenario("scenarios/quickstart.yaml"))
    Traceback (most recent call last):
    ...
    ValueError: SLO 'ttft_p99[interactve]': unknown SLO class 'interactve'; the scenario's requests have: batch, interactive
    """
    named = [t for t in criteria.slo if t.slo_class is not None]
    if not named:
        return
    known = request_slo_classes(scenario)
    for target in named:
        if target.slo_class not in known:
            raise ValueError(
                f"SLO {target.name!r}: unknown SLO class {target.slo_class!r}; the scenario's requests have: {', '.join(known)}"
            )


def _check_before_probes(criteria: StabilityCriteria, scenario: Scenario) -> None:
    """The files *scenario* references (:func:`~simpy_llm.workload.checks.check_spec_files`)
    and the classes its SLO criteria name, before the first probe."""
    check_spec_files(scenario)
    check_slo_classes(criteria, scenario)


def _fraction_or_none(_instance: Any, attribute: Any, value: float | None) -> None:
    if value is not None and not 0.0 <= value <= 1.0:
        raise ValueError(f"{attribute.name} must be in [0, 1] (or None), got {value!r}")


@attrs.frozen(kw_only=True)
class StabilityCriteria:
    """What a load must satisfy (see :mod:`simpy_llm.explore.capacity` for each measure).

    Stability alone is :attr:`max_backlog_growth`, :attr:`max_drop_fraction` and the
    pruning bound; the SLO criteria (:attr:`slo`, :attr:`min_goodput_fraction`) are
    judged on stable loads only: an unstable load fails them by definition.

    Examples
    --------
    >>> c = StabilityCriteria(slo={"ttft_p99": 0.5, "queue_delay_mean[batch]": 2}, min_goodput_fraction=0.9)
    >>> [t.name for t in c.slo], c.has_slo
    (['ttft_p99', 'queue_delay_mean[batch]'], True)
    >>> StabilityCriteria(max_backlog_growth=0)
    Traceback (most recent call last):
    ...
    ValueError: max_backlog_growth must be in (0, 1], got 0
    """

    max_backlog_growth: float = attrs.field(default=0.01)
    """Largest backlog growth over the measurement window, as a share of the window's
    arrivals (0.01: the system keeps up with 99% of what arrives), in (0, 1]."""
    max_drop_fraction: float | None = attrs.field(default=0.01, validator=_fraction_or_none)
    """Largest share of measured requests dropped (None: drops do not count)."""
    prune_backlog: int | None = attrs.field(default=None)
    """Requests in the system beyond which a probe stops at once, judged unstable (None:
    ``max(100, n / 4)`` for a probe of *n* requests, warm-up included, or without a
    request count ``n = load * (warmup_s + measure_s)``). A stable system holds about
    ``load * latency`` requests (Little's law), which the bound must leave room for: a
    quarter of the probe's requests in the system at once means the latency is a quarter
    of the whole run, too long for the run to judge; an overloaded one passes it once its
    backlog has grown by that much."""
    slo: tuple[SloCriterion, ...] = attrs.field(default=(), converter=_slo_criteria)
    """SLO criteria: a mapping ``{"ttft_p99": 0.5}``, strings ``"ttft_p99=0.5"`` or
    :class:`SloCriterion` objects; every one must be met."""
    min_goodput_fraction: float | None = attrs.field(default=None, validator=_fraction_or_none)
    """Smallest share of measured completed requests that meet the scenario's own
    per-class SLO targets (None: not judged)."""

    @max_backlog_growth.validator
    def _check_growth(self, _attribute: Any, value: float) -> None:
        if not 0.0 < value <= 1.0:
            raise ValueError(f"max_backlog_growth must be in (0, 1], got {value!r}")

    @prune_backlog.validator
    def _check_prune(self, _attribute: Any, value: int | None) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"prune_backlog must be an integer >= 1 (or None), got {value!r}")

    @property
    def has_slo(self) -> bool:
        """Whether any SLO criterion is set (else the two limits coincide)."""
        return bool(self.slo) or self.min_goodput_fraction is not None

    def describe(self) -> str:
        """The criteria in one line, as the cards print them.

        >>> StabilityCriteria(slo={"ttft_p99": 0.5}).describe()
        'backlog growth <= 0.01 of arrivals, drops <= 0.01; SLO: ttft_p99 <= 0.5 s'
        """
        slo = ", ".join(f"{t.name} <= {t.target_s:g} s" for t in self.slo) or "none"
        return (
            f"backlog growth <= {self.max_backlog_growth:g} of arrivals"
            + (f", drops <= {self.max_drop_fraction:g}" if self.max_drop_fraction is not None else "")
            + f"; SLO: {slo}"
            + (f"; goodput fraction >= {self.min_goodput_fraction:g}" if self.min_goodput_fraction is not None else "")
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-able); :meth:`from_dict` reads it back."""
        return {
            "max_backlog_growth": self.max_backlog_growth,
            "max_drop_fraction": self.max_drop_fraction,
            "prune_backlog": self.prune_backlog,
            "slo": {t.name: t.target_s for t in self.slo},
            "min_goodput_fraction": self.min_goodput_fraction,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StabilityCriteria:
        """The criteria :meth:`to_dict` wrote."""
        return cls(**dict(data))
