"""The ``metrics`` section of a scenario: how the summary groups requests.

Fairness cohorts (seed 003 §5.5 "Fairness classes", §8) group the measured requests by a
key of their records, and ``summary()["fairness"]["cohorts"]`` reports each group's SLO
attainment and the gap between the best and worst served (``docs/model.md``, "Fairness")::

    metrics:
      fairness:
        cohorts:
          - {by: client}
          - {by: draft_group}
          - {name: prompt_length, by: prompt_tokens, bins: [0, 512, 2048]}

Every key changes what the summary reports; the simulation itself is the same.
"""

from __future__ import annotations

from typing import Any

import attrs

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.validators import one_of

__all__ = ["BINNED_COHORT_KEYS", "COHORT_KEYS", "CohortConfig", "FairnessConfig", "MetricsConfig"]

COHORT_KEYS = (
    "client", "tenant", "slo_class", "draft_group", "draft_device", "replica_group", "cluster", "prompt_tokens", "output_tokens",
)
"""What a cohort groups requests by: a record's client, tenant, SLO class, draft group, draft
device (``<group>/<index>``), replica group or cluster, or bins of its prompt or output length."""
BINNED_COHORT_KEYS = ("prompt_tokens", "output_tokens")
"""The keys that group by ``bins`` of a length."""
MAX_BINS = 1000
"""Most bin edges of one cohort."""


def _edges(_inst: Any, attr: attrs.Attribute[Any], value: tuple[Any, ...] | None) -> None:
    """Bin edges: whole numbers >= 0, strictly increasing, at most ``MAX_BINS``."""
    if value is None:
        return
    if not value or len(value) > MAX_BINS:
        raise FieldValueError(attr.name, f"give 1 to {MAX_BINS} bin edges, got {len(value)}")
    for i, edge in enumerate(value):
        if isinstance(edge, bool) or not isinstance(edge, int) or edge < 0:
            raise FieldValueError(f"{attr.name}[{i}]", f"must be a whole number of tokens >= 0, got {edge!r}")
        if i and edge <= value[i - 1]:
            raise FieldValueError(f"{attr.name}[{i}]", f"edges must increase strictly: {edge} after {value[i - 1]}")


def _optional_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@attrs.frozen(kw_only=True)
class CohortConfig:
    """One way of grouping the measured requests for the fairness summary."""

    by: str = attrs.field(validator=one_of(COHORT_KEYS))
    """The record key the requests are grouped by (:data:`COHORT_KEYS`)."""
    bins: tuple[int, ...] | None = attrs.field(default=None, converter=_optional_tuple, validator=_edges)
    """Bin edges, tokens, for ``prompt_tokens`` and ``output_tokens`` (required there, refused
    otherwise): edges ``e_0 < e_1 < ... < e_k`` make the groups ``e_0-(e_1 - 1)``, ...,
    ``e_k+``, and ``<e_0`` for lengths below the first edge."""
    name: str | None = None
    """The cohort's name in the summary (default: ``by``)."""

    def __attrs_post_init__(self) -> None:
        if self.by in BINNED_COHORT_KEYS and self.bins is None:
            raise FieldValueError("bins", f"required with by: {self.by} (the length edges of its groups)")
        if self.by not in BINNED_COHORT_KEYS and self.bins is not None:
            raise FieldValueError("bins", f"applies only with by: {' or '.join(BINNED_COHORT_KEYS)}")
        if self.name is not None and not self.name:
            raise FieldValueError("name", "must not be empty")

    @property
    def label(self) -> str:
        """Its name in the summary."""
        return self.name if self.name is not None else self.by


@attrs.frozen(kw_only=True)
class FairnessConfig:
    """What the fairness summary reports besides its per-tenant indexes."""

    cohorts: tuple[CohortConfig, ...] = attrs.field(default=(), converter=tuple)
    """Groupings reported in ``summary()["fairness"]["cohorts"]``, by name (unique)."""

    def __attrs_post_init__(self) -> None:
        names = [c.label for c in self.cohorts]
        if len(set(names)) != len(names):
            raise FieldValueError("cohorts", f"cohort names must be unique (give name: to two cohorts of one key), got {names}")


@attrs.frozen(kw_only=True)
class MetricsConfig:
    """How the summary groups the requests (module docstring)."""

    fairness: FairnessConfig = attrs.field(factory=FairnessConfig)
    """Fairness cohorts."""
